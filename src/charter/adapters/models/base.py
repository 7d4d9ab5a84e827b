"""What the model adapters share: the SDK client with its retries off, the
operations (all ``read_only``), the estimate and the pricing, and a connection
pool per send."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from charter.adapters import Dispatch, EffectClass, Estimate, Operation, Outcome
from charter.adapters.models.pricing import ModelUnits, Pricing, UsageLookup, max_tokens
from charter.secret import Secret


class ModelAdapter:
    """The common part of a provider's adapter, built from the arguments every
    provider takes. A provider names itself, its operations' output limits and
    how its SDK is loaded and connected, and writes ``_send``."""

    #: The provider's name, as ``genai-prices`` prices it.
    provider: str
    #: The adapter's name when none is given.
    default_name: str
    #: The output limit each operation's request names; its keys are the operations.
    limits: Mapping[str, tuple[str, ...]]

    def __init__(
        self,
        client: Any = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 120.0,
        units: ModelUnits | None = None,
        name: str | None = None,
        key_header: str = "Idempotency-Key",
        lookup: UsageLookup | None = None,
        input_bound: Callable[[Any], int] | None = None,
    ) -> None:
        sdk = self._load()
        if client is None:
            client = self._connect(sdk, base_url=base_url, api_key=api_key, timeout=timeout)
        self.client = client.with_options(max_retries=0)
        self._sdk = sdk
        self.name = self.default_name if name is None else name
        #: The provider credentials this adapter holds, as secrets: a provider
        #: quoting a key back in an error (a 401's body) gets it scrubbed from
        #: everything recorded, like a request's secrets (S3).
        self.credentials = [
            Secret(value, name=f"{self.name}:credential")
            for value in (api_key, *(getattr(client, a, None) for a in ("api_key", "auth_token")))
            if isinstance(value, str) and value
        ]
        self.operations: Mapping[str, Operation] = {
            op: Operation(EffectClass.READ_ONLY) for op in self.limits
        }
        self.pricing = Pricing(self.provider, units or ModelUnits())
        self.key_header = key_header
        self.lookup = lookup
        self.input_bound = input_bound

    def estimate(self, operation: str, request: Any) -> Estimate:
        limit = max_tokens(request, self.limits[operation], f"{self.name}.{operation}")
        return self.pricing.estimate(request, limit, self.input_bound)

    async def dispatch(self, send: Dispatch) -> Outcome:
        # A connection pool per send: an async pool belongs to one event loop,
        # and a synchronous caller's send gets a loop of its own.
        async with self._sdk.DefaultAsyncHttpxClient() as http:
            return await self._send(self.client.with_options(http_client=http), send)

    @staticmethod
    def _load() -> Any:
        """The provider's SDK module (raising ``MissingExtra`` without it)."""
        raise NotImplementedError

    @staticmethod
    def _connect(sdk: Any, *, base_url: str | None, api_key: str | None, timeout: float) -> Any:
        """A client of the provider's SDK, for an adapter given none."""
        raise NotImplementedError

    async def _send(self, client: Any, send: Dispatch) -> Outcome:
        raise NotImplementedError
