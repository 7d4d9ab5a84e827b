"""What a gateway serves (G1, G2): its clients, its upstreams and its tools, from TOML.

``charter gateway --config gateway.toml`` reads one file (docs/gateway.md is
its reference)::

    [engine]                      # optional: the engine's own configuration and store
    config = "charter.toml"
    store = ".charter/charter.db"

    [gateway]
    console_url = "http://127.0.0.1:8000/console"   # named in pending approvals
    stdio_client = "agent"        # the client a stdio gateway serves
    separator = "__"              # tools named payments__pay to clients (default ".")

    [clients.agent]               # a principal whose credential a client presents
    mission = "msn_..."
    credential = "env:AGENT_CREDENTIAL"   # stdio only (over HTTP: the bearer token)

    [upstreams.payments]          # a command (stdio) or a url (streamable HTTP)
    command = ["python3", "-m", "charter.sandbox.mcp", "http://127.0.0.1:8080"]

    [tools."payments.pay"]        # an exact name or a pattern ("payments.*")
    effect = "idempotent_keyed"
    dedupe_window_seconds = 86400
    estimate = { usd_cents = "amount" }   # a whole number, or an argument's name
    cost = { usd_cents = "amount" }       # a field of the result's structured content
    lookup = "get_payment"                # a tool of the same upstream, by key
    lookup_key = "idempotency_key"        # the found record's field that must be the key
    same_call_seconds = 600               # identical arguments within 600 s: one call

Secrets are never written in the file: a credential, a header or an upstream's
environment value is ``env:NAME``, read from the environment when the gateway
starts. Everything is checked when the file is read; :func:`problems` lists
what only the upstreams' tools can tell (a pattern that matches none).
"""

from __future__ import annotations

import fnmatch
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from charter import Secret
from charter.adapters import EffectClass
from charter.errors import ConfigError

_SECRET_WORDS = ("authorization", "cookie", "token", "secret", "key", "password", "credential")


@dataclass(frozen=True)
class Client:
    """A client credential's principal and the one mission its calls run under."""

    principal: str
    mission: str
    credential: str | None = None  # ``env:NAME``: the stdio client's credential


@dataclass(frozen=True)
class Upstream:
    """An MCP server the gateway fronts: a command over stdio, or a URL."""

    name: str
    command: tuple[str, ...] = ()
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolRule:
    """How the calls of the tools a pattern matches are governed (G2)."""

    pattern: str
    effect: EffectClass | None = None
    dedupe_window_seconds: int | None = None
    estimate: Mapping[str, int | str] = field(default_factory=dict)
    cost: Mapping[str, str] = field(default_factory=dict)
    lookup: str | None = None
    lookup_key: str = "idempotency_key"
    same_call_seconds: int | None = None


@dataclass(frozen=True)
class GatewayConfig:
    """One gateway's file, read and checked (see the module's text)."""

    clients: Mapping[str, Client]
    upstreams: Mapping[str, Upstream]
    tools: tuple[ToolRule, ...] = ()
    console_url: str | None = None
    stdio_client: str | None = None
    engine_config: str | None = None
    store: str | None = None
    separator: str = "."

    def rule(self, name: str) -> ToolRule:
        """The rule for ``upstream.tool``: an exact entry, else the first pattern."""
        for r in self.tools:
            if r.pattern == name:
                return r
        for r in self.tools:
            if fnmatch.fnmatchcase(name, r.pattern):
                return r
        return ToolRule(name)

    @classmethod
    def from_file(cls, path: str | Path) -> GatewayConfig:
        """The file at ``path``; relative paths in it are read beside it."""
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"gateway configuration {p} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"gateway configuration {p} is not valid TOML: {exc}") from None
        return cls.from_mapping(data, base=p.parent)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, base: Path | None = None) -> GatewayConfig:
        """The configuration in ``data``; every problem found is in the one
        :class:`ConfigError` raised (``problems``: one line each)."""
        found: list[str] = []

        def each(table: str, read: Any) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for name, value in _checked(found, lambda: _table(data, table), {}).items():
                item = _checked(found, lambda n=name, v=value: read(n, v), None)
                if item is not None:
                    out[name] = item
            return out

        _checked(found, lambda: _only(data, set(_SECTIONS), "the file"), None)
        engine = _checked(found, lambda: _table(data, "engine"), {})
        gateway = _checked(found, lambda: _table(data, "gateway"), {})
        _checked(found, lambda: _only(engine, {"config", "store"}, "[engine]"), None)
        known = {"console_url", "stdio_client", "separator"}
        _checked(found, lambda: _only(gateway, known, "[gateway]"), None)
        separator = _checked(found, lambda: _separator(gateway), ".")
        clients: dict[str, Client] = each("clients", _client)
        upstreams: dict[str, Upstream] = each("upstreams", _upstream)
        if not upstreams and not found:
            found.append("the gateway needs at least one [upstreams.NAME]")
        found += [
            f"[upstreams.{u}]: its name holds the separator {separator!r}"
            for u in upstreams
            if separator in u
        ]
        tools = tuple(each("tools", _rule).values())
        for r in tools:
            head = r.pattern.partition(".")[0]
            if not any(fnmatch.fnmatchcase(u, head) for u in upstreams):
                found.append(f"[tools.{r.pattern!r}] names no upstream of this gateway")
        stdio = _checked(found, lambda: _text(gateway, "stdio_client", "[gateway]"), None)
        if stdio is not None and stdio not in clients:
            found.append(f"[gateway] stdio_client {stdio!r} is not one of [clients]")
        console = _checked(found, lambda: _text(gateway, "console_url", "[gateway]"), None)
        engine_config = _checked(found, lambda: _path(engine.get("config"), base, "config"), None)
        store = _checked(found, lambda: _store(engine.get("store"), base), None)
        if found:
            raise ConfigError("\n".join(found), problems=found)
        return cls(clients, upstreams, tools, console, stdio, engine_config, store, separator)


_SECTIONS = ("engine", "gateway", "clients", "upstreams", "tools")


def _checked(found: list[str], read: Any, default: Any) -> Any:
    """``read()``, or ``default`` with its problem noted in ``found``."""
    try:
        return read()
    except ConfigError as exc:
        found.append(exc.message)
        return default


def secret(value: str) -> str:
    """An ``env:NAME`` value, read now and remembered as a :class:`~charter.Secret`
    (S3): an upstream that echoes it back has it scrubbed from whatever is
    stored; a missing variable is a :class:`ConfigError`."""
    name = value.removeprefix("env:")
    if os.environ.get(name) is None:
        raise ConfigError(f"the environment variable {name} (named as env:{name}) is not set")
    return Secret.env(name).reveal()


def problems(config: GatewayConfig, tools: Mapping[str, list[str]]) -> list[str]:
    """What ``charter gateway check`` reports, one line each, given each
    upstream's tool names: a tool pattern that matches no tool, a lookup tool
    the upstream lacks."""
    found: list[str] = []
    names = [f"{u}.{t}" for u, listed in tools.items() for t in listed]
    for r in config.tools:
        if not any(fnmatch.fnmatchcase(n, r.pattern) for n in names):
            found.append(f"[tools.{r.pattern!r}] matches no tool of the upstreams")
        upstream = r.pattern.partition(".")[0]
        if r.lookup is not None and r.lookup not in tools.get(upstream, []):
            found.append(f"[tools.{r.pattern!r}] lookup {r.lookup!r} is not a tool of {upstream}")
    return found


# -- reading the tables ------------------------------------------------------------------
def _table(data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, Mapping):
        raise ConfigError(f"[{name}] must be a table")
    return value


def _only(data: Mapping[str, Any], keys: set[str], where: str) -> None:
    unknown = sorted(set(data) - keys)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {sorted(keys)}")


def _text(data: Mapping[str, Any], key: str, where: str) -> str | None:
    value = data.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{where} {key} must be a non-empty string, got {value!r}")
    return value


def _hidden(value: Any, where: str) -> str:
    """A secret's reference: ``env:NAME`` only, never the secret itself (S3)."""
    if not isinstance(value, str) or not value.startswith("env:") or value == "env:":
        raise ConfigError(f"{where} is a secret given in clear: write env:NAME and set NAME")
    return value


def _separator(gateway: Mapping[str, Any]) -> str:
    """What joins an upstream's name and a tool's in the names clients see."""
    value = gateway.get("separator", ".")
    if not isinstance(value, str) or not re.fullmatch(r"[._/-]{1,3}", value):
        raise ConfigError(
            f"[gateway] separator must be 1 to 3 of . _ - /, got {value!r}; '__' gives names "
            "that models limited to [A-Za-z0-9_-] accept"
        )
    return value


def _client(name: str, value: Any) -> Client:
    where = f"[clients.{name}]"
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a table")
    _only(value, {"mission", "credential"}, where)
    mission = _text(value, "mission", where)
    if mission is None:
        raise ConfigError(f"{where} needs the mission its calls run under")
    cred = value.get("credential")
    return Client(name, mission, None if cred is None else _hidden(cred, f"{where} credential"))


def _upstream(name: str, value: Any) -> Upstream:
    where = f"[upstreams.{name}]"
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a table")
    if "." in name or not name:
        raise ConfigError(f"{where}: an upstream's name has no dot (tools are named NAME.TOOL)")
    _only(value, {"command", "url", "headers", "env"}, where)
    command, url = value.get("command"), _text(value, "url", where)
    if (command is None) == (url is None):
        raise ConfigError(f"{where} needs a command (stdio) or a url (streamable HTTP), not both")
    if command is not None and (
        not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command)
    ):
        raise ConfigError(f"{where} command must be a list of strings")
    headers = _table(value, "headers")
    env = _table(value, "env")
    for key, v in headers.items():
        if any(w in key.lower() for w in _SECRET_WORDS) or str(v).startswith("env:"):
            _hidden(v, f"{where} header {key}")
        elif not isinstance(v, str):
            raise ConfigError(f"{where} header {key} must be a string")
    for key, v in env.items():
        _hidden(v, f"{where} env {key}")
    return Upstream(name, tuple(command or ()), url, dict(headers), dict(env))


def _rule(pattern: str, value: Any) -> ToolRule:
    where = f"[tools.{pattern!r}]"
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a table")
    keys = {"effect", "dedupe_window_seconds", "estimate", "cost", "lookup", "lookup_key",
            "same_call_seconds"}  # fmt: skip
    _only(value, keys, where)
    effect = value.get("effect")
    try:
        effect_class = None if effect is None else EffectClass(effect)
    except ValueError:
        choices = ", ".join(c.value for c in EffectClass)
        raise ConfigError(f"{where} effect must be one of {choices}, got {effect!r}") from None
    window = _seconds(value, "dedupe_window_seconds", where)
    if (effect_class is EffectClass.IDEMPOTENT_KEYED) != (window is not None):
        raise ConfigError(f"{where}: idempotent_keyed goes with dedupe_window_seconds, only")
    estimate = _table(value, "estimate")
    for unit, v in estimate.items():
        if isinstance(v, bool) or not isinstance(v, int | str) or (isinstance(v, int) and v < 0):
            raise ConfigError(f"{where} estimate {unit} must be a whole number or a name")
    cost = _table(value, "cost")
    if not all(isinstance(v, str) and v for v in cost.values()):
        raise ConfigError(f"{where} cost maps units to fields of the result")
    return ToolRule(
        pattern,
        effect_class,
        window,
        dict(estimate),
        dict(cost),
        _text(value, "lookup", where),
        _text(value, "lookup_key", where) or "idempotency_key",
        _seconds(value, "same_call_seconds", where),
    )


def _seconds(value: Mapping[str, Any], key: str, where: str) -> int | None:
    v = value.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
        raise ConfigError(f"{where} {key} must be a whole number of seconds, at least 1")
    return v


def _path(value: Any, base: Path | None, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where} must be a path")
    return str(base / value) if base is not None and not Path(value).is_absolute() else value


def _store(value: Any, base: Path | None) -> str | None:
    if isinstance(value, str) and "://" in value:
        return value
    return _path(value, base, "[engine] store")
