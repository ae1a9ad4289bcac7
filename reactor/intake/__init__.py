"""Where job events come from, as hints, and the one door into the work queue."""
