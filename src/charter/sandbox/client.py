"""How Charter talks to the payments sandbox: its HTTP adapter's declaration.

The sandbox documents its 409 (a stale fencing token, a key a lookup closed)
and 429 (a refusal) as made before anything is applied, so they are declared
"not applied"; every other status keeps the safe defaults. A lookup by key
that finds nothing closes the key, so its 404 is proof of non-application.
"""

from __future__ import annotations

from charter.adapters.http import Classification, HttpDeclaration, HttpOperation
from charter.adapters.protocol import EffectClass
from charter.secret import Secret

#: The sandbox forgets nothing, but a real payments API deduplicates a key for a day.
DEDUPE_WINDOW_SECONDS = 86_400


def declaration(
    url: str,
    *,
    name: str = "payments",
    unit: str = "usd_cents",
    timeout_seconds: float = 5.0,
    api_key: str | None = None,
) -> HttpDeclaration:
    """The sandbox at ``url``: ``pay`` (idempotent by key) and ``list`` (read only)."""
    return HttpDeclaration(
        name,
        url,
        {
            "pay": HttpOperation(
                "POST",
                "/v1/payments",
                EffectClass.IDEMPOTENT_KEYED,
                estimate={unit: "amount"},
                cost={unit: "amount"},
                lookup="/v1/payments/by-key/{idempotency_key}",
                absent_is_proof=True,
                dedupe_window_seconds=DEDUPE_WINDOW_SECONDS,
                price_source="sandbox/amount",
            ),
            "list": HttpOperation("GET", "/v1/payments", EffectClass.READ_ONLY, estimate={}),
        },
        Classification({409: "not_applied", 429: "not_applied"}),
        headers={}
        if api_key is None
        else {"Authorization": Secret(f"Bearer {api_key}", name=f"{name}-api-key")},
        timeout_seconds=timeout_seconds,
    )
