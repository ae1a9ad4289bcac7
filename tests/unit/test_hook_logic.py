"""The hooks' pure parts: parsing REACTOR_HOOKS, the retry schedule, webhook verdicts,
redaction, the operator commands' judgement, and the event-loop guard."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

import anyio
import anyio.lowlevel
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from reactor.db import HookChange, HookRow
from reactor.errors import ConfigError, UsageError
from reactor.hooks import (
    BLOCK_LIMIT_S,
    JITTER,
    KINDS,
    PERMANENT_STATUSES,
    Hook,
    NotifyHook,
    PythonHook,
    Resources,
    WebhookHook,
    parse_hooks,
    retry_delay,
    retry_span,
    webhook_verdict,
)
from reactor.hooks import ops as hook_ops
from reactor.hooks.guard import LoopGuard
from reactor.hooks.secrets import (
    SHARED_SECRET,
    pair_secret_variable,
    resolve,
    secret_variables,
)
from reactor.settings.config import Settings
from reactor.telemetry import redact

SECRET = "Zq9-pl4nted~S3cret"  # no character that splits a URL, and no identifier either


def parse(text: str, **options: Any) -> dict[str, Hook]:
    """parse_hooks without a database or an HTTP session: parsing touches neither."""
    return parse_hooks(
        text,
        Resources(
            threads=anyio.Semaphore(1),
            pool=None,
            session=cast(Any, None),
            shared_secret=options.pop("secret", None),
            **options,
        ),
    )


def refused(text: str, **options: Any) -> str:
    """The one-line ConfigError message ``text`` is refused with."""
    with pytest.raises(ConfigError) as caught:
        parse(text, **options)
    message = str(caught.value)
    assert "\n" not in message
    return message


def urls(hooks: Mapping[str, Hook]) -> dict[str, str]:
    return {name: hook.url for name, hook in hooks.items() if isinstance(hook, WebhookHook)}


# -- parsing REACTOR_HOOKS -----------------------------------------------------------------------


def test_a_hook_name_with_a_dash_starts_a_new_hook() -> None:
    # The split once took only [A-Za-z0-9_] names: this was one hook "a", whose URL's path
    # carried h2's credentials into every log line that showed it.
    hooks = parse("a=webhook:https://h/x,ops-diag=webhook:https://user:tok@h2/y")
    assert urls(hooks) == {"a": "https://h/x", "ops-diag": "https://user:tok@h2/y"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a=webhook:https://h/x?ids=1,2,3", {"a": "https://h/x?ids=1,2,3"}),
        # "b=2" is no item: what follows the comma is not name=kind:.
        ("a=webhook:https://h/x?a=1,b=2", {"a": "https://h/x?a=1,b=2"}),
        (
            "a=webhook:https://h/x?a=1,b=2, _b-2 = webhook:https://h/y",
            {"a": "https://h/x?a=1,b=2", "_b-2": "https://h/y"},
        ),
        ("a=webhook:https://h/x?a=1%2Cb=c:d", {"a": "https://h/x?a=1%2Cb=c:d"}),
    ],
)
def test_commas_that_start_no_item_stay_in_the_value(text: str, expected: dict[str, str]) -> None:
    assert urls(parse(text)) == expected


def test_every_kind_parses_next_to_the_others() -> None:
    hooks = parse(
        "judge=python:tests.hookmods:count, ops-diag=webhook:https://h/x?a=1,b=2,"
        "audit_2=notify:audit_channel"
    )
    assert list(hooks) == ["judge", "ops-diag", "audit_2"]
    assert isinstance(hooks["judge"], PythonHook)
    assert isinstance(hooks["audit_2"], NotifyHook)
    assert hooks["audit_2"].channel == "audit_channel"


@pytest.mark.parametrize("name", ["ops.diag", "9lives", "-x", "a" * 64, "óps"])
def test_a_bad_name_is_reported_not_glued_to_the_value_before_it(name: str) -> None:
    message = refused(f"a=webhook:https://h/x,{name}=webhook:https://user:{SECRET}@h2/y")
    assert "item 2 does not start with a hook name" in message
    assert SECRET not in message


@pytest.mark.parametrize(
    "text",
    [
        # Each quoted the value whole, or the part of it that a check refused.
        f"ops=notify:https://u:{SECRET}@h/x",
        f"ops=notify:{SECRET}",
        f"judge=python:https://u:{SECRET}@h/x",
        f"judge=python:tests.hookmods:{SECRET}",
        f"judge=python:{SECRET}",
        f"judge=python:tests.hookmods:count?token={SECRET}",
        # A URL without its scheme's "//" is all path to urlsplit, credentials included.
        f"w=webhook:user:{SECRET}@host/x",
        f"w=webhook:https:user:{SECRET}@host/x",
        f"w=webhook:ftp:{SECRET}",
        f"w=webhook:https://u:{SECRET}@h:port/x",
        f"w=webhook:https://u:{SECRET}@[h/x",
        f"w=webhook:https://[::1]:{SECRET}/x",
        # A bare URL as the spec: its "kind" is https, its "target" the rest.
        f"w=https://u:{SECRET}@h/x",
        # No name at all: the text before "=" is a URL's.
        f"https://u:{SECRET}@h/x?t=1",
        f"https://u:{SECRET}@h/x",
        # A comma inside a password splits it; the next "kind" is the password's middle.
        f"w=webhook:https://u:ab,c=d:{SECRET}@h/x",
        f"w=webhook:https://u:12,c=d:{SECRET}@h/x",
        f"w=webhook:https://h/x?t=1,{SECRET}=b:c",
        f"w=webhook:https://h/x?t=1,b=c:{SECRET}",
    ],
)
def test_no_parse_error_quotes_a_secret(text: str) -> None:
    assert SECRET not in refused(text)


def test_errors_still_say_what_is_wrong() -> None:
    assert "did you mean webhook?" in refused("w=webhok:https://h/x")
    assert "a URL is webhook:URL" in refused("w=https://h/x")
    assert "cannot import 'no_such_module_9'" in refused("j=python:no_such_module_9:f")
    assert "tests.hookmods has no 'nope'" in refused("j=python:tests.hookmods:nope")
    assert "tests.hookmods:not_a_function is not a function" in refused(
        "j=python:tests.hookmods:not_a_function"
    )
    assert "'ftp://h/x' is not an http(s) URL" in refused("w=webhook:ftp://h/x")
    assert "hook 'a' is defined twice" in refused("a=notify:c,a=notify:d")
    assert "item 1 is not name=kind:target" in refused("judge")


# Pieces of REACTOR_HOOKS items, secrets planted where a webhook URL keeps them; python
# targets are a fixed few, so that nothing but harmless modules is ever imported.
_URLS = [
    f"https://u:{SECRET}@h/x",
    f"https://{SECRET}@h/x",
    f"https://h/x?token={SECRET}",
    f"https://h/x?a=1,token={SECRET}",
    f"https://h/x#{SECRET}",
    f"u:{SECRET}@h/x",
    f"https:{SECRET}@h",
]
_SPECS = [
    *(f"webhook:{url}" for url in _URLS),
    *(f"notify:{url}" for url in _URLS),
    *(f"python:{url}" for url in _URLS),
    *_URLS,
    f"notify:{SECRET}",
    "notify:chan",
    "python:tests.hookmods:count",
    "python:tests.hookmods:nope",
    "python:no_such_module_9:f",
    "webhook:https://h/ok",
    f"webhok:{_URLS[0]}",
]
_ITEMS = st.builds(
    lambda name, eq, spec: f"{name}{eq}{spec}",
    st.sampled_from(["judge", "ops-diag", "a", "9x", "a.b", "", " b ", _URLS[0]]),
    st.sampled_from(["=", " = ", "", "=="]),
    st.sampled_from(_SPECS),
)


@st.composite
def _mangled(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from([",", ", ", ",,"])).join(draw(st.lists(_ITEMS, min_size=1)))
    # Then a few characters that mean something to the split or to a URL, anywhere.
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(list(",=:@/?#[]' "))) + text[at:]
    return text


@given(_mangled())
@example(f"a=webhook:https://h/x,ops-diag=webhook:https://user:{SECRET}@h2/y,b=notify:x-y")
@example(f"ops=notify:https://u:{SECRET}@h/x")
def test_no_parse_error_ever_contains_a_planted_secret(text: str) -> None:
    try:
        parse(text)
        message = ""
    except ConfigError as error:
        message = str(error)
    assert SECRET not in message


# -- the registry of kinds -------------------------------------------------------------------


def test_each_kind_makes_hooks_of_its_own_and_says_what_it_reads() -> None:
    hooks = parse("p=python:tests.hookmods:count,n=notify:chan,w=webhook:https://h/x")
    assert {name: hook.kind for name, hook in hooks.items()} == {
        "p": "python",
        "n": "notify",
        "w": "webhook",
    }
    assert all(KINDS[hook.kind].name == hook.kind for hook in hooks.values())
    # Only webhooks read secrets of their own, and they read the three variables in order.
    assert [name for name, kind in KINDS.items() if kind.reads_secrets] == ["webhook"]
    reads = KINDS["webhook"].secret_variables
    assert reads is not None
    assert reads("ana", "ops-diag") == (
        "REACTOR_WEBHOOK_SECRET_ANA_OPS_DIAG",
        "REACTOR_WEBHOOK_SECRET_OPS_DIAG",
        SHARED_SECRET,
    )


def test_an_unknown_kind_lists_every_registered_usage() -> None:
    message = refused("x=carrier_pigeon:coop")
    usages = [kind.usage for kind in KINDS.values()]
    assert message.endswith(f"use {', '.join(usages[:-1])} or {usages[-1]}")
    assert message == (
        "REACTOR_HOOKS: x: unknown kind; use python:module:function, notify:channel or webhook:url"
    )


def test_a_webhook_masks_its_secret_and_its_urls_credentials() -> None:
    (hook,) = parse(
        f"w=webhook:https://u:{SECRET}@h/x?token=tok-{SECRET}", secret="shared-1"
    ).values()
    assert {SECRET, f"tok-{SECRET}", "shared-1"} <= set(hook.secrets())
    (python,) = parse("p=python:tests.hookmods:count").values()
    assert python.secrets() == ()


# -- per-hook webhook secrets --------------------------------------------------------------------


def test_a_webhook_signs_with_its_own_secret_else_the_shared_one() -> None:
    hooks = parse(
        "judge=webhook:https://j/x,ops-diag=webhook:https://o/x,audit=webhook:https://a/x",
        secret="shared-secret",
        own_secrets={
            "REACTOR_WEBHOOK_SECRET_JUDGE": "judge-secret",
            "REACTOR_WEBHOOK_SECRET_OPS_DIAG": "ops-secret",
        },
    )
    secrets = {name: cast(WebhookHook, hook).secret for name, hook in hooks.items()}
    assert secrets == {"judge": "judge-secret", "ops-diag": "ops-secret", "audit": "shared-secret"}
    assert "judge-secret" not in repr(hooks)
    # Without a shared secret, only the hooks with their own sign.
    hooks = parse(
        "judge=webhook:https://j/x,audit=webhook:https://a/x",
        own_secrets={"REACTOR_WEBHOOK_SECRET_JUDGE": "judge-secret"},
    )
    assert [cast(WebhookHook, hook).secret for hook in hooks.values()] == ["judge-secret", None]


@pytest.mark.parametrize(
    ("hooks", "variable"),
    [
        ("judge=webhook:https://j/x", "REACTOR_WEBHOOK_SECRET_JUDEG"),  # a typo
        ("judge=python:tests.hookmods:count", "REACTOR_WEBHOOK_SECRET_JUDGE"),  # no webhook
        ("", "REACTOR_WEBHOOK_SECRET_JUDGE"),
    ],
)
def test_a_secret_for_no_webhook_is_refused(hooks: str, variable: str) -> None:
    message = refused(hooks, own_secrets={variable: SECRET})
    assert variable in message
    assert SECRET not in message


def test_a_secret_two_hook_names_share_is_refused() -> None:
    message = refused(
        "ops-diag=webhook:https://a/x,ops_diag=webhook:https://b/x",
        own_secrets={"REACTOR_WEBHOOK_SECRET_OPS_DIAG": SECRET},
    )
    assert "'ops-diag' and 'ops_diag'" in message
    assert SECRET not in message


# -- which variable signs which pair's webhook ------------------------------------------------


def test_a_pairs_webhook_reads_its_own_name_first_then_the_hooks_then_the_shared_one() -> None:
    assert pair_secret_variable("reactor_reports", "ops-diag") == (
        "REACTOR_WEBHOOK_SECRET_REACTOR_REPORTS_OPS_DIAG"
    )
    assert secret_variables("reactor", "ops") == (
        "REACTOR_WEBHOOK_SECRET_REACTOR_OPS",
        "REACTOR_WEBHOOK_SECRET_OPS",
        "REACTOR_WEBHOOK_SECRET",
    )
    one = {"reactor": ["ops", "judge", "audit"]}
    chosen = resolve(
        one,
        {"REACTOR_WEBHOOK_SECRET_REACTOR_OPS", "REACTOR_WEBHOOK_SECRET_JUDGE", SHARED_SECRET},
    )
    assert chosen == {
        "reactor": {
            "ops": "REACTOR_WEBHOOK_SECRET_REACTOR_OPS",
            "judge": "REACTOR_WEBHOOK_SECRET_JUDGE",
            "audit": SHARED_SECRET,
        }
    }
    assert resolve(one, set()) == {"reactor": {}}  # unsigned


def test_several_pairs_each_read_their_own_and_the_names_one_pair_alone_could_mean() -> None:
    webhooks = {"reactor": ["ops", "judge"], "reactor_reports": ["ops"], "quiet": []}
    chosen = resolve(
        webhooks,
        {
            "REACTOR_WEBHOOK_SECRET_REACTOR_OPS",
            "REACTOR_WEBHOOK_SECRET_REACTOR_REPORTS_OPS",
            "REACTOR_WEBHOOK_SECRET_JUDGE",  # judge: reactor's alone
        },
    )
    assert chosen == {
        "reactor": {
            "ops": "REACTOR_WEBHOOK_SECRET_REACTOR_OPS",
            "judge": "REACTOR_WEBHOOK_SECRET_JUDGE",
        },
        "reactor_reports": {"ops": "REACTOR_WEBHOOK_SECRET_REACTOR_REPORTS_OPS"},
        "quiet": {},
    }
    # The shared one, where one pair alone has webhooks.
    assert resolve({"reactor": ["ops"], "quiet": []}, {SHARED_SECRET}) == {
        "reactor": {"ops": SHARED_SECRET},
        "quiet": {},
    }


TWO_OPS = {"reactor": ["ops"], "reactor_reports": ["ops-diag", "ops"]}


@pytest.mark.parametrize(
    ("webhooks", "variables", "says"),
    [
        # Pair B names a hook like pair A's: the name without the pair is either's.
        (
            TWO_OPS,
            {"REACTOR_WEBHOOK_SECRET_OPS"},
            "REACTOR_WEBHOOK_SECRET_OPS is set, and pairs reactor and reactor_reports both have "
            "a webhook hook of that name",
        ),
        # ... even when one pair has its own: the other would read a key meant for A's.
        (
            TWO_OPS,
            {"REACTOR_WEBHOOK_SECRET_OPS", "REACTOR_WEBHOOK_SECRET_REACTOR_OPS"},
            "set REACTOR_WEBHOOK_SECRET_<PAIR>_<HOOK> for each (REACTOR_WEBHOOK_SECRET_REACTOR_OPS"
            " and REACTOR_WEBHOOK_SECRET_REACTOR_REPORTS_OPS) and unset REACTOR_WEBHOOK_SECRET_OPS",
        ),
        (
            {"reactor": ["ops"], "reactor_reports": ["judge"]},
            {SHARED_SECRET},
            "REACTOR_WEBHOOK_SECRET is set, and pairs reactor and reactor_reports both have "
            "webhook hooks",
        ),
        (
            {"reactor": ["ops"], "reactor_reports": ["judge"]},
            {SHARED_SECRET, "REACTOR_WEBHOOK_SECRET_REACTOR_OPS"},
            "unset REACTOR_WEBHOOK_SECRET",
        ),
        # Names that meet: pair a's hook b_c and pair a_b's hook c.
        (
            {"a": ["b_c"], "a_b": ["c"]},
            {"REACTOR_WEBHOOK_SECRET_A_B_C"},
            "REACTOR_WEBHOOK_SECRET_A_B_C would sign webhooks of pairs a and a_b alike",
        ),
        # Pair A's own name is pair B's hook named to meet it.
        (
            {"reactor": ["ops"], "reactor_reports": ["reactor_ops"]},
            {"REACTOR_WEBHOOK_SECRET_REACTOR_OPS"},
            "would sign webhooks of pairs reactor and reactor_reports alike",
        ),
        (
            {"reactor": ["ops-diag", "ops_diag"]},
            {"REACTOR_WEBHOOK_SECRET_REACTOR_OPS_DIAG"},
            "would sign webhook hooks 'ops-diag' and 'ops_diag' alike",
        ),
        # A key no webhook reads: a typo, or one left behind once the pair's own was set.
        (
            {"reactor": ["ops"]},
            {"REACTOR_WEBHOOK_SECRET_REACTOR_OPS", "REACTOR_WEBHOOK_SECRET_OPS"},
            "REACTOR_WEBHOOK_SECRET_OPS is set, but no webhook hook reads it",
        ),
        (
            {"reactor": ["ops"], "reactor_reports": []},
            {"REACTOR_WEBHOOK_SECRET_REACTOR_REPORTS_OPS"},
            "REACTOR_WEBHOOK_SECRET_REACTOR_REPORTS_OPS is set, but no webhook hook reads it",
        ),
    ],
)
def test_a_variable_two_pairs_could_read_is_refused(
    webhooks: dict[str, list[str]], variables: set[str], says: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve(webhooks, variables)
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)


@given(
    st.dictionaries(
        st.sampled_from(["a", "a_b", "reactor", "reactor_reports", "b"]),
        st.lists(st.sampled_from(["b", "c", "b_c", "ops", "reactor_ops", "ops-diag"]), unique=True),
        max_size=3,
    ),
    st.sets(
        st.sampled_from(
            [
                SHARED_SECRET,
                *(
                    f"REACTOR_WEBHOOK_SECRET_{suffix}"
                    for suffix in (
                        "B",
                        "C",
                        "B_C",
                        "A_B_C",
                        "OPS",
                        "REACTOR_OPS",
                        "OPS_DIAG",
                        "REACTOR_REPORTS_OPS",
                        "A_B",
                        "A_C",
                        "REACTOR_OPS_DIAG",
                    )
                ),
            ]
        )
    ),
)
def test_no_pair_ever_reads_a_variable_another_pair_reads(
    webhooks: dict[str, list[str]], variables: set[str]
) -> None:
    try:
        chosen = resolve(webhooks, variables)
    except ConfigError:
        return
    owner: dict[str, str] = {}
    for pair, signed in chosen.items():
        for hook, variable in signed.items():
            assert variable in variables
            assert variable in secret_variables(pair, hook)
            assert owner.setdefault(variable, pair) == pair
            if len(webhooks) > 1 and variable != pair_secret_variable(pair, hook):
                # A name without the pair: no other pair has what it would sign.
                others = [p for p, hooks in webhooks.items() if p != pair and hooks]
                if variable == SHARED_SECRET:
                    assert not others
                else:
                    assert not any(
                        variable in secret_variables(p, h)[1:2] for p in others for h in webhooks[p]
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
    assert span == pytest.approx(4095 + 27 * 3600)  # 28.1 h, as docs/hooks.md says
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


def retried(*pairs: tuple[int, str | None, bool]) -> str:
    """What `reactor hooks retry` says of these rows (id, status before, changed)."""
    return hook_ops.judge_changes(
        changes(*pairs), verb="re-queued", allowed=hook_ops.RETRYABLE, result="pending"
    )


def cancelled(*pairs: tuple[int, str | None, bool]) -> str:
    """What `reactor hooks cancel` says of these rows (id, status before, changed)."""
    return hook_ops.judge_changes(
        changes(*pairs), verb="cancelled", allowed=hook_ops.CANCELLABLE, result="cancelled"
    )


def test_retry_reports_what_it_requeued() -> None:
    message = retried((3, "failed", True), (9, "cancelled", True))
    assert message == "re-queued 2 hook call(s): 3, 9"


def test_an_unknown_id_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match=r"no hook row with id 77; nothing was re-queued") as err:
        retried((3, "failed", False), (77, None, False))
    assert err.value.exit_code == 2


def test_a_row_in_the_wrong_state_is_named() -> None:
    with pytest.raises(UsageError, match=r"hook row 4 is running: only pending or failed rows"):
        cancelled((4, "running", False))


def test_cancelling_a_cancelled_row_is_fine() -> None:
    message = cancelled((4, "pending", True), (5, "cancelled", False))
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
            await anyio.sleep(BLOCK_LIMIT_S / 2)  # waiting is not blocking

    async def rude() -> None:
        await anyio.lowlevel.checkpoint()
        time.sleep(BLOCK_LIMIT_S * 1.5)  # noqa: ASYNC251 -- the bug under test
        await anyio.lowlevel.checkpoint()

    await LoopGuard(polite(), reports.append)
    assert reports == []
    await LoopGuard(rude(), reports.append)
    assert len(reports) == 1
    assert reports[0] >= BLOCK_LIMIT_S * 1.5


@pytest.mark.anyio
async def test_the_guard_passes_errors_and_cancellation_through() -> None:
    async def fails() -> None:
        await anyio.lowlevel.checkpoint()
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        await LoopGuard(fails(), lambda _: None)

    cleaned = anyio.Event()

    async def waits() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            cleaned.set()

    with anyio.move_on_after(0.05) as scope:
        await LoopGuard(waits(), lambda _: None)
    assert scope.cancelled_caught
    assert cleaned.is_set()
