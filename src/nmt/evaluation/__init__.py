"""Scores: a checkpoint evaluated, given translations scored, the final model chosen on valid."""
