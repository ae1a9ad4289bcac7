"""The hooks' pure parts: the retry schedule, webhook verdicts, redaction, the operator commands'
judgement, and the event-loop guard."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

import anyio
import anyio.lowlevel
import pytest

from reactor import hook_ops, redact
from reactor.config import Settings
from reactor.db import HookChange, HookRow
from reactor.errors import UsageError
from reactor.hooks import (
    BLOCK_LIMIT,
    JITTER,
    PERMANENT_STATUSES,
    _LoopGuard,
    retry_delay,
    retry_span,
    webhook_verdict,
)

# -- the retry schedule --------------------------------------------------------------------------


def test_retry_delay_doubles_then_is_capped() -> None:
    delays = [retry_delay(n, base=1.0, cap=3600.0, jitter=0.0) for n in range(1, 16)]
    assert delays[:4] == [1.0, 2.0, 4.0, 8.0]
    assert delays[11] == 2048.0
    assert delays[12:] == [3600.0] * 3
    assert retry_delay(1000, base=1.0, cap=3600.0, jitter=0.0) == 3600.0  # no overflow
    assert retry_delay(3, base=0.0, cap=3600.0, jitter=0.5) == 0.0


def test_jitter_only_lengthens_and_by_at_most_a_quarter() -> None:
    for n in (1, 5, 20):
        low = retry_delay(n, base=1.0, cap=3600.0, jitter=0.0)
        high = retry_delay(n, base=1.0, cap=3600.0, jitter=1.0)
        assert high == pytest.approx(low * (1 + JITTER))
        assert low < retry_delay(n, base=1.0, cap=3600.0, jitter=0.3) < high
    assert JITTER == 0.25


def test_the_default_schedule_outlasts_a_day() -> None:
    s = Settings()
    span = retry_span(attempts=s.hook_max_attempts, base=s.hook_backoff, cap=s.hook_max_backoff)
    # At least 24 hours between the first try and the last, even with no jitter at all...
    assert span >= 24 * 3600
    assert span == pytest.approx(4095 + 27 * 3600)  # 28.1 h, as README says
    # ...and the early retries are quick: a blip costs seconds, not an hour.
    assert retry_span(attempts=6, base=s.hook_backoff, cap=s.hook_max_backoff) == 31.0


# -- webhook verdicts ----------------------------------------------------------------------------


@pytest.mark.parametrize("status", [200, 201, 202, 204, 299])
def test_2xx_is_done(status: int) -> None:
    assert webhook_verdict(status) == "done"


@pytest.mark.parametrize("status", [301, 308, 410])
def test_moved_for_good_and_gone_are_permanent(status: int) -> None:
    assert webhook_verdict(status) == "permanent"


@pytest.mark.parametrize(
    "status", [300, 302, 303, 307, 400, 401, 403, 404, 408, 409, 422, 429, 500, 502, 503, 504]
)
def test_everything_else_is_retried(status: int) -> None:
    # 401, 403 and 404 are what a receiver answers mid-deploy or mid-key-rotation.
    assert webhook_verdict(status) == "retry"


def test_the_permanent_set_is_small() -> None:
    assert frozenset({301, 308, 410}) == PERMANENT_STATUSES


# -- redaction -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "https://user:pa55word@judge.example/hook?token=abc123#frag",
            "https://judge.example/hook",
        ),
        ("http://127.0.0.1:8080/judge?x=1", "http://127.0.0.1:8080/judge"),
        ("https://[::1]:9000/p", "https://[::1]:9000/p"),
        ("https://host", "https://host"),
        ("http://h:notaport/x", "<malformed URL>"),
    ],
)
def test_safe_url_keeps_scheme_host_and_path(url: str, shown: str) -> None:
    assert redact.safe_url(url) == shown


def test_scrub_cuts_every_url_and_masks_secrets() -> None:
    text = (
        "Client error for url 'https://u:hunter22@api.example/v1/judge?api_key=zz-key-9' "
        "after postgresql://app:dbpass1@db/app; the token zz-key-9 was refused"
    )
    secrets = redact.known_secrets(
        webhook_secret="whsec-1234",
        dsns=["postgresql://app:dbpass1@db/app", None],
        urls=["https://u:hunter22@api.example/v1/judge?api_key=zz-key-9"],
    )
    assert secrets == {"whsec-1234", "dbpass1", "hunter22", "zz-key-9"}
    shown = redact.scrub(text + " whsec-1234", secrets)
    for secret in secrets:
        assert secret not in shown
    assert "https://api.example/v1/judge" in shown
    assert "postgresql://db/app" in shown
    assert shown.endswith("the token *** was refused ***")


def test_short_values_are_not_masked() -> None:
    # "?page=1" must not turn every 1 in a message into ***.
    assert redact.url_secrets("https://h/p?page=1&v=ok&key=long-enough") == {"long-enough"}
    assert redact.dsn_secrets("host=h dbname=d user=u") == set()
    assert redact.dsn_secrets("host=h password=s3cr3t") == {"s3cr3t"}


# -- hooks list / retry / cancel -----------------------------------------------------------------


def changes(*pairs: tuple[int, str | None, bool]) -> list[HookChange]:
    return [HookChange(i, status, changed) for i, status, changed in pairs]


def test_retry_reports_what_it_requeued() -> None:
    message = hook_ops.judge_changes(
        changes((3, "failed", True), (9, "cancelled", True)),
        verb="re-queued",
        allowed=hook_ops.RETRYABLE,
        result="pending",
    )
    assert message == "re-queued 2 hook call(s): 3, 9"


def test_an_unknown_id_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match=r"no hook row with id 77; nothing was re-queued") as err:
        hook_ops.judge_changes(
            changes((3, "failed", False), (77, None, False)),
            verb="re-queued",
            allowed=hook_ops.RETRYABLE,
            result="pending",
        )
    assert err.value.exit_code == 2


def test_a_row_in_the_wrong_state_is_named() -> None:
    with pytest.raises(UsageError, match=r"hook row 4 is running: only pending or failed rows"):
        hook_ops.judge_changes(
            changes((4, "running", False)),
            verb="cancelled",
            allowed=hook_ops.CANCELLABLE,
            result="cancelled",
        )


def test_cancelling_a_cancelled_row_is_fine() -> None:
    message = hook_ops.judge_changes(
        changes((4, "pending", True), (5, "cancelled", False)),
        verb="cancelled",
        allowed=hook_ops.CANCELLABLE,
        result="cancelled",
    )
    assert message == "cancelled 1 hook call(s): 4; already so: 5"


@pytest.mark.parametrize("bad", ["abc", "-3", "0", "1.5", "", "٣"])
def test_ids_must_be_positive_integers(bad: str) -> None:
    with pytest.raises(UsageError, match="is not a hook row id"):
        hook_ops.parse_ids(["1", bad])


def test_listing_json_names_the_next_attempt() -> None:
    now = datetime(2025, 1, 1, tzinfo=UTC)

    def row(status: str) -> HookRow:
        return HookRow(
            1, "judge", status, 2, str(uuid.uuid4()), str(uuid.uuid4()),
            "HTTP 500 from https://u:pw12345@h/p?t=zzzz9",
            now, now.replace(hour=1) if status == "running" else None, now, now,
        )  # fmt: skip

    listed = hook_ops.as_json([row("pending"), row("running"), row("failed")], 3, 1)
    assert (listed["total"], listed["failed"]) == (3, 1)
    hooks = listed["hooks"]
    assert [h["next_attempt_at"] for h in hooks] == [
        now.isoformat(),
        now.replace(hour=1).isoformat(),
        None,
    ]
    assert {h["last_error"] for h in hooks} == {"HTTP 500 from https://h/p"}


# -- the event-loop guard ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_blocking_step_is_reported_and_awaits_are_not() -> None:
    reports: list[float] = []

    async def polite() -> None:
        for _ in range(5):
            await anyio.sleep(BLOCK_LIMIT / 2)  # waiting is not blocking

    async def rude() -> None:
        await anyio.lowlevel.checkpoint()
        time.sleep(BLOCK_LIMIT * 1.5)  # noqa: ASYNC251 -- the bug under test
        await anyio.lowlevel.checkpoint()

    await _LoopGuard(polite(), reports.append)
    assert reports == []
    await _LoopGuard(rude(), reports.append)
    assert len(reports) == 1
    assert reports[0] >= BLOCK_LIMIT * 1.5


@pytest.mark.anyio
async def test_the_guard_passes_errors_and_cancellation_through() -> None:
    async def fails() -> None:
        await anyio.lowlevel.checkpoint()
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        await _LoopGuard(fails(), lambda _: None)

    cleaned = anyio.Event()

    async def waits() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            cleaned.set()

    with anyio.move_on_after(0.05) as scope:
        await _LoopGuard(waits(), lambda _: None)
    assert scope.cancelled_caught
    assert cleaned.is_set()
