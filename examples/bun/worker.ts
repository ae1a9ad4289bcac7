// The worker: takes queued jobs and finishes them. That is all it does for the reactor.
//
//   DATABASE_URL=postgres://... bun worker.ts [--until-idle]
//
// It never writes analysis_runs: the browser tab saves the run (save-run.ts) and, when no tab
// did within the grace window, the reactor records it from the job row. What the reactor needs
// from the worker is one UPDATE per job that sets, together:
//   - status 'complete' or 'failed': the trigger notifies the reactor on that transition;
//   - results (non-empty) and doc_html: a job without both needs no run;
//   - updated_at = now(): the grace window runs from it, by the database clock.
// If the results land in a later UPDATE, the trigger still queues the job then.
import { SQL } from "bun";

const sql = new SQL(process.env.DATABASE_URL!);
const concurrency = Number(process.env.WORKER_CONCURRENCY ?? 4);
const untilIdle = process.argv.includes("--until-idle"); // exit once the queue is empty
let stopping = false;
process.on("SIGTERM", () => (stopping = true)); // finish the job in hand, then exit

type Job = { id: string; run_id: string };
type Outcome = { status: "complete" | "failed"; docHtml: string | null; results: object };

/** Claim the oldest queued job; SKIP LOCKED lets any number of workers share the queue. */
async function claim(): Promise<Job | null> {
  const [job] = await sql`
    UPDATE analysis_jobs SET status = 'running', updated_at = now()
     WHERE id = (SELECT id FROM analysis_jobs WHERE status = 'queued'
                  ORDER BY created_at FOR UPDATE SKIP LOCKED LIMIT 1)
     RETURNING id, run_id`;
  return (job as Job | undefined) ?? null;
}

/** Stands in for your analysis: extract the document, then judge it. */
async function analyze(job: Job): Promise<Outcome> {
  const docHtml = `<h1>Report for ${job.run_id}</h1>`;
  await Bun.sleep(Math.random() * 20);
  if (Math.random() < 0.05) {
    // A failed job with a document and its error in the results still gets a run.
    return { status: "failed", docHtml, results: { error: "the judge timed out" } };
  }
  return { status: "complete", docHtml, results: { verdicts: 1 + Math.floor(Math.random() * 40) } };
}

async function finish(job: Job, outcome: Outcome): Promise<void> {
  await sql`
    UPDATE analysis_jobs
       SET status = ${outcome.status}, results = ${outcome.results},
           doc_html = ${outcome.docHtml}, updated_at = now()
     WHERE id = ${job.id}`;
}

async function work(): Promise<void> {
  while (!stopping) {
    const job = await claim();
    if (job === null) {
      if (untilIdle) return;
      await Bun.sleep(500); // or LISTEN for new jobs; polling keeps the example short
      continue;
    }
    const outcome = await analyze(job).catch(
      // Nothing was extracted: terminal all the same, and a job without a document needs no run.
      (error): Outcome => ({ status: "failed", docHtml: null, results: { error: `${error}` } }),
    );
    await finish(job, outcome);
  }
}

await Promise.all(Array.from({ length: concurrency }, work));
await sql.close();
