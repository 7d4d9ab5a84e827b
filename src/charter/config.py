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
"""

from __future__ import annotations

import importlib
import math
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from charter.adapters.http import HttpDeclaration, declare
from charter.audit.signing import check_public
from charter.contracts.contract import RESUME_STRICTNESS, ResumeMode
from charter.errors import ConfigError

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
}


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
