"""The Celery worker and beat: the app, its thin tasks, and what each worker process runs beside
them (heartbeat, wake-ups, the connection budget)."""
