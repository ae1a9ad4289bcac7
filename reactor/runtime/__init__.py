"""The process-level replica and each pair's reactor under it."""
