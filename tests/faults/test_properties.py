"""The precedence rule as a property: for any interleaving of client saves, jobs of one run
going terminal (or back, or away, or terminal again), and reactor passes, the run row is what
DESIGN.md §2 says.

A tiny pure model of the rules runs beside the real record statements (``record_oldest`` and
``record_jobs`` on a pool, grace 0) and the two must agree after every step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import anyio.from_thread
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reactor import db
from reactor.install import Install
from reactor.testing.audit import Verdict
from tests.faults.support import Conn, connect
from tests.faults.tables import JobId, RunKey, Tables

JOBS = 3


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
    # The job's updated stamp a worker row was written from: a later finish replaces it.
    written_from: int | None = None
    clock: int = 0
    log: list[str] = field(default_factory=list)

    def key(self, i: int) -> tuple[int, int]:
        return (self.jobs[i].created, i)

    def outranked_by(self, i: int) -> bool:
        """The run row may be replaced by job i: a worker row of an earlier (or gone) job, or
        of an earlier finish of job i itself (it was updated since the row was written)."""
        assert self.row is not None
        job, saved_by = self.row
        if saved_by != "worker":  # client, or NULL (legacy) which counts as client
            return False
        if job == i:
            return self.written_from != self.jobs[i].updated
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
            self.written_from = self.jobs[newest].updated

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


@dataclass(frozen=True)
class Database:
    """The real side: the app's tables, and the reactor's record statements on a pool."""

    tables: Tables
    conn: Conn
    reactor: db.Database
    portal: Any

    @property
    def run(self) -> RunKey:
        return self.tables.nth_run(0xABC)

    def job(self, i: int) -> JobId:
        """Job i's id: the ids are in the jobs' order, in Python and in PostgreSQL alike."""
        return self.tables.nth_job(i + 1)

    def row(self) -> tuple[int, str | None] | None:
        """The run row as the model has it: (job index, "worker", "client" or None)."""
        row = self.tables.run_row(self.conn, self.run)
        if row is None:
            return None
        job, saved_by = row
        said = {self.tables.worker: "worker", self.tables.client: "client"}
        index = next(i for i in range(JOBS) if self.job(i) == job)
        return index, None if saved_by is None else said[saved_by]


def apply(op: Op, model: Model, real: Database) -> None:
    kind, *args = op
    if kind in ("finish", "unfinish", "softdelete", "delete", "client") and args[0] not in (
        model.jobs
    ):
        return  # the job was hard-deleted: nothing to do
    if kind == "softdelete" and not real.tables.soft_deletes:
        return  # an app that never soft-deletes
    tables, conn = real.tables, real.conn
    model.clock += 1
    stamp = model.clock
    # Updated an hour ago and a millisecond later at each step: long past any grace.
    age = 3600 - stamp / 1000
    if kind == "finish":
        i, empty, failed = args
        job = model.jobs[i]
        job.status, job.results, job.updated = (
            "failed" if failed else "complete",
            {} if empty else {"v": stamp},
            stamp,
        )
        tables.finish(conn, real.job(i), failed=failed, results=json.dumps(job.results), age=age)
    elif kind == "unfinish":
        i = args[0]
        model.jobs[i].status, model.jobs[i].updated = "running", stamp
        tables.reopen(conn, real.job(i), age=age)
    elif kind == "softdelete":
        i = args[0]
        model.jobs[i].deleted = True
        tables.soft_delete(conn, real.job(i))
    elif kind == "delete":
        i = args[0]
        del model.jobs[i]
        tables.delete(conn, real.job(i))
    elif kind == "client":
        i, saved_by = args
        if model.jobs[i].results is None:
            return  # a tab only saves a job that has results
        model.row = (i, saved_by)
        tables.client_save(conn, real.job(i), legacy=saved_by is None)
    elif kind == "oldest":
        model.oldest(args[0])
        real.portal.call(real.reactor.record_oldest, args[0])
    elif kind == "jobs":
        chosen = sorted(args[0])
        model.record([i for i in chosen if i in model.jobs])
        real.portal.call(real.reactor.record_jobs, [str(real.job(i)) for i in chosen])


# The pool lives in the portal's thread, and its maintenance draws jitter from the global
# random while Hypothesis draws an example here: Hypothesis takes that for the strategy's own.
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
@pytest.mark.second_mapping
def test_precedence_matches_the_model(database_url: str, tables: Tables) -> None:
    if tables.loaded().one_to_one:
        pytest.skip("each job is its own run in a one-to-one mapping: no run has two jobs")
    with (
        anyio.from_thread.start_blocking_portal("asyncio") as portal,
        connect(database_url) as conn,
    ):
        pool = db.make_pool(database_url, max_size=2)
        portal.call(pool.open)
        queries = db.Database.pooled(Install.of(tables.mapping), pool)
        real = Database(tables, conn, queries, portal)
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
            conn.execute(tables.render("TRUNCATE @jobs@, @runs@, run_audit, @reactor@.hook_outbox"))
            model = Model({i: Job(c) for i, c in enumerate(created)})
            # One transaction, one now(): created in the order of the ranks a day ago, ties
            # left to the ids; updated 2 hours ago.
            with conn.transaction():
                for i, c in enumerate(created):
                    tables.add_job(
                        conn,
                        job=real.job(i),
                        run=real.run,
                        doc="<p>d</p>",
                        created_age=86_400 - c,
                        updated_age=7200,
                    )
            for step in steps:
                apply(step, model, real)
                assert real.row() == model.row, f"after {step}"
            # A job finished again without leaving its terminal value is, to the tables, a
            # touch: the trigger does not queue it, the reconcile does. Then the last pass.
            portal.call(queries.reconcile_pass, "test")
            apply(("oldest", 10), model, real)
            assert real.row() == model.row, "after the reconcile and the last pass"
            # At rest, by the database's own count: nothing still needs a run, and no worker
            # write landed on a client row.
            counts = real.reactor.install.query("verdict", "audit.sql")
            verdict = conn.execute(counts, {"grace": 0}).fetchone()
            assert verdict is not None
            assert Verdict(*verdict).lost == 0
            assert Verdict(*verdict).clobbered == 0

        try:
            check()
        finally:
            portal.call(pool.close)
        assert examples >= 60
