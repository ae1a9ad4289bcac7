"""The precedence rule as a property: for any interleaving of client saves, jobs of one run
going terminal (or back, or away), and reactor passes, the run row is what DESIGN.md §2 says.

A tiny pure model of the rules runs beside the real record statements (``record_oldest`` and
``record_jobs`` on a pool, grace 0) and the two must agree after every step.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import anyio.from_thread
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reactor import db, sql
from reactor.audit import Verdict
from tests.faults.support import Conn, connect

JOBS = 3
RUN = uuid.UUID(int=0xABC)
# Ids in a known order: PostgreSQL compares uuids as bytes, Python as integers; they agree.
IDS = [uuid.UUID(int=i + 1) for i in range(JOBS)]


# -- the model ---------------------------------------------------------------------------------


@dataclass
class Job:
    created: int  # created_at rank; ties are broken by id
    status: str = "running"
    results: Any = None
    deleted: bool = False
    updated: int = 0

    def eligible(self) -> bool:
        return (
            self.status in ("complete", "failed")
            and not self.deleted
            and self.results is not None
            and self.results != {}
        )


@dataclass
class Model:
    """DESIGN.md §2: "when a job is due" and "precedence at every write site"."""

    jobs: dict[int, Job]
    row: tuple[int, str | None] | None = None  # (job index, saved_by)
    clock: int = 0
    log: list[str] = field(default_factory=list)

    def key(self, i: int) -> tuple[int, int]:
        return (self.jobs[i].created, i)

    def outranked_by(self, i: int) -> bool:
        """The run row may be replaced by job i: a worker row of an earlier (or gone) job."""
        assert self.row is not None
        job, saved_by = self.row
        if saved_by != "worker":  # client, or NULL (legacy) which counts as client
            return False
        return job not in self.jobs or self.key(job) < self.key(i)

    def needs_run(self, i: int) -> bool:
        return (
            i in self.jobs
            and self.jobs[i].eligible()
            and (self.row is None or self.outranked_by(i))
        )

    def record(self, candidates: list[int]) -> None:
        claimed = [i for i in candidates if self.needs_run(i)]
        if claimed:
            newest = max(claimed, key=self.key)
            self.row = (newest, "worker")

    def oldest(self, limit: int) -> None:
        due = sorted(
            (i for i in self.jobs if self.needs_run(i)), key=lambda i: (self.jobs[i].updated, i)
        )
        self.record(due[:limit])


# -- the operations, on both -------------------------------------------------------------------

Op = tuple[Any, ...]

# Finishes and passes are the interesting steps: they come three times as often.
finishes = st.tuples(
    st.just("finish"),
    st.integers(0, JOBS - 1),
    st.sampled_from([False, False, True]),
    st.booleans(),
)
passes = st.one_of(
    st.tuples(st.just("oldest"), st.just(10)),  # the whole backlog: batch order is not the rule
    st.tuples(st.just("jobs"), st.sets(st.integers(0, JOBS - 1), min_size=1)),
)
ops = st.one_of(
    finishes,
    finishes,
    finishes,
    passes,
    passes,
    passes,
    st.tuples(st.just("unfinish"), st.integers(0, JOBS - 1)),
    st.tuples(st.just("client"), st.integers(0, JOBS - 1), st.sampled_from(["client", None])),
    st.tuples(st.just("oldest"), st.just(10)),  # the whole backlog: batch order is not the rule
    st.tuples(st.just("jobs"), st.sets(st.integers(0, JOBS - 1), min_size=1)),
    st.tuples(st.just("delete"), st.integers(0, JOBS - 1)),
    st.tuples(st.just("softdelete"), st.integers(0, JOBS - 1)),
)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[int], list[Op]]:
    """created_at ranks, and steps: every job finishes once, a few passes, a few odd steps,
    all shuffled (hypothesis alone mostly draws the same dull step again and again)."""
    created = draw(st.lists(st.integers(0, 2), min_size=JOBS, max_size=JOBS))
    steps: list[Op] = []
    for i in range(JOBS):
        _, _, empty, failed = draw(finishes)
        steps.append(("finish", i, empty, failed))
    steps += draw(st.lists(passes, min_size=2, max_size=4))
    steps += draw(st.lists(ops, max_size=8))
    return created, list(draw(st.permutations(steps)))


def apply(op: Op, model: Model, conn: Conn, database: db.Database, portal: Any) -> None:
    kind, *args = op
    if kind in ("finish", "unfinish", "softdelete", "delete", "client") and args[0] not in (
        model.jobs
    ):
        return  # the job was hard-deleted: nothing to do
    model.clock += 1
    stamp = model.clock
    if kind == "finish":
        i, empty, failed = args
        job = model.jobs[i]
        job.status, job.results, job.updated = (
            "failed" if failed else "complete",
            {} if empty else {"v": stamp},
            stamp,
        )
        conn.execute(
            "UPDATE analysis_jobs SET status = %s, results = %s, "
            "updated_at = now() - interval '1 hour' + make_interval(secs => %s) WHERE id = %s",
            (job.status, json.dumps(job.results), stamp / 1000, IDS[i]),
        )
    elif kind == "unfinish":
        i = args[0]
        model.jobs[i].status, model.jobs[i].updated = "running", stamp
        conn.execute(
            "UPDATE analysis_jobs SET status = 'running', "
            "updated_at = now() - interval '1 hour' + make_interval(secs => %s) WHERE id = %s",
            (stamp / 1000, IDS[i]),
        )
    elif kind == "softdelete":
        i = args[0]
        model.jobs[i].deleted = True
        conn.execute("UPDATE analysis_jobs SET deleted_at = now() WHERE id = %s", (IDS[i],))
    elif kind == "delete":
        i = args[0]
        del model.jobs[i]
        conn.execute("DELETE FROM analysis_jobs WHERE id = %s", (IDS[i],))
    elif kind == "client":
        i, saved_by = args
        if model.jobs[i].results is None:
            return  # a tab only saves a job that has results
        model.row = (i, saved_by)
        conn.execute(
            """
            INSERT INTO analysis_runs (id, job_id, doc_html, results, saved_by)
            SELECT run_id, id, doc_html, results, %(by)s FROM analysis_jobs WHERE id = %(id)s
            ON CONFLICT (id) DO UPDATE SET job_id = EXCLUDED.job_id,
                doc_html = EXCLUDED.doc_html, results = EXCLUDED.results,
                saved_by = EXCLUDED.saved_by, updated_at = now()
            """,
            {"by": saved_by, "id": IDS[i]},
        )
    elif kind == "oldest":
        model.oldest(args[0])
        portal.call(database.record_oldest, args[0])
    elif kind == "jobs":
        chosen = sorted(args[0])
        model.record([i for i in chosen if i in model.jobs])
        portal.call(database.record_jobs, [str(IDS[i]) for i in chosen])


def db_row(conn: Conn) -> tuple[int, str | None] | None:
    row = conn.execute(
        "SELECT job_id, saved_by FROM analysis_runs WHERE id = %s", (RUN,)
    ).fetchone()
    return None if row is None else (IDS.index(row[0]), row[1])


# The pool lives in the portal's thread, and its maintenance draws jitter from the global
# random while Hypothesis draws an example here: Hypothesis takes that for the strategy's own.
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
def test_precedence_matches_the_model(database_url: str) -> None:
    with (
        anyio.from_thread.start_blocking_portal("asyncio") as portal,
        connect(database_url) as conn,
    ):
        pool = db.make_pool(database_url, max_size=2)
        portal.call(pool.open)
        database = db.Database(pool, grace=0.0)
        examples = 0

        @settings(
            max_examples=60,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
            database=None,
            derandomize=True,
        )
        @given(scenarios())
        def check(scenario: tuple[list[int], list[Op]]) -> None:
            nonlocal examples
            created, steps = scenario
            examples += 1
            conn.execute("TRUNCATE analysis_jobs, analysis_runs, run_audit, reactor.hook_outbox")
            model = Model({i: Job(c) for i, c in enumerate(created)})
            for i, c in enumerate(created):
                conn.execute(
                    "INSERT INTO analysis_jobs (id, run_id, status, doc_html, created_at, "
                    "updated_at) VALUES (%s, %s, 'running', '<p>d</p>', "
                    "'2020-01-01'::timestamptz + make_interval(secs => %s), "
                    "now() - interval '2 hours')",
                    (IDS[i], RUN, c),
                )
            for step in [*steps, ("oldest", 10)]:
                apply(step, model, conn, database, portal)
                assert db_row(conn) == model.row, f"after {step}"
            # At rest, by the database's own count: nothing still needs a run, and no worker
            # write landed on a client row.
            verdict = conn.execute(sql.query("verdict", "audit.sql"), {"grace": 0}).fetchone()
            assert verdict is not None
            assert Verdict(*verdict).lost == 0
            assert Verdict(*verdict).clobbered == 0

        try:
            check()
        finally:
            portal.call(pool.close)
        assert examples >= 60
