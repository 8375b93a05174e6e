"""Text and subwords: SentencePiece, its worker processes, special ids, target-language tags."""
