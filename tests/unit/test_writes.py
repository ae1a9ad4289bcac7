"""When a pair's record statements are judged unable to write (reactor/record/writes.py)."""

from __future__ import annotations

from reactor.record.writes import BROKEN_AFTER, REPEATED_FOR_S, WriteHealth

GONE = 'column "doc_html" of relation "analysis_runs" does not exist'


def test_an_error_on_the_pairs_objects_is_a_verdict_at_the_second_failure() -> None:
    writes = WriteHealth()
    writes.failed(GONE, "42703", now=10.0)
    assert writes.problem is None  # one could be a statement racing a migration
    writes.failed(GONE, "42703", now=11.0)
    assert BROKEN_AFTER == 2
    assert writes.problem == GONE


def test_a_privilege_or_authorization_error_counts_as_broken() -> None:
    for state in ("42501", "0LP01", "28000"):
        writes = WriteHealth()
        writes.failed("denied", state, now=0.0)
        writes.failed("denied", state, now=0.5)
        assert writes.problem == "denied", state


def test_any_other_error_is_a_verdict_only_once_it_repeats_for_half_a_minute() -> None:
    writes = WriteHealth()
    writes.failed("canceling statement due to user request", "57014", now=0.0)
    writes.failed("canceling statement due to user request", "57014", now=REPEATED_FOR_S - 1)
    assert writes.problem is None
    writes.failed("canceling statement due to user request", "57014", now=REPEATED_FOR_S)
    assert writes.problem == "canceling statement due to user request"


def test_another_error_starts_the_count_again() -> None:
    writes = WriteHealth()
    writes.failed("server closed the connection unexpectedly", "08006", now=0.0)
    writes.failed(GONE, "42703", now=40.0)
    assert writes.problem is None
    writes.failed("server closed the connection unexpectedly", "08006", now=41.0)
    writes.failed("server closed the connection unexpectedly", "08006", now=42.0)
    assert writes.problem is None  # the repetition began at 41 s, not at 0


def test_a_statement_that_succeeds_clears_the_verdict() -> None:
    writes = WriteHealth()
    writes.failed(GONE, "42703", now=0.0)
    writes.failed(GONE, "42703", now=1.0)
    writes.succeeded()
    assert writes.problem is None
    writes.failed(GONE, "42703", now=2.0)
    assert writes.problem is None  # counted from the success on
