"""Hugging Face ``transformers``: a trained Transformer as a folder that stock ``transformers`` loads
(``scripts/export_hf.py``, docs/sharing.md)."""
