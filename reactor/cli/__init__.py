"""The ``reactor`` command: :func:`main` (:mod:`.commands`) runs what :mod:`.arguments` parses.

The upkeep commands (``migrate``, ``sweep``, ``hooks``) are :mod:`.upkeep`; what a command runs
on, resolved against the database at its start, is :mod:`.served`.
"""

from reactor.cli.commands import main

__all__ = ["main"]
