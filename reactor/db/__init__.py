"""Every conversation with PostgreSQL: connections, the pool, the named queries and migrations.

Everything else in the reactor calls this package and never builds SQL of its own. It is split
by concern, and every public name is re-exported here, so callers write ``db.X``:

- :mod:`.session`: how a connection is opened, configured and pooled;
- :mod:`.calls`: how each statement runs on one, and the connectors the queries run on;
- :mod:`.rows`: the rows the queries return, decoded by column name;
- :mod:`.queries`: :class:`Database`, the named queries of ``triggers/*.sql`` as its methods,
  each written once, bound to an install, to where they run and to its pair's settings
  (:mod:`.named`); the queue's and the installation's are there, and each other concern's in
  a module of its own:
- :mod:`.health`: the replica's health check and heartbeat, and the checks of several pairs in
  one statement; :mod:`.reconcile`, the shared pass over the job table; :mod:`.outbox`, the hook
  outbox's rows;
- :mod:`.migrations`: the migration engine behind `reactor migrate`; :mod:`.online_ddl`, how it
  changes the app's tables while the app writes; :mod:`.indexes`, the indexes it builds there,
  as data; and :mod:`.script`, the script `reactor migrate --print` prints instead;
- :mod:`.fit`: the mapping checked against the catalog before anything runs, and
  :mod:`.catalog`, what it reads there (a table's kind, owner and columns).
"""

from __future__ import annotations

from reactor.db.calls import (
    CALL_TIMEOUT_S,
    Connector,
    Dedicated,
    Pooled,
    Target,
    call,
    connector,
    read_only_server,
    run_bare,
    run_pinned,
    statement_refused,
)
from reactor.db.catalog import owners_note
from reactor.db.drift import REINSTALLED, mapping_changed, require_current_mapping
from reactor.db.fit import fit
from reactor.db.health import HealthCheck, health_of_pairs, health_params
from reactor.db.migrations import Migrated, migrate, require_schema, schema_version
from reactor.db.named import BATCH_BYTES
from reactor.db.pool import make_pool, own_check
from reactor.db.queries import Database
from reactor.db.reconcile import RECONCILE_CHUNK, RECONCILE_LEASE_S
from reactor.db.rows import (
    Health,
    HookChange,
    HookClaim,
    HookRow,
    JobOutcome,
    JobTrigger,
    Outcome,
    QueuedJob,
    ReconcileOutcome,
    ReconcilePass,
    ReconcileStep,
    Verified,
)
from reactor.db.script import OUTSIDE_TRANSACTION, migration_script
from reactor.db.session import (
    DATABASE_ERRORS,
    LISTENER_APPLICATION_NAME,
    LISTENER_ROLE,
    PREPARE_THRESHOLD,
    AnyConnection,
    StandbyPolicy,
    arrived,
    configure,
    configure_pooled,
    connect,
    conninfo,
    end_listener_session,
    first_line,
    is_own_session,
    kept_aside,
    session_identity,
    standby_problem,
    until_readable,
)

__all__ = [
    "BATCH_BYTES",
    "CALL_TIMEOUT_S",
    "DATABASE_ERRORS",
    "LISTENER_APPLICATION_NAME",
    "LISTENER_ROLE",
    "OUTSIDE_TRANSACTION",
    "PREPARE_THRESHOLD",
    "RECONCILE_CHUNK",
    "RECONCILE_LEASE_S",
    "REINSTALLED",
    "AnyConnection",
    "Connector",
    "Database",
    "Dedicated",
    "Health",
    "HealthCheck",
    "HookChange",
    "HookClaim",
    "HookRow",
    "JobOutcome",
    "JobTrigger",
    "Migrated",
    "Outcome",
    "Pooled",
    "QueuedJob",
    "ReconcileOutcome",
    "ReconcilePass",
    "ReconcileStep",
    "StandbyPolicy",
    "Target",
    "Verified",
    "arrived",
    "call",
    "configure",
    "configure_pooled",
    "connect",
    "connector",
    "conninfo",
    "end_listener_session",
    "first_line",
    "fit",
    "health_of_pairs",
    "health_params",
    "is_own_session",
    "kept_aside",
    "make_pool",
    "mapping_changed",
    "migrate",
    "migration_script",
    "own_check",
    "owners_note",
    "read_only_server",
    "require_current_mapping",
    "require_schema",
    "run_bare",
    "run_pinned",
    "schema_version",
    "session_identity",
    "standby_problem",
    "statement_refused",
    "until_readable",
]
