"""The TypeScript side (examples/bun) under real Bun, next to a real ``reactor run``.

Bun is the npm package of examples/bun/package-lock.json; ``tests.tools.bun`` installs it with
``npm ci`` on first use, so ``uv run pytest`` is still the only test command.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psycopg
import pytest

from reactor.hooks import IDEMPOTENCY_HEADER, HookCall
from reactor.hooks.signature import SIGNATURE_HEADER, sign
from reactor.install import REFERENCE_INSTALL
from reactor.testing.audit import Verdict
from tests import tools
from tests.acceptance.conftest import reactor_env
from tests.acceptance.test_cli import listening
from tests.helpers import worker_writes
from tests.polling import wait_for

SECRET = "bun-e2e-secret"
TABS = Path(__file__).parent / "bun" / "tabs.ts"
JOBS = 60
GRACE = 1.5


@dataclass
class Lines:
    """A process's output, read line by line in a thread so that its pipe never fills."""

    stream: IO[str]
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.stream:
            self.lines.append(line.rstrip("\n"))

    def after(self, prefix: str, timeout: float = 15) -> str:
        """The rest of the first line that starts with ``prefix``, once it is printed."""
        found = wait_for(
            lambda: next((line for line in self.lines if line.startswith(prefix)), None), timeout
        )
        return str(found)[len(prefix) :]

    def join(self) -> None:
        """Wait until the stream ends (the process has exited)."""
        self._reader.join(10)

    def objects(self) -> list[dict[str, Any]]:
        """Every line that is a JSON object, parsed (once the process has ended)."""
        self.join()
        return [json.loads(line) for line in self.lines if line.startswith("{")]


@dataclass
class Bun:
    """A Bun process with its output."""

    proc: subprocess.Popen[str]
    out: Lines
    err: Lines

    def stop(self) -> None:
        """SIGTERM, then wait for it: a Bun server exits on it."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(10)

    def finish(self, timeout: float = 30) -> None:
        """Wait for a process that ends by itself, and require exit code 0."""
        code = self.proc.wait(timeout)
        self.err.join()
        assert code == 0, "\n".join(self.err.lines)


StartBun = Callable[..., Bun]


@pytest.fixture(scope="module")
def bun() -> Path:
    return tools.bun()


@pytest.fixture
def start_bun(bun: Path) -> Iterator[StartBun]:
    """``start_bun(script, *args, env=...)`` runs ``bun script`` in examples/bun."""
    started: list[Bun] = []
    base = {k: v for k, v in os.environ.items() if not k.startswith("REACTOR_")}

    def start(script: str | Path, *args: str, env: dict[str, str]) -> Bun:
        proc = subprocess.Popen(
            [str(bun), str(script), *args],
            cwd=tools.BUN_EXAMPLE,
            env={**base, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert proc.stderr is not None
        started.append(Bun(proc, Lines(proc.stdout), Lines(proc.stderr)))
        return started[-1]

    yield start
    for process in started:
        if process.proc.poll() is None:
            process.proc.kill()
        process.proc.wait()
        for lines in (process.out, process.err):
            lines.join()
            lines.stream.close()


def as_url(dsn: str) -> str:
    """A libpq key=value DSN as the postgres:// URL that Bun's clients take."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    auth = urllib.parse.quote(str(params.pop("user", "postgres")), safe="")
    if password := params.pop("password", None):
        auth += ":" + urllib.parse.quote(str(password), safe="")
    host, port = params.pop("host", "127.0.0.1"), params.pop("port", 5432)
    dbname = urllib.parse.quote(str(params.pop("dbname")), safe="")
    query = urllib.parse.urlencode({k: str(v) for k, v in params.items()})
    return f"postgresql://{auth}@{host}:{port}/{dbname}" + (f"?{query}" if query else "")


def deliver(url: str, call: HookCall, *, at: int, body: bytes | None = None) -> tuple[int, str]:
    """POST ``call`` as the reactor does, signed at unix time ``at``; ``body`` tampers with it."""
    signed = call.as_json().encode()
    headers = {
        "Content-Type": "application/json",
        IDEMPOTENCY_HEADER: call.idempotency_key,
        SIGNATURE_HEADER: sign(SECRET, signed, timestamp=at),
    }
    request = urllib.request.Request(url, data=body or signed, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read().decode()


def test_bun_test_and_typecheck(bun: Path) -> None:
    tests = subprocess.run(
        [str(bun), "test"], cwd=tools.BUN_EXAMPLE, capture_output=True, text=True, timeout=120
    )
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert " 0 fail" in tests.stderr
    tsc = tools.BUN_EXAMPLE / "node_modules" / ".bin" / "tsc"
    types = subprocess.run(
        [str(tsc), "-p", "."], cwd=tools.BUN_EXAMPLE, capture_output=True, text=True, timeout=120
    )
    assert types.returncode == 0, types.stdout + types.stderr


def test_receiver_refuses_tampered_and_replayed_requests(
    database_url: str, start_bun: StartBun
) -> None:
    env = {"DATABASE_URL": as_url(database_url), "REACTOR_WEBHOOK_SECRET": SECRET, "PORT": "0"}
    receiver = start_bun("webhook-receiver.ts", env=env)
    url = receiver.out.after("webhook receiver on ") + "judge"
    run_id, job_id = str(uuid.uuid4()), str(uuid.uuid4())
    call = HookCall(run_id, job_id, "judge", 1, f"{run_id}:{job_id}:judge")
    now = int(time.time())
    tampered = call.as_json().replace('"attempt":1', '"attempt":2').encode()
    assert deliver(url, call, at=now, body=tampered)[0] == 401
    # Past the 300 s tolerance either way, by more than the seconds this test takes: the
    # receiver's clock moves on while it runs (the exact edge is reactor-hooks.test.ts's).
    assert deliver(url, call, at=now - 330)[0] == 401
    assert deliver(url, call, at=now + 330)[0] == 401
    assert deliver(url, call, at=now) == (200, '{"duplicate":false}')
    assert deliver(url, call, at=now + 1) == (200, '{"duplicate":true}')  # a retry
    receiver.stop()
    assert receiver.out.objects() == [{"handled": call.idempotency_key}]


def test_bun_worker_and_tabs_next_to_the_reactor(
    database_url: str, spawn: Callable[..., subprocess.Popen[str]], start_bun: StartBun
) -> None:
    url = as_url(database_url)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO analysis_jobs (id, run_id, status) "
            "SELECT gen_random_uuid(), gen_random_uuid(), 'queued' FROM generate_series(1, %s)",
            (JOBS,),
        )
        receiver = start_bun(
            "webhook-receiver.ts",
            env={"DATABASE_URL": url, "REACTOR_WEBHOOK_SECRET": SECRET, "PORT": "0"},
        )
        consumer = start_bun("notify-consumer.ts", "reactor_ops", env={"DATABASE_URL": url})
        api = start_bun("save-run.ts", env={"DATABASE_URL": url, "PORT": "0"})
        receiver_url = receiver.out.after("webhook receiver on ")
        consumer.out.after("listening on reactor_ops")
        spawn(
            "run",
            env=reactor_env(
                database_url,
                REACTOR_GRACE_SECONDS=str(GRACE),
                REACTOR_HOOKS=f"judge=webhook:{receiver_url}judge,ops=notify:reactor_ops",
                REACTOR_WEBHOOK_SECRET=SECRET,
            ),
        )
        wait_for(lambda: listening(conn))
        tabs = start_bun(
            TABS,
            env={
                "DATABASE_URL": url,
                "API_URL": api.out.after("save-run API on "),
                "JOBS": str(JOBS),
                "SAVE_RATIO": "0.7",
            },
        )
        worker = start_bun("worker.ts", "--until-idle", env={"DATABASE_URL": url})
        worker.finish()
        tabs.finish()
        wait_for(lambda: settled(conn), timeout=30)

        # At least once, from the receiver's side: a repeat of a delivered call is answered
        # and not handled again.
        run_id, job_id = conn.execute(
            "SELECT run_id, job_id FROM run_audit WHERE saved_by = 'worker' LIMIT 1"
        ).fetchone() or pytest.fail("the reactor recorded no run")
        key = f"{run_id}:{job_id}:judge"
        repeat = HookCall(str(run_id), str(job_id), "judge", 2, key)
        assert deliver(receiver_url + "judge", repeat, at=int(time.time()))[0] == 200
        receiver.stop()
        consumer.stop()

        query = REFERENCE_INSTALL.query("verdict", "audit.sql")
        verdict = Verdict(*conn.execute(query, {"grace": GRACE}).fetchall()[0])
        assert verdict.jobs == JOBS
        assert verdict.clean, verdict  # lost, dup, clobbered, early and wrong all 0
        (tab_saves,) = [line["saved"] for line in tabs.out.objects()]
        assert 0 < tab_saves < JOBS  # about 70%
        assert verdict.saved_by_client == tab_saves  # a tab's save always stays
        assert verdict.saved_by_worker == JOBS - tab_saves  # the reactor wrote the rest
        recorded = [f"{run}:{job}" for run, job, _ in worker_writes(conn)]
    handled = [line["handled"] for line in receiver.out.objects()]
    assert sorted(handled) == sorted(f"{key}:judge" for key in recorded)  # each exactly once
    received = [line["received"] for line in consumer.out.objects()]
    assert sorted(received) == sorted(f"{key}:ops" for key in recorded)


def settled(conn: psycopg.Connection[Any]) -> bool:
    """No job needs a run any more, and every hook of every recorded run is done."""
    row = conn.execute(
        """
        SELECT (SELECT count(*) FROM analysis_jobs j LEFT JOIN analysis_runs r ON r.id = j.run_id
                 WHERE r.id IS NULL AND j.status IN ('complete', 'failed')
                   AND j.doc_html IS NOT NULL AND j.results <> '{}'::jsonb),
               (SELECT count(*) FROM reactor.hook_outbox WHERE status <> 'done')
        """
    ).fetchone()
    return row == (0, 0)
