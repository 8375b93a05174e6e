"""Tools over trained models: checkpoint averaging, distillation data, vocabulary shortlists."""
