"""A hint naming a job id its column cannot hold costs nothing: on a bigint job table (the
second mapping), `9999999999999999999` is counted as garbage where the listener reads it, and
never reaches the statement that verifies the real hints sent beside it, whose cast it would
fail with the whole batch; no scan is asked for."""

from __future__ import annotations

import psycopg
import pytest

from reactor import db
from reactor.install import Install, mapping_file
from reactor.runtime.replica import open_replica
from reactor.settings.config import Settings
from reactor.settings.pairs import Pair
from tests.integration.support import recorded, start_scans_over
from tests.integration.test_mapping import SECOND_SQL, SECOND_TOML, add, app
from tests.polling import eventually

pytestmark = pytest.mark.anyio

GRACE = 1.0


@pytest.fixture
async def bigint_install(empty_database_url: str) -> Install:
    """The second mapping's tables, installed: a bigint job id."""
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(SECOND_SQL)
    async with await db.connect(empty_database_url, "test") as conn:
        install = (await db.migrate(conn, mapping_file.load(str(SECOND_TOML)))).install
    assert install.id_type == "bigint"
    return install


async def test_an_out_of_range_id_is_counted_and_the_real_hints_beside_it_are_armed(
    bigint_install: Install, empty_database_url: str
) -> None:
    url = empty_database_url
    settings = Settings(
        database_url=url, grace=GRACE, scan_interval=600.0, http_addr=None, probe_interval=1.0
    )
    pair = Pair(bigint_install, settings)
    async with open_replica(settings, [pair]) as replica, replica.running():
        reactor = replica.reactors[pair.name]
        await eventually(lambda: reactor.listener is not None and reactor.listener.proven)
        await start_scans_over(reactor)
        asked: list[bool] = []
        request = reactor.scanner.request

        def counting(*, rearm: bool = False) -> None:
            asked.append(rearm)
            request(rearm=rearm)

        reactor.scanner.request = counting  # type: ignore[method-assign]
        rejected = reactor.metrics.notified["rejected"]._value.get()
        with app(url) as conn:
            jobs = [add(conn, f"r{i}", state="running", verdicts=None) for i in range(3)]
            # One commit: the three real hints and the bad one arrive together, in one batch.
            with conn.transaction():
                conn.execute(
                    "UPDATE app.\"Job\" SET state = 'done', verdicts = '[\"ok\"]',"
                    ' "updatedAt" = now() AT TIME ZONE \'UTC\' WHERE "jobId" = ANY(%s)',
                    (jobs,),
                )
                conn.execute(
                    "SELECT pg_notify(%s, '9999999999999999999@' || extract(epoch FROM now()))",
                    (bigint_install.channel,),
                )

            def written() -> int:
                row = conn.execute(
                    'SELECT count(*) FROM app."Report" WHERE "fromJob" = ANY(%s)', (jobs,)
                ).fetchone()
                return int(row[0]) if row else 0

            await eventually(lambda: written() == 3, timeout=10 * GRACE)
        # The rows commit before the recorder counts them: wait for its count, not the rows.
        await eventually(lambda: recorded(reactor, "timer") + recorded(reactor, "scan") == 3)
        assert recorded(reactor, "timer") == 3, "the timer road, not a scan's"
        assert reactor.metrics.notified["rejected"]._value.get() == rejected + 1
        assert asked == [], "no scan asked for"
