"""Benchmarks of backstop-reactor, each measured against an alternative in the same run.

Run them with ``uv run python -m bench [NAME ...] [--quick] [--results DIR]``; see
``bench/REPORT.md`` for the latest figures and ``bench/__main__.py`` for the list.
"""
