import { describe, expect, test } from "bun:test";
import { IDEMPOTENCY_HEADER, type HookCall, SIGNATURE_HEADER, sign } from "./reactor-hooks.ts";
import { type Once, receiver } from "./webhook-receiver.ts";

const secret = "s3cret";
const call: HookCall = {
  run_id: "r",
  job_id: "j",
  hook: "judge",
  attempt: 1,
  idempotency_key: "r:j:judge",
};

type Tweaks = { at?: number; body?: string; signedBody?: string; key?: string };

/** A request as the reactor sends it, signed at unix time 5000 unless `at` says otherwise. */
function request(options: Tweaks = {}): Request {
  const body = options.body ?? JSON.stringify(call);
  const signed = new TextEncoder().encode(options.signedBody ?? body);
  return new Request("http://receiver/judge", {
    method: "POST",
    body,
    headers: {
      [SIGNATURE_HEADER]: sign(secret, signed, options.at ?? 5000),
      [IDEMPOTENCY_HEADER]: options.key ?? call.idempotency_key,
    },
  });
}

function setup(handle: (call: HookCall) => Promise<void> = async () => {}) {
  const handled: string[] = [];
  const keys = new Set<string>();
  const once: Once = async (key, work) => {
    if (keys.has(key)) return false;
    await work(); // the key is kept only once the work succeeded, as the database version does
    keys.add(key);
    return true;
  };
  const handler = receiver({
    secret,
    once,
    handle: async (c) => {
      await handle(c);
      handled.push(c.idempotency_key);
    },
    now: () => 5000,
  });
  return { handler, handled };
}

describe("receiver", () => {
  test("handles a call once, however often it arrives", async () => {
    const { handler, handled } = setup();
    const first = await handler(request());
    expect(first.status).toBe(200);
    expect(await first.json()).toEqual({ duplicate: false });
    const again = await handler(request({ at: 5010 })); // a retry: same key, fresh signature
    expect(await again.json()).toEqual({ duplicate: true });
    expect(handled).toEqual(["r:j:judge"]);
  });

  test("refuses a tampered body", async () => {
    const { handler, handled } = setup();
    const tampered = JSON.stringify({ ...call, attempt: 2 });
    const response = await handler(request({ body: tampered, signedBody: JSON.stringify(call) }));
    expect(response.status).toBe(401);
    expect(handled).toEqual([]);
  });

  test("refuses a replay past the tolerance", async () => {
    const { handler, handled } = setup();
    expect((await handler(request({ at: 5000 - 301 }))).status).toBe(401);
    expect(handled).toEqual([]);
  });

  test("refuses a body that is not the call its header names", async () => {
    const { handler } = setup();
    expect((await handler(request({ key: "r:j:other" }))).status).toBe(400);
    expect((await handler(request({ body: "[]" }))).status).toBe(400);
  });

  test("answers 5xx when the work fails, so the reactor retries it", async () => {
    let fail = true;
    const { handler, handled } = setup(async () => {
      if (fail) throw new Error("judge unavailable");
    });
    expect((await handler(request())).status).toBe(500);
    fail = false;
    expect(await (await handler(request())).json()).toEqual({ duplicate: false });
    expect(handled).toEqual(["r:j:judge"]);
  });

  test("takes only POST", async () => {
    const { handler } = setup();
    expect((await handler(new Request("http://receiver/judge"))).status).toBe(405);
  });
});
