"""An example agent resumed in a fresh process after a crash, its code changed
meanwhile: its agent has one more instruction. Every model request it replays
then asks for something else than recorded (tests/test_example_pydantic_ai.py).

    python _changed_example.py CONFIG.json
"""

from __future__ import annotations

import sys
from typing import Any

import _step as step
import pydantic_ai_agent as example

made = example.Agent


def changed(*args: Any, **options: Any) -> Any:
    """The example's agent, told one more thing."""
    options["instructions"] = f"{options['instructions']} Pay in euros."
    return made(*args, **options)


if __name__ == "__main__":
    example.Agent = changed  # the one change the example goes through
    sys.exit(step.main(sys.argv[1:], example.build_plan))
