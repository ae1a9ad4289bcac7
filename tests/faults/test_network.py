"""The network between the reactor and PostgreSQL fails: silent partitions, a partition that
never heals for the old connections, a slow link, and resets in the middle of record statements.

The reactor runs in-process and reaches the server only through the fault proxy; the app (the
worker and the tabs) connects directly, so it keeps finishing jobs while the reactor is cut off.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
import pytest

from reactor.service import Reactor
from tests.faults.conftest import Report, StartReactor
from tests.faults.proxy import FaultProxy
from tests.faults.support import Workload, settle, with_port
from tests.integration.conftest import eventually

pytestmark = pytest.mark.anyio

GRACE = 1.0
PROBE = 1.0
RATE = 20.0  # jobs finished per second


async def drive(app: Workload, seconds: float, rate: float = RATE) -> None:
    await anyio.to_thread.run_sync(app.drive, seconds, rate)


async def quiesce(app: Workload) -> None:
    await anyio.to_thread.run_sync(app.quiesce)


async def warm_pool(reactor: Reactor) -> None:
    """Open every pool connection, as a busy replica has them."""
    pool = reactor.database.pool
    held = [await pool.getconn() for _ in range(pool.max_size)]
    for conn in held:
        await pool.putconn(conn)


async def _silent_partition(
    database_url: str,
    proxy: FaultProxy,
    reactor_at: StartReactor,
    workload: Callable[..., Workload],
    report: Report,
    *,
    cycles: int,
    outage: float,
    scenario: str,
) -> None:
    app = workload(grace=GRACE, seed=1)
    detect: list[float] = []
    dsn = with_port(database_url, proxy.port)
    async with reactor_at(dsn, grace=GRACE, probe_interval=PROBE, probe_timeout=PROBE) as reactor:
        listener = reactor.listener
        assert listener is not None
        for _ in range(cycles):
            await eventually(lambda: listener.state == "listening", timeout=30)
            await drive(app, 1.0)
            before = listener.connections
            # Jobs finished right before the cut: their deadlines fall inside the outage.
            await anyio.to_thread.run_sync(app.finish, 10)
            proxy.partition()
            cut = time.monotonic()
            noticed: float | None = None
            while time.monotonic() < cut + outage:
                await drive(app, 0.25)
                if noticed is None and listener.state != "listening":
                    noticed = time.monotonic() - cut
            if noticed is not None:
                detect.append(noticed)
            proxy.heal()

            def reconnected(since: int = before) -> bool:
                return listener.connections > since

            await eventually(reconnected, timeout=30)
        await quiesce(app)
        judgement, took = await settle(database_url, GRACE, within=30)
    seen = f"noticed in {len(detect)}/{cycles} cycles before the heal"
    if detect:
        seen += f", after {min(detect):.1f}-{max(detect):.1f}s"
    report(scenario, cycles, judgement, recovery=took, note=f"outage {outage:g}s; {seen}")
    assert judgement.clean, str(judgement)
    # Lateness: the outage plus the reconnect, never a scan interval.
    assert judgement.verdict.lateness_max is not None
    assert judgement.verdict.lateness_max < outage + 10


async def test_silent_partition_is_recovered(
    database_url: str,
    proxy: FaultProxy,
    reactor_at: StartReactor,
    workload: Callable[..., Workload],
    report: Report,
) -> None:
    await _silent_partition(
        database_url,
        proxy,
        reactor_at,
        workload,
        report,
        cycles=1,
        outage=3.0,
        scenario="net: silent partition",
    )


@pytest.mark.slow
async def test_silent_partitions_long(
    database_url: str,
    proxy: FaultProxy,
    reactor_at: StartReactor,
    workload: Callable[..., Workload],
    report: Report,
) -> None:
    await _silent_partition(
        database_url,
        proxy,
        reactor_at,
        workload,
        report,
        cycles=5,
        outage=15.0,
        scenario="net: silent partition (long)",
    )


async def test_silent_partition_of_the_listener_is_noticed_within_the_probe_timeout(
    database_url: str,
    proxy: FaultProxy,
    reactor_at: StartReactor,
    workload: Callable[..., Workload],
    report: Report,
) -> None:
    # Only the LISTEN connection goes through the proxy; the pool (and so the probe's send)
    # reaches the server directly.
    app = workload(grace=GRACE, seed=5)
    proxied = with_port(database_url, proxy.port)
    async with reactor_at(
        database_url, listen_dsn=proxied, probe_interval=PROBE, probe_timeout=PROBE
    ) as reactor:
        listener = reactor.listener
        assert listener is not None
        await eventually(lambda: listener.proven, timeout=10)
        await anyio.to_thread.run_sync(app.finish, 10)
        proxy.partition()
        cut = time.monotonic()
        try:
            await eventually(lambda: listener.state != "listening", timeout=2 * PROBE + 1)
            noticed = time.monotonic() - cut
            await drive(app, 2.0)
        finally:
            proxy.heal()
        await eventually(lambda: listener.connections >= 2 and listener.proven, timeout=30)
        await quiesce(app)
        judgement, took = await settle(database_url, GRACE, within=30)
    report(
        "net: silent partition of LISTEN only",
        1,
        judgement,
        recovery=took,
        note=f"noticed after {noticed:.2f}s (probe interval and timeout {PROBE:g}s)",
    )
    assert noticed <= 2 * PROBE + 0.5
    assert judgement.clean, str(judgement)


async def test_partition_during_the_probe_send_is_noticed_within_the_probe_timeout(
    database_url: str,
    proxy: FaultProxy,
    reactor_at: StartReactor,
    workload: Callable[..., Workload],
    report: Report,
) -> None:
    app = workload(grace=GRACE, seed=6)
    dsn = with_port(database_url, proxy.port)
    outage = 6.0
    async with reactor_at(dsn, probe_interval=PROBE, probe_timeout=PROBE) as reactor:
        listener = reactor.listener
        assert listener is not None
        await eventually(lambda: listener.proven, timeout=10)
        cut: list[float] = []
        send = reactor.database.notify

        async def notify(channel: str, payload: str) -> None:
            # The cut lands exactly as the next probe notification leaves.
            if payload.startswith("probe:") and not cut:
                proxy.partition()
                cut.append(time.monotonic())
            await send(channel, payload)

        reactor.database.notify = notify  # type: ignore[method-assign]
        await eventually(lambda: cut, timeout=5)
        noticed: float | None = None
        try:
            await eventually(lambda: listener.state != "listening", timeout=outage)
            noticed = time.monotonic() - cut[0]
        except TimeoutError:
            pass  # judged below, after the heal and the verdict
        finally:
            proxy.heal()
        await anyio.to_thread.run_sync(app.finish, 10)
        await quiesce(app)
        judgement, took = await settle(database_url, GRACE, within=30)
    report(
        "net: partition while the probe is sent",
        1,
        judgement,
        recovery=took,
        note="listener " + (f"noticed after {noticed:.2f}s" if noticed else "never noticed"),
    )
    assert judgement.clean, str(judgement)
    assert noticed is not None, f"the listener did not notice a {outage:g}s partition"
    assert noticed <= 2 * PROBE + 0.5


async def _old_links_never_heal(
    database_url: str,
    proxy: FaultProxy,
    reactor_at: StartReactor,
    workload: Callable[..., Workload],
    report: Report,
    *,
    seconds: float,
    scenario: str,
) -> None:
    app = workload(grace=GRACE, seed=2)
    dsn = with_port(database_url, proxy.port)
    try:
        async with reactor_at(
            dsn, grace=GRACE, probe_interval=PROBE, probe_timeout=PROBE
        ) as reactor:
            listener = reactor.listener
            assert listener is not None
            await eventually(lambda: listener.proven, timeout=10)
            await warm_pool(reactor)
            await drive(app, 1.0)
            await anyio.to_thread.run_sync(app.finish, 10)
            proxy.partition(new=False)
            await drive(app, seconds)
            await quiesce(app)
            judgement, took = await settle(database_url, GRACE, within=5)
            report(
                scenario,
                1,
                judgement,
                recovery=took,
                note=f"old connections frozen for good, new ones fine; {seconds:g}s of traffic",
            )
    finally:
        proxy.reset_frozen()  # let the reactor's stuck calls fail, so it can stop
    assert judgement.clean, str(judgement)


async def test_partition_that_never_heals_for_old_connections(
    database_url: str,
    proxy: FaultProxy,
    reactor_at: StartReactor,
    workload: Callable[..., Workload],
    report: Report,
) -> None:
    await _old_links_never_heal(
        database_url,
        proxy,
        reactor_at,
        workload,
        report,
        seconds=3.0,
        scenario="net: old connections never heal",
    )


async def _slow_network(
    database_url: str,
    proxy: FaultProxy,
    reactor_at: StartReactor,
    workload: Callable[..., Workload],
    report: Report,
    *,
    seconds: float,
    scenario: str,
) -> None:
    app = workload(grace=GRACE, seed=3)
    proxy.latency = 0.2
    dsn = with_port(database_url, proxy.port)
    async with reactor_at(dsn, grace=GRACE, probe_interval=PROBE, probe_timeout=2 * PROBE):
        await drive(app, seconds)
        await quiesce(app)
        judgement, took = await settle(database_url, GRACE, within=30)
    report(scenario, 1, judgement, recovery=took, note="+200 ms each way; probe timeout 2 s")
    assert judgement.clean, str(judgement)
    # A record costs a pool check and a statement (4 one-way trips); while the pool grows, a
    # new connection costs ~10 round trips (4 s): the reactor sends its 8 session settings one
    # statement at a time.
    assert judgement.verdict.lateness_max is not None
    assert judgement.verdict.lateness_max < 8.0


async def test_slow_network(
    database_url: str,
    proxy: FaultProxy,
    reactor_at: StartReactor,
    workload: Callable[..., Workload],
    report: Report,
) -> None:
    await _slow_network(
        database_url,
        proxy,
        reactor_at,
        workload,
        report,
        seconds=3.0,
        scenario="net: +200 ms latency",
    )


@pytest.mark.slow
async def test_slow_network_long(
    database_url: str,
    proxy: FaultProxy,
    reactor_at: StartReactor,
    workload: Callable[..., Workload],
    report: Report,
) -> None:
    await _slow_network(
        database_url,
        proxy,
        reactor_at,
        workload,
        report,
        seconds=60.0,
        scenario="net: +200 ms latency (long)",
    )


async def _resets_mid_record(
    database_url: str,
    proxy: FaultProxy,
    reactor_at: StartReactor,
    workload: Callable[..., Workload],
    report: Report,
    *,
    resets: int,
    scenario: str,
) -> None:
    app = workload(grace=GRACE, seed=4)
    dsn = with_port(database_url, proxy.port)
    async with reactor_at(dsn, grace=GRACE, probe_interval=PROBE, probe_timeout=PROBE) as reactor:
        # RST right after a record statement reaches the server: before it runs, while it runs,
        # or after it committed but before the reply (the reactor cannot tell which).
        proxy.reset_on(b"INSERT INTO analysis_runs AS r", times=resets, delay=(0.0, 0.01))
        deadline = time.monotonic() + 20 + resets
        while proxy.resets_fired() < resets and time.monotonic() < deadline:
            await drive(app, 0.5)
        await quiesce(app)
        judgement, took = await settle(database_url, GRACE, within=30)
        errors = reactor.metrics.record_errors._value.get()
    fired = proxy.resets_fired()
    report(
        scenario,
        fired,
        judgement,
        recovery=took,
        note=f"RST 0-10 ms after a record statement was sent; {errors:g} record errors",
    )
    assert fired == resets
    assert judgement.clean, str(judgement)


async def test_reset_in_the_middle_of_record_statements(
    database_url: str,
    proxy: FaultProxy,
    reactor_at: StartReactor,
    workload: Callable[..., Workload],
    report: Report,
) -> None:
    await _resets_mid_record(
        database_url,
        proxy,
        reactor_at,
        workload,
        report,
        resets=5,
        scenario="net: RST mid record statement",
    )


@pytest.mark.slow
async def test_resets_in_the_middle_of_record_statements_long(
    database_url: str,
    proxy: FaultProxy,
    reactor_at: StartReactor,
    workload: Callable[..., Workload],
    report: Report,
) -> None:
    await _resets_mid_record(
        database_url,
        proxy,
        reactor_at,
        workload,
        report,
        resets=60,
        scenario="net: RST mid record statement (long)",
    )
