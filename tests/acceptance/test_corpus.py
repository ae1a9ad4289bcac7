"""Each schema of tests/apps/ from ``reactor init`` to the reactor recording its runs, with no
hand edit of the draft beyond ``--terminal``, judged by DESIGN.md's invariants.

As a newcomer would: the draft written by ``init -o``, ``migrate`` as the owner, the runtime
role from ``init --role`` applied as the superuser, ``reactor run`` as that role with a hook.
The app then plays what its code does (reactor.app.App on the drafted mapping, so one app
serves every schema): jobs the worker finishes, some saved by the client's upsert, some that
need no run (no documents, deleted, still running, and where the mapping judges by verdicts,
failed without any). The audit of every write to the artifact table says the rest.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import psycopg
import psycopg.conninfo
import pytest

from reactor import audit, db
from reactor.app import DOCUMENT, App
from reactor.db.fit import fit
from reactor.install import mapping_file, sql
from reactor.install.mapping import Mapping
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.acceptance.test_init import CORPUS
from tests.acceptance.test_init import App as Schema
from tests.conftest import FAULT_ROW
from tests.faults.support import Judgement, Replicas, judge, report_cells, unhooked
from tests.polling import wait_for

GRACE = 0.5
ROLE = "reactor_rt"
HOOK = "judge"
# How many jobs of each kind the app finishes.
RECORDED = 4  # the worker's alone: the reactor writes their runs
SAVED = 3  # the client saves them inside the grace


@dataclass(frozen=True)
class Played:
    """What the app did: the runs the reactor owes and the ones the client saved."""

    recorded: int
    saved: int


def _drafted(url: str, schema: Schema, path: Path) -> None:
    result = run_reactor(
        "init",
        "--jobs",
        schema.jobs,
        "--runs",
        schema.runs,
        "--terminal",
        schema.terminal,
        "-o",
        str(path),
        env=reactor_env(url),
    )
    assert result.returncode == 0, result.stderr
    config = reactor_env(url, REACTOR_CONFIG=str(path))
    migrated = run_reactor("migrate", env=config)
    assert migrated.returncode == 0, migrated.stderr
    role = run_reactor("init", "--role", ROLE, env=config)
    assert role.returncode == 0, role.stderr
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(role.stdout)


def _audited(url: str, path: Path) -> App:
    """The drafted mapping typed from the catalog, with the audit of its artifact table
    installed as the superuser and writable by the runtime role (the trigger runs as whoever
    writes); the app that writes its tables."""

    async def typed() -> tuple[Mapping, App]:
        async with await db.connect(url, "test") as conn:
            drafted = await fit(conn, mapping_file.load(str(path)))
            return drafted, await App.fit(conn, drafted)

    drafted, app = anyio.run(typed, backend="asyncio")
    table = sql.render("@audit@", drafted)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(audit.ddl(drafted))
        (sequence,) = conn.execute(
            "SELECT pg_get_serial_sequence(%s, 'seq')", (table,)
        ).fetchone() or (None,)
        assert sequence is not None, table
        conn.execute(f"GRANT INSERT ON {table} TO {ROLE}")
        conn.execute(f"GRANT USAGE ON SEQUENCE {sequence} TO {ROLE}")
    return app


def _play(url: str, app: App) -> Played:
    """The app's work, in the order an app does it; returns what the reactor owes."""
    jobs = app.mapping.jobs
    # A document every column of the job's documents takes: text, or json where one is json.
    json_documents = any(jobs.type_of(column) in ("json", "jsonb") for column in app.documents)
    document = '{"doc": "<p>doc</p>"}' if json_documents else DOCUMENT
    with psycopg.connect(url, autocommit=True) as conn:

        def create(count: int, **options: Any) -> list[Any]:
            options.setdefault("document", document)
            return [row[0] for row in conn.execute(*app.create(count=count, **options))]

        recorded = create(RECORDED)
        conn.execute(*app.finish(*recorded[:-1]))
        conn.execute(*app.finish(recorded[-1], failed=True))
        saved = create(SAVED)
        conn.execute(*app.finish(*saved))
        conn.execute(*app.tab_save(*saved))
        # Jobs that need no run.
        create(1)  # still running
        if app.documents:
            conn.execute(*app.finish(*create(1, document=None)))
        if app.verdicts:
            conn.execute(*app.finish(*create(1), failed=True, verdicts=None))
        gone = create(2)
        # Finished and removed at once, as a cancel would: no run is ever due for them.
        with conn.transaction():
            conn.execute(*app.finish(*gone))
            if jobs.deleted_at is None:
                conn.execute(*app.delete(*gone))
            else:
                conn.execute(*app.soft_delete(gone[0]))
                conn.execute(*app.delete(gone[1]))
        if not app.mapping.one_to_one:
            # A re-analysis: a later job of a run already recorded, whose row must become the
            # newer job's (stale counts it otherwise).
            (run,) = conn.execute(*app.run_of(recorded[0])).fetchone() or ()
            again = create(1, runs=[run])
            conn.execute(*app.finish(*again))
    return Played(RECORDED, SAVED)


def _settled(url: str, app: App) -> Judgement:
    """The judgement once the reactor has recorded every run it owes (bounded)."""

    def owed() -> bool:
        with psycopg.connect(url, autocommit=True) as conn:
            (left,) = conn.execute(*app.unsettled()).fetchone() or (None,)
        return bool(left == 0)

    wait_for(owed, 30, "every run recorded")

    async def judged() -> Judgement:
        return await judge(url, GRACE, app.mapping)

    return anyio.run(judged, backend="asyncio")


def _first_artifact(url: str, app: App) -> float:
    """When the reactor wrote its first artifact row, by the database clock (epoch seconds)."""
    query = sql.render(
        "SELECT extract(epoch FROM min(at))::float8 FROM @audit@ WHERE saved_by = @worker@",
        app.mapping,
    )
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    (first,) = row or (None,)
    assert first is not None
    return float(first)


@pytest.mark.parametrize("schema", CORPUS, ids=[schema.name for schema in CORPUS])
def test_the_draft_records_every_run_the_app_leaves(
    empty_database_url: str, schema: Schema, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = empty_database_url
    schema.load(url)
    path = tmp_path / "reactor.toml"
    began = time.time()
    _drafted(url, schema, path)
    app = _audited(url, path)
    as_role = psycopg.conninfo.make_conninfo(url, user=ROLE)
    env = reactor_env(
        as_role,
        REACTOR_CONFIG=str(path),
        REACTOR_GRACE_SECONDS=str(GRACE),
        REACTOR_HOOKS=f"{HOOK}=python:tests.hookmods:count",
        REACTOR_DRAIN_SECONDS="5",
    )
    replicas = Replicas(tmp_path)
    try:
        reactor = replicas.start(env, "reactor")
        with psycopg.connect(url, autocommit=True) as conn:
            wait_for(
                lambda: (
                    not reactor.alive()
                    or conn.execute(
                        "SELECT 1 FROM pg_stat_activity WHERE usename = %s "
                        "AND application_name = 'reactor-listener'",
                        (ROLE,),
                    ).fetchone()
                ),
                30,
                "reactor listening",
            )
        assert reactor.alive(), reactor.log.read_text()
        listening = time.time() - began
        played = _play(url, app)
        try:
            judgement = _settled(url, app)
        except AssertionError as error:
            raise AssertionError(
                f"{error}; the reactor's log:\n{reactor.log.read_text()}"
            ) from None
        first = _first_artifact(url, app) - began
        with psycopg.connect(url, autocommit=True) as conn:
            wait_for(lambda: unhooked(conn, app, HOOK) == 0, 20, "every recorded run hooked")
        reactor.terminate()
        assert reactor.wait(30) == 0, reactor.log.read_text()
    finally:
        replicas.close()
    cells = report_cells(f"corpus: {schema.name}", 1, judgement, recovery=None, unhooked=0)
    note = (
        f"init to the first worker-written artifact {first:.2f} s (to `reactor run` listening "
        f"{listening:.2f} s; grace {GRACE} s)"
    )
    request.node.user_properties.append((FAULT_ROW, (cells, note)))
    assert judgement.clean, str(judgement)
    verdict = judgement.verdict
    # Every run the app left to the reactor is its, every save the client's, and no other.
    assert (verdict.saved_by_worker, verdict.saved_by_client) == (played.recorded, played.saved)
    assert "scan failed" not in "\n".join(reactor.messages())
