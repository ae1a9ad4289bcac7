"""Which variable signs which webhook: a pair's secrets are its own.

Webhook hook HOOK of pair PAIR (the pair's ``reactor_schema``) signs with the first of these
that is set (each name upper-cased, ``-`` written ``_``), and goes unsigned when none is:

1. ``REACTOR_WEBHOOK_SECRET_<PAIR>_<HOOK>``, its own;
2. ``REACTOR_WEBHOOK_SECRET_<HOOK>``, the hook's name without the pair;
3. ``REACTOR_WEBHOOK_SECRET``, the shared one.

A process serving one pair reads all three, as it always has. With several, a name without the
pair could be meant for either pair that has such a hook, and whichever read it would hand its
receiver the other's key: so such a name is read only where one pair alone could mean it.
Start is refused (ConfigError, exit 2) when:

- ``REACTOR_WEBHOOK_SECRET_<HOOK>`` is set and two pairs have a webhook hook HOOK;
- ``REACTOR_WEBHOOK_SECRET`` is set and two pairs have webhook hooks;
- a variable would sign the webhooks of two pairs (names that meet: pair ``a``'s hook ``b_c``
  and pair ``a_b``'s hook ``c`` both read the one ending ``_A_B_C``), or two webhooks of
  one pair (``ops-diag`` and ``ops_diag``) alike;
- a ``REACTOR_WEBHOOK_SECRET_<...>`` is set that no webhook reads (a typo, or a key left
  behind when the hook's own name was set), since it would otherwise lie there for a hook
  named to meet it.

So no pair's webhook ever reads a variable another pair's webhook reads. :func:`own_secrets`
gives each pair's settings the secrets its webhooks read and no other, before its hooks are
made; :func:`secret_for` is the one that signs a hook, and :func:`check_own_secrets` refuses a
secret of a pair that none of its webhooks reads. Pure; messages name variables, never their
values.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from reactor.errors import ConfigError
from reactor.settings.config import Settings
from reactor.settings.pairs import Pair
from reactor.settings.table import SETTINGS, WEBHOOK_SECRET_PREFIX

SHARED_SECRET = SETTINGS["webhook_secret"].variable
_EACH = WEBHOOK_SECRET_PREFIX + "<PAIR>_<HOOK>"


def webhook_secret_variable(hook: str) -> str:
    """The variable that holds webhook ``hook``'s own secret: ``ops-diag`` reads
    REACTOR_WEBHOOK_SECRET_OPS_DIAG."""
    return WEBHOOK_SECRET_PREFIX + hook.upper().replace("-", "_")


def pair_secret_variable(pair: str, hook: str) -> str:
    """The variable that holds webhook ``hook`` of pair ``pair``'s own secret: hook
    ``ops-diag`` of pair ``reactor`` reads REACTOR_WEBHOOK_SECRET_REACTOR_OPS_DIAG."""
    return webhook_secret_variable(f"{pair}_{hook}")


def secret_variables(pair: str, hook: str) -> tuple[str, str, str]:
    """The variables webhook ``hook`` of ``pair`` may read, the first that is set winning."""
    return pair_secret_variable(pair, hook), webhook_secret_variable(hook), SHARED_SECRET


def resolve(
    webhooks: Mapping[str, Sequence[str]], variables: Collection[str]
) -> dict[str, dict[str, str]]:
    """For each pair of ``webhooks`` (pair name: the names of its webhook hooks), the variable
    that signs each of its signed webhooks; ``variables``: the names of those set, the shared
    one included. ConfigError for every case the module docstring lists."""
    set_ = frozenset(variables)
    if len(webhooks) > 1:
        _refuse_names_without_the_pair(webhooks, set_)
    chosen: dict[str, dict[str, str]] = {pair: {} for pair in webhooks}
    readers: dict[str, list[tuple[str, str]]] = {}
    for pair, hooks in webhooks.items():
        for hook in hooks:
            read = next((name for name in secret_variables(pair, hook) if name in set_), None)
            if read is not None:
                chosen[pair][hook] = read
                readers.setdefault(read, []).append((pair, hook))
    for variable in sorted(set_ - {SHARED_SECRET}):
        who = readers.get(variable, [])
        if not who:
            raise ConfigError(
                f"{variable} is set, but no webhook hook reads it: a webhook reads {_EACH}, or "
                f"{WEBHOOK_SECRET_PREFIX}<HOOK> (each name upper-cased, - as _); correct the "
                "name, or unset it"
            )
        pairs = sorted({pair for pair, _ in who})
        if len(pairs) > 1:
            raise ConfigError(
                f"{variable} would sign webhooks of pairs {' and '.join(pairs)} alike; a pair's "
                f"secrets are its own: rename a hook so that their {_EACH} differ"
            )
        if len(who) > 1:
            names = " and ".join(repr(hook) for _, hook in who)
            raise ConfigError(f"{variable} would sign webhook hooks {names} alike; rename one")
    return chosen


def _refuse_names_without_the_pair(
    webhooks: Mapping[str, Sequence[str]], variables: frozenset[str]
) -> None:
    holders: dict[str, dict[str, str]] = {}  # REACTOR_WEBHOOK_SECRET_<HOOK>: pair: hook
    for pair, hooks in webhooks.items():
        for hook in hooks:
            holders.setdefault(webhook_secret_variable(hook), {}).setdefault(pair, hook)
    for variable in sorted(variables):
        pairs = holders.get(variable, {})
        if len(pairs) > 1:
            each = " and ".join(pair_secret_variable(p, h) for p, h in sorted(pairs.items()))
            raise ConfigError(
                f"{variable} is set, and pairs {' and '.join(sorted(pairs))} both have a webhook "
                f"hook of that name, which would read the one key; with several pairs, set "
                f"{_EACH} for each ({each}) and unset {variable}"
            )
    signing = sorted(pair for pair, hooks in webhooks.items() if hooks)
    if SHARED_SECRET in variables and len(signing) > 1:
        raise ConfigError(
            f"{SHARED_SECRET} is set, and pairs {' and '.join(signing)} both have webhook "
            f"hooks, which would read the one key; with several pairs, set {_EACH} for each "
            f"webhook hook and unset {SHARED_SECRET}"
        )


def own_secrets(
    served: Sequence[Pair], webhooks: Mapping[str, Sequence[str]], settings: Settings
) -> tuple[Pair, ...]:
    """Each of ``served`` with the secrets its own webhooks read, and no other: ``webhooks``
    names each pair's webhook hooks (:func:`reactor.hooks.spec.secret_readers`), ``settings``
    are the process's, with every secret the environment gives. :func:`resolve` says which
    variable each webhook reads, and refuses what would let a pair read another's. Each hook's
    secret is kept under its name without the pair, as :func:`secret_for` looks it up, and the
    shared one only where a hook falls back to it; the pair's hooks are then made from its
    settings alone, as a single pair's always were."""
    found = dict(settings.webhook_secrets)
    if settings.webhook_secret is not None:
        found[SHARED_SECRET] = settings.webhook_secret
    chosen = resolve({pair.name: webhooks[pair.name] for pair in served}, found)
    return tuple(
        replace(
            pair,
            settings=replace(
                pair.settings,
                webhook_secrets={
                    webhook_secret_variable(hook): found[variable]
                    for hook, variable in chosen[pair.name].items()
                    if variable != SHARED_SECRET
                },
                webhook_secret=(
                    settings.webhook_secret if SHARED_SECRET in chosen[pair.name].values() else None
                ),
            ),
        )
        for pair in served
    )


def secret_for(hook: str, own: Mapping[str, str], shared: str | None) -> str | None:
    """The secret that signs webhook ``hook``: its own (``own``, by variable, as a pair's
    settings hold them), else the shared one; None: its calls go unsigned."""
    return own.get(webhook_secret_variable(hook)) or shared


def check_own_secrets(webhooks: Sequence[str], own: Collection[str]) -> None:
    """Refuse a secret of ``own`` (variable names) that no hook of ``webhooks`` (the names of a
    pair's webhook hooks) reads, or that two of them would read."""
    # A secret for no webhook would leave the hook it was meant for signing with the shared
    # one (a typo, a renamed hook), and its receiver refusing every call for a day of retries.
    readers: dict[str, list[str]] = {}
    for name in webhooks:
        readers.setdefault(webhook_secret_variable(name), []).append(name)
    for variable in sorted(own):
        names = readers.get(variable)
        if not names:
            raise ConfigError(
                f"{variable} is set, but REACTOR_HOOKS has no webhook hook of that name (the "
                "variable is REACTOR_WEBHOOK_SECRET_ and the name upper-cased, - as _)"
            )
        if len(names) > 1:
            raise ConfigError(
                f"{variable} would sign webhook hooks {' and '.join(map(repr, names))} alike; "
                "rename one of them"
            )
