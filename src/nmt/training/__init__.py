"""Training: the loop, the schedule, the loss, checkpoints, TensorBoard, distributed set-up."""
