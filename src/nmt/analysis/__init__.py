"""What a translation attends to and aligns with: cross-attention maps, word alignments."""
