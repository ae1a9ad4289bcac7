"""Each schema of tests/apps/ from ``reactor init`` to the reactor recording its runs, judged by
DESIGN.md's invariants: the tables as Django, Rails, Prisma, SQLAlchemy, Ecto, Laravel, GORM,
Drizzle, Kysely and TypeORM make them, and a hand-written pair.

As a newcomer whose app saves as its ORM does would: the draft written by ``init -o`` with
``--terminal``, and one edit, ``app_saves = "plain"`` (the draft offers it, commented);
``migrate`` as the owner, the runtime role from ``init --role`` applied as the superuser,
``reactor run`` as that role with a hook. The worker plays what its code does
(reactor.testing.app.App on the drafted mapping, so one worker serves every schema): jobs it
finishes, some that need no run (no documents, deleted, still running, and where the mapping judges
by verdicts, failed without any), one retried (it fails, runs again and finishes with another
document). The tab saves the way the ORM does, as the SQL the ORM sends: its create inside the
grace, and after the reactor wrote the row, its create and its upsert (which leaves saved_by
alone). The ORM must get what it expects back (one row, the RETURNING it asked for), the tab's data
must stand, and the audit of every write to the artifact table says the rest.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import psycopg
import psycopg.conninfo
import pytest

from reactor import db
from reactor.db.fit import fit
from reactor.install import mapping_file, sql
from reactor.install.mapping import Mapping
from reactor.install.quote import identifier
from reactor.testing import audit
from reactor.testing.app import DOCUMENT, App
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.acceptance.test_init import DJANGO, HANDWRITTEN, PRISMA, RAILS, SQLALCHEMY
from tests.acceptance.test_init import App as Schema
from tests.conftest import FAULT_ROW
from tests.faults.support import Judgement, Replicas, judge, report_cells, unhooked
from tests.polling import wait_for

GRACE = 0.5
ROLE = "reactor_rt"
HOOK = "judge"
# How many jobs of each kind the app finishes.
RECORDED = 4  # the worker's alone: the reactor writes their runs
SAVED = 3  # the tab saves them with the ORM's create, inside the grace
LATE = 2  # the tab saves them after the reactor wrote: with the ORM's create, then its upsert
RETRIED = 1  # the reactor records it, it runs again, and its last finish must replace the row


@dataclass(frozen=True)
class Save:
    """What a tab's save carries: the job and its run, the tab's own data, and what the ORM
    makes itself (an id for the new row, its clock, naive in UTC where the columns are)."""

    job: Any
    run: Any
    data: str
    fresh: uuid.UUID
    now: datetime

    @property
    def naive(self) -> datetime:
        return self.now.replace(tzinfo=None)


@dataclass(frozen=True)
class Orm:
    """One schema of tests/apps/ and how its ORM saves the artifact: ``create`` and ``upsert``
    as the ORM sends them (``raw``: with PostgreSQL's $n placeholders, else psycopg's), with
    the parameters ``values`` makes; ``returning``: the columns the create's RETURNING gives
    back (None: all of them; () for none); ``data``: the artifact column that holds what the
    tab saved, filled by the reactor from the job's column of the same name."""

    schema: Schema
    create: str
    upsert: str
    values: Callable[[Save], Sequence[Any] | dict[str, Any]]
    returning: tuple[str, ...] | None
    data: str
    raw: bool = True
    # The upsert's parameters, where they are not the create's.
    upsert_values: Callable[[Save], Sequence[Any] | dict[str, Any]] | None = None

    @property
    def name(self) -> str:
        return self.schema.name


# The shapes test_init.py drafts too, and the ones this file adds.
ECTO = Schema("ecto", "analyses", "analysis_reports", "completed,failed", True)
LARAVEL = Schema("laravel", "scans", "scan_reports", "done,failed", True)
GORM = Schema("gorm", "transcodes", "renditions", "2,3", True)
DRIZZLE = Schema("drizzle", "jobs", "reports", "done,failed", True)
KYSELY = Schema("kysely", "task", "task_result", "complete,failed", True)
TYPEORM = Schema("typeorm", "job", "report", "done,failed", True)

ORMS = [
    # ExportReport.objects.create(...): the primary key is the export's, so nothing comes
    # back; bulk_create(update_conflicts=True, unique_fields=["export"], update_fields=[...]).
    Orm(
        DJANGO,
        'INSERT INTO "app_exportreport" ("export_id", "result", "owner_id", "created_at") '
        "VALUES (%s, %s, %s, %s)",
        'INSERT INTO "app_exportreport" ("export_id", "result", "owner_id", "created_at") '
        'VALUES (%s, %s, %s, %s) ON CONFLICT("export_id") DO UPDATE SET '
        '"result" = EXCLUDED."result", "owner_id" = EXCLUDED."owner_id", '
        '"created_at" = EXCLUDED."created_at"',
        lambda s: (s.job, s.data, 0, s.now),
        (),
        "result",
        raw=False,
    ),
    # ExportReport.create!(...); ExportReport.upsert(..., unique_by: :export_id), whose values
    # Rails writes inline (bound here) and whose update keeps updated_at when nothing changed.
    Orm(
        RAILS,
        'INSERT INTO "export_reports" ("export_id", "payload", "created_at", "updated_at") '
        'VALUES ($1, $2, $3, $4) RETURNING "id"',
        'INSERT INTO "export_reports" ("export_id","payload","created_at","updated_at") '
        'VALUES ($1, $2, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP) ON CONFLICT ("export_id") '
        'DO UPDATE SET updated_at=(CASE WHEN ("export_reports"."payload" IS NOT DISTINCT FROM '
        'excluded."payload") THEN "export_reports".updated_at ELSE CURRENT_TIMESTAMP END),'
        '"payload"=excluded."payload" RETURNING "id"',
        lambda s: (s.job, s.data, s.naive, s.naive),
        ("id",),
        "payload",
        upsert_values=lambda s: (s.job, s.data),
    ),
    # prisma.report.create({ data }) returns every scalar field; prisma.report.upsert with one
    # unique field in where is the database's own upsert (Prisma 4.6+).
    Orm(
        PRISMA,
        'INSERT INTO "public"."Report" ("id","jobId","output","createdAt") VALUES ($1,$2,$3,$4) '
        'RETURNING "public"."Report"."id", "public"."Report"."jobId", "public"."Report"."output", '
        '"public"."Report"."createdAt"',
        'INSERT INTO "public"."Report" ("id","jobId","output","createdAt") VALUES ($1,$2,$3,$4) '
        'ON CONFLICT ("jobId") DO UPDATE SET "output" = $5 WHERE ("public"."Report"."jobId" = $6 '
        'AND 1=1) RETURNING "public"."Report"."id", "public"."Report"."jobId", '
        '"public"."Report"."output", "public"."Report"."createdAt"',
        lambda s: (str(s.fresh), s.job, s.data, s.naive),
        ("id", "jobId", "output", "createdAt"),
        "output",
        upsert_values=lambda s: (str(s.fresh), s.job, s.data, s.naive, s.data, s.job),
    ),
    # session.add(JobResult(...)); session.flush() with the psycopg dialect's typed binds; and
    # insert(JobResult).values(...).on_conflict_do_update(index_elements=[job_id], set_=...).
    Orm(
        SQLALCHEMY,
        "INSERT INTO job_results (job_id, result) VALUES (%(job_id)s::BIGINT, "
        "%(result)s::VARCHAR) RETURNING job_results.id",
        "INSERT INTO job_results (job_id, result) VALUES (%(job_id)s::BIGINT, "
        "%(result)s::VARCHAR) ON CONFLICT (job_id) DO UPDATE SET result = excluded.result",
        lambda s: {"job_id": s.job, "result": s.data},
        ("id",),
        "result",
        raw=False,
    ),
    # The app's own SQL: the report keyed by the task's report_id, naming the task.
    Orm(
        HANDWRITTEN,
        "INSERT INTO work.reports (id, task_id, body, findings) VALUES ($1, $2, $3, $4)",
        "INSERT INTO work.reports (id, task_id, body, findings) VALUES ($1, $2, $3, $4) "
        "ON CONFLICT (id) DO UPDATE SET task_id = EXCLUDED.task_id, body = EXCLUDED.body, "
        "findings = EXCLUDED.findings",
        lambda s: (s.run, s.job, "<p>tab</p>", s.data),
        (),
        "findings",
    ),
    # Repo.insert(changeset): an Ecto.UUID made by Ecto, fields in alphabetical order, no
    # RETURNING (and {:error, :stale} unless one row is inserted); Repo.insert(changeset,
    # on_conflict: {:replace, [:findings, :updated_at]}, conflict_target: :analysis_id,
    # returning: [:id]).
    Orm(
        ECTO,
        'INSERT INTO "analysis_reports" ("analysis_id","findings","id","inserted_at",'
        '"updated_at") VALUES ($1,$2,$3,$4,$5)',
        'INSERT INTO "analysis_reports" ("analysis_id","findings","id","inserted_at",'
        '"updated_at") VALUES ($1,$2,$3,$4,$5) ON CONFLICT ("analysis_id") DO UPDATE SET '
        '"findings" = EXCLUDED."findings","updated_at" = EXCLUDED."updated_at" RETURNING "id"',
        lambda s: (s.job, s.data, s.fresh, s.naive, s.naive),
        (),
        "findings",
    ),
    # ScanReport::create([...]): insertGetId; ScanReport::upsert([...], ['scan_id'],
    # ['findings']), which adds the timestamps and sorts the columns.
    Orm(
        LARAVEL,
        'insert into "scan_reports" ("scan_id", "findings", "updated_at", "created_at") '
        'values ($1, $2, $3, $4) returning "id"',
        'insert into "scan_reports" ("created_at", "findings", "scan_id", "updated_at") '
        'values ($1, $2, $3, $4) on conflict ("scan_id") do update set "findings" = '
        '"excluded"."findings", "updated_at" = "excluded"."updated_at"',
        lambda s: (s.job, s.data, s.naive, s.naive),
        ("id",),
        "findings",
        upsert_values=lambda s: (s.naive, s.data, s.job, s.naive),
    ),
    # db.Create(&rendition); db.Clauses(clause.OnConflict{Columns: transcode_id, DoUpdates:
    # clause.AssignmentColumns(findings, updated_at)}).Create(&rendition).
    Orm(
        GORM,
        'INSERT INTO "renditions" ("created_at","updated_at","deleted_at","transcode_id",'
        '"findings") VALUES ($1,$2,$3,$4,$5) RETURNING "id"',
        'INSERT INTO "renditions" ("created_at","updated_at","deleted_at","transcode_id",'
        '"findings") VALUES ($1,$2,$3,$4,$5) ON CONFLICT ("transcode_id") DO UPDATE SET '
        '"updated_at"="excluded"."updated_at","findings"="excluded"."findings" RETURNING "id"',
        lambda s: (s.now, s.now, None, s.job, s.data),
        ("id",),
        "findings",
    ),
    # db.insert(reports).values({ jobId, findings }).returning();
    # .onConflictDoUpdate({ target: reports.jobId, set: { findings } }).
    Orm(
        DRIZZLE,
        'insert into "reports" ("id", "job_id", "findings", "created_at") values (default, $1, '
        '$2, default) returning "id", "job_id", "findings", "created_at"',
        'insert into "reports" ("id", "job_id", "findings", "created_at") values (default, $1, '
        '$2, default) on conflict ("job_id") do update set "findings" = $3 returning "id", '
        '"job_id", "findings", "created_at"',
        lambda s: (s.job, s.data),
        ("id", "job_id", "findings", "created_at"),
        "findings",
        upsert_values=lambda s: (s.job, s.data, s.data),
    ),
    # db.insertInto("task_result").values({ task_id, verdict }).returningAll(); with
    # .onConflict((oc) => oc.column("task_id").doUpdateSet({ verdict: (eb) =>
    # eb.ref("excluded.verdict") })).
    Orm(
        KYSELY,
        'insert into "task_result" ("task_id", "verdict") values ($1, $2) returning *',
        'insert into "task_result" ("task_id", "verdict") values ($1, $2) on conflict '
        '("task_id") do update set "verdict" = "excluded"."verdict" returning *',
        lambda s: (s.job, s.data),
        None,
        "verdict",
    ),
    # reports.save(report): the generated id as DEFAULT, read back; reports.upsert(report,
    # ["job"]).
    Orm(
        TYPEORM,
        'INSERT INTO "report"("id", "findings", "jobId") VALUES (DEFAULT, $1, $2) RETURNING "id"',
        'INSERT INTO "report"("id", "findings", "jobId") VALUES (DEFAULT, $1, $2) ON CONFLICT ( '
        '"jobId" ) DO UPDATE SET "findings" = EXCLUDED."findings", "jobId" = EXCLUDED."jobId" '
        'RETURNING "id"',
        lambda s: (s.data, s.job),
        ("id",),
        "findings",
    ),
]


@dataclass(frozen=True)
class Played:
    """What the app did: the runs the reactor owes, the ones the tab saved, and the retried
    job's."""

    recorded: int
    saved: int
    retried: list[Any]


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
    # The one edit: the draft offers the app's plain save, commented out.
    draft = path.read_text()
    assert '\n# app_saves = "plain"\n' in draft, draft
    path.write_text(draft.replace('\n# app_saves = "plain"\n', '\napp_saves = "plain"\n'))
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
    assert drafted.runs.app_saves == "plain"
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


class Tab:
    """The browser tab: the ORM's own statements, sent as the ORM sends them, each checked for
    what the ORM reads back."""

    def __init__(self, conn: psycopg.Connection[Any], app: App, orm: Orm) -> None:
        self.conn, self.app, self.orm = conn, app, orm
        self.json = app.mapping.jobs.type_of(orm.data) in ("json", "jsonb")
        self.saved: dict[Any, Any] = {}  # run key: what the tab saved there

    def create(self, job: Any) -> None:
        """The ORM's create of ``job``'s artifact."""
        self._send(job, self.orm.create, self.orm.values, self.orm.returning)

    def upsert(self, job: Any) -> None:
        """The ORM's upsert of ``job``'s artifact, which leaves saved_by alone."""
        values = self.orm.upsert_values or self.orm.values
        returning = self.orm.returning if "returning" in self.orm.upsert.lower() else ()
        self._send(job, self.orm.upsert, values, returning)

    def data(self, run: Any) -> Any:
        """What the artifact of ``run`` holds in the tab's column, as JSON reads it."""
        row = self.conn.execute(
            self.app.render(
                f"SELECT to_jsonb(r.{identifier(self.orm.data)}) FROM @runs@ r "
                "WHERE @r.key@ = %(run)s",
                parameters=True,
            ),
            {"run": run},
        ).fetchone()
        return None if row is None else row[0]

    def _send(
        self,
        job: Any,
        query: str,
        values: Callable[[Save], Sequence[Any] | dict[str, Any]],
        returning: tuple[str, ...] | None,
    ) -> None:
        (run,) = self.conn.execute(*self.app.run_of(job)).fetchone() or (None,)
        tab = {"tab": job if isinstance(job, int) else str(job)}
        data = json.dumps(tab) if self.json else f"saved by the tab for {job}"
        save = Save(job, run, data, uuid.uuid4(), datetime.now(UTC).replace(microsecond=0))
        cursor = psycopg.RawCursor(self.conn) if self.orm.raw else self.conn.cursor()
        with cursor as cur:
            cur.execute(query, values(save))
            # One row inserted, as every ORM counts on (Ecto's insert is stale on 0).
            assert cur.rowcount == 1, (self.orm.name, query)
            back = cur.fetchall() if cur.description else []
        if returning != ():
            columns = "*" if returning is None else ", ".join(identifier(c) for c in returning)
            stored = self.conn.execute(
                self.app.render(
                    f"SELECT {columns} FROM @runs@ r WHERE @r.key@ = %(run)s", parameters=True
                ),
                {"run": run},
            ).fetchall()
            assert back == stored, (self.orm.name, back, stored)
        self.saved[run] = tab if self.json else data


def _play(conn: psycopg.Connection[Any], app: App, orm: Orm) -> tuple[Played, Tab]:
    """The app's work, in the order an app does it; returns what the reactor owes, and the
    tab that saved."""
    jobs = app.mapping.jobs
    # A document every column of the job's documents takes: text, or json where one is json.
    json_documents = any(jobs.type_of(column) in ("json", "jsonb") for column in app.documents)
    document = '{"doc": "<p>doc</p>"}' if json_documents else DOCUMENT
    again = '{"doc": "<p>again</p>"}' if json_documents else "<p>again</p>"
    tab = Tab(conn, app, orm)

    def create(count: int, **options: Any) -> list[Any]:
        options.setdefault("document", document)
        return [row[0] for row in conn.execute(*app.create(count=count, **options))]

    recorded = create(RECORDED)
    conn.execute(*app.finish(*recorded[:-1]))
    conn.execute(*app.finish(recorded[-1], failed=True))
    saved = create(SAVED)
    conn.execute(*app.finish(*saved))
    for job in saved:
        tab.create(job)
    late = create(LATE)
    retried = create(RETRIED)
    conn.execute(*app.finish(*late, *retried))
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
        (run,) = conn.execute(*app.run_of(recorded[0])).fetchone() or (None,)
        conn.execute(*app.finish(*create(1, runs=[run])))
    # The tab comes back after the reactor wrote: its create, then its upsert.
    wait_for(
        lambda: all(_worker_row(conn, app, job) for job in (*late, *retried)),
        30,
        "the reactor's rows of the late saves and the retried job",
    )
    tab.create(late[0])
    tab.upsert(late[1])
    # The retried job runs again and finishes with another document.
    conn.execute(*app.reopen(*retried))
    conn.execute(*app.redocument(*retried, document=again))
    conn.execute(*app.finish(*retried))
    return Played(RECORDED + RETRIED, SAVED + LATE, retried), tab


def _worker_row(conn: psycopg.Connection[Any], app: App, job: Any) -> bool:
    (run,) = conn.execute(*app.run_of(job)).fetchone() or (job,)
    row = conn.execute(*app.run_row(run)).fetchone()
    return row is not None and row[1] == app.mapping.runs.worker


def _settled(url: str, app: App) -> Judgement:
    """The judgement once the reactor has recorded every run it owes (bounded)."""

    def owed() -> bool:
        with psycopg.connect(url, autocommit=True) as conn:
            (left,) = conn.execute(*app.unsettled()).fetchone() or (None,)
        return bool(left == 0)

    try:
        wait_for(owed, 30, "every run recorded")
    except AssertionError as error:
        raise AssertionError(f"{error}; the finished jobs:\n{_jobs_and_runs(url, app)}") from None

    async def judged() -> Judgement:
        return await judge(url, GRACE, app.mapping)

    return anyio.run(judged, backend="asyncio")


# Each finished job's run, queue row and run row, for a failure to show which job waits and why.
JOBS_AND_RUNS = """
SELECT @j.id@::text AS job, @j.run@::text AS run, @created(j)@ AS created,
       @j.updated_at@ AS updated,
       (SELECT p.since FROM @reactor@.pending p WHERE p.job_id = @j.id@) AS queued_since,
       (SELECT @r.job@::text || ' ' || coalesce(@r.saved_by@, 'NULL') FROM @runs@ r
         WHERE @r.key@ = @j.run@) AS run_row
  FROM @jobs@ j
 WHERE @eligible(j)@
 ORDER BY 2, 3
"""


def _jobs_and_runs(url: str, app: App) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(app.render(JOBS_AND_RUNS)).fetchall()
    return "\n".join(" | ".join(str(value) for value in row) for row in rows)


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


@pytest.mark.parametrize("orm", ORMS, ids=[orm.name for orm in ORMS])
def test_the_draft_records_every_run_the_app_leaves(
    empty_database_url: str, orm: Orm, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = empty_database_url
    schema = orm.schema
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
    app_conn = psycopg.connect(url, autocommit=True)
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
        played, tab = _play(app_conn, app, orm)
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
        # Every save of the tab's stands as it saved it, after the reactor is done.
        kept = {run: tab.data(run) for run in tab.saved}
        (retried,) = played.retried
        (run,) = tab.conn.execute(*app.run_of(retried)).fetchone() or (None,)
        last = tab.conn.execute(
            app.render(
                f"SELECT to_jsonb(r.{identifier(orm.data)}) = to_jsonb(j.{identifier(orm.data)}), "
                "@r.saved_by@ FROM @runs@ r JOIN @jobs@ j ON @j.id@ = @r.job@ "
                "WHERE @r.key@ = %(run)s",
                parameters=True,
            ),
            {"run": run},
        ).fetchone()
    finally:
        app_conn.close()
        replicas.close()
    cells = report_cells(f"corpus: {schema.name}", 1, judgement, recovery=None, unhooked=0)
    note = (
        f"init to the first worker-written artifact {first:.2f} s (to `reactor run` listening "
        f"{listening:.2f} s; grace {GRACE} s)"
    )
    request.node.user_properties.append((FAULT_ROW, (cells, note)))
    # The retried job's artifact holds its last finish, written by the reactor (DESIGN.md's
    # rule c): the audit judges its first write by that finish too.
    assert last == (True, app.mapping.runs.worker), "the retried job's run kept its first finish"
    assert judgement.clean, str(judgement)
    verdict = judgement.verdict
    # Every run the app left to the reactor is its, every save the client's, and no other.
    assert (verdict.saved_by_worker, verdict.saved_by_client) == (played.recorded, played.saved)
    assert kept == tab.saved
    assert "scan failed" not in "\n".join(reactor.messages())
