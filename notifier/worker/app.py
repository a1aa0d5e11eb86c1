"""The Celery app, configured from ``celeryconfig``; its tasks are in ``notifier.worker.tasks``."""

from celery import Celery

app = Celery("notifier")
app.config_from_object("celeryconfig")
