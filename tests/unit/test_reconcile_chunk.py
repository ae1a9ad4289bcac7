"""The reconcile's chunk, sized by time: what a step of STEP_TARGET_S seconds holds."""

from __future__ import annotations

from reactor.insurance.reconcile import MAX_CHUNK, MIN_CHUNK, STEP_TARGET_S, next_chunk


def test_a_chunk_grows_towards_the_target_at_most_twofold_per_step() -> None:
    # 1,000 jobs in a third of the target: three times as many would fit, two times are taken.
    assert next_chunk(1000, STEP_TARGET_S / 3, 1000) == 2000
    # Just under the target's pace: what fits.
    assert next_chunk(1000, STEP_TARGET_S / 1.5, 1000) == 1500


def test_a_slow_step_shrinks_the_next_chunk_at_once() -> None:
    assert next_chunk(8000, STEP_TARGET_S * 4, 8000) == 2000


def test_the_chunk_stays_within_its_bounds() -> None:
    assert next_chunk(MAX_CHUNK, STEP_TARGET_S / 100, MAX_CHUNK) == MAX_CHUNK
    assert next_chunk(MIN_CHUNK, STEP_TARGET_S * 100, MIN_CHUNK) == MIN_CHUNK


def test_the_pace_is_read_from_the_jobs_walked_not_the_chunk_asked() -> None:
    # The pass's last step walked 100 of 4,000 in a tenth of the target: 1,000 fit.
    assert next_chunk(4000, STEP_TARGET_S / 10, 100) == 1000


def test_a_step_that_walked_nothing_keeps_the_chunk() -> None:
    assert next_chunk(3000, 0.002, None) == 3000
    assert next_chunk(3000, 0.002, 0) == 3000
    assert next_chunk(3000, 0.0, 500) == 3000
