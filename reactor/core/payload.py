"""What a notification says, read without trusting it, and the LISTEN statements; pure.

A payload is only a hint that a job may need its timer: only the trigger's exact form names a
job, anything else names none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import psycopg.sql

from reactor.core.ownership import CHANNEL_MAX_BYTES

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_INTEGER = re.compile(r"-?[0-9]{1,19}")
# The integer types a job id may have, each with the bound of its values: -bound <= id < bound.
# An id its column cannot hold names no job, and sent on to the verify statement it would fail
# that statement's cast, and with it every real hint of the batch.
_INTEGER_BOUND = {"smallint": 2**15, "integer": 2**31, "bigint": 2**63}
# A text id is taken as sent, up to this long: the trigger sends what the column holds.
_TEXT_ID_MAX_CHARS = 512


def parse_payload(payload: str, id_type: str) -> str | None:
    """The job id a payload names, in the canonical text form of ``id_type`` (uuid, bigint or
    text; a uuid's lower-case form), or None if it names none: also an integer the column's
    type cannot hold.

    Only the trigger's exact form is accepted: uuid.UUID alone would also take braces, URNs
    and non-ASCII digits.
    """
    if id_type == "text":
        return payload if 0 < len(payload) <= _TEXT_ID_MAX_CHARS else None
    if len(payload) > 64:  # a job id is at most 36 characters; don't even strip a flood
        return None
    text = payload.strip()
    bound = _INTEGER_BOUND.get(id_type)
    if bound is not None:
        if not _INTEGER.fullmatch(text):
            return None
        value = int(text)
        return str(value) if -bound <= value < bound else None
    return text.lower() if _UUID.fullmatch(text) else None


_EPOCH = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,9})?")


def parse_hint(payload: str, id_type: str) -> tuple[str, float | None] | None:
    """The job a payload names and, when it carries it, the job's updated_at as unix seconds.

    The trigger sends ``<job id>@<updated_at>``; a bare job id (an older trigger) is accepted
    too, without a time. Anything else names no job.
    """
    # The time is after the last "@": a text id may hold one.
    job, sep, at = payload.rpartition("@")
    if not sep:
        job = payload
    job_id = parse_payload(job, id_type)
    if job_id is None:
        return None
    if not sep:
        return job_id, None
    return (job_id, float(at)) if _EPOCH.fullmatch(at) else None


PROBE = "probe:"
# What a replica sends with its id on the membership channel: with its first heartbeat (the
# health query) and when it stops cleanly (the replica_leave query). A replica id is 64
# characters at most.
JOINED = "joined:"
LEFT = "left:"
# Said on the membership channel by the poll that rings a silent doorbell (the poll_queue query).
RANG = "rang:"
_REPLICA_MAX_CHARS = 64


@dataclass(frozen=True, slots=True)
class ProbeHeard:
    """A probe notification, with its token."""

    token: str


@dataclass(frozen=True, slots=True)
class ReplicaSaid:
    """A replica said it ``left`` (or joined); only its heartbeat row can confirm it."""

    replica: str
    left: bool


@dataclass(frozen=True, slots=True)
class Rang:
    """A replica rang the doorbell of ``channel`` awake (reactor.insurance.doorbell): the others
    poll the queue from now on. Only the bell's row can confirm it."""

    channel: str


@dataclass(frozen=True, slots=True)
class JobNotified:
    """A notification named a job: its canonical id and, when sent, its updated_at in unix
    seconds (the sender's word). Not yet a :class:`reactor.claim.sources.Hint`: that is what a
    source knows of a job once it is read (a notification's, once verified)."""

    job: str
    updated_at: float | None


Said = ProbeHeard | ReplicaSaid | Rang | JobNotified


def read(payload: str, id_type: str, *, membership: bool = True) -> Said | None:
    """What ``payload`` says: a probe, a replica joining or leaving or a doorbell rung (only
    where ``membership`` is heard), a job hint; None when it names nothing."""
    if payload.startswith(PROBE):
        return ProbeHeard(payload[len(PROBE) :])
    if membership:
        for prefix, left in ((LEFT, True), (JOINED, False)):
            if payload.startswith(prefix):
                return ReplicaSaid(payload[len(prefix) : len(prefix) + _REPLICA_MAX_CHARS], left)
        if payload.startswith(RANG):
            return Rang(payload[len(RANG) : len(RANG) + CHANNEL_MAX_BYTES])
    hint = parse_hint(payload, id_type)
    return None if hint is None else JobNotified(*hint)


def listen_statement(channel: str) -> psycopg.sql.Composed:
    """LISTEN on ``channel``."""
    # Quoted: pg_notify() takes the name verbatim, LISTEN would fold its case.
    return psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel))


def change_statement(*, listen: list[str], unlisten: list[str]) -> psycopg.sql.Composed | None:
    """The LISTENs and UNLISTENs that take a session from one set of channels to another, as
    one simple-protocol round trip; None when there is nothing to change."""
    parts = [listen_statement(name) for name in listen] + [
        psycopg.sql.SQL("UNLISTEN {}").format(psycopg.sql.Identifier(name)) for name in unlisten
    ]
    return psycopg.sql.SQL("; ").join(parts) if parts else None
