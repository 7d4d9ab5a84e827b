"""The example's crew without Charter: what CrewAI does alone when killed.

``python _crewai_plain.py CONFIG.json``: the same agent, task and model
(CrewAI's OpenAI client at the fake provider) as examples/crewai_agent.py,
with plain tools: ``pay`` sends the sandbox a key of its own making (a fresh
UUID, as a tool with no record to draw one from does). CrewAI keeps no record
of a task in flight, so starting again is ``crew.kickoff()`` again (its
``replay`` too starts a task from its beginning). With ``kill`` set, the
process SIGKILLs itself once the sandbox answered the payment, before the tool
returns: after the payment was applied, before CrewAI recorded it.
"""

from __future__ import annotations

# ruff: noqa: I001 - _crewai_env is imported before CrewAI, which it prepares
import _crewai_env  # noqa: F401 - CrewAI's telemetry off before it loads
import json
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
from crewai import Agent, Crew, Task
from crewai.tools import tool


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import crewai_agent as example


def main(argv: list[str]) -> int:
    cfg = json.loads(Path(argv[0]).read_text())

    @tool("pay")
    def pay(payee: str, amount: int, reference: str) -> dict[str, Any]:
        """Pay ``amount`` cents to ``payee``."""
        body = {"amount": amount, "currency": "usd", "payee": payee, "reference": reference}
        headers = {"Idempotency-Key": str(uuid.uuid4())}
        paid = httpx.post(f"{cfg['sandbox_url']}/v1/payments", json=body, headers=headers)
        if cfg.get("kill"):
            os.kill(os.getpid(), signal.SIGKILL)
        payment: dict[str, Any] = paid.json()
        return payment

    llm = example.model(cfg["model_url"]).inner  # CrewAI's own LLM, unwrapped
    clerk = Agent(
        role="clerk",
        goal="Buy what the team needs, once",
        backstory="You pay the team's vendors.",
        llm=llm,
        tools=[example.quote, pay],
    )
    buy = Task(
        description="Find the {item}'s price, pay the {item} vendor, then say so.",
        expected_output="A sentence saying what was paid.",
        agent=clerk,
    )
    result = Crew(agents=[clerk], tasks=[buy]).kickoff(inputs={"item": cfg["item"]})
    print(json.dumps({"completed": result.raw}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
