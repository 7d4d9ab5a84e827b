"""The CrewAI tests' environment: they run in .venv-crewai, which
``python3 tasks.py test`` makes beside .venv (CrewAI's pins of openai, mcp and
pydantic have no resolution with the main test environment's). Imported by
each CrewAI test module before CrewAI: elsewhere the module is skipped, and
under ``CI=true`` it fails instead, so that CI never loses these tests
silently. CrewAI's telemetry and tracing stay off and its storage is a temporary
folder (nothing leaves the machine or lands in the home folder), and it is
loaded once with its import warnings quiet.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import warnings

import pytest

if importlib.util.find_spec("crewai") is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI=true and crewai is not installed: run these tests in .venv-crewai")
    pytest.skip(
        "CrewAI's tests run in .venv-crewai (python3 tasks.py test)", allow_module_level=True
    )

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("CREWAI_STORAGE_DIR", tempfile.mkdtemp(prefix="charter-crewai-"))

with warnings.catch_warnings():  # CrewAI's lazy submodules warn as they load
    warnings.simplefilter("ignore", ImportWarning)
    import crewai  # noqa: F401

#: CrewAI reads its own deprecated fields on every kickoff: its deprecation
#: warnings, not Charter's, are no test's error (``pytestmark`` of each module).
QUIET = pytest.mark.filterwarnings(r"ignore::DeprecationWarning:crewai(\..*)?")
