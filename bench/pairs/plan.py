"""What the pairs benchmark sets up and aims for: its pairs, the broken one, its budgets."""

from __future__ import annotations

PAIRS = ("a", "b", "c")
BROKEN = "c"
IDLE_BUDGET = 14.0
LATENESS_BUDGET_S = 0.010
# "Unchanged": with the broken pair, a healthy pair's p99 is within this factor of its own
# healthy p99, or within SLACK_S of it (sub-millisecond figures move by more than any factor).
UNCHANGED = 1.5
SLACK_S = 0.001
DOC_BYTES = 4096
# The load generator this far behind its own schedule says the machine, not only the reactor,
# is the bottleneck.
SATURATED_S = 0.005
# The load's first second is reported apart from the goal's figures: each phase begins after
# the pool has idled, and psycopg_pool opens the connections a burst needs one at a time.
FIRST_S = 1.0
