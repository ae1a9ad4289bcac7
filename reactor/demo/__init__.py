"""The demo on an embedded PostgreSQL: :class:`EmbeddedPostgres` (:mod:`.embedded`) is the
throwaway server it runs on, which the tests and the benchmarks start too."""

from reactor.demo.embedded import EmbeddedPostgres

__all__ = ["EmbeddedPostgres"]
