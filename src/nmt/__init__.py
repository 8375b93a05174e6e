"""nmt: a small, hackable neural machine translation toolkit (Transformer and RNNsearch)."""

__version__ = "0.1.0"
