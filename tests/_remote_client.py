"""A remote client that dies mid-send: ``_remote_client.py BASE CREDENTIAL MISSION``.

It claims a run as a segment, starts node ``n1``, is told to send its payment,
prints what it holds (one JSON line) and then hangs as if the send were under
way, until the test kills it: nothing is ever reported.
"""

from __future__ import annotations

import json
import sys
import time

import httpx


def main(base: str, credential: str, mission: str) -> None:
    headers = {"Authorization": f"Bearer {credential}"}
    with httpx.Client(base_url=base + "/api/v1", headers=headers, timeout=30) as http:
        claim = http.post(f"/missions/{mission}/runs", json={"segment": "py-1"}).json()
        held = {k: claim[k] for k in ("segment", "epoch", "claim")}
        run = claim["run_id"]
        execution = http.post(f"/runs/{run}/nodes/n1/start", json=held).json()["execution"]
        order = http.post(
            f"/runs/{run}/attempts",
            json={
                **held,
                "node_id": "n1",
                "execution": execution,
                "effect_key": "pay",
                "adapter": "pay",
                "operation": "transfer",
                "effect_class": "unsafe",
                "request": {"to": "acme", "amount": 5_000},
                "estimate": {"usd": 5_000, "calls": 1},
            },
        ).json()
        print(json.dumps({"run": run, "order": order, "execution": execution}), flush=True)
        time.sleep(3600)  # the send "under way": killed here


if __name__ == "__main__":
    main(*sys.argv[1:4])
