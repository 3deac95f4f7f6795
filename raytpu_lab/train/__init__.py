"""Training runs on TPU slices: Ray Train launchers and their results."""
