"""``notifier api``: the HTTP API for producers that are not on the database (``app.py``)."""
