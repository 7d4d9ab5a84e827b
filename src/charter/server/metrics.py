"""The Prometheus text exposition of the engine's figures (version 0.0.4), and
of the credentials this server process refused (P4)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from charter import AttemptStatus, RunStatus

if TYPE_CHECKING:
    from charter import Engine
    from charter.server.gate import Refusals


def render(engine: Engine, refusals: Refusals) -> str:
    figures = engine.figures()
    out: list[str] = []

    def family(name: str, kind: str, text: str, samples: list[tuple[str, float]]) -> None:
        out.extend([f"# HELP {name} {text}", f"# TYPE {name} {kind}"])
        # Whole amounts stay whole: a float would round large ones (A9).
        out.extend(
            f"{name}{labels} {value if isinstance(value, int) else f'{value:g}'}"
            for labels, value in samples
        )

    family(
        "charter_runs",
        "gauge",
        "Runs by status.",
        [(f'{{status="{s.value}"}}', figures.runs.get(s.value, 0)) for s in RunStatus],
    )
    family(
        "charter_attempts",
        "gauge",
        "Attempts by status.",
        [(f'{{status="{s.value}"}}', figures.attempts.get(s.value, 0)) for s in AttemptStatus],
    )
    for part in ("limit", "available", "held", "spent", "overrun"):
        family(
            f"charter_allowance_{part}",
            "gauge",
            f"Allowance {part}, summed over missions, in each unit's smallest step.",
            [(f'{{unit="{_escape(u)}"}}', getattr(b, part)) for u, b in figures.balances.items()],
        )
    family(
        "charter_unresolved_attempts",
        "gauge",
        "Attempts sent and not settled (dispatched or unknown).",
        [("", figures.in_flight)],
    )
    family(
        "charter_unresolved_oldest_seconds",
        "gauge",
        "How long the oldest unresolved attempt has waited since it was prepared.",
        [("", figures.oldest_in_flight_seconds)],
    )
    family(
        "charter_approvals_pending",
        "gauge",
        "Approvals waiting for a decision.",
        [("", figures.approvals_pending)],
    )
    family(
        "charter_http_refused_credentials_total",
        "counter",
        "Requests this server process refused for a bad or missing credential.",
        [("", refusals.total)],
    )
    family(
        "charter_http_refused_credentials_unwritten",
        "gauge",
        "Of those, how many are not yet in an auth.refused summary on the engine's chain.",
        [("", refusals.total - refusals.written)],
    )
    return "\n".join(out) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
