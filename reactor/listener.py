"""The LISTEN side: one dedicated connection that turns notifications into job ids.

A notification is only a hint that a job may need its timer; the payload is parsed, never
trusted, and garbage is counted and logged while the loop carries on.

The listener proves itself rather than assuming: between waits for notifications it runs
``SELECT 1`` on its own connection (a frozen backend or a silent partition raises nothing in
``notifies()``) and sends itself a probe notification through the pool, which must come back
over LISTEN. A connection that fails the first check is replaced; one that passes the first but
not the second is listening somewhere notifications never arrive, which is what a
transaction-mode pooler does, so the listener reports itself degraded and the service falls back
to polling until probes arrive again.
"""

from __future__ import annotations

import logging
import math
import re
import uuid
from collections.abc import Callable
from typing import Literal

import anyio
import anyio.abc
import psycopg
import psycopg.sql
import tenacity

from reactor import db
from reactor.config import Settings
from reactor.errors import ReactorError
from reactor.metrics import Metrics

log = logging.getLogger(__name__)

State = Literal["connecting", "listening", "degraded"]

_PROBE = "probe:"


_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def parse_payload(payload: str) -> str | None:
    """The job id a payload names, in canonical lower-case form, or None if it names none.

    Only the trigger's exact form is accepted: uuid.UUID alone would also take braces, URNs
    and non-ASCII digits.
    """
    if len(payload) > 64:  # a job id is 36 characters; don't even strip a flood
        return None
    text = payload.strip()
    return text.lower() if _UUID.fullmatch(text) else None


_EPOCH = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,9})?")


def parse_hint(payload: str) -> tuple[str, float | None] | None:
    """The job a payload names and, when it carries it, the job's updated_at as unix seconds.

    The trigger sends ``<job id>@<updated_at>``; a bare job id (an older trigger) is accepted
    too, without a time. Anything else names no job.
    """
    job, sep, at = payload.partition("@")
    job_id = parse_payload(job)
    if job_id is None:
        return None
    if not sep:
        return job_id, None
    return (job_id, float(at)) if _EPOCH.fullmatch(at) else None


class Listener:
    """Keeps a LISTEN connection alive and hands job ids (with updated_at) to ``on_job``."""

    def __init__(
        self,
        settings: Settings,
        database: db.Database,
        metrics: Metrics,
        *,
        on_job: Callable[[str, float | None], None],
        on_listening: Callable[[], None],
        dsn: str,
    ) -> None:
        self.settings = settings
        self.database = database
        self.metrics = metrics
        self.on_job = on_job
        self.on_listening = on_listening
        self.dsn = dsn
        self.state: State = "connecting"
        self.connections = 0
        self._probe_token: str | None = None
        self._probe_sent = -math.inf
        # Whether a probe came back on the current connection: readiness waits for it.
        self.proven = False

    @property
    def delivering(self) -> bool:
        """False when notifications cannot be relied on: not connected, or probes lost."""
        return self.state == "listening"

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen for ever, reconnecting with jittered backoff; started once LISTEN is up."""
        started = False
        previous_pid = 0
        while True:
            conn = await self._connect()
            try:
                async with conn:
                    # Quoted: pg_notify() takes the name verbatim, LISTEN would fold its case.
                    await conn.execute(
                        psycopg.sql.SQL("LISTEN {}").format(
                            psycopg.sql.Identifier(self.settings.channel)
                        )
                    )
                    self.connections += 1
                    self.proven = False
                    if self.connections > 1:
                        self.metrics.reconnects.inc()
                        log.info("listener reconnected", extra={"channel": self.settings.channel})
                        await self._end_previous_session(conn, previous_pid)
                    previous_pid = conn.info.backend_pid
                    self._set_state("listening")
                    # Re-arm from the database: anything notified while we were away is found.
                    self.on_listening()
                    if not started:
                        task_status.started()
                        started = True
                    await self._listen(conn)
            except (psycopg.Error, OSError, TimeoutError) as error:
                log.warning(
                    "listener connection lost, reconnecting", extra={"error": db.first_line(error)}
                )
            finally:
                self._set_state("connecting")

    async def _end_previous_session(self, conn: db.AnyConnection, pid: int) -> None:
        # A connection we gave up on (a silent partition, a probe timeout) may still be alive on
        # the server, registered as a listener that reads nothing: it holds the NOTIFY queue
        # back until the server's keepalives notice. End it now; a role may end its own sessions.
        try:
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE pid = %s AND application_name = 'reactor-listener'",
                (pid,),
            )
        except psycopg.Error as error:
            log.debug("could not end the previous listener session", extra={"error": str(error)})

    async def _connect(self) -> db.AnyConnection:
        retrying = tenacity.AsyncRetrying(
            wait=tenacity.wait_random_exponential(multiplier=0.1, max=5),
            retry=tenacity.retry_if_exception_type(ReactorError),
            before_sleep=lambda state: log.warning(
                "listener cannot connect, retrying",
                extra={"attempt": state.attempt_number, "error": str(state.outcome.exception())}
                if state.outcome
                else {},
            ),
        )
        async for attempt in retrying:
            with attempt:
                return await db.connect(self.dsn, "listener")
        raise AssertionError("unreachable: retrying never stops")

    async def _listen(self, conn: db.AnyConnection) -> None:
        await self._send_probe()
        while True:
            async for notify in conn.notifies(timeout=self._wait_time()):
                self._receive(notify.payload)
            # Shielded, like the probe: a stop arriving mid-statement waits for it (bounded by
            # the probe timeout) rather than interrupting psycopg's own cancel, which closes
            # the connection and logs a warning.
            with anyio.CancelScope(shield=True), anyio.fail_after(self.settings.probe_timeout):
                await conn.execute("SELECT 1")
            self._check_probe()
            if anyio.current_time() - self._probe_sent >= self.settings.probe_interval:
                await self._send_probe()

    def _wait_time(self) -> float:
        # Wake up in time to judge the outstanding probe, or to send the next one.
        now = anyio.current_time()
        if self._probe_token is not None:
            return max(0.01, self._probe_sent + self.settings.probe_timeout - now)
        return max(0.01, self._probe_sent + self.settings.probe_interval - now)

    def _receive(self, payload: str) -> None:
        if payload.startswith(_PROBE):
            self.metrics.notifications.labels("probe").inc()
            if payload[len(_PROBE) :] == self._probe_token:
                self._probe_token = None
                self.proven = True
                if self.state == "degraded":
                    log.info("probe notifications arrive again; back to LISTEN")
                self._set_state("listening")
            return
        hint = parse_hint(payload)
        if hint is None:
            self.metrics.notifications.labels("rejected").inc()
            log.warning(
                "ignored a notification that names no job",
                extra={"channel": self.settings.channel, "payload": payload[:80]},
            )
            return
        self.metrics.notifications.labels("accepted").inc()
        self.on_job(*hint)

    def _check_probe(self) -> None:
        late = anyio.current_time() - self._probe_sent > self.settings.probe_timeout
        if self._probe_token is not None and late:
            self._probe_token = None
            if self.state != "degraded":
                log.error(
                    "LISTEN is connected but our probe notification never arrived: a "
                    "transaction-mode pooler (PgBouncer, Supavisor, RDS Proxy) drops them; set "
                    "REACTOR_LISTEN_DATABASE_URL to a direct connection or REACTOR_MODE=poll; "
                    "polling meanwhile",
                    extra={"channel": self.settings.channel},
                )
            self._set_state("degraded")

    async def _send_probe(self) -> None:
        token = uuid.uuid4().hex
        self._probe_sent = anyio.current_time()
        try:
            # Bounded: while the pool waits for a connection, this loop reads nothing.
            with anyio.CancelScope(shield=True), anyio.fail_after(self.settings.probe_timeout):
                await self.database.notify(self.settings.channel, _PROBE + token)
        except (psycopg.Error, OSError, TimeoutError) as error:
            log.warning("could not send the delivery probe", extra={"error": db.first_line(error)})
            return
        self._probe_token = token

    def _set_state(self, state: State) -> None:
        self.state = state
        self.metrics.listener_up.set(1 if state == "listening" else 0)
