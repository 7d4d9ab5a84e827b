"""An adapter for JSON APIs over HTTP: payments, messaging, ticketing (A1-A8, F3, R7).

Each operation is declared once, in Python (:class:`HttpOperation`) or in the
engine's TOML configuration (:func:`declare`), so that ``charter reconcile``
can build the same adapter in another process. Every send carries the
attempt's idempotency key (A5) and the fencing token (F2) in headers of their
own, and goes out only before the send deadline (F3): the deadline is checked
right before the request is written, and the connect timeout is cut to what
remains of it. The HTTP client's own retries are off and redirects are not
followed, so every request that leaves is an attempt Charter knows about.

What a response means is decided by a :class:`Classification`, whose defaults
are the safe reading of HTTP:

==========================================  ===================================
what happened                               the attempt
==========================================  ===================================
no connection (refused, connect timeout)    not applied: no byte was sent
2xx                                         SUCCEEDED, cost read from the body
400, 401, 403, 404, 422                     FAILED, the response kept as receipt
408, 409, 429, any other 4xx, 3xx, 5xx      UNKNOWN: the target may have acted
timeout or reset after sending              UNKNOWN
==========================================  ===================================

A status becomes "not applied" only where the target documents that it
refuses it before processing anything (declare it: ``{429: "not_applied"}``).

Reconciling looks the effect up (``lookup``, a GET path naming
``{idempotency_key}``, ``{attempt_id}``, ``{run_id}`` or request fields) and
reads the answer by the one rule of :mod:`charter.attempts.classify`: a 2xx is
evidence of application only when it holds the effect itself — the body, or
the object at ``lookup_found`` (``"data"`` for a list answer), matching
``lookup_match`` when declared — with the actual cost read from that object.
An empty list, an empty body, an envelope, several candidates or an object
that does not match prove nothing. A 404 (or an empty answer) proves
non-application only if the operation declares ``absent_is_proof``: the
target guarantees that an applied effect is visible to the lookup at once
*and* that a send still on its way with that key can no longer apply.

The HTTP client is httpx, behind the ``http`` extra; declaring operations
needs nothing but the standard library.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

from charter.adapters import sending
from charter.adapters.protocol import (
    Dispatch,
    EffectClass,
    Estimate,
    Evidence,
    Operation,
    Outcome,
    RecordedAttempt,
)
from charter.attempts.classify import Lookup, lookup_evidence, read_lookup
from charter.errors import AdapterError, ConfigError, MissingExtra, NotApplied
from charter.secret import Secret

if TYPE_CHECKING:
    import httpx

Verdict = Literal["succeeded", "failed", "unknown", "not_applied"]
VERDICTS: tuple[Verdict, ...] = ("succeeded", "failed", "unknown", "not_applied")

#: The safe defaults for statuses outside 2xx: a refusal the target made after
#: reading the request is a failure; anything that may have been processed is
#: unknown. Statuses not listed (and every 3xx and 5xx) are unknown.
DEFAULT_STATUSES: Mapping[int, Verdict] = {
    400: "failed",
    401: "failed",
    403: "failed",
    404: "failed",
    422: "failed",
    408: "unknown",
    409: "unknown",
    429: "unknown",
}

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")

#: How an amount is found: unit -> a dotted path into the JSON (``"amount"``,
#: ``"charge.total"``), or a function of the JSON that returns unit -> amount.
AmountRule = Mapping[str, str] | Callable[[Any], Mapping[str, int]]

_FIELD = re.compile(r"{([A-Za-z_][A-Za-z0-9_]*)}")


@dataclass(frozen=True)
class Classification:
    """What each HTTP status means for an attempt: ``statuses`` overrides the defaults."""

    statuses: Mapping[int, Verdict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for status, verdict in self.statuses.items():
            if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
                raise ConfigError(
                    f"an HTTP status is a whole number from 100 to 599, not {status!r}"
                )
            if verdict not in VERDICTS:
                raise ConfigError(f"status {status} maps to {verdict!r}; use one of {VERDICTS}")
            if verdict == "succeeded" and not 200 <= status < 300:
                raise ConfigError(
                    f"status {status} cannot mean success: only a 2xx carries a result"
                )

    def of(self, status: int) -> Verdict:
        if status in self.statuses:
            return self.statuses[status]
        if 200 <= status < 300:
            return "succeeded"
        return DEFAULT_STATUSES.get(status, "unknown")


@dataclass(frozen=True)
class HttpOperation:
    """One operation of an HTTP API: where it goes, what it may do, what it costs.

    ``estimate`` reads the upper bound from the request, ``cost`` the actual
    cost from a 2xx body or the effect a lookup found (without it the
    estimate is taken as the actual cost: a fixed-price API). Amounts are
    integers in the unit's smallest step. ``lookup_found`` is the dotted path
    to the effect in the lookup's answer (``"data"``: a list of at most one);
    ``lookup_match`` maps fields of the found effect to what they must hold
    for it to be this attempt's (a value, a list of values, or
    ``"{idempotency_key}"``, ``"{attempt_id}"``, ``"{run_id}"``).
    ``lookup_empty_is_absent``: the target documents that an empty answer
    (``[]``, ``null``, no body) means it holds no such effect, as a 404 does;
    otherwise an empty answer proves nothing.
    """

    method: str
    path: str
    effect: EffectClass
    estimate: AmountRule
    cost: AmountRule | None = None
    lookup: str | None = None
    absent_is_proof: bool = False
    lookup_found: str | None = None
    lookup_match: Mapping[str, Any] | None = None
    lookup_empty_is_absent: bool = False
    dedupe_window_seconds: int | None = None
    retries: int = 2
    price_source: str = "declared"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"method must be one of {METHODS}, not {self.method!r}")
        for what, template in (("path", self.path), ("lookup", self.lookup)):
            if template is not None and (
                not isinstance(template, str) or not template.startswith("/")
            ):
                raise ConfigError(f"{what} must be a path starting with '/', not {template!r}")
        if self.absent_is_proof and (self.lookup is None or "{idempotency_key}" not in self.lookup):
            raise ConfigError(
                "absent_is_proof needs a lookup by {idempotency_key}: only the key the "
                "attempt was sent with can show that this attempt never applied"
            )
        self._check_lookup_reading()
        for what, rule in (("estimate", self.estimate), ("cost", self.cost)):
            if rule is not None and not callable(rule) and not _is_fields(rule):
                raise ConfigError(
                    f"{what} maps each unit to a dotted field path (or is a function), not {rule!r}"
                )
        self.operation  # noqa: B018 - checks effect, window and retries the one way

    def _check_lookup_reading(self) -> None:
        reads = self.lookup_found is not None or self.lookup_match or self.lookup_empty_is_absent
        if reads and self.lookup is None:
            raise ConfigError(
                "lookup_found, lookup_match and lookup_empty_is_absent read a lookup: declare one"
            )
        if self.lookup_found is not None and (
            not isinstance(self.lookup_found, str) or not all(self.lookup_found.split("."))
        ):
            raise ConfigError(f"lookup_found is a dotted path, not {self.lookup_found!r}")
        if self.lookup_match is None:
            return
        if not isinstance(self.lookup_match, Mapping):
            raise ConfigError("lookup_match maps fields of the found effect to values")
        for path, wanted in self.lookup_match.items():
            values = wanted if isinstance(wanted, list) else [wanted]
            if not isinstance(path, str) or not path or not values:
                raise ConfigError(f"lookup_match: {path!r} = {wanted!r} is not a field and value")
            for value in values:
                known = {"{idempotency_key}", "{attempt_id}", "{run_id}"}
                if not isinstance(value, str | int | bool) or (
                    isinstance(value, str) and value.startswith("{") and value not in known
                ):
                    raise ConfigError(
                        f"lookup_match {path!r}: {value!r} is not a value or one of {sorted(known)}"
                    )

    @property
    def operation(self) -> Operation:
        try:
            return Operation(EffectClass(self.effect), self.dedupe_window_seconds, self.retries)
        except (AdapterError, ValueError) as exc:
            raise ConfigError(f"operation {self.method} {self.path}: {exc}") from None


@dataclass(frozen=True)
class HttpDeclaration:
    """Everything an :class:`HttpAdapter` is built from, checked without the HTTP client."""

    name: str
    base_url: str
    operations: Mapping[str, HttpOperation]
    classification: Classification = field(default_factory=Classification)
    idempotency_header: str = "Idempotency-Key"
    fencing_header: str = "X-Fencing-Token"
    headers: Mapping[str, str | Secret] = field(default_factory=dict)
    timeout_seconds: float = 10.0
    connect_timeout_seconds: float = 5.0

    def __post_init__(self) -> None:
        if not re.fullmatch(r"https?://[^/\s]+(/\S*)?", self.base_url or ""):
            raise ConfigError(f"base_url must be an http:// or https:// URL, not {self.base_url!r}")
        if not self.operations:
            raise ConfigError(f"HTTP adapter {self.name!r} declares no operations")
        for name in ("timeout_seconds", "connect_timeout_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(
                    f"{name} must be a positive number: a request always has a timeout"
                )
        if self.idempotency_header.lower() == self.fencing_header.lower():
            raise ConfigError("the idempotency key and the fencing token need headers of their own")

    def build(self) -> HttpAdapter:
        return HttpAdapter(self)


def _httpx() -> Any:
    try:
        import httpx  # noqa: PLC0415 - an optional extra, loaded when an adapter is built
    except ImportError:
        raise MissingExtra(
            "the HTTP adapter needs httpx: pip install 'charter[http]'", extra="http"
        ) from None
    return httpx


class TargetUncertain(Exception):
    """The target answered in a way that does not say whether it acted (A3): UNKNOWN."""


class HttpAdapter:
    """An :class:`~charter.adapters.Adapter` for a JSON API, built from a declaration.

    Pass ``transport`` (an httpx transport) only to put something between the
    adapter and the network; retries stay off either way. The default one checks
    the send deadline again right before a send's first byte on its socket
    (:mod:`.sending`, F3).
    """

    def __init__(self, declaration: HttpDeclaration, *, transport: Any = None) -> None:
        httpx = self._httpx = _httpx()
        self.declaration = declaration
        self.name = declaration.name
        self.operations: Mapping[str, Operation] = {
            name: op.operation for name, op in declaration.operations.items()
        }
        self._timeout = httpx.Timeout(
            declaration.timeout_seconds, connect=declaration.connect_timeout_seconds
        )
        self._client = httpx.Client(
            base_url=declaration.base_url,
            timeout=self._timeout,
            follow_redirects=False,
            transport=transport or sending.transport(httpx),
        )
        self._no_send = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
        self._http_error = httpx.HTTPError

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HttpAdapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _op(self, operation: str) -> HttpOperation:
        op = self.declaration.operations.get(operation)
        if op is None:
            raise AdapterError(f"adapter {self.name!r} has no operation {operation!r}")
        return op

    def estimate(self, operation: str, request: Any) -> Estimate:
        op = self._op(operation)
        return Estimate(amounts(op.estimate, request, "request"), op.price_source)

    def dispatch(self, send: Dispatch) -> Outcome:
        op = self._op(send.operation)
        wire = _revealed(send.request)
        has_body = op.method != "GET"
        left_s = (send.deadline_monotonic_us - send.clock.monotonic_us()) / 1_000_000
        request = self._client.build_request(
            op.method,
            _fill(op.path, wire, {}),
            json=wire if has_body else None,
            params=None if has_body or not isinstance(wire, dict) else wire,
            headers={
                **self._headers(),
                self.declaration.idempotency_header: send.idempotency_key,
                self.declaration.fencing_header: send.fencing_token,
            },
            timeout=self._httpx.Timeout(
                self.declaration.timeout_seconds,
                connect=max(0.001, min(self.declaration.connect_timeout_seconds, left_s)),
            ),
        )
        send.check_deadline()  # right before the bytes go out (F3), and at the socket:
        try:
            with sending.sending(send):
                response = self._client.send(request)
        except self._no_send as exc:
            raise NotApplied(
                f"no connection to {self.declaration.base_url}: nothing was sent",
                evidence={"error": type(exc).__name__, "detail": str(exc)},
            ) from None
        return self._answer(op, send.request, response)

    def _answer(self, op: HttpOperation, request: Any, response: httpx.Response) -> Outcome:
        body = _body(response)
        receipt = {"status": response.status_code}  # the body is the result: stored once
        verdict = self.declaration.classification.of(response.status_code)
        if verdict == "succeeded":
            cost = (
                amounts(op.estimate, request, "request")
                if op.cost is None
                else amounts(op.cost, body, "response")
            )
            return Outcome.succeeded(body, cost=cost, receipt=receipt, price_source=op.price_source)
        if verdict == "failed":
            return Outcome.failed(body, receipt=receipt)
        if verdict == "not_applied":
            raise NotApplied(
                f"the target refused before applying (HTTP {response.status_code})",
                evidence={**receipt, "body": body},
            )
        raise TargetUncertain(f"HTTP {response.status_code}: {_excerpt(body)}")

    def reconcile(self, attempt: RecordedAttempt) -> Evidence:
        op = self._op(attempt.operation)
        if op.lookup is None:
            return Evidence.indeterminate({"lookup": f"{attempt.operation} declares no lookup"})
        known = {
            "idempotency_key": attempt.idempotency_key,
            "attempt_id": attempt.id,
            "run_id": attempt.run_id,
        }
        path = _fill(op.lookup, attempt.request, known)
        try:
            response = self._client.get(path, headers=self._headers())
        except self._http_error as exc:
            return Evidence.indeterminate({"lookup": path, "error": type(exc).__name__})
        body = _body(response)
        status = response.status_code
        seen: dict[str, Any] = {"lookup": path, "status": status}
        if 200 <= status < 300:
            read = read_lookup(
                body,
                found_at=op.lookup_found,
                match=op.lookup_match,
                known=known,
                empty_is_absent=op.lookup_empty_is_absent,
            )
        elif status in (404, 410):
            read = Lookup("absent", why=f"HTTP {status}")
        else:
            read = Lookup("indeterminate", why=f"HTTP {status}")
        if read.seen != "found":
            seen["body"] = body  # what proved nothing is kept; a found effect is the result

        def applied(found: Mapping[str, Any]) -> Outcome:
            cost = dict(attempt.estimate) if op.cost is None else amounts(op.cost, found, "lookup")
            return Outcome.succeeded(found, cost=cost, receipt=seen, price_source=op.price_source)

        return lookup_evidence(
            read, absent_is_proof=op.absent_is_proof, outcome=applied, detail=seen
        )

    def _headers(self) -> dict[str, str]:
        return {
            k: v.reveal() if isinstance(v, Secret) else v
            for k, v in self.declaration.headers.items()
        }


def amounts(rule: AmountRule, data: Any, where: str) -> dict[str, int]:
    """The amounts ``rule`` reads from ``data`` (the request or a response body)."""
    if callable(rule):
        return dict(rule(data))
    found: dict[str, int] = {}
    for unit, path in rule.items():
        value: Any = data
        for step in path.split("."):
            value = value.get(step) if isinstance(value, dict) else None
        if isinstance(value, bool) or not isinstance(value, int):
            raise AdapterError(
                f"the {where} has no whole-number amount at {path!r} for unit {unit!r} "
                f"(found {value!r})"
            )
        found[unit] = value
    return found


def _is_fields(rule: Any) -> bool:
    return isinstance(rule, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in rule.items()
    )


def _revealed(value: Any) -> Any:
    """The request as it goes on the wire: each secret's value, revealed here only (S3)."""
    if isinstance(value, Secret):
        return value.reveal()
    if isinstance(value, dict):
        return {k: _revealed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_revealed(v) for v in value]
    return value


def _fill(template: str, request: Any, known: Mapping[str, str]) -> str:
    """A path with its ``{name}`` fields filled from ``known`` or the request, URL-quoted."""

    def value(match: re.Match[str]) -> str:
        name = match[1]
        if name in known:
            return quote(str(known[name]), safe="")
        if isinstance(request, dict) and isinstance(request.get(name), str | int):
            return quote(str(request[name]), safe="")
        raise AdapterError(f"path {template!r} needs {name!r}, which the request does not have")

    return _FIELD.sub(value, template)


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _excerpt(body: Any) -> str:
    text = body if isinstance(body, str) else json.dumps(body, sort_keys=True)
    return text if len(text) <= 300 else text[:300] + "..."


_DECLARATION_KEYS = {
    "http",
    "idempotency_header",
    "fencing_header",
    "headers",
    "timeout_seconds",
    "connect_timeout_seconds",
    "classify",
    "operations",
}
_OPERATION_KEYS = {
    "method",
    "path",
    "effect",
    "estimate",
    "cost",
    "lookup",
    "absent_is_proof",
    "lookup_found",
    "lookup_match",
    "lookup_empty_is_absent",
    "dedupe_window_seconds",
    "retries",
    "price_source",
}


def declare(name: str, table: Mapping[str, Any]) -> HttpDeclaration:
    """An HTTP adapter declared in the engine's TOML configuration::

        [adapters.payments]
        http = "https://api.example.com"
        headers = { Authorization = "env:PAYMENTS_AUTH" }   # env: -> read from the environment
        classify = { 429 = "not_applied" }                 # documented as refused unprocessed

        [adapters.payments.operations.pay]
        method = "POST"
        path = "/v1/payments"
        effect = "idempotent_keyed"
        dedupe_window_seconds = 86400
        estimate = { usd_cents = "amount" }                 # unit -> field of the request
        cost = { usd_cents = "amount" }                     # unit -> field of the response
        lookup = "/v1/payments/by-key/{idempotency_key}"
        absent_is_proof = true

    Checked here, so a mistake is reported when the configuration is read.
    """
    where = f"[adapters.{name}]"
    _known_keys(table, _DECLARATION_KEYS, where)
    operations = table.get("operations")
    if not isinstance(operations, Mapping) or not operations:
        raise ConfigError(f"{where} needs an [adapters.{name}.operations.<name>] table")
    classify = table.get("classify", {})
    if not isinstance(classify, Mapping):
        raise ConfigError(f"{where} classify maps HTTP statuses to verdicts")
    statuses: dict[int, Verdict] = {}
    for status, verdict in classify.items():
        if not str(status).isdigit():
            raise ConfigError(f"{where} classify: {status!r} is not an HTTP status")
        statuses[int(status)] = verdict
    headers = table.get("headers", {})
    if not isinstance(headers, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise ConfigError(f"{where} headers maps header names to strings")
    return HttpDeclaration(
        name,
        table.get("http", ""),
        {op: _operation(f"[adapters.{name}.operations.{op}]", t) for op, t in operations.items()},
        Classification(statuses),
        table.get("idempotency_header", "Idempotency-Key"),
        table.get("fencing_header", "X-Fencing-Token"),
        {k: _header(v) for k, v in headers.items()},
        table.get("timeout_seconds", 10.0),
        table.get("connect_timeout_seconds", 5.0),
    )


def _operation(where: str, table: Any) -> HttpOperation:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where} must be a table")
    _known_keys(table, _OPERATION_KEYS, where)
    missing = [k for k in ("method", "path", "effect", "estimate") if k not in table]
    if missing:
        raise ConfigError(f"{where} needs {', '.join(missing)}")
    try:
        effect = EffectClass(table["effect"])
    except ValueError:
        raise ConfigError(
            f"{where} effect must be one of {[e.value for e in EffectClass]}"
        ) from None
    try:
        return HttpOperation(**{**table, "effect": effect})
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _header(value: str) -> str | Secret:
    """``env:NAME`` is a secret read from the environment; anything else is literal."""
    if value.startswith("env:"):
        return Secret(None, name=value)  # read when a request is sent, in that process
    return value


def _known_keys(table: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = set(table) - known
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
