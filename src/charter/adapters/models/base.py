"""What the model adapters share: the SDK client with its retries off, the
operations (all ``read_only``), the pricing, and a connection pool per send."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from charter.adapters import Dispatch, EffectClass, Operation, Outcome
from charter.adapters.models.pricing import ModelUnits, Pricing, UsageLookup


class ModelAdapter:
    """The common part of a provider's adapter; a provider writes ``_send``."""

    def _setup(
        self,
        sdk: Any,
        client: Any,
        *,
        provider: str,
        operations: Sequence[str],
        name: str,
        units: ModelUnits | None,
        key_header: str,
        lookup: UsageLookup | None,
        input_bound: Callable[[Any], int] | None,
    ) -> None:
        self.client = client.with_options(max_retries=0)
        self._sdk = sdk
        self.name = name
        self.operations: Mapping[str, Operation] = {
            op: Operation(EffectClass.READ_ONLY) for op in operations
        }
        self.pricing = Pricing(provider, units or ModelUnits())
        self.key_header = key_header
        self.lookup = lookup
        self.input_bound = input_bound

    async def dispatch(self, send: Dispatch) -> Outcome:
        # A connection pool per send: an async pool belongs to one event loop,
        # and a synchronous caller's send gets a loop of its own.
        async with self._sdk.DefaultAsyncHttpxClient() as http:
            return await self._send(self.client.with_options(http_client=http), send)

    async def _send(self, client: Any, send: Dispatch) -> Outcome:
        raise NotImplementedError
