"""Lets ``celery -A notifier`` find the app."""

from notifier.worker.tasks import app

__all__ = ["app"]
