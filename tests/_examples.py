"""Running an example script as one step of a mission, in a fresh process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_step(
    example: Path, cfg: dict[str, Any], tmp: Path, **how: Any
) -> tuple[int, list[dict[str, Any]]]:
    """Run ``example`` on ``cfg`` updated with ``how``: its exit code (0, or
    killed by its crash hook) and the JSON lines it printed."""
    path = tmp / f"step-{len(list(tmp.glob('step-*')))}.json"
    path.write_text(json.dumps({**cfg, **how}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, str(example), str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode in (0, -signal.SIGKILL), done.stderr
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()]
