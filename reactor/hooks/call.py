"""What every hook shares, whatever its kind: the call it receives, the shape of a hook, and
the failure retrying cannot fix. The rooms below it (:mod:`.guard`, :mod:`.kinds`,
:mod:`.registry`) import it and it imports none of them.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import asdict, dataclass
from typing import ClassVar, Protocol


@dataclass(frozen=True, slots=True)
class HookCall:
    """What a hook receives: which run, which attempt, and the key to deduplicate on."""

    run_id: str
    job_id: str
    hook: str
    attempt: int
    idempotency_key: str

    def as_json(self) -> str:
        """The call as a JSON object, as the notify and webhook kinds send it."""
        return json.dumps(asdict(self), separators=(",", ":"))


class PermanentFailure(Exception):
    """A hook failure that retrying cannot fix; the row is parked at once."""


class Hook(Protocol):
    """One configured hook."""

    # The kind's name as REACTOR_HOOKS writes it (python, notify, webhook): a span's hook_kind.
    kind: ClassVar[str]
    name: str
    spec: str

    @property
    def watches_loop(self) -> bool:
        """Whether the hook watches the event loop itself while it runs (a threaded one), so
        the runner does not time its steps as well."""
        ...

    def secrets(self) -> Collection[str]:
        """The secret values the hook was made with, masked in whatever it reports."""
        ...

    async def __call__(self, call: HookCall) -> None:
        """Run once; raise to fail (PermanentFailure: do not retry)."""
        ...


def idempotency_key(run_id: str, job_id: str, hook: str, finish: int = 0) -> str:
    """Stable for one hook of one recorded (run, job) finish, whichever replica or attempt
    runs it: a job that finishes again (a retry) gets a key of its own for its later finish."""
    return f"{run_id}:{job_id}:{hook}" + (f":{finish}" if finish else "")
