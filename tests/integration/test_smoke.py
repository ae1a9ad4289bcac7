"""The core loop end to end: a job goes terminal, no tab saves it, the reactor records it."""

from __future__ import annotations

import psycopg
import pytest

from tests.helpers import early_writes, finish, new_job, run_row, worker_writes
from tests.integration.conftest import StartReactor
from tests.polling import eventually

pytestmark = pytest.mark.anyio


async def test_notified_job_is_recorded_after_grace(
    database_url: str, start_reactor: StartReactor
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(grace=0.3) as reactor:
            job_id, run_id = new_job(conn)
            finish(conn, job_id)
            row = await eventually(lambda: run_row(conn, run_id))
            assert row == (job_id, "worker")
            # The row is visible once committed, the count once the answer is back.
            timer = reactor.metrics.recorded.labels("timer")
            await eventually(lambda: timer._value.get() == 1)
        assert early_writes(conn, 0.3) == 0
        assert len(worker_writes(conn)) == 1
