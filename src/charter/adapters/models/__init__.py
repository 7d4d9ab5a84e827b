"""Model adapters: calls to the OpenAI and Anthropic APIs as attempts.

A model call is ``read_only`` (A7): it changes nothing outside but is billed.
Its estimate is an upper bound (the input tokens bounded by the request's
size, plus ``max_tokens`` at the output price); its actual cost is the
response's usage, priced offline with ``genai-prices``, whose version is the
price source recorded with both (L8). Token units (input, output) can be
allowance units beside money. A stream cut off in the middle stays UNKNOWN
with the partial usage as evidence: it may still be billed.

:mod:`~charter.adapters.models.openai` (extra ``charter[openai]``) and
:mod:`~charter.adapters.models.anthropic` (extra ``charter[anthropic]``) hold
the adapters; :mod:`~charter.adapters.models.pricing` what they share.
"""

from charter.adapters.models.pricing import ModelUnits, Usage

__all__ = ["ModelUnits", "Usage"]
