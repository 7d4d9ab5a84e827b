"""A gateway under test: the payments sandbox, its MCP face, a store, and `charter gateway`.

Everything is real: the sandbox is an HTTP service on loopback with its own
records (the ground truth of what was paid), its MCP face
(``python -m charter.sandbox.mcp``) is the upstream MCP server, started by
the gateway over stdio, and the gateway is a ``charter gateway`` process the
test starts, kills and starts again. Clients are the MCP SDK's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import charter
from charter.sandbox import Sandbox
from charter.testing import credential

NAMES = ("agent", "ops", "mallory")
CONTRACT: dict[str, Any] = {
    "objective": "pay suppliers through MCP tools",
    "principals": {
        "agent": {"run": ["payments.pay", "payments.get_payment"]},
        "ops": ["resolve", "approve", "raise_limit", "stop"],
        "mallory": {"run": ["payments.*"]},
    },
    "allowance": {"usd_cents": 100_000},
}
PAY: dict[str, Any] = {
    "effect": "idempotent_keyed",
    "dedupe_window_seconds": 86_400,
    "estimate": {"usd_cents": "amount"},
    "cost": {"usd_cents": "amount"},
    "lookup": "get_payment",
}


def _toml(value: Any) -> str:
    """A TOML value for the few shapes these files hold."""
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def toml(tables: Mapping[str, Mapping[str, Any]]) -> str:
    return "".join(
        f"[{name}]\n" + "".join(f"{json.dumps(k)} = {_toml(v)}\n" for k, v in body.items())
        for name, body in tables.items()
    )


@dataclass
class World:
    """The store, a mission, the sandbox and the gateway's files."""

    tmp: Path
    store: str
    engine: charter.Engine
    sandbox: Sandbox
    creds: dict[str, str]
    mission: str
    gateway_file: Path
    port: int = 0  # chosen by the system at the first start, kept by restarts
    proc: subprocess.Popen[bytes] | None = None

    def principal(self, name: str) -> charter.Principal:
        return self.engine.authenticate(self.creds[name])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def env(self) -> dict[str, str]:
        src = str(Path(charter.__file__).resolve().parent.parent)
        path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
        return {**os.environ, "PYTHONPATH": path, "AGENT_CREDENTIAL": self.creds["agent"]}

    def command(self, *extra: str) -> list[str]:
        charter_cli = [sys.executable, "-m", "charter"]
        return [*charter_cli, "gateway", "--config", str(self.gateway_file), *extra]

    def start(self) -> None:
        """Start ``charter gateway`` on HTTP; back once it listens (it says where,
        on the port the system chose the first time, the same one after)."""
        self.proc = subprocess.Popen(
            self.command("--port", str(self.port)), env=self.env(), stderr=subprocess.PIPE
        )
        assert self.proc.stderr is not None
        said: list[str] = []
        for line in iter(self.proc.stderr.readline, b""):
            said.append(line.decode())
            if said[-1].startswith("gateway: http://127.0.0.1:"):
                self.port = int(said[-1].removeprefix("gateway: http://127.0.0.1:").split("/")[0])
                return
        self.proc.wait(timeout=10)
        raise RuntimeError(f"the gateway exited ({self.proc.returncode}): {''.join(said)}")

    def kill(self) -> None:
        """SIGKILL the gateway (its upstream's stdio server sees its pipe close)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None

    def payments(self) -> list[dict[str, Any]]:
        return [p.to_dict() for p in self.sandbox.ledger.payments()]

    def stored(self) -> dict[str, Any]:
        """What the store holds about the mission, its audit chain included."""
        e, m = self.engine, self.mission
        return {
            "runs": [r.to_dict() for r in e.runs(m)],
            "attempts": [a.to_dict() for a in e.attempts(mission_id=m)],
            "ledger": e.ledger_entries(m),
            "incidents": e.incidents(m),
            "audit": len(e.audit_events(m)),
        }


@contextlib.contextmanager
def world(
    tmp: Path,
    store: str,
    *,
    contract: Mapping[str, Any] | None = None,
    tools: Mapping[str, Mapping[str, Any]] | None = None,
    engine: Mapping[str, Any] | None = None,
    gateway: Mapping[str, Any] | None = None,
) -> Iterator[World]:
    """A world whose gateway file fronts the sandbox's MCP face for ``agent``."""
    pairs = {n: credential(n) for n in NAMES}
    creds = {n: c for n, (c, _) in pairs.items()}
    digests = {n: d for n, (_, d) in pairs.items()}
    settings = {"store": store, **(engine or {})}
    engine_file = tmp / "charter.toml"
    engine_file.write_text(toml({"engine": settings, "credentials": digests}).replace(
        "[engine]\n", ""))  # fmt: skip
    config = charter.EngineConfig.from_file(engine_file)
    with Sandbox(tmp / "sandbox.db") as box, charter.Engine.open(store, config=config) as eng:
        mission = eng.create_mission(contract or CONTRACT, by=eng.authenticate(creds["ops"]))
        upstream = [sys.executable, "-m", "charter.sandbox.mcp", box.url]
        tables: dict[str, Any] = {
            "engine": {"config": str(engine_file)},
            "gateway": {
                "console_url": "http://127.0.0.1:8765/console",
                "stdio_client": "agent",
                **(gateway or {}),
            },
            "clients.agent": {"mission": mission, "credential": "env:AGENT_CREDENTIAL"},
            "clients.ops": {"mission": mission},
            "upstreams.payments": {"command": upstream},
        }
        for pattern, rule in (tools if tools is not None else {"payments.pay": PAY}).items():
            tables[f"tools.{json.dumps(pattern)}"] = dict(rule)
        gateway_file = tmp / "gateway.toml"
        gateway_file.write_text(toml(tables))
        w = World(tmp, store, eng, box, creds, mission, gateway_file)
        try:
            yield w
        finally:
            w.stop()


@contextlib.asynccontextmanager
async def http_client(w: World, who: str = "agent") -> AsyncIterator[Any]:
    """The MCP SDK's client over streamable HTTP, with ``who``'s credential."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {w.creds[who]}"})
    async with http, Client(streamable_http_client(w.url, http_client=http)) as client:
        yield client
