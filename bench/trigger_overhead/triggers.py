"""The reactor's triggers on a job table, read back as installed and put in place again in
each of the forms trigger_overhead and app_cost compare."""

from __future__ import annotations

from bench.conn import Conn
from reactor.install import REFERENCE_INSTALL, sql

# The reactor's triggers on the job table as installed, whatever this version calls them, with
# the definitions of their functions.
REACTOR_TRIGGERS = """
SELECT t.tgname, pg_get_triggerdef(t.oid), t.tgfoid::regproc::text, pg_get_functiondef(t.tgfoid)
  FROM pg_trigger t
 WHERE t.tgrelid = %s::regclass AND NOT t.tgisinternal AND t.tgname LIKE 'reactor%%'
 ORDER BY t.tgname
"""

# The floor of a notifying install: a trigger that does nothing but notify on the transition
# into a terminal status, on the reactor's channel with the reactor's payload, so that the
# listening replica receives the same messages. It pays what PostgreSQL makes every notifying
# commit pay (the trigger call, the NOTIFY queued, the commit-time lock on the cluster's
# notification queue, the listener signalled); nothing of the reactor's own.
NOTIFY_ONLY = """
CREATE OR REPLACE FUNCTION public.bench_notify_only() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], NEW.id::text || '@' || extract(epoch FROM NEW.updated_at));
    RETURN NULL;
END
$f$;
CREATE TRIGGER bench_notify_only AFTER UPDATE ON analysis_jobs FOR EACH ROW
    WHEN (NEW.status IN ('complete', 'failed') AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION public.bench_notify_only('analysis_jobs_terminal');
CREATE TRIGGER bench_notify_only_insert AFTER INSERT ON analysis_jobs FOR EACH ROW
    WHEN (NEW.status IN ('complete', 'failed'))
    EXECUTE FUNCTION public.bench_notify_only('analysis_jobs_terminal');
"""


class Triggers:
    """The reactor's triggers on a job table as installed; ``quiet`` is the product's own
    no-NOTIFY mode (``reactor migrate --no-notify``): the jobs are queued, never notified."""

    def __init__(self, table: str, definitions: list[tuple[str, str]]) -> None:
        self.table = table
        self.definitions = definitions  # (name, CREATE TRIGGER ...)

    @property
    def names(self) -> list[str]:
        """The trigger names."""
        return [name for name, _ in self.definitions]

    @classmethod
    async def read(cls, conn: Conn, table: str = "analysis_jobs") -> Triggers:
        """Read the triggers installed on ``table``."""
        cur = await conn.execute(REACTOR_TRIGGERS, (table,))
        rows = await cur.fetchall()
        if not rows:
            raise RuntimeError(f"no reactor trigger on {table}; nothing to measure")
        return cls(table, [(name, trigger_sql) for name, trigger_sql, _, _ in rows])

    async def install(self, conn: Conn, config: str) -> None:
        """Put ``with``, ``quiet``, ``notify_only`` or ``without`` in place."""
        for name in self.names:
            await conn.execute(f"DROP TRIGGER IF EXISTS {name} ON {self.table}")
        for name in ("bench_notify_only", "bench_notify_only_insert"):
            await conn.execute(f"DROP TRIGGER IF EXISTS {name} ON {self.table}")
        if config == "notify_only":
            if self.table != "analysis_jobs":
                raise ValueError("the notify-only floor is written for the reference tables")
            await conn.execute(NOTIFY_ONLY)
        elif config == "with":
            for _, trigger_sql in self.definitions:
                await conn.execute(trigger_sql)
        elif config == "quiet":
            # What `reactor migrate --no-notify` installs: the same triggers, with no channel,
            # rendered for the mapping in force (the reference).
            text = REFERENCE_INSTALL.render(sql.repeatable().text, channel="")
            await conn.execute(text)
