"""What a process is told: its settings, each declared once in :mod:`.table` (a row:
:mod:`.setting`, its text parsed by :mod:`.parsers`), read by :mod:`.environment` into the
dataclasses of :mod:`.config`; its DSNs (:mod:`.dsn`); and the job/artifact pairs it serves
(:mod:`.pairs`)."""
