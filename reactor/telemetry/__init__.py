"""What the process says about itself: metrics, traces and logs."""
