"""The demo on an embedded PostgreSQL."""
