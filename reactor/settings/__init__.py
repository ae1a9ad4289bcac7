"""What a process is told: its settings (:mod:`.config`), its DSNs (:mod:`.dsn`), and the
job/artifact pairs it serves (:mod:`.pairs`)."""
