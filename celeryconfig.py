"""Celery's settings for notifier, each with the reason it is set.

Loaded by ``notifier.worker.app`` with ``app.config_from_object("celeryconfig")``. Values that an
operator tunes come from ``notifier.settings`` (environment variables ``NOTIFIER_*``).
"""

from celery.schedules import crontab

from notifier import redis_access
from notifier.settings import SettingsError, get_settings
from notifier.status_webhook import BEAT_SECONDS

try:
    _settings = get_settings()
except SettingsError as exc:
    # One line naming the variable, not a traceback through Celery's loader; exits non-zero.
    raise SystemExit(f"notifier: {exc}") from None

# One Redis server, or kombu's sentinel:// transport, which asks NOTIFIER_REDIS_SENTINELS for the
# primary on every (re)connection and so follows a failover (docs/redis-failover.md).
broker_url, _broker_sentinel = redis_access.celery_broker(_settings)
# Results are never read: tasks record their outcome in PostgreSQL. (No result backend, so none to
# point at the Sentinels either.)
task_ignore_result = True
result_backend = None

task_serializer = "json"
accept_content = ["json"]
timezone = "UTC"
enable_utc = True

# A task is acknowledged after it ran, and a worker killed mid-task hands it back; a dispatch
# is safe to repeat because every row it touches is claimed in the database.
task_acks_late = True
task_reject_on_worker_lost = True
# One message at a time per process: a busy process must not sit on dispatches others could run.
worker_prefetch_multiplier = 1
# A dispatch starts no send after its budget, and every network call has a timeout, so a task
# lasts at most its budget plus one send; the limits sit above that and fire only on a bug.
task_soft_time_limit = int(_settings.task_soft_time_limit)
task_time_limit = task_soft_time_limit + 30
# With late acks, a task whose connection to Redis was lost would be redelivered while it still
# runs; cancel it instead (its claimed rows are protected by their lease and claim token).
worker_cancel_long_running_tasks_on_connection_loss = True
broker_transport_options = {
    # Redis redelivers unacknowledged messages after this; keep it above the hard time limit.
    "visibility_timeout": task_time_limit * 2,
    "socket_timeout": 10,
    "socket_connect_timeout": 10,
    # With Sentinels: the name of the primary they monitor (``master_name``).
    **_broker_sentinel,
}
broker_connection_retry_on_startup = True
# No task is ever sent with an ETA or countdown: retry times live in the rows. (Delayed messages
# would sit unacknowledged in Redis past the visibility timeout and be delivered twice.)
# Recycle worker processes now and then, so slow leaks in a provider library cannot grow forever.
worker_max_tasks_per_child = 1000
worker_max_memory_per_child = 512_000  # KiB
# Let Flower and `celery events` see tasks.
worker_send_task_events = True
task_send_sent_event = True

_interval = _settings.dispatch_interval
beat_schedule = {
    "dispatch": {
        "task": "notifier.dispatch",
        "schedule": _interval,
        # A trigger that was not picked up before the next one is useless: drop it.
        "options": {"expires": max(_interval * 0.9, 0.5)},
    },
    "rescue": {
        "task": "notifier.rescue",
        "schedule": max(_interval, 5.0),
        "options": {"expires": max(_interval * 0.9, 0.5)},
    },
    # A campaign's last rows are final: mark it finished (a read per running campaign).
    "finish-campaigns": {
        "task": "notifier.finish_campaigns",
        "schedule": max(_interval, 5.0),
        "options": {"expires": max(_interval * 0.9, 0.5)},
    },
    # Once a day at a quiet hour (UTC). Not an 86400 s interval: beat counts an interval from
    # its own start, and its schedule file does not outlive a redeploy, so a beat restarted
    # more often than daily would never purge. A purge not started within the hour is dropped;
    # tomorrow's deletes the same rows.
    "purge": {
        "task": "notifier.purge",
        "schedule": crontab(hour=3, minute=17),
        "options": {"expires": 3600},
    },
}
# Only with a status webhook: without one, nothing is scheduled and no event is written. While
# a backlog keeps every pool process dispatching, a trigger waits for one to finish its budget:
# it must not expire before, or events would wait for the backlog's end.
if _settings.status_webhook_url:
    beat_schedule["status-webhook"] = {
        "task": "notifier.status_webhook",
        "schedule": BEAT_SECONDS,
        "options": {"expires": _settings.dispatch_budget_seconds + 2 * BEAT_SECONDS},
    }
