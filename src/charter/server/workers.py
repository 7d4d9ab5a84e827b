"""One of several processes serving a console (``charter serve --workers N``).

Each worker opens its own engine on the store, so the store serialises what
must be serial across them as it does across any processes. What they share
comes from the serving process in
:data:`~charter.server.WORKER_ENVIRONMENT`: where the store and the
configuration are, whether cookies are ``Secure``, and the key binding the
sign-in forms (a form one worker served may be posted to another). The key is
read once and removed, so nothing this worker starts inherits it.
"""

from __future__ import annotations

import json
import os
from typing import Any

from charter import Engine, EngineConfig
from charter.server import WORKER_ENVIRONMENT, create_app, settled


def app() -> Any:
    """The worker's application (a factory: uvicorn calls it in the worker)."""
    spec = json.loads(os.environ.pop(WORKER_ENVIRONMENT))
    config = EngineConfig.from_file(spec["config"]) if spec["config"] else EngineConfig.discover()
    engine = Engine.open(spec["store"], config=config, create=False)
    app = create_app(engine, secure_cookies=spec["secure"], key=bytes.fromhex(spec["key"]))
    settled()
    return app
