"""The example clerk's conversation, as the fake provider answers it.

Turn one asks for the survey's price, turn two pays what ``quote`` returned,
turn three says it is done: each answer follows from the request's messages
alone, so a request sent again gets the same answer.
"""

from __future__ import annotations

import json
from typing import Any


def clerk_turns(body: dict[str, Any]) -> dict[str, Any]:
    results = [m for m in body["messages"] if m["role"] == "tool"]
    if not results:
        return _calls("call_quote_1", "quote", {"item": "survey"})
    if len(results) == 1:
        price = json.loads(results[0]["content"])
        args = {"payee": "survey-vendor", "amount": price, "reference": "survey-1"}
        return _calls("call_pay_1", "pay", args)
    return {"role": "assistant", "content": "Paid the survey vendor."}


def _calls(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}
