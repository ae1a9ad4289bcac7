"""reactor.settings.pairs: REACTOR_CONFIG names one pair or several, each file its own schema and
settings; every mistake is one line naming the file."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import cast

import pytest
from prometheus_client.exposition import generate_latest

from reactor.cli.served import with_own_secrets
from reactor.errors import ConfigError
from reactor.hooks import check_hooks
from reactor.install import mapping
from reactor.runtime.replica import Replica
from reactor.runtime.service import Reactor
from reactor.settings import pairs
from reactor.settings.config import Settings
from reactor.telemetry import logs
from reactor.telemetry.metrics import Metrics, PairMetrics

SECOND = (Path(__file__).parent.parent / "mappings" / "second.toml").read_text()
ENV = Settings.from_env({"REACTOR_GRACE_SECONDS": "30", "REACTOR_HOOK_TIMEOUT_SECONDS": "60"})


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def config(*paths: str) -> dict[str, str]:
    return {"REACTOR_CONFIG": ":".join(paths)}


def owned(environ: dict[str, str], settings: Settings) -> tuple[pairs.Pair, ...]:
    """The pairs of ``environ``, each with the webhook secrets its own hooks read, as every
    command is given them (reactor.hooks.secrets decides which)."""
    return with_own_secrets(pairs.from_env(environ, settings), settings)


@pytest.fixture
def two(tmp_path: Path) -> dict[str, str]:
    reference = write(tmp_path, "analysis.toml", 'reactor_schema = "reactor"\n')
    second = write(
        tmp_path,
        "reports.toml",
        'reactor_schema = "reactor_reports"\n'
        + SECOND
        + '\n[reactor]\ngrace = 5\nhooks = "judge=tests.hookmods:judge"\n',
    )
    return config(reference, second)


def test_no_file_is_the_reference_pair() -> None:
    for environ in ({}, {"REACTOR_CONFIG": " : "}):
        (pair,) = pairs.from_env(environ, ENV)
        assert pair.mapping is mapping.REFERENCE
        assert (pair.name, pair.channel, pair.settings) == (
            "reactor",
            "analysis_jobs_terminal",
            ENV,
        )


def test_one_file_keeps_its_meaning(tmp_path: Path) -> None:
    (pair,) = pairs.from_env(config(write(tmp_path, "second.toml", SECOND)), ENV)
    assert pair.name == "reactor"
    assert pair.mapping.jobs.table == ("app", "Job")
    # The reference's channel name stays the reference's: the app's tables get their own.
    assert pair.channel == "reactor_jobs_terminal"
    channel = Settings.from_env({"REACTOR_CHANNEL": "mine"})
    (pair,) = pairs.from_env(config(write(tmp_path, "second.toml", SECOND)), channel)
    assert pair.channel == "mine"


def test_several_files_are_several_pairs_each_with_its_own_settings(
    two: dict[str, str],
) -> None:
    reference, reports = pairs.from_env(two, ENV)
    assert (reference.name, reports.name) == ("reactor", "reactor_reports")
    assert (reference.channel, reports.channel) == (
        "analysis_jobs_terminal",
        "reactor_reports_jobs_terminal",
    )
    # The file's [reactor] table changes its own pair; the environment gives the rest.
    assert (reference.settings.grace, reports.settings.grace) == (30.0, 5.0)
    assert (reference.settings.hooks, reports.settings.hooks) == ("", "judge=tests.hookmods:judge")
    assert reports.settings.hook_timeout == 60.0
    assert reference.settings == ENV
    assert pairs.named((reference, reports), "reactor_reports") is reports


@pytest.mark.parametrize(
    ("files", "settings", "flags", "says"),
    [
        (("", 'reactor_schema = "b"\n'), ENV, (), "each names its own reactor_schema"),
        (('reactor_schema = "b"\n', 'reactor_schema = "b"\n'), ENV, (), "is also"),
        (
            (
                'reactor_schema = "a"\n[reactor]\nchannel = "c"\n',
                'reactor_schema = "b"\n[reactor]\nchannel = "c"\n',
            ),
            ENV,
            (),
            "channel 'c' is also",
        ),
        (
            ('reactor_schema = "a"\n', 'reactor_schema = "b"\n'),
            ENV,
            (),
            "each pair writes an artifact table of its own",
        ),
        (
            ('reactor_schema = "a"\n', 'reactor_schema = "b"\n'),
            Settings.from_env({"REACTOR_CHANNEL": "c"}),
            (),
            "REACTOR_CHANNEL (or --channel) names one channel",
        ),
        (
            ('reactor_schema = "a"\n[reactor]\nmode = "poll"\n',),
            ENV,
            (),
            "unknown key [reactor] mode",
        ),
        (('reactor_schema = "a"\n[reactor]\ngrace = "soon"\n',), ENV, (), "[reactor] grace='soon'"),
        (('reactor_schema = "a"\n[reactor]\ngrace = true\n',), ENV, (), "a string or a number"),
        (('reactor_schema = "a"\nreactor = 1\n',), ENV, (), "reactor must be a table"),
        (("[reactor]\ngrace = 3\n",), ENV, ("grace",), "--grace is given"),
    ],
    ids=[
        "no schema",
        "same schema",
        "same channel",
        "same runs table",
        "one channel for all",
        "not a pair's setting",
        "bad value",
        "wrong type",
        "not a table",
        "flag and file",
    ],
)
def test_mistakes_name_the_file(
    tmp_path: Path,
    files: tuple[str, ...],
    settings: Settings,
    flags: tuple[str, ...],
    says: str,
) -> None:
    paths = [write(tmp_path, f"pair{n}.toml", text) for n, text in enumerate(files)]
    with pytest.raises(ConfigError) as raised:
        pairs.from_env(config(*paths), settings, frozenset(flags))
    assert says in str(raised.value)
    if "REACTOR_CHANNEL" not in says and "--grace" not in says:
        assert ".toml" in str(raised.value)


def test_each_pair_gets_the_secrets_of_its_own_webhooks(tmp_path: Path) -> None:
    analysis = write(tmp_path, "analysis.toml", 'reactor_schema = "reactor"\n')
    reports = write(
        tmp_path,
        "reports.toml",
        'reactor_schema = "reactor_reports"\n'
        + SECOND
        + '\n[reactor]\nhooks = "judge=webhook:https://judge.internal/reports"\n',
    )
    signed = Settings.from_env({"REACTOR_WEBHOOK_SECRET_JUDGE": "s" * 32})
    reference, second = owned(config(analysis, reports), signed)
    assert reference.settings.webhook_secrets == {}
    assert second.settings.webhook_secrets == {"REACTOR_WEBHOOK_SECRET_JUDGE": "s" * 32}
    check_hooks(reference.settings)
    check_hooks(second.settings)
    unused = Settings.from_env({"REACTOR_WEBHOOK_SECRET_JUGDE": "s" * 32})
    with pytest.raises(ConfigError, match="REACTOR_WEBHOOK_SECRET_JUGDE is set, but no webhook"):
        owned(config(analysis, reports), unused)


def both_name_ops(tmp_path: Path) -> dict[str, str]:
    """Two pairs, the second's file naming a webhook hook like the first's."""
    analysis = write(
        tmp_path,
        "analysis.toml",
        'reactor_schema = "reactor"\n[reactor]\nhooks = "ops=webhook:https://ops.internal/a"\n',
    )
    reports = write(
        tmp_path,
        "reports.toml",
        'reactor_schema = "reactor_reports"\n'
        + SECOND
        + '\n[reactor]\nhooks = "ops=webhook:https://elsewhere.example/b"\n',
    )
    return config(analysis, reports)


def test_a_pairs_file_naming_a_hook_like_anothers_is_not_handed_its_secret(
    tmp_path: Path,
) -> None:
    two = both_name_ops(tmp_path)
    for environ in (
        {"REACTOR_WEBHOOK_SECRET_OPS": "a" * 32},
        {"REACTOR_WEBHOOK_SECRET": "a" * 32},
        {"REACTOR_WEBHOOK_SECRET_OPS": "a" * 32, "REACTOR_WEBHOOK_SECRET_REACTOR_OPS": "b" * 32},
    ):
        with pytest.raises(ConfigError) as refused:
            owned(two, Settings.from_env(environ))
        message = str(refused.value)
        assert "pairs reactor and reactor_reports both have" in message
        assert "REACTOR_WEBHOOK_SECRET_<PAIR>_<HOOK>" in message
        assert "a" * 32 not in message
    own = Settings.from_env(
        {
            "REACTOR_WEBHOOK_SECRET_REACTOR_OPS": "a" * 32,
            "REACTOR_WEBHOOK_SECRET_REACTOR_REPORTS_OPS": "b" * 32,
        }
    )
    analysis, reports = owned(two, own)
    # Each pair's settings hold its own webhook's secret, and no other.
    assert analysis.settings.webhook_secrets == {"REACTOR_WEBHOOK_SECRET_OPS": "a" * 32}
    assert reports.settings.webhook_secrets == {"REACTOR_WEBHOOK_SECRET_OPS": "b" * 32}
    assert analysis.settings.webhook_secret is None
    assert reports.settings.webhook_secret is None
    check_hooks(analysis.settings)
    check_hooks(reports.settings)


def test_one_pair_reads_the_names_it_always_did_and_its_own(tmp_path: Path) -> None:
    one = write(
        tmp_path,
        "one.toml",
        'reactor_schema = "reactor_reports"\n'
        + SECOND
        + '\n[reactor]\nhooks = "ops=webhook:https://o/x,judge=webhook:https://j/x,'
        + 'audit=webhook:https://a/x"\n',
    )
    environ = {
        "REACTOR_WEBHOOK_SECRET": "s" * 32,
        "REACTOR_WEBHOOK_SECRET_JUDGE": "j" * 32,
        "REACTOR_WEBHOOK_SECRET_REACTOR_REPORTS_OPS": "o" * 32,
    }
    (pair,) = owned(config(one), Settings.from_env(environ))
    assert pair.settings.webhook_secrets == {
        "REACTOR_WEBHOOK_SECRET_OPS": "o" * 32,
        "REACTOR_WEBHOOK_SECRET_JUDGE": "j" * 32,
    }
    assert pair.settings.webhook_secret == "s" * 32  # audit's
    (reference,) = owned({}, Settings.from_env({"REACTOR_WEBHOOK_SECRET": "s" * 32}))
    assert reference.settings.webhook_secret is None  # no webhook reads it


def test_a_command_on_one_pair_of_several_is_told_which(two: dict[str, str]) -> None:
    served = pairs.from_env(two, ENV)
    with pytest.raises(ConfigError, match=re.escape("--pair reactor | reactor_reports")):
        pairs.named(served, None)
    with pytest.raises(ConfigError, match="no such pair"):
        pairs.named(served, "reactor_nope")


def test_every_pair_metric_carries_its_pair_and_the_process_counts_its_own_once() -> None:
    first, second = Metrics(), Metrics()
    first.recorded_by["timer"].inc(3)
    second.recorded_by["scan"].inc(2)
    merged = PairMetrics({"analysis": first, "reports": second})
    merged.http_dropped.labels("probes", "limit").inc()
    text = generate_latest(merged.registry).decode()
    assert 'reactor_runs_recorded_total{pair="analysis",source="timer"} 3.0' in text
    assert 'reactor_runs_recorded_total{pair="reports",source="scan"} 2.0' in text
    # One family per name, whichever pair it came from.
    assert text.count("# TYPE reactor_runs_recorded_total counter") == 1
    dropped = [
        line
        for line in text.splitlines()
        if line.startswith("reactor_http_connections_dropped_total")
    ]
    assert 'reactor_http_connections_dropped_total{reason="limit",server="probes"} 1.0' in dropped
    assert not any("pair=" in line for line in dropped)


def test_a_pairs_lines_name_it() -> None:
    record = logging.makeLogRecord({"msg": "recorded", "job_id": "1"})
    assert logs.fields_of(record) == {"job_id": "1"}
    token = logs.PAIR.set("reports")
    try:
        assert logs.fields_of(record) == {"job_id": "1", "pair": "reports"}
    finally:
        logs.PAIR.reset(token)


class _Pair:
    """What Replica reads of a pair's reactor to judge the whole: its health and metrics."""

    def __init__(self, alive: bool, ready: bool, reason: str) -> None:
        self.answer = (alive, ready, reason)
        self.metrics = Metrics()
        self.stopping = False

    def health(self) -> tuple[bool, bool, str]:
        return self.answer


def replica(broken: dict[str, str] | None = None, **pairs: _Pair) -> Replica:
    made = Replica(Settings(mode="poll"), broken=broken)
    made.reactors = cast(dict[str, Reactor], pairs)
    return made


def test_the_replica_is_ready_only_while_every_pair_is() -> None:
    ok = _Pair(True, True, "ok")
    assert replica(a=ok, b=ok).health() == (True, True, "ok")
    waiting = _Pair(True, False, "LISTEN connection not up yet; polling")
    assert replica(a=ok, b=waiting).health() == (
        True,
        False,
        "pair b: LISTEN connection not up yet; polling",
    )
    # A wedged pair is worse than one not ready, whichever comes first.
    wedged = _Pair(False, False, "stopping")
    assert replica(a=waiting, b=wedged).health() == (False, False, "pair b: stopping")
    # A pair left out at start is never ready.
    assert replica({"c": "table app.Gone not found"}, a=ok).health() == (
        True,
        False,
        "pair c: not served: table app.Gone not found",
    )


def test_a_replica_of_one_pair_is_that_pair() -> None:
    only = _Pair(True, False, "starting")
    one = replica(a=only)
    assert one.only is cast(Reactor, only)
    assert one.health() == (True, False, "starting")
    assert one.metrics is only.metrics
    assert isinstance(replica(a=only, b=only).metrics, PairMetrics)
