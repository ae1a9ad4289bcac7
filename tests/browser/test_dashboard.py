"""The operator's page, as a person uses it: a real Chromium opens the page of a running
``reactor run`` on a real PostgreSQL with a backlog, a failed hook and a job set aside, reads
it, signs in, clicks, and the database rows change. Without the token there is nothing to click,
and a POST is refused.

Chromium is Debian's (``.ci/run`` installs it), driven by Playwright; missing, the tests skip,
or fail under CI. A screenshot of each page is kept in the test's tmp dir, and copied to
``REACTOR_TEST_ARTIFACTS`` when that is set.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests import tools
from tests.acceptance.conftest import reactor_env
from tests.helpers import Conn, finish, new_job
from tests.integration.support import add_job, scalar
from tests.polling import wait_for
from tests.ports import free_port, http_status

playwright = pytest.importorskip("playwright.sync_api")

Spawn = Callable[..., subprocess.Popen[str]]

REJECT_FLAGGED = (
    "ALTER TABLE analysis_runs ADD CONSTRAINT no_flagged CHECK (NOT results ? 'flagged')"
)


def keep(shot: Path) -> None:
    """Copy a screenshot to REACTOR_TEST_ARTIFACTS, when set."""
    target = os.environ.get("REACTOR_TEST_ARTIFACTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(target) / shot.name)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = tools.chromium()
    with playwright.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


def incident(conn: Conn) -> tuple[list[uuid.UUID], uuid.UUID]:
    """Three finished jobs whose runs the app's own rule rejects (a backlog, two hours old, that
    gets set aside), and one good job whose hook will fail; returns (rejected, good)."""
    conn.execute(REJECT_FLAGGED)
    rejected = [
        add_job(conn, status="complete", results={"flagged": True}, age=7200 - i)[0]
        for i in range(3)
    ]
    good, _ = new_job(conn)
    return rejected, good


def start(spawn: Spawn, database_url: str, **variables: str) -> tuple[subprocess.Popen[str], str]:
    """A reactor with its probes and its page each on a free port; returns it and the page's
    base URL, once the probes say it is ready."""
    probes, page = free_port(), free_port()
    env = reactor_env(
        database_url,
        REACTOR_HTTP_ADDR=f"127.0.0.1:{probes}",
        REACTOR_DASHBOARD_ADDR=f"127.0.0.1:{page}",
        REACTOR_GRACE_SECONDS="0.2",
        REACTOR_HOOKS="judge=python:tests.hookmods:always_fail",
        REACTOR_HOOK_MAX_ATTEMPTS="1",
        **variables,
    )
    proc = spawn("run", env=env)
    ready = f"http://127.0.0.1:{probes}/readyz"
    wait_for(lambda: http_status(ready) == 200 or proc.poll() is not None, 60)
    assert proc.poll() is None, proc.communicate()[1]
    return proc, f"http://127.0.0.1:{page}"


def settle(conn: Conn, good: uuid.UUID, rejected: list[uuid.UUID]) -> int:
    """Finish the good job and wait for its hook to park and the rejected ones to be set aside;
    returns the failed hook row's id."""
    finish(conn, good)

    def ready() -> bool:
        parked = scalar(conn, "SELECT count(*) FROM reactor.hook_outbox WHERE status = 'failed'")
        held = scalar(conn, "SELECT count(*) FROM reactor.set_aside")
        return bool(parked == 1 and held == len(rejected))

    wait_for(ready, 30)
    hook_id: int = scalar(conn, "SELECT id FROM reactor.hook_outbox WHERE status = 'failed'")
    return hook_id


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return out + err


def test_an_operator_reads_the_page_signs_in_and_acts(
    database_url: str, spawn: Spawn, browser: Any, tmp_path: Path
) -> None:
    token = "dash-" + secrets.token_hex(16)
    with psycopg.connect(database_url, autocommit=True) as conn:
        rejected, good = incident(conn)
        proc, base = start(spawn, database_url, REACTOR_DASHBOARD_TOKEN=token)
        hook_id = settle(conn, good, rejected)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto(base + "/")

        # At a glance: the verdict, and why, in words.
        verdict = page.locator("#verdict")
        assert verdict.locator(".state").inner_text().lower() == "at risk"
        assert "cannot be written and are set aside" in verdict.inner_text()
        # The backlog and its oldest job against the trim horizon.
        jobs = page.locator("#jobs").inner_text()
        assert "3\ndue, no run yet" in jobs
        oldest = re.compile(r"\b2h( \d+s)? oldest due, against a 1d trim horizon")
        assert oldest.search(" ".join(jobs.split()))
        assert str(rejected[0]) in jobs  # the oldest due job, and first in the set-aside list
        assert "violates check constraint" in page.locator("#set-aside + p + table").inner_text()
        # What this replica recorded last, and its lateness chart.
        assert "recorded" in jobs
        assert str(good) in jobs
        assert page.locator("#jobs svg rect.bar").count() == 17
        # Replicas: this one, live, listening.
        replicas = page.locator("#replicas").inner_text()
        assert "1 live, 1 LISTEN session(s); mode listen." in replicas
        assert "(this one)" in replicas
        assert "LISTEN listening and proven" in replicas
        # Hooks: the failed row with its error, attempts and next try.
        hooks = page.locator("#hooks").inner_text()
        assert "judge says no" in hooks
        assert "none: parked until retried" in hooks
        assert "Reconcile" in page.content()

        # Read-only until signed in: no buttons but the way to sign in.
        assert page.locator("#hooks button").count() == 0
        page.click("text=sign in to act")
        page.fill("input[name=token]", "not-the-token-at-all")
        page.click("button[type=submit]")
        assert "That is not the token." in page.content()
        page.fill("input[name=token]", token)
        page.click("button[type=submit]")
        page.wait_for_url(base + "/")
        shot = tmp_path / "dashboard.png"
        page.screenshot(path=str(shot), full_page=True)
        keep(shot)

        # Retry the failed hook: the row is re-queued on a fresh schedule.
        def hook(column: str) -> Any:
            query = f"SELECT {column} FROM reactor.hook_outbox WHERE id = %s"
            return scalar(conn, query, (hook_id,))

        assert hook("retry_base") == 0
        page.locator(
            f"#hooks form[action='/actions/hooks/retry']:has(input[value='{hook_id}']) button"
        ).click()
        page.wait_for_load_state()
        assert f"re-queued 1 hook call(s): {hook_id}" in page.locator(".banner.good").inner_text()
        assert hook("retry_base") == 1
        # It runs again at once, and fails again (this hook always does).
        wait_for(lambda: hook("attempts") == 2)

        # The app's rule is fixed; release the oldest job set aside: its run is written.
        conn.execute("ALTER TABLE analysis_runs DROP CONSTRAINT no_flagged")
        page.goto(base + "/")
        page.locator(
            f"form[action='/actions/set-aside/release']:has(input[value='{rejected[0]}']) button"
        ).click()
        page.wait_for_load_state()
        assert f"released job {rejected[0]}" in page.locator(".banner.good").inner_text()
        wait_for(
            lambda: (
                scalar(
                    conn,
                    "SELECT count(*) FROM analysis_runs r JOIN analysis_jobs j ON j.run_id = r.id"
                    " WHERE j.id = %s AND r.saved_by = 'worker'",
                    (rejected[0],),
                )
                == 1
            )
        )

        # A form from elsewhere, cookie or not, is refused.
        forged = page.request.post(
            base + "/actions/hooks/cancel",
            form={"id": str(hook_id)},
            headers={"Origin": "https://evil.example"},
        )
        assert forged.status == 403

        # Signing out ends the session in the reactor too: the cookie, kept, opens nothing.
        (kept,) = [c for c in page.context.cookies() if c["name"] == "reactor_dashboard"]
        page.goto(base + "/")
        csrf = page.locator("input[name=csrf]").first.get_attribute("value")
        page.click("text=sign out")
        page.wait_for_url(base + "/")
        assert page.locator("#hooks button").count() == 0
        assert "sign in to act" in page.content()
        replayed = page.request.post(
            base + "/actions/hooks/cancel",
            form={"id": str(hook_id), "csrf": str(csrf)},
            headers={"Cookie": f"reactor_dashboard={kept['value']}"},
        )
        assert replayed.status == 403
        assert "sign in" in replayed.text()
        page.close()
        output = stop(proc)
    assert "dashboard action" in output
    assert f'"hook_ids": [{hook_id}]' in output
    assert token not in output


def test_without_a_token_the_page_is_read_only(
    database_url: str, spawn: Spawn, browser: Any, tmp_path: Path
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        rejected, good = incident(conn)
        proc, base = start(spawn, database_url)
        hook_id = settle(conn, good, rejected)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto(base + "/")
        assert page.locator("#verdict .state").inner_text().lower() == "at risk"
        assert "judge says no" in page.locator("#hooks").inner_text()
        assert page.locator("button").count() == 0
        assert "sign in" not in page.content()
        refused = page.request.post(base + "/actions/hooks/retry", form={"id": str(hook_id)})
        assert refused.status == 403
        assert "read-only" in refused.text()
        shot = tmp_path / "dashboard-read-only.png"
        page.screenshot(path=str(shot), full_page=True)
        keep(shot)
        page.close()
        query = "SELECT status FROM reactor.hook_outbox WHERE id = %s"
        assert scalar(conn, query, (hook_id,)) == "failed"
        stop(proc)
