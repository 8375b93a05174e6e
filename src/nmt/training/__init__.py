"""Training: the loop, its budget, the schedule, the loss, averaging, TensorBoard, distributed set-up."""
