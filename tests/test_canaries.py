"""Secret canaries (S3): a secret echoed back in any encoding is stored nowhere.

A target may hand a credential back in many shapes: as is, inside a URL
(percent-encoded), in a header (base64), in JSON (escaped), in bytes or in an
exception's text. A canary secret, built so that each of those encodings
differs, goes through every path an adapter's report takes (a result, a
receipt, a refusal's evidence, an exception's text, a lookup's evidence), and
then every form of it is searched for in the store's files while the engine is
live (write-ahead log included), in the audit log and in what the command line
prints.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote, quote_plus

import charter
from charter.adapters import Dispatch, Outcome
from charter.testing import RecordingAdapter
from conftest import Principals

#: Distinct as is, percent-encoded, form-encoded, base64 and JSON-escaped.
CANARY = 'cAn4ry/+tok=en&x y"z'


def forms(value: str) -> dict[str, str]:
    return {
        "plain": value,
        "url-quoted": quote(value, safe=""),
        "form-quoted": quote_plus(value),
        "base64": base64.b64encode(value.encode()).decode(),
        "base64-url": base64.urlsafe_b64encode(value.encode()).decode(),
        "json-escaped": json.dumps(value)[1:-1],
    }


def token(send: Dispatch) -> str:
    secret = send.request["auth"]
    assert isinstance(secret, charter.Secret)
    return secret.reveal()


def echo_everywhere(send: Dispatch) -> Outcome:
    value = token(send)
    f = forms(value)
    return Outcome.succeeded(
        {"url": f"https://api.example/x?key={f['url-quoted']}", "json": json.dumps(value)},
        cost={"calls": 1},
        receipt={"authorization": f"Basic {f['base64']}", "raw": value.encode()},
    )


def refuse_with_it(send: Dispatch) -> Outcome:
    raise charter.NotApplied(
        "refused", evidence={"form": f"key={forms(token(send))['form-quoted']}"}
    )


def lose_with_it(send: Dispatch) -> Outcome:
    raise TimeoutError(f"GET https://api.example/?k={forms(token(send))['base64-url']} timed out")


def test_S3_a_canary_echoed_in_every_encoding_is_found_nowhere(
    backend: str,
    store_address: str,
    engine: charter.Engine,
    who: Principals,
    mission: str,
    creds: tuple[dict[str, str], dict[str, str]],
    tmp_path: Path,
) -> None:
    adapter = RecordingAdapter(
        script={"charge": echo_everywhere, "write": refuse_with_it, "read": lose_with_it}
    )
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    request = {"amount": 1, "auth": charter.Secret(CANARY, name="canary")}
    done = ex.perform(adapter, "charge", request, effect_key="c")
    refused = ex.perform(adapter, "write", request, effect_key="w")
    lost = ex.perform(adapter, "read", request, effect_key="r")
    adapter.evidence[lost.id] = charter.Evidence.indeterminate(
        {"seen": forms(CANARY)["json-escaped"], "b64": forms(CANARY)["base64"]}
    )
    engine.coordinator.reconcile(lost.id, adapter, by=who.alice)
    assert [a.status.value for a in (done, refused, lost)] == ["succeeded", "failed", "unknown"]

    places: dict[str, bytes] = {
        "attempts": json.dumps([a.to_dict() for a in engine.attempts(mission_id=mission)]).encode(),
        "evidence": json.dumps(
            {a.id: engine.evidence(a.id) for a in (done, refused, lost)}, default=str
        ).encode(),
        "audit": json.dumps(engine.audit_events(mission), default=str).encode(),
    }
    if backend == "sqlite":  # the files themselves, while the engine is live
        for path in Path(store_address).parent.iterdir():
            if path.name.startswith("charter.db"):
                places[path.name] = path.read_bytes()
        places["cli"] = _cli(store_address, creds, ex.run_id, tmp_path)
    found = [
        f"{form} in {place}"
        for place, data in places.items()
        for form, text in forms(CANARY).items()
        if text.encode() in data
    ]
    assert found == []


def _cli(store: str, creds: tuple[dict[str, str], dict[str, str]], run: str, cwd: Path) -> bytes:
    """What ``charter show`` and ``charter attempts`` print about the run."""
    config = cwd / "charter.toml"
    digests = "\n".join(f'{n} = "{d}"' for n, d in creds[1].items())
    config.write_text(f'store = "{store}"\n[credentials]\n{digests}\n')
    env = {**os.environ, "CHARTER_CONFIG": str(config)}
    out = b""
    for args in (["show", run], ["attempts", "--run", run, "--json"]):
        out += subprocess.run(
            [sys.executable, "-m", "charter", *args], capture_output=True, env=env, check=True
        ).stdout
    return out
