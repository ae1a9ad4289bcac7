"""``python -m reactor`` is the ``reactor`` command."""

from reactor.cli import main

main()
