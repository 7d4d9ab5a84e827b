"""The handoff report (S4): what someone taking over a mission needs to know.

Built from a mission's records — a verified snapshot's, or a store's read the
same way — so a person (markdown) or an agent (``--json``) reads one account:
the objective and contract, the runs and their nodes, settled attempts with
their costs, unresolved attempts with the evidence so far and the next safe
action, approvals pending and expired, incidents, the allowance left, and the
artifacts, each *checked* (present with a matching hash, or not) with who may
consume them. It is a view: it carries no signature and no chain, so it
cannot be imported, resumed from or acted on; it says so at its top.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from charter.contracts.contract import Contract
from charter.contracts.principals import Right

KIND = "charter-handoff-report"
NOTICE = (
    "This report is a view of recorded state. It cannot be imported, resumed from or "
    "acted on: to continue the mission, import its signed snapshot (`charter import`) "
    "or accept a handover (`charter adopt`)."
)
_UNRESOLVED = ("prepared", "dispatched", "unknown")
#: The next safe action per unresolved phase (R5), for whoever continues.
NEXT_ACTION = {
    "prepared": "never sent: re-admitted (or voided) when the run continues; nothing to check",
    "dispatched": "keep the hold; obtain evidence (reconcile) and a person's resolution; "
    "never send it again",
    "unknown": "keep the hold; obtain evidence (reconcile) and a person's resolution; "
    "never send it again",
}


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _attempt(a: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": a["id"],
        "run_id": a["run_id"],
        "node_id": a["node_id"],
        "effect_key": a["effect_key"],
        "adapter": a["adapter"],
        "operation": a["operation"],
        "effect_class": a["effect_class"],
        "status": a["status"],
    }


def _artifacts(
    manifest: Sequence[Mapping[str, Any]], available: Callable[[str], bool], contract: Contract
) -> dict[str, Any]:
    items = [{**dict(item), "available": available(item["sha256"])} for item in manifest]
    consumers = {
        name: list(grants.get(Right.CONSUME, ()))
        for name, grants in sorted(contract.principals.items())
        if grants.get(Right.CONSUME)
    }
    return {"items": items, "consumers": consumers}


def _approvals(rows: Sequence[Mapping[str, Any]], now_us: int) -> dict[str, Any]:
    """Pending approvals, and those that expired (by ``now_us``) before being used."""

    def expired(a: Mapping[str, Any]) -> bool:
        return a["status"] == "expired" or (
            a["status"] in ("pending", "approved")
            and a["expires_at_us"] is not None
            and a["expires_at_us"] <= now_us
        )

    return {
        "pending": [dict(a) for a in rows if a["status"] == "pending" and not expired(a)],
        "expired": [dict(a) for a in rows if expired(a)],
    }


def build(
    *,
    source: Mapping[str, Any],
    state: Mapping[str, Sequence[Mapping[str, Any]]],
    artifacts: Sequence[Mapping[str, Any]],
    available: Callable[[str], bool],
    now_us: int,
) -> dict[str, Any]:
    """The report as data; ``now_us`` decides which approvals have expired."""
    mission = state["missions"][0]
    body = next(
        v["body"] for v in state["contract_versions"] if v["version"] == mission["contract_version"]
    )
    contract = Contract.from_dict(json.loads(body))
    evidence: dict[str, list[dict[str, Any]]] = {}
    for e in state["evidence"]:
        evidence.setdefault(e["attempt_id"], []).append(
            {k: e[k] for k in ("source", "verdict", "outcome", "detail", "actor", "epoch")}
        )
    nodes: dict[str, list[dict[str, Any]]] = {}
    for n in state["node_executions"]:
        nodes.setdefault(n["run_id"], []).append(
            {k: n[k] for k in ("node_id", "execution", "status", "result_hash")}
        )
    return {
        "kind": KIND,
        "notice": NOTICE,
        "source": dict(source),
        "mission": {
            "id": mission["id"],
            "name": mission["name"],
            "contract_version": mission["contract_version"],
        },
        "contract": contract.to_dict(),
        "runs": [
            {
                **{k: r[k] for k in ("id", "status", "epoch", "plan", "linked_from")},
                "nodes": nodes.get(r["id"], []),
            }
            for r in state["runs"]
        ],
        "settled": [
            {**_attempt(a), "actual": _json(a["actual"])}
            for a in state["attempts"]
            if a["status"] not in _UNRESOLVED and a["status"] != "voided"
        ],
        "unresolved": [
            {
                **_attempt(a),
                "hold": _json(a["estimate"]),
                "evidence": evidence.get(a["id"], []),
                "next_action": NEXT_ACTION[a["status"]],
            }
            for a in state["attempts"]
            if a["status"] in _UNRESOLVED
        ],
        "approvals": _approvals(state["approvals"], now_us),
        "incidents": [
            {k: i[k] for k in ("id", "kind", "status", "detail", "attempt_id")}
            for i in state["incidents"]
        ],
        "allowance": {
            a["unit"]: {k: a[k] for k in ("limit_amount", "available", "held", "spent", "overrun")}
            for a in state["allowances"]
        },
        "artifacts": _artifacts(artifacts, available, contract),
    }


def _lines(title: str, rows: Sequence[str]) -> list[str]:
    return ["", f"## {title}", "", *(rows or ["(none)"])]


def _preamble(report: Mapping[str, Any]) -> list[str]:
    """Title, the notice that this is a view, the source, objective and contract."""
    m, c = report["mission"], report["contract"]
    src = report["source"]
    return [
        f"# Handoff: {m['name']} ({m['id']})",
        "",
        f"> {report['notice']}",
        "",
        f"Source: {src['kind']}"
        + (f", chain head {src['head']['seq']} verified" if "head" in src else ""),
        "",
        f"**Objective.** {c['objective']}",
        "",
        f"**Contract** version {m['contract_version']}; principals: "
        + "; ".join(
            f"{name} ({', '.join(sorted(grants))})" for name, grants in c["principals"].items()
        ),
    ]


def handoff_markdown(report: Mapping[str, Any]) -> str:
    """The report for people."""
    out = _preamble(report)
    out += _lines(
        "Runs and nodes",
        [
            f"- run {r['id']}: {r['status']} (epoch {r['epoch']}"
            + (f", follows {r['linked_from']}" if r["linked_from"] else "")
            + ")"
            + "".join(
                f"\n  - node {n['node_id']} #{n['execution']}: {n['status']}" for n in r["nodes"]
            )
            for r in report["runs"]
        ],
    )
    out += _lines(
        "Settled attempts",
        [
            f"- {a['id']} {a['adapter']}.{a['operation']} ({a['node_id']}/{a['effect_key']}): "
            f"{a['status']}, cost {json.dumps(a['actual'], sort_keys=True)}"
            for a in report["settled"]
        ],
    )
    out += _lines(
        "Unresolved attempts",
        [
            f"- {a['id']} {a['adapter']}.{a['operation']} ({a['node_id']}/{a['effect_key']}): "
            f"{a['status']}, hold {json.dumps(a['hold'], sort_keys=True)}; "
            f"evidence so far: {len(a['evidence'])}; next: {a['next_action']}"
            for a in report["unresolved"]
        ],
    )
    ap = report["approvals"]
    out += _lines(
        "Approvals",
        [f"- {a['id']} pending ({a['scope']})" for a in ap["pending"]]
        + [f"- {a['id']} expired ({a['scope']}): a new request is needed" for a in ap["expired"]],
    )
    out += _lines(
        "Incidents",
        [f"- {i['id']} {i['kind']}: {i['status']}" for i in report["incidents"]],
    )
    out += _lines(
        "Allowance left",
        [
            f"- {unit}: {b['available']} of {b['limit_amount']} available "
            f"({b['held']} held, {b['spent']} spent, {b['overrun']} overrun)"
            for unit, b in report["allowance"].items()
        ],
    )
    arts = report["artifacts"]
    out += _lines(
        "Artifacts",
        ([] if arts["items"] else ["- no artifacts recorded"])
        + [
            f"- {a['sha256'][:16]}… {a['size']} bytes at {a['location']}: "
            + ("available, hash matches" if a["available"] else "NOT available here")
            for a in arts["items"]
        ]
        + [
            f"- may consume: {name} ({', '.join(scopes)})"
            for name, scopes in arts["consumers"].items()
        ],
    )
    return "\n".join(out) + "\n"
