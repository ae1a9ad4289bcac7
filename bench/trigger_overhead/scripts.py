"""trigger_overhead's pgbench scripts on the reference tables, and how many clients run them."""

from __future__ import annotations

CLIENTS = 6
PROGRESS_JOBS = 10_000

PROGRESS_SCRIPT = f"""\\set n random(1, {PROGRESS_JOBS})
UPDATE analysis_jobs SET updated_at = now() WHERE id = md5('p' || :n)::uuid;
"""

# :k is a per-client counter (pgbench keeps a client's variables between transactions), so each
# terminal transition finishes a job that is still running.
FINISH_SCRIPT = """\\set k :k + 1
UPDATE analysis_jobs SET status = 'complete', results = '{"verdicts": 3}', updated_at = now()
 WHERE id = md5('f' || :client_id || '-' || :k)::uuid;
"""
