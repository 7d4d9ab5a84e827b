"""Workers: processes that carry runs from the store, and tell people when a run
needs them (:mod:`charter.workers.notify`, K3)."""

from charter.workers.worker import Teller, Worker

__all__ = ["Teller", "Worker"]
