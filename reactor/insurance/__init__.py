"""The insurance passes: what finds the jobs notifications missed, each on its own schedule.

The health check, the poll, the fallback scan, the reconcile and the hook retention purge, and
the one schedule (:mod:`.cadence`) that runs them through the pool.
"""
