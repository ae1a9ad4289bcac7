"""What the process says about itself: metrics, traces, logs, progress."""
