// Receives the reactor's `webhook:` hook (REACTOR_HOOKS="judge=webhook:http://host:8080/judge").
//
//   REACTOR_WEBHOOK_SECRET=... DATABASE_URL=postgres://... bun webhook-receiver.ts
//
// Answers: 2xx once the call was handled (or was a duplicate); 401 for a forged or replayed
// request; 400 for a body that is not a hook call. The reactor retries 5xx, 408 and 429 with
// backoff, and parks a call as failed on any other 4xx, so a bug here must not answer 4xx.
import { SQL } from "bun";
import {
  type HookCall,
  IDEMPOTENCY_HEADER,
  parseHookCall,
  SIGNATURE_HEADER,
  verify,
} from "./reactor-hooks.ts";

/** Runs `work` unless `key` was handled before; resolves false for a duplicate. */
export type Once = (key: string, work: () => Promise<void>) => Promise<boolean>;

export type ReceiverOptions = {
  secret: string;
  once: Once;
  handle: (call: HookCall) => Promise<void>;
  now?: () => number; // unix seconds
  toleranceSeconds?: number;
};

/** The request handler, separate from the server so tests can call it directly. */
export function receiver(options: ReceiverOptions): (request: Request) => Promise<Response> {
  const now = options.now ?? (() => Math.floor(Date.now() / 1000));
  return async (request) => {
    if (request.method !== "POST") return new Response("POST only\n", { status: 405 });
    // The signature covers the bytes as sent: verify those, then parse.
    const body = new Uint8Array(await request.arrayBuffer());
    const signature = request.headers.get(SIGNATURE_HEADER);
    const verdict = verify(options.secret, signature, body, now(), options.toleranceSeconds);
    if (!verdict.ok) return new Response(`${verdict.reason}\n`, { status: 401 });
    const call = parseHookCall(new TextDecoder().decode(body));
    if (call === null || request.headers.get(IDEMPOTENCY_HEADER) !== call.idempotency_key) {
      return new Response("not a hook call\n", { status: 400 });
    }
    try {
      const handled = await options.once(call.idempotency_key, () => options.handle(call));
      return Response.json({ duplicate: !handled });
    } catch (error) {
      console.error(`${call.idempotency_key}: ${error}`);
      return new Response("failed; retry\n", { status: 500 }); // the reactor retries a 5xx
    }
  };
}

/**
 * Deduplication that holds across restarts and any number of receivers: the key's row is
 * inserted in the same transaction as the work. A concurrent duplicate waits on that row and
 * then finds it; if the work fails, the rollback removes the key and the retry runs it again.
 */
export function onceInDatabase(sql: SQL): Once {
  return (key, work) =>
    sql.begin(async (tx) => {
      const fresh = await tx`
        INSERT INTO webhook_receipts (idempotency_key) VALUES (${key})
        ON CONFLICT DO NOTHING RETURNING 1`;
      if (fresh.length === 0) return false;
      await work();
      return true;
    });
}

if (import.meta.main) {
  const secret = process.env.REACTOR_WEBHOOK_SECRET;
  if (!secret) {
    console.error("webhook-receiver: set REACTOR_WEBHOOK_SECRET to the reactor's secret");
    process.exit(2);
  }
  const sql = new SQL(process.env.DATABASE_URL!);
  // In your app this table belongs in a migration.
  await sql`CREATE TABLE IF NOT EXISTS webhook_receipts (
              idempotency_key text PRIMARY KEY, received_at timestamptz NOT NULL DEFAULT now())`;
  const server = Bun.serve({
    hostname: process.env.HOST ?? "127.0.0.1",
    port: Number(process.env.PORT ?? 8080),
    fetch: receiver({
      secret,
      once: onceInDatabase(sql),
      // Your work goes here: grade the run, open a ticket. It runs inside the receipt's
      // transaction, so a failure leaves no receipt behind and the reactor's retry redoes it.
      handle: async (call) => console.log(JSON.stringify({ handled: call.idempotency_key })),
    }),
  });
  console.log(`webhook receiver on ${server.url}`);
}
