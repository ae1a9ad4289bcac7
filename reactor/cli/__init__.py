"""The ``reactor`` command: :func:`main` (:mod:`.commands`) runs what :mod:`.arguments` parses.

The upkeep commands (``migrate``, ``sweep``, ``hooks``) are :mod:`.upkeep`; what a command runs
on, resolved against the database at its start, is :mod:`.served`. :func:`cmd_status` is
``reactor status`` as the command runs it, inside a caller's event loop (the benchmarks time it).
"""

from reactor.cli.commands import cmd_status, main

__all__ = ["cmd_status", "main"]
