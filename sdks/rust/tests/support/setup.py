"""A store for the Rust SDK's tests: credentials, configuration and a mission.

Run with the project's Python: ``setup.py DIR [LEASE_SECONDS|- [BUSY_SECONDS|-]]``. Writes ``DIR/charter.toml``
(the store ``DIR/charter.db``, a digest per principal, the human resume
policy) and creates one mission whose contract lets ``agent`` run
``payments.*`` and ``ops`` settle, stop and raise limits. Prints one JSON line:
``{"config", "store", "mission", "credentials": {name: "NAME:SECRET"}}``.
A second mission (``tight``) has an allowance of 10 cents, for refusals; a
third (``gated``) needs an approval for each payment.
"""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path

import charter

PRINCIPALS = {
    "agent": {"run": ["payments.*"]},
    "ops": ["resolve", "stop", "raise_limit", "approve"],
    "nobody": ["consume"],
}


def contract(limit: int, *, gated: bool = False) -> dict[str, object]:
    terms: dict[str, object] = {
        "objective": "pay the week's invoices",
        "principals": PRINCIPALS,
        "allowance": {"usd_cents": limit},
    }
    if gated:  # each payment waits for a person's approval (W2)
        terms["approvals"] = {"required": ["payments.pay"], "ttl_seconds": 600}
    return terms


def main(where: Path, lease: str | None, busy: str | None) -> None:
    creds = {n: f"{n}:{secrets.token_urlsafe(32)}" for n in PRINCIPALS}
    digests = {n: charter.hash_secret(c.split(":", 1)[1]) for n, c in creds.items()}
    store = where / "charter.db"
    lines = [f"store = {json.dumps(str(store))}", 'resume = "human"']
    if lease is not None:  # a send must end within its lease (F3): both shortened
        lines += [f"lease_seconds = {int(lease)}", f"send_deadline_seconds = {int(lease)}"]
    if busy is not None:  # how long a write waits for the store's lock before store_busy
        lines += [f"busy_timeout_seconds = {float(busy)}"]
    lines += ["", "[credentials]"]
    lines += [f"{n} = {json.dumps(d)}" for n, d in digests.items()]
    config_path = where / "charter.toml"
    config_path.write_text("\n".join(lines) + "\n")
    config = charter.EngineConfig.from_file(config_path)
    with charter.Engine.open(str(store), config=config) as engine:
        ops = engine.authenticate(creds["ops"])
        mission = engine.create_mission(contract(1_000_000), by=ops)
        tight = engine.create_mission(contract(10), by=ops)
        gated = engine.create_mission(contract(1_000_000, gated=True), by=ops)
    print(
        json.dumps(
            {
                "config": str(config_path),
                "store": str(store),
                "mission": mission,
                "tight": tight,
                "gated": gated,
                "credentials": creds,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    given = [a if a != "-" else None for a in sys.argv[2:4]]
    given += [None] * (2 - len(given))
    main(Path(sys.argv[1]), given[0], given[1])
