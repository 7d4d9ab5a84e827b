"""The child of ``test_notify.py``: a deliverer of notices in a process of its own (K3).

Run as ``python _notify_child.py CONFIG.json``; the configuration names the store,
the webhook's URL, the environment variable holding its secret, the store's time
(the child's clock stands still there) and the mode:

- ``crash``: deliver with :func:`charter.testing.kill_at` armed at ``notice.sent``:
  the process is killed right after the webhook answered, before the delivery is
  marked done. It is expected to die by SIGKILL.
- ``drain``: deliver until nothing is pending, then print how many deliveries
  this process made, as JSON on one line.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import charter
from charter.config import Webhook
from charter.secret import Secret
from charter.testing import ManualClock, kill_at
from charter.workers.notify import Notices


def main() -> None:
    cfg = json.loads(Path(sys.argv[1]).read_text())
    hook = kill_at("notice.sent") if cfg["mode"] == "crash" else None
    engine = charter.Engine.open(cfg["store"], clock=ManualClock(cfg["now_us"]), crash_hook=hook)
    webhook = Webhook("ops", cfg["url"], Secret.env(cfg["secret_env"]), timeout_seconds=5)
    notices = Notices(engine, [webhook])
    print(json.dumps({"ready": True}), flush=True)
    delivered = 0
    deadline = time.monotonic() + 60
    while notices.pending() and time.monotonic() < deadline:
        made = notices.deliver_due()
        delivered += made
        if not made:
            time.sleep(0.01)  # the rest is claimed by the other deliverer
    print(json.dumps({"delivered": delivered}), flush=True)
    engine.close()


if __name__ == "__main__":
    main()
