"""Lets ``celery -A notifier`` find the app."""

from notifier.tasks import app

__all__ = ["app"]
