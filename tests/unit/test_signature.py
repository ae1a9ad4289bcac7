"""Webhook signatures: the header format, checked against an independent implementation (here,
and the TypeScript of docs/hooks.md run by node when it is installed), and replay protection."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from reactor.hooks.signature import SignatureError, check_signature, sign, verify_signature

SECRET = "whsec_test_Zq8"
BODY = b'{"run_id":"r","job_id":"j","hook":"judge","attempt":1,"idempotency_key":"r:j:judge"}'
T = 1_700_000_000
HOOKS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "hooks.md"


def independent(secret: str, header: str, body: bytes) -> tuple[int, bool]:
    """Parse and check the header from the documented format alone: (t, signature matches)."""
    match = re.fullmatch(r"t=(\d+),v1=([0-9a-f]{64})", header)
    assert match, header
    t = int(match.group(1))
    mac = hmac.new(secret.encode(), str(t).encode() + b"." + body, hashlib.sha256).hexdigest()
    return t, hmac.compare_digest(mac, match.group(2))


def test_header_matches_the_documented_format() -> None:
    header = sign(SECRET, BODY, timestamp=T)
    assert independent(SECRET, header, BODY) == (T, True)
    assert independent("another secret", header, BODY) == (T, False)


@pytest.mark.parametrize("offset", [0, 1, 299.9, 300, -300])
def test_within_the_tolerance_verifies(offset: float) -> None:
    header = sign(SECRET, BODY, timestamp=T)
    assert verify_signature(SECRET, header, BODY, now=T + offset)
    assert check_signature(SECRET.encode(), header, BODY, now=T + offset) == T


@pytest.mark.parametrize("offset", [300.5, 3600, -301])
def test_a_replay_past_the_tolerance_is_refused(offset: float) -> None:
    header = sign(SECRET, BODY, timestamp=T)
    assert not verify_signature(SECRET, header, BODY, now=T + offset)
    with pytest.raises(SignatureError, match="tolerance"):
        check_signature(SECRET, header, BODY, now=T + offset)
    assert verify_signature(SECRET, header, BODY, now=T + offset, tolerance=abs(offset) + 1)


def test_a_changed_timestamp_or_body_is_refused() -> None:
    header = sign(SECRET, BODY, timestamp=T)
    # Moving t forward to dodge the tolerance breaks the signature: t is signed.
    replayed = header.replace(f"t={T}", f"t={T + 3600}")
    assert not verify_signature(SECRET, replayed, BODY, now=T + 3600)
    assert not verify_signature(SECRET, header, BODY + b" ", now=T)
    assert not verify_signature("wrong", header, BODY, now=T)


@pytest.mark.parametrize(
    "header",
    [None, "", "sha256=abc", "t=1", "v1=abc", "t=x,v1=abc", "t=1,t=1,v1=abc", "garbage"],
)
def test_malformed_headers_are_refused(header: str | None) -> None:
    assert not verify_signature(SECRET, header, BODY, now=1)


def test_several_signatures_one_matching_is_enough() -> None:
    # A sender rotating its secret may sign with both; unknown schemes are ignored.
    good = sign(SECRET, BODY, timestamp=T).split(",")[1]
    header = f"t={T},v0=zzz,v1={'0' * 64},{good}"
    assert verify_signature(SECRET, header, BODY, now=T)


def _typescript_from_the_docs() -> str:
    text = HOOKS_PAGE.read_text(encoding="utf-8")
    match = re.search(r"```ts\n(.*?)```", text, re.DOTALL)
    assert match, "docs/hooks.md has no ```ts block"
    return match.group(1)


def test_the_documented_typescript_verifies_what_the_reactor_signs(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    # Node runs JavaScript: drop the type annotations the page's snippet uses.
    code = re.sub(
        r":\s*(?:string|number|boolean|Buffer)(?:\[\])?(?:\s*\|\s*(?:undefined|null))?"
        r"(?=\s*[,)=;{])",
        "",
        _typescript_from_the_docs(),
    )
    header = sign(SECRET, BODY, timestamp=T)
    cases = {
        "fresh": [header, T + 10],
        "replayed": [header, T + 301],
        "tampered": [header.replace("v1=", "v1=0"), T],
        "future": [header, T - 301],
    }
    script = tmp_path / "check.mjs"
    script.write_text(
        code
        + f"\nconst body = Buffer.from({json.dumps(BODY.decode())});\n"
        + f"const cases = {json.dumps(cases)};\n"
        + "const out = {};\n"
        + "for (const [name, [h, now]] of Object.entries(cases)) {\n"
        + f"  out[name] = verifyReactorSignature({json.dumps(SECRET)}, h, body, now);\n"
        + "}\n"
        + "console.log(JSON.stringify(out));\n"
    )
    done = subprocess.run([node, str(script)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "fresh": True,
        "replayed": False,
        "tampered": False,
        "future": False,
    }
