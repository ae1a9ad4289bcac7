"""What the demo, the tests and the benchmarks share: the simulated app (:mod:`.app`) that
writes jobs and saves runs as a real app would, and the audit (:mod:`.audit`) that checks the
invariants on what it left."""
