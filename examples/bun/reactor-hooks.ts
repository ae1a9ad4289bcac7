// What the reactor's follow-up hooks send, and how a receiver checks a webhook's signature.
//
// Every hook call is the JSON object below, for a `notify:` hook as the NOTIFY payload and for
// a `webhook:` hook as the POST body. Delivery is at least once: the same call can arrive again
// (a retry, a replica that died after the call succeeded), so deduplicate on idempotency_key,
// which is "<run_id>:<job_id>:<hook>" for every attempt. A webhook also gets it in the
// Idempotency-Key header.
//
// With REACTOR_WEBHOOK_SECRET set, every webhook carries
//   X-Reactor-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>
// Signing the timestamp with the body lets a receiver refuse a captured request replayed later;
// the HMAC alone would accept it for ever.
import { createHmac, timingSafeEqual } from "node:crypto";

export const SIGNATURE_HEADER = "X-Reactor-Signature";
export const IDEMPOTENCY_HEADER = "Idempotency-Key";

export type HookCall = {
  run_id: string;
  job_id: string;
  hook: string;
  attempt: number; // 1 for the first try, counted across replicas
  idempotency_key: string;
};

/** The call in `text`, or null when it is not one (never trust a payload's shape). */
export function parseHookCall(text: string): HookCall | null {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return null;
  }
  const call = value as Partial<HookCall> | null;
  const ok =
    typeof call?.run_id === "string" &&
    typeof call.job_id === "string" &&
    typeof call.hook === "string" &&
    Number.isInteger(call.attempt) &&
    call.idempotency_key === `${call.run_id}:${call.job_id}:${call.hook}`;
  return ok ? (call as HookCall) : null;
}

// How far a request's timestamp may be from our clock, either way: clock skew plus transit.
export const DEFAULT_TOLERANCE_SECONDS = 300;

export type Verdict = { ok: true } | { ok: false; reason: string };

/** The header value for `body` signed at `timestamp`: what the reactor sends (tests use it). */
export function sign(secret: string, body: Uint8Array, timestamp: number): string {
  return `t=${timestamp},v1=${hmacHex(secret, timestamp, body)}`;
}

/**
 * Check `header` against the raw `body` bytes, as received: never a re-serialised JSON, whose
 * bytes may differ. `now` is unix seconds, passed in so tests can move the clock.
 */
export function verify(
  secret: string,
  header: string | null,
  body: Uint8Array,
  now: number,
  toleranceSeconds = DEFAULT_TOLERANCE_SECONDS,
): Verdict {
  const fields = new Map(
    (header ?? "").split(",").map((part) => {
      const at = part.indexOf("=");
      return [part.slice(0, at).trim(), part.slice(at + 1).trim()] as const;
    }),
  );
  const t = fields.get("t") ?? "";
  const v1 = fields.get("v1") ?? "";
  if (!/^\d{1,12}$/.test(t) || !/^[0-9a-f]{64}$/.test(v1)) {
    return { ok: false, reason: "missing or malformed signature" };
  }
  const timestamp = Number(t);
  if (Math.abs(now - timestamp) > toleranceSeconds) {
    return { ok: false, reason: "timestamp outside the tolerance (a replay?)" };
  }
  // Constant time: a comparison that stops at the first differing byte would tell an attacker,
  // through the response time, how much of a forged signature was right.
  const expected = Buffer.from(hmacHex(secret, timestamp, body), "hex");
  if (!timingSafeEqual(expected, Buffer.from(v1, "hex"))) {
    return { ok: false, reason: "signature does not match the body" };
  }
  return { ok: true };
}

function hmacHex(secret: string, timestamp: number, body: Uint8Array): string {
  return createHmac("sha256", secret).update(`${timestamp}.`).update(body).digest("hex");
}
