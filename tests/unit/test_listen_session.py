"""reactor.listen.session: the LISTEN session's states, on a fake clock (times passed in)."""

from __future__ import annotations

import itertools

import pytest

from reactor.listen import session as ls
from reactor.listen.session import PROBE_LOST, Session

INTERVAL = 5.0
TIMEOUT = 2.0
MAIN = frozenset({"jobs", "reactor_replicas"})
SHARES = frozenset({"jobs.1", "jobs.7"})


def make_session() -> Session:
    tokens = (f"t{n}" for n in itertools.count())
    session = Session(
        probe_interval=INTERVAL, probe_timeout=TIMEOUT, rand=lambda: 0.5, token=lambda: next(tokens)
    )
    session.want(MAIN, SHARES)
    return session


def only(actions: list[ls.Action], kind: type) -> list[ls.Action]:
    return [action for action in actions if isinstance(action, kind)]


def listening(session: Session, now: float = 0.0) -> str:
    """Connect and LISTEN on the main channels; the token of the first probe."""
    assert session.tick(now) == [ls.Connect()]
    assert session.connected(now) == [ls.Change(tuple(sorted(MAIN)), ())]
    actions = session.changed(now)
    assert actions[0] == ls.Rearm(MAIN), "what was notified before LISTEN is read after it"
    [probe] = only(actions, ls.Probe)
    assert isinstance(probe, ls.Probe)
    session.probe_sent(probe.token, now, went=True)
    return probe.token


def proven(session: Session, now: float = 0.0, token: str | None = None) -> None:
    token = token or listening(session, now)
    actions = session.probe_heard(token)
    assert session.phase == "proven"
    assert actions[0] == ls.Configure()
    assert only(actions, ls.Change) == [ls.Change(tuple(sorted(SHARES)), ())]
    assert session.changed(now) == [ls.Rearm(SHARES)]
    assert session.on == MAIN | SHARES


def test_a_failed_connect_backs_off_and_says_each_problem_once() -> None:
    session = make_session()
    assert session.tick(0.0) == [ls.Connect()]
    assert session.tick(0.0) == [], "one attempt at a time"
    [report] = session.connect_failed(0.0, "password authentication failed", permanent=False)
    assert report == ls.Report(
        "listener cannot connect; polling meanwhile", "password authentication failed", True
    )
    first_retry = session.retry_at
    assert first_retry > 0.0
    assert session.wake_at() == first_retry
    assert session.tick(first_retry - 0.001) == []
    assert session.tick(first_retry) == [ls.Connect()]
    [again] = session.connect_failed(first_retry, "password authentication failed", permanent=False)
    assert isinstance(again, ls.Report)
    assert not again.news
    assert session.retry_at - first_retry > first_retry, "the pause grows with each failure"


def pause_after(failures: int, *, permanent: bool) -> float:
    session = make_session()
    now = 0.0
    for _ in range(failures):
        assert session.tick(now) == [ls.Connect()]
        session.connect_failed(now, "refused", permanent=permanent)
        now, pause = session.retry_at, session.retry_at - now
    return pause


def test_a_permanent_problem_is_retried_rarely() -> None:
    assert pause_after(10, permanent=False) <= 5.0
    assert pause_after(10, permanent=True) > 20.0


def test_listen_is_established_then_proven_by_a_probe_from_another_session() -> None:
    session = make_session()
    token = listening(session)
    assert session.phase == "listening"
    assert not session.proven
    assert session.on == MAIN, "the shares' channels wait for the proof"
    assert session.probe_heard("someone-elses") == []
    assert not session.proven
    proven(session, token=token)
    assert session.failures == 0
    assert session.probe_heard(token) == [], "a probe heard twice changes nothing"


def test_a_probe_that_never_comes_back_degrades_and_pings_the_session() -> None:
    session = make_session()
    listening(session)
    assert session.wake_at() == TIMEOUT
    assert session.tick(TIMEOUT - 0.01) == []
    actions = session.tick(TIMEOUT)
    assert session.phase == "degraded"
    assert isinstance(actions[0], ls.Report)
    assert actions[0].alarm
    assert actions[-1] == ls.Ping()
    # The next probe one interval after the last.
    assert session.tick(INTERVAL - 0.01) == []
    [probe] = session.tick(INTERVAL)
    assert isinstance(probe, ls.Probe)
    session.probe_sent(probe.token, INTERVAL, went=True)
    actions = session.probe_heard(probe.token)
    assert session.proven
    assert ls.Report("listener is back", None) in actions


def test_a_proven_session_whose_probe_is_lost_is_closed_and_reconnected() -> None:
    session = make_session()
    proven(session)
    token = session.probe_for_check()
    assert token is not None
    assert session.probe_for_check() is None, "one probe out at a time"
    session.probe_sent(token, 10.0, went=True)
    assert session.wake_at() == 10.0 + INTERVAL
    assert session.tick(10.0 + INTERVAL - 0.01) == []
    actions = session.tick(10.0 + INTERVAL)
    assert actions[0] == ls.Close(PROBE_LOST)
    assert session.phase == "waiting"
    assert session.on == frozenset()
    assert session.tick(session.retry_at) == [ls.Connect()]


def test_any_notification_proves_delivery_as_well_as_a_probe() -> None:
    session = make_session()
    proven(session)
    token = session.probe_for_check()
    assert token is not None
    session.probe_sent(token, 10.0, went=True)
    session.heard()
    assert session.tick(100.0) == []
    assert session.proven
    # Every check carries one: what arrived before it proves nothing about after it.
    session.heard()
    token = session.probe_for_check()
    assert token is not None
    session.probe_sent(token, 100.0, went=True)
    assert session.tick(100.0 + INTERVAL)[0] == ls.Close(PROBE_LOST)


def test_a_check_that_could_not_carry_the_probe_pings_the_session() -> None:
    session = make_session()
    proven(session)
    token = session.probe_for_check()
    assert token is not None
    assert session.probe_sent(token, 10.0, went=False) == [ls.Ping()]
    assert session.tick(100.0) == [], "not waited for"


def test_channels_change_while_connected_one_round_trip_at_a_time() -> None:
    session = make_session()
    proven(session)
    # A second pair subscribes, and the first loses a share meanwhile.
    [change] = session.want(MAIN | {"other"}, SHARES)
    assert change == ls.Change(("other",), ())
    assert session.want(MAIN | {"other"}, frozenset({"jobs.1"})) == [], "after the one in flight"
    actions = session.changed(1.0)
    assert actions == [ls.Rearm(frozenset({"other"})), ls.Change((), ("jobs.7",))]
    assert session.changed(1.0) == []
    assert session.on == MAIN | {"other", "jobs.1"}
    # The pair leaves.
    assert session.want(MAIN, frozenset({"jobs.1"})) == [ls.Change((), ("other",))]
    session.changed(2.0)
    assert session.on == MAIN | {"jobs.1"}


def test_channels_wanted_while_down_are_listened_on_at_connect() -> None:
    session = make_session()
    assert session.want(MAIN | {"other"}, SHARES) == []
    session.tick(0.0)
    [change] = session.connected(0.0)
    assert change == ls.Change(tuple(sorted(MAIN | {"other"})), ())


@pytest.mark.parametrize("where", ["listen", "changing", "proven"])
def test_a_lost_session_starts_over(where: str) -> None:
    session = make_session()
    if where == "listen":
        session.tick(0.0)
        session.connected(0.0)
    elif where == "changing":
        proven(session)
        session.want(MAIN | {"other"}, SHARES)
    else:
        proven(session)
    actions = session.lost(3.0, "server closed the connection unexpectedly")
    assert actions[0] == ls.Close("server closed the connection unexpectedly")
    assert session.phase == "waiting"
    assert not session.proven
    assert session.tick(session.retry_at) == [ls.Connect()]
    [change] = session.connected(session.retry_at)
    assert isinstance(change, ls.Change)
    assert frozenset(change.listen) == session.wanted()
