"""reactor.listen.listener: payloads become canonical job ids, or nothing; the LISTEN statement."""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any, cast
from unittest.mock import MagicMock

import anyio
import psycopg.sql
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reactor import db
from reactor.core.clock import FakeClock
from reactor.core.ownership import share_of
from reactor.core.payload import parse_hint, parse_payload
from reactor.errors import ConfigError
from reactor.install import Install, mapping
from reactor.listen.listener import Listener
from reactor.listen.session import Probe
from reactor.listen.subscriber import Subscriber
from reactor.settings.config import Settings
from reactor.telemetry.metrics import Metrics
from tests.hearing import Heard

JOB = "5f0c6a2e-1b7d-4c3e-9a8f-0123456789ab"
CANONICAL = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


# -- parse_payload -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        JOB,
        JOB.upper(),
        "5F0C6A2E-1b7d-4C3E-9a8f-0123456789AB",
        f" {JOB}",
        f"{JOB}\n",
        f"\t {JOB.upper()} \r\n",
    ],
)
def test_accepts_a_uuid_and_returns_it_canonical(payload: str) -> None:
    assert parse_payload(payload, "uuid") == JOB


@pytest.mark.parametrize(
    "payload",
    [
        "",
        " ",
        "null",
        "None",
        "0",
        "12345",
        '{"id": 1}',
        f'{{"id": "{JOB}"}}',
        "x" * 8000,
        f"{JOB} extra",
        f"{JOB}x",
        f"x{JOB}",
        f"job {JOB}",
        f"{JOB},{JOB}",
        f"{JOB} {JOB}",
        JOB + JOB,
        JOB[:-1],  # one digit short
        JOB[:-1] + "g",  # not hex
        "probe:60e0ec73065a4a7b8cb9c61f90017bf2",
        f"probe:{JOB}",
        f"probe:{JOB.replace('-', '')}",
        JOB + " " * 8000,  # padding beyond any sane payload
        "\x00" * 36,
        f"{{{JOB}}}",  # braces: uuid.UUID takes them, the trigger never sends them
        f"urn:uuid:{JOB}",
        JOB.replace("-", ""),  # no dashes
        "\u0661" * 32,  # non-ASCII digits
    ],
)
def test_rejects_anything_else(payload: str) -> None:
    assert parse_payload(payload, "uuid") is None


@given(st.text())
@settings(max_examples=500, deadline=None, database=None)
def test_arbitrary_text_never_raises(payload: str) -> None:
    result = parse_payload(payload, "uuid")
    assert result is None or CANONICAL.fullmatch(result)


@given(st.binary(max_size=100))
@settings(max_examples=200, deadline=None, database=None)
def test_arbitrary_decoded_bytes_never_raise(raw: bytes) -> None:
    result = parse_payload(raw.decode("utf-8", errors="replace"), "uuid")
    assert result is None or CANONICAL.fullmatch(result)


@given(
    job=st.uuids(),
    upper=st.booleans(),
    before=st.text(alphabet=" \t\r\n", max_size=4),
    after=st.text(alphabet=" \t\r\n", max_size=4),
)
@settings(max_examples=300, deadline=None, database=None)
def test_any_uuid_round_trips(job: uuid.UUID, upper: bool, before: str, after: str) -> None:
    text = str(job).upper() if upper else str(job)
    assert parse_payload(before + text + after, "uuid") == str(job)


@given(job=st.uuids(), junk=st.text(alphabet="abcdefghijklmnopqrstuvwxyz:;,0123456789", min_size=1))
@settings(max_examples=300, deadline=None, database=None)
def test_uuid_glued_to_other_text_is_rejected(job: uuid.UUID, junk: str) -> None:
    assert parse_payload(f"{job}{junk}", "uuid") is None
    assert parse_payload(f"{junk}:{job}", "uuid") is None


# -- hints: the job id and its updated_at -------------------------------------------------------


@pytest.mark.parametrize(
    ("id_type", "low", "high"),
    [
        ("bigint", -(2**63), 2**63 - 1),
        ("integer", -(2**31), 2**31 - 1),
        ("smallint", -(2**15), 2**15 - 1),
    ],
)
def test_an_integer_id_is_taken_only_within_its_columns_range(
    id_type: str, low: int, high: int
) -> None:
    for inside in (low, -1, 0, 7, high):
        assert parse_payload(str(inside), id_type) == str(inside)
    for outside in (low - 1, high + 1, 9_999_999_999_999_999_999):
        assert parse_payload(str(outside), id_type) is None
    assert parse_hint(f"{high + 1}@1700000000.5", id_type) is None


def test_a_hint_carries_the_jobs_updated_at() -> None:
    assert parse_hint(f"{JOB}@1733030400.123456", "uuid") == (JOB, 1733030400.123456)
    assert parse_hint(f"{JOB}@1733030400", "uuid") == (JOB, 1733030400.0)
    assert parse_hint(JOB, "uuid") == (JOB, None)


@pytest.mark.parametrize(
    "tail",
    ["@", "@-1", "@1e9", "@nan", "@inf", "@1.2.3", "@ 12", "@12@13", "@0x10", "@\uff11\uff12"],
)
def test_a_hint_with_a_bad_time_names_no_job(tail: str) -> None:
    assert parse_hint(JOB + tail, "uuid") is None


def test_garbage_is_no_hint() -> None:
    assert parse_hint("garbage@123", "uuid") is None
    assert parse_hint("", "uuid") is None


# -- what the listener does with payloads ---------------------------------------------------------


def make_subscriber(channel: str, jobs: list[str]) -> Subscriber:
    install = Install.of(mapping.REFERENCE, channel)
    database = db.Database(install, cast(Any, MagicMock()))
    heard = Heard(database)
    # The jobs the pair is handed are the test's.
    heard.jobs = jobs
    return Subscriber(database, Metrics(), heard.verifier, heard)


def probing(listener: Listener) -> str:
    """Connect the listener's session, LISTEN, and return the token of the probe it sends."""
    session = listener.session
    session.tick(0.0)
    [_change] = session.connected(0.0)
    probe = session.changed(0.0)[-1]
    assert isinstance(probe, Probe)
    session.probe_sent(probe.token, 0.0, went=True)
    return probe.token


def make_listener(channel: str = "analysis_jobs_terminal") -> tuple[Listener, list[str]]:
    jobs: list[str] = []
    settings = Settings.from_env({"REACTOR_CHANNEL": channel})
    subscriber = make_subscriber(channel, jobs)
    listener = Listener(settings, clock=FakeClock(), dsn="host=unused", subscribers=[subscriber])
    return listener, jobs


def test_each_pairs_notifications_go_to_that_pair() -> None:
    first: list[str] = []
    second: list[str] = []
    one, two = make_subscriber("first_done", first), make_subscriber("second_done", second)
    listener = Listener(
        Settings.from_env({}), clock=FakeClock(), dsn="host=unused", subscribers=[one, two]
    )
    other = str(uuid.uuid4())
    listener._receive(JOB, "first_done")
    listener._receive(other, two.share_channels[share_of(other)])
    listener._receive(str(uuid.uuid4()), "nobody_done")
    assert (first, second) == ([JOB], [other])
    # A probe proves the one session, whichever pair's channel it came on.
    token = probing(listener)
    listener._receive(f"probe:{token}", "second_done")
    assert listener.proven
    listener.unsubscribe(two)
    listener._receive(str(uuid.uuid4()), "second_done")
    assert second == [other]


def test_two_pairs_on_one_channel_are_refused() -> None:
    listener, _ = make_listener("same")
    with pytest.raises(ConfigError):
        listener.subscribe(make_subscriber("same", []))


def test_receive_hands_canonical_ids_to_the_pair() -> None:
    listener, jobs = make_listener()
    listener._receive(f" {JOB.upper()} ")
    listener._receive("garbage")
    listener._receive('{"id": 1}')
    assert jobs == [JOB]


def test_receive_never_hands_a_probe_to_the_pair() -> None:
    listener, jobs = make_listener()
    token = probing(listener)
    listener._receive("probe:other")
    assert not listener.proven
    listener._receive(f"probe:{token}")
    assert listener.proven
    assert listener.session.probe_token is None
    assert listener.state == "listening"
    assert jobs == []


# -- the LISTEN statement ------------------------------------------------------------------------

# PostgreSQL keywords LISTEN cannot take as a bare name (a syntax error unless quoted).
_RESERVED = {"select", "order", "user", "table", "from", "where", "all", "group", "limit"}


class _Stop(Exception):
    """Ends the listener's loop from inside the fake connection."""


class _FakeConnection:
    def __init__(self) -> None:
        self.statements: list[str] = []

    async def __aenter__(self) -> _FakeConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def close(self) -> None:
        return None

    async def execute(self, statement: object, params: object = None) -> None:
        if isinstance(statement, psycopg.sql.Composable):
            statement = statement.as_string(None)
        self.statements.append(str(statement))
        raise _Stop


def listened(monkeypatch: pytest.MonkeyPatch, channel: str) -> set[str | None]:
    """The channels the first statement on a new connection LISTENs on."""
    return {channel_listened_to(one) for one in listen_statement(monkeypatch, channel).split("; ")}


def listen_statement(monkeypatch: pytest.MonkeyPatch, channel: str) -> str:
    listener, _ = make_listener(channel)
    conn = _FakeConnection()

    async def connect(dsn: str, role: str, **kwargs: object) -> _FakeConnection:
        return conn

    monkeypatch.setattr(db, "connect", connect)
    with pytest.raises(_Stop):
        anyio.run(listener.run)
    assert len(conn.statements) == 1
    return conn.statements[0]


def channel_listened_to(statement: str) -> str | None:
    """The channel PostgreSQL would listen on for ``statement``, or None for a syntax error."""
    match = re.fullmatch(r'\s*LISTEN\s+("(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)\s*;?\s*', statement)
    if match is None:
        return None
    name = match.group(1)
    if name.startswith('"'):
        return name[1:-1].replace('""', '"')
    if name.lower() in _RESERVED:
        return None
    return name.lower()  # PostgreSQL folds unquoted identifiers to lower case


def test_listen_names_the_default_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    # The jobs' channel, and the membership channel of the reactor's schema.
    assert listened(monkeypatch, "analysis_jobs_terminal") == {
        "analysis_jobs_terminal",
        "reactor_replicas",
    }


@pytest.mark.parametrize("channel", ["AnalysisDone", "select"])
def test_listen_names_exactly_the_channel_pg_notify_uses(
    monkeypatch: pytest.MonkeyPatch, channel: str
) -> None:
    try:
        Settings.from_env({"REACTOR_CHANNEL": channel})
    except ConfigError:
        return  # refusing such a channel up front would be a fix too
    assert listened(monkeypatch, channel) == {channel, "reactor_replicas"}


def test_garbage_is_counted_and_logged_at_most_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    listener, jobs = make_listener()
    caplog.set_level(logging.WARNING, logger="reactor.listen.subscriber")
    for n in range(20_000):
        listener._receive(f"garbage-{n}")
    subscriber = listener.subscribers[0]
    assert subscriber.metrics.notified["rejected"]._value.get() == 20_000
    lines = [r for r in caplog.records if r.name == "reactor.listen.subscriber"]
    assert len(lines) == 1, "the first at once, the rest counted"
    # The health check reports what is left once the interval passed; the clock did not move.
    subscriber.report(listener.clock.now())
    assert len([r for r in caplog.records if r.name == "reactor.listen.subscriber"]) == 1
    subscriber.report(listener.clock.now() + 10.0)
    lines = [r for r in caplog.records if r.name == "reactor.listen.subscriber"]
    assert [cast(Any, r).count for r in lines] == [1, 19_999]
    assert jobs == []
