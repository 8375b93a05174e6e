"""Re-exports for the test modules that still import from here: the helpers live in helpers.py."""

from helpers import tiny_rnnsearch, tiny_transformer

__all__ = ["tiny_rnnsearch", "tiny_transformer"]
