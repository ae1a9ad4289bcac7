// Browser tabs, for the end-to-end test: each finished job's tab saves its run, with
// probability SAVE_RATIO, a moment after the job finished, through the app's API (save-run.ts).
// Exits once JOBS jobs have finished and every save is answered; prints how many it saved.
import { SQL } from "bun";

const sql = new SQL(process.env.DATABASE_URL!);
const api = process.env.API_URL!;
const jobs = Number(process.env.JOBS);
const ratio = Number(process.env.SAVE_RATIO ?? 0.7);
const maxDelayMs = Number(process.env.MAX_DELAY_MS ?? 300);

async function save(id: string): Promise<void> {
  await Bun.sleep(Math.random() * maxDelayMs);
  const response = await fetch(`${api}api/jobs/${id}/run`, { method: "POST" });
  if (response.status !== 204) throw new Error(`save of ${id}: HTTP ${response.status}`);
}

const seen = new Set<string>();
const saves: Promise<void>[] = [];
while (seen.size < jobs) {
  const finished = await sql`SELECT id FROM analysis_jobs WHERE status IN ('complete', 'failed')`;
  for (const { id } of finished) {
    if (seen.has(id)) continue;
    seen.add(id);
    if (Math.random() < ratio) saves.push(save(id));
  }
  await Bun.sleep(20);
}
await Promise.all(saves);
console.log(JSON.stringify({ saved: saves.length }));
await sql.close();
