"""Hearing of a job: the LISTEN session, what arrives on it, and its verification against the
tables before anything is acted on."""
