import { describe, expect, test } from "bun:test";
import { parseHookCall, sign, verify } from "./reactor-hooks.ts";

const secret = "s3cret";
const body = new TextEncoder().encode('{"run_id":"r"}');
const bytes = (text: string) => new TextEncoder().encode(text);

describe("verify", () => {
  test("accepts what the reactor signs", () => {
    // Computed by the reactor: reactor.hooks.signature.sign("s3cret", body, timestamp=1700000000).
    const header =
      "t=1700000000,v1=c2074ca39f54940fb90bce3df92f9f576deb86f6a77d7b8a03bed7279b0b7e47";
    expect(sign(secret, body, 1700000000)).toBe(header);
    expect(verify(secret, header, body, 1700000000)).toEqual({ ok: true });
  });

  test("refuses a tampered body, a wrong secret and a forged timestamp", () => {
    const header = sign(secret, body, 1000);
    expect(verify(secret, header, bytes('{"run_id":"x"}'), 1000).ok).toBe(false);
    expect(verify("other", header, body, 1000).ok).toBe(false);
    expect(verify(secret, header.replace("t=1000", "t=1001"), body, 1000).ok).toBe(false);
  });

  test("refuses a replay past the tolerance, either way", () => {
    const header = sign(secret, body, 1000);
    expect(verify(secret, header, body, 1300, 300).ok).toBe(true);
    expect(verify(secret, header, body, 1301, 300)).toEqual({
      ok: false,
      reason: "timestamp outside the tolerance (a replay?)",
    });
    expect(verify(secret, header, body, 699, 300).ok).toBe(false);
  });

  const zeros = "0".repeat(64);
  test.each([null, "", "sha256=abc", "t=1000", `v1=${zeros}`, `t=x,v1=${zeros}`])(
    "refuses a malformed header %p",
    (header) => {
      const verdict = verify(secret, header, body, 1000);
      expect(verdict).toEqual({ ok: false, reason: "missing or malformed signature" });
    },
  );
});

describe("parseHookCall", () => {
  const call = {
    run_id: "r",
    job_id: "j",
    hook: "judge",
    attempt: 1,
    idempotency_key: "r:j:judge",
  };

  test("takes a hook call", () => {
    expect(parseHookCall(JSON.stringify(call))).toEqual(call);
  });

  test.each([
    "not json",
    "null",
    "[]",
    JSON.stringify({ ...call, idempotency_key: "r:j:other" }),
    JSON.stringify({ ...call, attempt: "1" }),
    JSON.stringify({ ...call, run_id: undefined }),
  ])("refuses %p", (text) => {
    expect(parseHookCall(text)).toBeNull();
  });
});
