// Consumes a `notify:` hook (REACTOR_HOOKS="ops=notify:reactor_ops").
//
//   DATABASE_URL=postgres://... bun notify-consumer.ts reactor_ops
//
// The reactor counts a notify hook done once its pg_notify() commits, and PostgreSQL delivers a
// NOTIFY only to sessions listening at that moment: a call sent while this process is down or
// reconnecting is gone. Use it to wake a worker that then reads its own durable state (say, the
// runs it has not judged yet), and catch up in `onlisten` after every (re)connect. When each
// call must arrive, use a `webhook:` hook instead: those are retried until answered.
import postgres from "postgres";
import { type HookCall, parseHookCall } from "./reactor-hooks.ts";

export async function consume(
  databaseUrl: string,
  channel: string,
  handle: (call: HookCall) => void,
  onListening: () => void,
): Promise<postgres.Sql> {
  // LISTEN needs a direct connection: through a transaction-mode pooler (PgBouncer,
  // Supavisor, RDS Proxy) it "succeeds" and nothing ever arrives.
  const sql = postgres(databaseUrl, { max: 1 });
  // Delivery is at least once: skip a key seen before (a real consumer keeps the keys where it
  // records its work, not in memory).
  const seen = new Set<string>();
  await sql.listen(
    channel,
    (payload) => {
      const call = parseHookCall(payload);
      if (call === null) return console.error(`ignored a payload that is no hook call: ${payload}`);
      if (seen.has(call.idempotency_key)) return;
      seen.add(call.idempotency_key);
      handle(call);
    },
    onListening, // called after every (re)connect: the place to catch up
  );
  return sql;
}

if (import.meta.main) {
  const channel = process.argv[2] ?? "reactor_ops";
  await consume(
    process.env.DATABASE_URL!,
    channel,
    (call) => console.log(JSON.stringify({ received: call.idempotency_key })),
    () => console.log(`listening on ${channel}`),
  );
}
