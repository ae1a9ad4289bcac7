"""The network between the reactor and PostgreSQL fails: silent partitions, a partition that
never heals for the old connections, a slow link, and resets in the middle of record statements.

The reactor runs in-process and reaches the server only through the fault proxy; the app (the
worker and the tabs) connects directly, so it keeps finishing jobs while the reactor is cut off.
"""

from __future__ import annotations

import functools
import time

import pytest

from reactor.runtime.service import Reactor
from tests.faults.proxy import FaultProxy
from tests.faults.scenario import Scenario, short_and_long
from tests.faults.support import with_port
from tests.polling import eventually

pytestmark = pytest.mark.anyio

PROBE = 1.0
# What a loaded two-core machine adds to a bound made of probe intervals and timeouts.
SLACK = 1.0


async def warm_pool(reactor: Reactor) -> None:
    """Open every pool connection, as a busy replica has them."""
    pool = reactor.database.pool
    held = [await pool.getconn() for _ in range(pool.max_size)]
    for conn in held:
        await pool.putconn(conn)


async def _silent_partition(
    scenario: Scenario, proxy: FaultProxy, *, cycles: int, outage: float, name: str
) -> None:
    app = scenario.app(seed=1)
    detect: list[float] = []
    dsn = with_port(scenario.database_url, proxy.port)
    async with scenario.fleet(dsn, probe_interval=PROBE, probe_timeout=PROBE) as fleet:
        for _ in range(cycles):
            await eventually(
                lambda: fleet.all_listeners(lambda listener: listener.state == "listening"),
                timeout=30,
            )
            await scenario.drive(app, 1.0)
            before = fleet.connections()
            # Jobs finished right before the cut: their deadlines fall inside the outage.
            await scenario.finish(app, 10)
            proxy.partition()
            cut = time.monotonic()
            noticed: float | None = None
            while time.monotonic() < cut + outage:
                await scenario.drive(app, 0.25)
                if noticed is None and fleet.all_listeners(
                    lambda listener: listener.state != "listening"
                ):
                    noticed = time.monotonic() - cut
            if noticed is not None:
                detect.append(noticed)
            proxy.heal()
            await eventually(functools.partial(fleet.reconnected_since, before), timeout=30)
        judgement, took = await scenario.verdict(app)
    seen = f"noticed in {len(detect)}/{cycles} cycles before the heal"
    if detect:
        seen += f", after {min(detect):.1f}-{max(detect):.1f}s"
    scenario.conclude(name, cycles, judgement, recovery=took, note=f"outage {outage:g}s; {seen}")
    # Lateness: the outage plus the reconnect, never a scan interval.
    assert judgement.verdict.lateness_max_overall is not None
    assert judgement.verdict.lateness_max_overall < outage + 10


@short_and_long(
    ("cycles", "outage", "name"),
    (1, 3.0, "net: silent partition"),
    (5, 15.0, "net: silent partition (long)"),
)
async def test_silent_partition_is_recovered(
    scenario: Scenario, proxy: FaultProxy, cycles: int, outage: float, name: str
) -> None:
    await _silent_partition(scenario, proxy, cycles=cycles, outage=outage, name=name)


async def test_silent_partition_of_the_listener_is_noticed_within_the_probe_timeout(
    scenario: Scenario, proxy: FaultProxy
) -> None:
    # Only the LISTEN connections go through the proxy; the pools (and so the probes' sends)
    # reach the server directly.
    app = scenario.app(seed=5)
    proxied = with_port(scenario.database_url, proxy.port)
    async with scenario.fleet(
        listen_dsn=proxied, probe_interval=PROBE, probe_timeout=PROBE
    ) as fleet:
        await eventually(lambda: fleet.all_listeners(lambda listener: listener.proven), timeout=10)
        await scenario.finish(app, 10)
        proxy.partition()
        cut = time.monotonic()
        try:
            await eventually(
                lambda: fleet.all_listeners(lambda listener: listener.state != "listening"),
                timeout=3 * PROBE + 1,
            )
            noticed = time.monotonic() - cut
            await scenario.drive(app, 2.0)
        finally:
            proxy.heal()
        await eventually(
            lambda: fleet.all_listeners(
                lambda listener: listener.connections >= 2 and listener.proven
            ),
            timeout=30,
        )
        judgement, took = await scenario.verdict(app)
    scenario.conclude(
        "net: silent partition of LISTEN only",
        1,
        judgement,
        recovery=took,
        note=f"noticed after {noticed:.2f}s (probe interval and timeout {PROBE:g}s)",
    )
    # The next check carries a probe (within an interval), which must be back within the probe
    # timeout: two probe intervals here, and a second of scheduling on a loaded machine.
    assert noticed <= 2 * PROBE + SLACK


async def test_partition_during_the_listeners_check_is_noticed_within_the_probe_timeout(
    scenario: Scenario, proxy: FaultProxy
) -> None:
    app = scenario.app(seed=6)
    dsn = with_port(scenario.database_url, proxy.port)
    outage = 6.0
    async with scenario.fleet(dsn, probe_interval=PROBE, probe_timeout=PROBE) as fleet:
        await eventually(lambda: fleet.all_listeners(lambda listener: listener.proven), timeout=10)
        cut: list[float] = []
        first = fleet.reactors[0]
        listener = first.listener
        assert listener is not None
        hand_out = listener.probe_for_check

        def probe_for_check() -> str | None:
            # The cut lands exactly as the first replica's next health check leaves through the
            # pool, with the probe for its LISTEN session unless other probes arrived meanwhile.
            if not cut:
                proxy.partition()
                cut.append(time.monotonic())
            return hand_out()

        listener.probe_for_check = probe_for_check  # type: ignore[method-assign]
        await eventually(lambda: cut, timeout=5)
        noticed: float | None = None
        try:
            await eventually(
                lambda: fleet.all_listeners(lambda listener: listener.state != "listening"),
                timeout=outage,
            )
            noticed = time.monotonic() - cut[0]
        except TimeoutError:
            pass  # judged below, after the heal and the verdict
        finally:
            proxy.heal()
        await scenario.finish(app, 10)
        judgement, took = await scenario.verdict(app)
    scenario.conclude(
        "net: partition while the listener checks",
        1,
        judgement,
        recovery=took,
        note="listener " + (f"noticed after {noticed:.2f}s" if noticed else "never noticed"),
    )
    assert noticed is not None, f"the listener did not notice a {outage:g}s partition"
    # Every replica must notice: its next check leaves within a probe interval, times out, and
    # one bounded ping of the session follows (the pool could not vouch for it): an interval and
    # two probe timeouts here, and a second of scheduling on a loaded machine.
    assert noticed <= 3 * PROBE + SLACK


async def _old_links_never_heal(
    scenario: Scenario, proxy: FaultProxy, *, seconds: float, name: str
) -> None:
    app = scenario.app(seed=2)
    dsn = with_port(scenario.database_url, proxy.port)
    try:
        async with scenario.fleet(dsn, probe_interval=PROBE, probe_timeout=PROBE) as fleet:
            await eventually(
                lambda: fleet.all_listeners(lambda listener: listener.proven), timeout=10
            )
            for reactor in fleet.reactors:
                await warm_pool(reactor)
            await scenario.drive(app, 1.0)
            await scenario.finish(app, 10)
            proxy.partition(new=False)
            await scenario.drive(app, seconds)
            judgement, took = await scenario.verdict(app, within=5)
            scenario.conclude(
                name,
                1,
                judgement,
                recovery=took,
                note=f"old connections frozen for good, new ones fine; {seconds:g}s of traffic",
            )
    finally:
        proxy.reset_frozen()  # let the reactors' stuck calls fail, so they can stop


async def test_partition_that_never_heals_for_old_connections(
    scenario: Scenario, proxy: FaultProxy
) -> None:
    await _old_links_never_heal(
        scenario, proxy, seconds=3.0, name="net: old connections never heal"
    )


async def _slow_network(
    scenario: Scenario, proxy: FaultProxy, *, seconds: float, name: str
) -> None:
    app = scenario.app(seed=3)
    proxy.latency = 0.2
    dsn = with_port(scenario.database_url, proxy.port)
    async with scenario.fleet(dsn, probe_interval=PROBE, probe_timeout=2 * PROBE):
        await scenario.drive(app, seconds)
        judgement, took = await scenario.verdict(app)
    scenario.conclude(name, 1, judgement, recovery=took, note="+200 ms each way; probe timeout 2 s")
    # A record costs a pool check and a statement (4 one-way trips); while the pool grows, a
    # new connection costs ~10 round trips (4 s): the reactor sends its 8 session settings one
    # statement at a time.
    assert judgement.verdict.lateness_max_overall is not None
    assert judgement.verdict.lateness_max_overall < 8.0


@short_and_long(
    ("seconds", "name"), (3.0, "net: +200 ms latency"), (60.0, "net: +200 ms latency (long)")
)
async def test_slow_network(
    scenario: Scenario, proxy: FaultProxy, seconds: float, name: str
) -> None:
    await _slow_network(scenario, proxy, seconds=seconds, name=name)


async def _resets_mid_record(
    scenario: Scenario, proxy: FaultProxy, *, resets: int, name: str
) -> None:
    app = scenario.app(seed=4)
    dsn = with_port(scenario.database_url, proxy.port)
    async with scenario.fleet(dsn, probe_interval=PROBE, probe_timeout=PROBE) as fleet:
        # RST right after a record statement reaches the server: before it runs, while it runs,
        # or after it committed but before the reply (the reactor cannot tell which).
        write = scenario.tables.render("INSERT INTO @runs@ AS r").encode()
        proxy.reset_on(write, times=resets, delay=(0.0, 0.01))
        deadline = time.monotonic() + 20 + resets
        while proxy.resets_fired() < resets and time.monotonic() < deadline:
            await scenario.drive(app, 0.5)
        judgement, took = await scenario.verdict(app)
        errors = fleet.total(lambda reactor: reactor.metrics.record_errors._value.get())
    fired = proxy.resets_fired()
    scenario.conclude(
        name,
        fired,
        judgement,
        recovery=took,
        note=f"RST 0-10 ms after a record statement was sent; {errors:g} record errors",
    )
    assert fired == resets


@pytest.mark.second_mapping
@short_and_long(
    ("resets", "name"),
    (5, "net: RST mid record statement"),
    (60, "net: RST mid record statement (long)"),
)
async def test_reset_in_the_middle_of_record_statements(
    scenario: Scenario, proxy: FaultProxy, resets: int, name: str
) -> None:
    await _resets_mid_record(scenario, proxy, resets=resets, name=name)
