"""notifier: deliver the rows of a PostgreSQL ``notifications`` table by email, webhook and more.

Producers need only ``enqueue`` and ``cancel``; the Celery app lives in ``notifier.worker.app``,
its tasks in ``notifier.worker.tasks``.
"""

from notifier.client import Enqueued, cancel, enqueue, upsert_profile

__all__ = ["Enqueued", "cancel", "enqueue", "upsert_profile"]
