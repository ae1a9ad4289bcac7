"""Follow-up hooks: what runs after the reactor records a run (an LLM judge, ops diagnosis).

Hooks are durable: the record statement queues one ``reactor.hook_outbox`` row per run and hook,
and the :class:`.HookRunner` of any replica leases rows with ``SKIP LOCKED``, runs them with a
timeout and bounded concurrency, and settles each attempt: done, retried on a capped
exponential schedule with jitter (:func:`.retry_delay`), or parked as failed after
``REACTOR_HOOK_MAX_ATTEMPTS``. A row whose run holds a later job by the time it is claimed is
settled as superseded and never called. No transaction stays open while a hook runs. A replica
killed mid-hook loses nothing: its lease expires and another replica takes the row (unless
that was the row's last attempt: see below). On SIGTERM, unfinished leases are handed back at
once. :class:`~reactor.insurance.retention.HookRetention` deletes settled rows once
``REACTOR_HOOK_RETENTION_SECONDS`` have passed; replicas purging at once share the rows.

Delivery is at least once. Every call carries an idempotency key, stable across retries and
replicas, so a hook can deduplicate.

``REACTOR_HOOKS`` is ``name=kind:target`` items separated by commas. A hook name is a letter or
``_``, then up to 62 letters, digits, ``_`` or ``-``. A comma ends an item only where what
follows it looks like the start of the next one: ``name=kind:``, that is a name, ``=``, letters
and ``:`` (``,ops-diag=webhook:``), spaces allowed around the ``=``. So that a mistyped name is
reported rather than glued to the value before it, "a name" here is anything without space,
comma or ``=``. Any other comma belongs to the value: a webhook URL's query may hold
``?ids=1,2`` or ``?a=1,b=2``. A comma inside a value that is followed by ``x=letters:`` would
start an item; write it ``%2C`` (any URL may).

Kinds:

- ``python:module:function``: ``async def function(call: HookCall)`` runs on the event loop;
  a plain ``def`` runs in a worker thread, so blocking code cannot stall the reactor. Raising
  fails the attempt (:class:`PermanentFailure`: parked at once).
- ``notify:channel``: ``pg_notify(channel, json)``, for a worker that judges on its own.
- ``webhook:url``: a JSON POST, signed (:mod:`reactor.hooks.signature`) with the hook's own
  secret (:mod:`reactor.hooks.secrets`: its pair's ``REACTOR_WEBHOOK_SECRET_<PAIR>_<HOOK>``,
  its ``REACTOR_WEBHOOK_SECRET_<HOOK>``, or the shared ``REACTOR_WEBHOOK_SECRET``); unsigned
  when none is set. 2xx is success; redirects are never
  followed; :func:`webhook_verdict` says which other statuses are permanent.

Nothing a hook reports is shown whole: URLs are cut to scheme, host and path, and configured
secrets are masked (:mod:`reactor.telemetry.redact`), in logs, stored errors and status alike. A
configuration error names the hook and what is wrong, and quotes only what cannot be secret
(names, module paths): never a URL but as scheme, host and path, never a target that failed
its check.

The rooms, each importing only those before it: :mod:`.call` (what a hook is and receives),
:mod:`.guard` (the event loop's watch over a hook's code), :mod:`.kinds` (the three kinds),
:mod:`.secrets` (which variable signs which webhook), :mod:`.registry` (each kind's parser, the
resources it takes and the secrets it reads), :mod:`.spec` (``REACTOR_HOOKS`` parsed into
hooks through the registry), :mod:`.runner`
(claiming, running and settling attempts: a duty of the replica's cadence).

A hook that raises anything but the runner's own cancellation, ``SystemExit`` and
``KeyboardInterrupt`` included, has failed an attempt like any other. A hook that kills its
process (``os._exit``, a crash in a C extension) leaves its row running until the lease runs
out; that counts as an attempt too, and the claim parks a row whose last attempt ended so
instead of handing it to the next replica to kill.
"""

from __future__ import annotations

from reactor.hooks.call import Hook, HookCall, PermanentFailure, idempotency_key
from reactor.hooks.guard import BLOCK_LIMIT_S
from reactor.hooks.kinds import (
    IDEMPOTENCY_HEADER,
    PERMANENT_STATUSES,
    NotifyHook,
    PythonHook,
    WebhookHook,
    webhook_verdict,
)
from reactor.hooks.registry import KINDS, Kind, Resources
from reactor.hooks.runner import JITTER, OUTCOMES, HookRunner, retry_delay, retry_span
from reactor.hooks.spec import check_hooks, open_hooks, parse_hooks

__all__ = [
    "BLOCK_LIMIT_S",
    "IDEMPOTENCY_HEADER",
    "JITTER",
    "KINDS",
    "OUTCOMES",
    "PERMANENT_STATUSES",
    "Hook",
    "HookCall",
    "HookRunner",
    "Kind",
    "NotifyHook",
    "PermanentFailure",
    "PythonHook",
    "Resources",
    "WebhookHook",
    "check_hooks",
    "idempotency_key",
    "open_hooks",
    "parse_hooks",
    "retry_delay",
    "retry_span",
    "webhook_verdict",
]
