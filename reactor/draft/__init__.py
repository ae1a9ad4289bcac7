"""``reactor init``: a mapping file drafted from the catalog.

:mod:`~reactor.draft.facts` holds what the catalog says as plain values, :mod:`~reactor.draft.
catalog` reads them, :mod:`~reactor.draft.links` finds the pairs and their key columns,
:mod:`~reactor.draft.propose` writes the draft (through :mod:`~reactor.draft.toml`), and
:mod:`~reactor.draft.command` runs the command. Only ``catalog`` and ``command`` do I/O.
"""
