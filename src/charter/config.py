"""Engine configuration: credentials, settlement and resume policy, timings.

Configuration belongs to whoever runs the engine, not to missions: a contract
may only *restrict* the resume policy (R9). It is plain data, loadable from a
TOML file (``charter.toml`` or ``$CHARTER_CONFIG``)::

    store = ".charter/charter.db"
    evidence_settles = "confirm"     # or "auto" (R7)
    resume = "human"                 # "automatic" | "rules" | "human" (R9)
    lease_seconds = 30
    send_deadline_seconds = 30
    answer_bytes = 1048576           # most JSON kept of each part of a target's answer (A10)
    artifacts = ".charter/artifacts"  # the artifact store (N2)
    workspace = ".charter/work"      # runs' workspaces
    signing_key = "keys/charter.pem" # Ed25519 key: signs snapshots and checkpoints (S2)
    trusted_keys = ["ed25519:..."]   # public keys whose snapshots this engine imports

    [credentials]                    # name -> sha256 digest of the secret (P1)
    alice = "sha256:9f86d0..."

    [adapters]                       # name -> "module:factory" (for `charter reconcile`)
    payments = "myapp.adapters:payments"

    [adapters.tickets]               # or an HTTP API declared here (see docs/adapters.md)
    http = "https://tickets.example.com"
    operations.open = { method = "POST", path = "/v1/tickets", effect = "unsafe", estimate = {} }

    [webhooks.ops]                   # told when a run needs a person (K3, docs/notices.md)
    url = "https://ops.example.com/charter"
    secret = "env:CHARTER_WEBHOOK_SECRET"  # the HMAC key, read from the environment
    events = ["approval", "unknown_attempt"]  # optional: the kinds it takes (default all)
    timeout_seconds = 10             # optional: the most one delivery may take
"""

from __future__ import annotations

import importlib
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from charter.adapters.http import HttpDeclaration, declare
from charter.audit.signing import check_public
from charter.contracts.contract import RESUME_STRICTNESS, ResumeMode
from charter.errors import ConfigError
from charter.secret import Secret

if TYPE_CHECKING:
    from charter.adapters import Adapter

#: A resume rule is called with the run's :class:`~charter.recovery.state.RecoveryState`
#: (a read-only view; the recovery room sits above configuration, so the type
#: is not named here) and says whether the run may continue.
ResumeRule = Callable[[Any], bool]

_KEYS = {
    "store",
    "adapters",
    "credentials",
    "evidence_settles",
    "resume",
    "lease_seconds",
    "send_deadline_seconds",
    "busy_timeout_seconds",
    "answer_bytes",
    "artifacts",
    "workspace",
    "signing_key",
    "trusted_keys",
    "webhooks",
}

#: What a notice that a run needs a person is about (K3): an attempt whose
#: outcome no lookup settles, an approval or an input waited for, an open
#: incident, an exhausted allowance, a run that cannot resume; ``needs_person``
#: when the poster does not say which (its needs do).
NOTICE_KINDS = (
    "needs_person",
    "unknown_attempt",
    "approval",
    "input",
    "incident",
    "allowance",
    "cannot_resume",
)
_ENV_NAME = re.compile(r"env:[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Webhook:
    """Where notices that a run needs a person are posted (K3), signed with ``secret``.

    The secret is a :class:`~charter.secret.Secret`: in TOML only its
    environment variable is named (``env:NAME``), so the key is in no file, no
    store and no log; the deliverer reads it when it signs. ``events`` are the
    kinds this endpoint takes (``None``: every kind); ``timeout_seconds`` bounds
    one delivery, connection to answer, so a dead endpoint costs that at most.
    """

    name: str
    url: str
    secret: Secret
    events: tuple[str, ...] | None = None
    timeout_seconds: float = 10.0

    def __post_init__(self) -> None:
        where = f"webhook {self.name!r}"
        if not isinstance(self.name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", self.name):
            raise ConfigError(f"{where}: a webhook's name is 1-64 letters, digits, '_', '.', '-'")
        if not isinstance(self.url, str) or not re.fullmatch(r"https?://[^/@\s]+(/\S*)?", self.url):
            raise ConfigError(
                f"{where}: url must be an http:// or https:// address with a host and no "
                "user or password in it (the signature is what proves the sender)"
            )
        if not isinstance(self.secret, Secret):
            raise ConfigError(
                f"{where}: secret must be a charter.secret.Secret ('env:NAME' in TOML)"
            )
        if self.events is not None and (
            isinstance(self.events, str)
            or not self.events
            or any(e not in NOTICE_KINDS for e in self.events)
        ):
            raise ConfigError(
                f"{where}: events must be a non-empty list of {list(NOTICE_KINDS)}; "
                "leave it out to take every kind"
            )
        t = self.timeout_seconds
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t <= 300:
            raise ConfigError(f"{where}: timeout_seconds must be a number of seconds in (0, 300]")

    def takes(self, kind: str) -> bool:
        """Whether notices of ``kind`` go to this endpoint."""
        return self.events is None or kind in self.events


@dataclass(frozen=True)
class EngineConfig:
    """How this engine runs. Immutable; build a new one to change it."""

    store: str | None = None
    credentials: Mapping[str, str] = field(default_factory=dict)
    #: Adapter name -> ``"module:factory"`` or an HTTP API's declaration; lets the
    #: CLI reconcile in a fresh process.
    adapters: Mapping[str, str | HttpDeclaration] = field(default_factory=dict)
    evidence_settles: Literal["confirm", "auto"] = "confirm"
    resume: ResumeMode = "human"
    #: Predicates consulted by ``resume`` when ``resume = "rules"``; all must pass.
    resume_rules: tuple[ResumeRule, ...] = ()
    lease_seconds: float = 30.0
    send_deadline_seconds: float = 30.0
    busy_timeout_seconds: float = 5.0
    #: The most bytes of JSON recorded of each part of a target's answer (its
    #: result, its receipt, a lookup's detail): beyond it, the head is kept
    #: with the whole's length and SHA-256 (A10). It keeps a mission's record,
    #: its snapshots and its handovers to a size a store and an import accept.
    answer_bytes: int = 1 << 20
    #: The artifact store, shared by every worker on this machine (N2), and the
    #: directory under which each run has its workspace (``WORKSPACE/RUN_ID``).
    artifacts: str = ".charter/artifacts"
    workspace: str = ".charter/work"
    #: Path of the Ed25519 key (PEM) that signs snapshots and chain checkpoints
    #: (S2; see :mod:`charter.audit.signing`); ``None``: nothing is signed.
    signing_key: str | None = None
    #: Public keys (``ed25519:BASE64``) whose signatures this engine accepts, besides
    #: its own signing key's: other stores' keys, and retired keys of its own.
    trusted_keys: tuple[str, ...] = ()
    #: Endpoints told, signed, when a run needs a person (K3; ``[webhooks.NAME]``).
    webhooks: Mapping[str, Webhook] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.evidence_settles not in ("confirm", "auto"):
            raise ConfigError("evidence_settles must be 'confirm' (default) or 'auto'")
        if self.resume not in RESUME_STRICTNESS:
            raise ConfigError(f"resume must be one of {list(RESUME_STRICTNESS)}")
        for name in ("lease_seconds", "send_deadline_seconds", "busy_timeout_seconds"):
            v = getattr(self, name)
            if (
                isinstance(v, bool)
                or not isinstance(v, int | float)
                or not math.isfinite(v)
                or v <= 0
            ):
                raise ConfigError(f"{name} must be a positive, finite number of seconds")
        if (
            isinstance(self.answer_bytes, bool)
            or not isinstance(self.answer_bytes, int)
            or not 1024 <= self.answer_bytes <= 1 << 26
        ):
            raise ConfigError(
                "answer_bytes must be a whole number of bytes from 1024 to 67108864 (64 MiB)"
            )
        if self.store is not None and not isinstance(self.store, str):
            raise ConfigError("store must be a path or URL string")
        if self.signing_key is not None and not isinstance(self.signing_key, str):
            raise ConfigError("signing_key must be the path of a PEM file")
        if isinstance(self.trusted_keys, str) or not all(
            check_public(k) for k in self.trusted_keys
        ):
            raise ConfigError("trusted_keys must be a list of 'ed25519:BASE64' public keys")
        if self.send_deadline_seconds > self.lease_seconds:
            raise ConfigError(
                "send_deadline_seconds must not exceed lease_seconds: a send must never be "
                "possible after another owner could take over (F3)"
            )
        if not isinstance(self.webhooks, Mapping) or any(
            not isinstance(w, Webhook) or w.name != n for n, w in self.webhooks.items()
        ):
            raise ConfigError("webhooks must map each webhook's name to its Webhook")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, base: Path | None = None) -> EngineConfig:
        unknown = set(data) - _KEYS
        if unknown:
            raise ConfigError(
                f"unknown configuration key(s) {sorted(unknown)}; known: {sorted(_KEYS)}"
            )
        values = dict(data)
        store = values.get("store")
        if isinstance(store, str) and base is not None and "://" not in store:
            values["store"] = str(base / store)
        for key in ("artifacts", "workspace"):
            if isinstance(values.get(key), str) and base is not None:
                values[key] = str(base / values[key])
        signing_key = values.get("signing_key")
        if isinstance(signing_key, str) and base is not None:
            values["signing_key"] = str(base / signing_key)
        if isinstance(values.get("trusted_keys"), list):
            values["trusted_keys"] = tuple(values["trusted_keys"])
        credentials = values.get("credentials", {})
        if not isinstance(credentials, Mapping):
            raise ConfigError("[credentials] must map principal names to 'sha256:<hex>' digests")
        values["credentials"] = dict(credentials)
        values["adapters"] = _adapters(values.get("adapters", {}))
        values["webhooks"] = _webhooks(values.get("webhooks", {}))
        try:
            return cls(**values)
        except TypeError as exc:
            raise ConfigError(f"invalid configuration: {exc}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> EngineConfig:
        """The configuration in the TOML file at ``path`` (the module's text shows
        its keys). Relative paths in it (the store, artifacts, workspace, the
        signing key) are read beside the file, not from the current directory,
        so one file serves every process that names it; a missing file, bad
        TOML or an unknown key is a :class:`~charter.errors.ConfigError`."""
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"configuration file {p} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"configuration file {p} is not valid TOML: {exc}") from None
        return cls.from_mapping(data, base=p.parent)

    def load_adapter(self, name: str) -> Adapter:
        """Build the adapter configured under ``name`` (imports its module)."""
        path = self.adapters.get(name)
        if isinstance(path, HttpDeclaration):
            return path.build()
        if path is None:
            raise ConfigError(
                f"no adapter {name!r} is configured; add it under [adapters] in the "
                "configuration as name = 'module:factory'"
            )
        factory = import_path(path)
        adapter = factory() if callable(factory) and not hasattr(factory, "dispatch") else factory
        if getattr(adapter, "name", None) != name:
            raise ConfigError(
                f"{path} built an adapter named {getattr(adapter, 'name', None)!r}, not {name!r}"
            )
        return adapter  # type: ignore[no-any-return]

    @classmethod
    def discover(cls) -> EngineConfig:
        """``$CHARTER_CONFIG``, else ``./charter.toml`` if present, else defaults."""
        env = os.environ.get("CHARTER_CONFIG")
        if env:
            return cls.from_file(env)
        local = Path("charter.toml")
        if local.exists():
            return cls.from_file(local)
        return cls()


def _adapters(adapters: Any) -> dict[str, str | HttpDeclaration]:
    """[adapters]: each name maps to a ``"module:factory"`` path or an HTTP declaration."""
    if not isinstance(adapters, Mapping):
        raise ConfigError("[adapters] must map adapter names to 'module:factory' paths or tables")
    found: dict[str, str | HttpDeclaration] = {}
    for name, value in adapters.items():
        if isinstance(value, str) and ":" in value:
            found[name] = value
        elif isinstance(value, Mapping) and "http" in value:
            found[name] = declare(name, value)
        else:
            raise ConfigError(
                f"[adapters] {name!r} must be a 'module:factory' path or a table declaring "
                'an HTTP API (http = "https://..." and its operations)'
            )
    return found


def _webhooks(webhooks: Any) -> dict[str, Webhook]:
    """[webhooks.NAME]: url, secret = "env:NAME", and optionally events and timeout_seconds."""
    if not isinstance(webhooks, Mapping):
        raise ConfigError("[webhooks] must hold one table per webhook: [webhooks.NAME]")
    found: dict[str, Webhook] = {}
    for name, table in webhooks.items():
        if not isinstance(table, Mapping):
            raise ConfigError(f"[webhooks.{name}] must be a table with url and secret")
        unknown = set(table) - {"url", "secret", "events", "timeout_seconds"}
        if unknown or "url" not in table or "secret" not in table:
            raise ConfigError(
                f"[webhooks.{name}] takes url and secret, and optionally events and "
                f"timeout_seconds; unknown: {sorted(unknown)}"
            )
        secret = table["secret"]
        if not isinstance(secret, str) or not _ENV_NAME.fullmatch(secret):
            # The value itself is not repeated: it may be the key, written by mistake.
            raise ConfigError(
                f"[webhooks.{name}] secret must name an environment variable as 'env:NAME' "
                "(a key is never written in the configuration)"
            )
        events = table.get("events")
        found[name] = Webhook(
            name,
            table["url"],
            Secret(None, name=secret),
            tuple(events) if isinstance(events, list) else events,
            table.get("timeout_seconds", 10.0),
        )
    return found


def import_path(path: str) -> Any:
    """Resolve ``"package.module:attribute"``; a clear error if it does not exist."""
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot import {path!r}: {exc}") from None
    return obj
