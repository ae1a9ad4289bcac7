// The browser tab's save, as the app's API runs it when the tab sees its job finish.
//
//   DATABASE_URL=postgres://... bun save-run.ts      # POST /api/jobs/<job id>/run
//
// The save is an upsert that always wins: saved_by = 'client' on insert and on conflict alike.
// The reactor never overwrites a client row (nor a legacy one with saved_by NULL), so the tab
// may save before the reactor, after it (replacing the reactor's row), or while the reactor
// writes: the tab's row is the one that stays. A save that forgets saved_by = 'client' in the
// DO UPDATE leaves a worker-marked row that a later re-analysis may replace.
import { SQL } from "bun";

/** Save the run of a finished job from its row; false when the job is not finished. */
export async function saveRun(sql: SQL, jobId: string): Promise<boolean> {
  const saved = await sql`
    INSERT INTO analysis_runs (id, job_id, doc_html, results, saved_by)
    SELECT run_id, id, doc_html, results, 'client' FROM analysis_jobs
     WHERE id = ${jobId} AND status IN ('complete', 'failed') AND deleted_at IS NULL
    ON CONFLICT (id) DO UPDATE
       SET job_id = EXCLUDED.job_id, doc_html = EXCLUDED.doc_html,
           results = EXCLUDED.results, saved_by = 'client', updated_at = now()
    RETURNING id`;
  return saved.length > 0;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

if (import.meta.main) {
  const sql = new SQL(process.env.DATABASE_URL!);
  const server = Bun.serve({
    hostname: process.env.HOST ?? "127.0.0.1",
    port: Number(process.env.PORT ?? 3000),
    routes: {
      "/api/jobs/:id/run": {
        POST: async (request) =>
          UUID.test(request.params.id) && (await saveRun(sql, request.params.id))
            ? new Response(null, { status: 204 })
            : new Response("no finished job with that id\n", { status: 404 }),
      },
    },
    fetch: () => new Response("not found\n", { status: 404 }),
  });
  console.log(`save-run API on ${server.url}`);
}
