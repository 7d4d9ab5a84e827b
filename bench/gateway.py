"""The MCP gateway's overhead per tool call (G2): a read-only call through
``charter gateway`` beside the same call made on its upstream directly.

``measure(url, ...)`` runs in a process of its own (``bench/worker.py``). The
upstream is an MCP server of one read-only tool that answers at once
(``python bench/gateway.py upstream``, on the MCP SDK's ``MCPServer``). The MCP
SDK's own client opens two sessions over stdio: one on the upstream started
directly, one on ``charter gateway --stdio`` fronting the same upstream, with
its store at ``url``. The calls alternate one by one (direct, through the
gateway, direct, ...), so a slow moment of the machine falls on both; each
call through the gateway is a run of one read-only attempt, so what it adds
is the gateway's own hop and the store's transactions of a governed call.

    python bench/gateway.py                  # SQLite, and PostgreSQL when
    python bench/gateway.py --calls 500      # CHARTER_BENCH_POSTGRES names a server
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pg
from timing import Sample, clock, fmt, fmt_sample, row, sample_of

import charter
from charter.testing import credential

HERE = Path(__file__).resolve()
UPSTREAM = "up"
TOOL = "look"
CONTRACT: dict[str, Any] = {
    "objective": "measure the MCP gateway",
    "principals": {"agent": {"run": [f"{UPSTREAM}.*"]}, "ops": ["resolve", "stop"]},
    "allowance": {"usd_cents": 10**12},
}
#: The target: what the gateway may add to a read-only call's median on SQLite.
TARGET_S = 0.002


def upstream() -> None:
    """The upstream MCP server, over stdio: one read-only tool answering at once."""
    from mcp.server.mcpserver import MCPServer
    from mcp_types import ToolAnnotations

    server = MCPServer(UPSTREAM, log_level="WARNING")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def look(n: int) -> dict[str, int]:
        """Answer ``n`` back."""
        return {"n": n}

    server.run("stdio")


def _files(url: str, scratch: Path) -> tuple[Path, dict[str, str], str]:
    """The engine's and the gateway's files over the store at ``url``, with a
    mission for ``agent``: the gateway file, the environment and the mission."""
    pairs = {n: credential(n) for n in ("agent", "ops")}
    engine_file = scratch / "charter.toml"
    digests = "".join(f'{n} = "{d}"\n' for n, (_, d) in pairs.items())
    engine_file.write_text(f"store = {json.dumps(url)}\n[credentials]\n{digests}")
    config = charter.EngineConfig.from_file(engine_file)
    with charter.Engine.open(url, config=config) as engine:
        mission = engine.create_mission(CONTRACT, by=engine.authenticate(pairs["ops"][0]))
    command = json.dumps([sys.executable, str(HERE), "upstream"])
    gateway_file = scratch / "gateway.toml"
    gateway_file.write_text(
        f"[engine]\nconfig = {json.dumps(str(engine_file))}\n"
        '[gateway]\nstdio_client = "agent"\n'
        f'[clients.agent]\nmission = "{mission}"\ncredential = "env:AGENT_CREDENTIAL"\n'
        f"[upstreams.{UPSTREAM}]\ncommand = {command}\n"
    )
    src = str(Path(charter.__file__).resolve().parent.parent)
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "AGENT_CREDENTIAL": pairs["agent"][0]}
    return gateway_file, env, mission


@contextlib.asynccontextmanager
async def _sessions(gateway_file: Path, env: dict[str, str]) -> AsyncIterator[tuple[Any, Any]]:
    """The MCP SDK's client on the upstream, and on the gateway in front of it."""
    from mcp import Client, StdioServerParameters

    direct = StdioServerParameters(command=sys.executable, args=[str(HERE), "upstream"], env=env)
    gated = StdioServerParameters(
        command=sys.executable,
        args=["-m", "charter", "gateway", "--config", str(gateway_file), "--stdio"],
        env=env,
    )
    async with Client(direct) as upstream_client, Client(gated) as gateway_client:
        yield upstream_client, gateway_client


async def _timed(client: Any, name: str, n: int) -> float:
    started = clock()
    result = await client.call_tool(name, {"n": n})
    took = clock() - started
    if result.is_error or result.structured_content != {"n": n}:
        raise SystemExit(f"{name} answered {result}")
    return took


async def _interleaved(
    gateway_file: Path, env: dict[str, str], calls: int, warmup: int
) -> tuple[Sample, Sample]:
    direct, gated = Sample("s"), Sample("s")
    async with _sessions(gateway_file, env) as (upstream_client, gateway_client):
        for i in range(warmup + calls):
            d = await _timed(upstream_client, TOOL, i)
            g = await _timed(gateway_client, f"{UPSTREAM}.{TOOL}", i)
            (direct.warmup if i < warmup else direct.values).append(d)
            (gated.warmup if i < warmup else gated.values).append(g)
    return direct, gated


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, the nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def measure(url: str, calls: int = 300, warmup: int = 20) -> dict[str, Any]:
    """``calls`` read-only calls each way, interleaved, after ``warmup`` each."""
    scratch = Path(tempfile.mkdtemp(prefix="charter-gateway-"))
    gateway_file, env, mission = _files(url, scratch)
    direct, gated = asyncio.run(_interleaved(gateway_file, env, calls, warmup))
    with charter.Engine.open(url, config=charter.EngineConfig()) as engine:
        attempts = engine.attempts(mission_id=mission)
        settled = sum(a.status is charter.AttemptStatus.SUCCEEDED for a in attempts)
    if settled != warmup + calls:
        raise SystemExit(f"{settled} attempts settled for {warmup + calls} calls")
    out: dict[str, Any] = {"calls": calls, "attempts": settled}
    for name, sample in (("direct", direct), ("gateway", gated)):
        p50, p99 = percentile(sample.values, 0.5), percentile(sample.values, 0.99)
        out[name] = {"sample": sample.to_dict(), "p50": p50, "p99": p99}
    out["added"] = {q: out["gateway"][q] - out["direct"][q] for q in ("p50", "p99")}
    out["sample"] = out["gateway"]["sample"]
    return out


def rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The bench's rows (bench/report.py): what the gateway adds to a call's
    median, against the target on SQLite, and for what it tells elsewhere."""
    out = []
    for where, got in sorted(results.get("gateway", {}).items()):
        gated, direct = sample_of(got.get("gateway")), sample_of(got.get("direct"))
        if gated is None or direct is None:
            continue
        added, sqlite = got["added"]["p50"], where == "sqlite"
        found = row(
            f"MCP gateway: added to a read-only tool call, p50 ({where})",
            fmt_sample(gated),
            f"upstream directly: {fmt_sample(direct)}",
            value=added,
            shown=fmt(added, "s"),
            target=TARGET_S,
            target_text=f"≤ {TARGET_S * 1e3:g} ms" if sqlite else "(none)",
        )
        out.append(found if sqlite else {**found, "result": "info", "limit": None})
    return out


def table(results: dict[str, dict[str, Any]]) -> str:
    """p50 and p99 of each way, and what the gateway adds, per store."""
    head = ("store", "calls", "direct p50", "gateway p50", "added p50", "direct p99",
            "gateway p99", "added p99")  # fmt: skip
    lines = [head]
    for where, got in results.items():
        d, g, a = got["direct"], got["gateway"], got["added"]
        lines.append((where, str(got["calls"]), fmt(d["p50"], "s"), fmt(g["p50"], "s"),
                      fmt(a["p50"], "s"), fmt(d["p99"], "s"), fmt(g["p99"], "s"),
                      fmt(a["p99"], "s")))  # fmt: skip
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    text = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in lines]
    sqlite = results.get("sqlite")
    if sqlite is not None:
        added = sqlite["added"]["p50"]
        verdict = "met" if added <= TARGET_S else "missed"
        text.append(f"target: ≤ {TARGET_S * 1e3:g} ms added at p50 on SQLite: {verdict}")
    return "\n".join(text)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/gateway.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="calls each way (default 300)")
    parser.add_argument("--warmup", type=int, default=20, help="calls dropped first, each way")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    args = parser.parse_args(argv)
    results: dict[str, dict[str, Any]] = {}
    scratch = Path(tempfile.mkdtemp(prefix="charter-gateway-bench-"))
    started = time.monotonic()
    results["sqlite"] = measure(str(scratch / "gateway.db"), args.calls, args.warmup)
    server = contextlib.nullcontext(None) if args.no_postgres else pg.server()
    with server as srv:
        if srv is not None:
            url = pg.fresh_database(srv, "bench_gateway")
            results["postgresql"] = measure(url, args.calls, args.warmup)
    print(table(results))
    print(f"({time.monotonic() - started:.0f} s; load {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["upstream"]:
        upstream()
    else:
        sys.exit(main(sys.argv[1:]))
