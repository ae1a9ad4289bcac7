"""The operator's server: probes, metrics and the page."""
