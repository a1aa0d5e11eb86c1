"""Send-time guards: a check, registered by the deployment, that a row may still be sent.

A row names its guard in the ``guard`` column. Right before the row is sent, the guard is
called with it and answers ``Send()`` or ``Skip(reason)``; a skipped row becomes ``cancelled``
with the reason in ``last_error``. A guard that cannot decide raises ``GuardError``, and the row
is retried like any transient failure: never sent on a guess.

Guards register in the ``notifier.delivery.guards`` entry-point group, like providers. Built in:
``http``, which asks the URL in ``NOTIFIER_GUARD_HTTP_URL``.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import httpx

from notifier import plugins
from notifier.delivery.outcomes import Cancelled, Result
from notifier.models import Notification, truncate
from notifier.providers import Permanent, Retry
from notifier.settings import Settings

ENTRY_POINT_GROUP = "notifier.guards"

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Send:
    """The condition still holds: send."""


@dataclass(frozen=True, slots=True)
class Skip:
    """The condition no longer holds: cancel, with this reason."""

    reason: str


Verdict = Send | Skip


class GuardError(Exception):
    """The guard could not decide; the row is tried again later."""


@runtime_checkable
class Guard(Protocol):
    """A send-time check. ``check`` may be called from several threads at once."""

    name: ClassVar[str]

    def check(self, notification: Notification) -> Verdict: ...

    def close(self) -> None: ...


Registry = plugins.Registry[Guard]


def objection(guards: Registry, n: Notification) -> Result | None:
    """What ``n``'s guard holds against sending it now, as its result: ``Cancelled`` for a
    ``Skip``, ``Retry`` when the guard cannot decide or raises (a guard bug is no reason to
    send), ``Permanent`` for a guard this deployment does not have; ``None`` to go ahead."""
    guard = guards.get(n.guard or "")
    if guard is None:
        known = ", ".join(sorted(guards)) or "none"
        return Permanent(f"unknown guard {n.guard!r}; this deployment has: {known}")
    try:
        verdict = guard.check(n)
    except GuardError as exc:
        return Retry(f"guard {n.guard}: {exc}")
    except Exception as exc:
        log.exception("guard %s raised on notification %d", n.guard, n.id)
        return Retry(f"guard {n.guard} raised {type(exc).__name__}: {exc}")
    if isinstance(verdict, Skip):
        return Cancelled(verdict.reason)
    return None


def _name(guard: Guard) -> str:
    return guard.name


def registry_of(guards: list[Guard]) -> Registry:
    return plugins.Registry(_name, guards)


def load_registry(settings: Settings) -> Registry:
    """Instantiate every guard registered under the ``notifier.guards`` entry points."""
    return plugins.load(ENTRY_POINT_GROUP, _name, settings)


class HttpGuard:
    """Asks a service of the deployment whether the row may be sent.

    POSTs ``{"id", "channel", "recipient", "dedupe_key", "payload"}`` as JSON to
    ``NOTIFIER_GUARD_HTTP_URL`` and sends only on an explicit yes: a 200 answer whose JSON body is
    ``{"send": true}``. ``{"send": false, "reason": "..."}`` cancels the row. Anything else - no
    answer within ``NOTIFIER_GUARD_HTTP_TIMEOUT``, another status, another body - is a
    ``GuardError``: the row is retried, never sent.
    """

    name: ClassVar[str] = "http"

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def check(self, notification: Notification) -> Verdict:
        url = self._settings.guard_http_url
        if not url:
            raise GuardError("the http guard needs NOTIFIER_GUARD_HTTP_URL; it is not set")
        document = {
            "id": notification.id,
            "channel": notification.channel,
            "recipient": notification.recipient,
            "dedupe_key": notification.dedupe_key,
            "payload": notification.payload,
        }
        try:
            response = self._http().post(url, json=document)
        except httpx.TimeoutException:
            raise GuardError(
                f"http guard gave no answer within {self._settings.guard_http_timeout}s"
            ) from None
        except httpx.HTTPError as exc:
            raise GuardError(f"http guard unreachable: {type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            raise GuardError(
                f"http guard answered HTTP {response.status_code}: {truncate(response.text, 200)}"
            )
        return _verdict(response.content)

    def close(self) -> None:
        """Kept open across batches so its connections are reused."""

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(
                    timeout=httpx.Timeout(self._settings.guard_http_timeout),
                    follow_redirects=False,
                )
            return self._client


def _verdict(content: bytes) -> Verdict:
    try:
        answer: Any = json.loads(content)
    except ValueError:
        raise GuardError(
            f"http guard's answer is not JSON: {truncate(content.decode(errors='replace'), 200)}"
        ) from None
    if not isinstance(answer, dict) or not isinstance(answer.get("send"), bool):
        raise GuardError('http guard must answer {"send": true} or {"send": false, "reason": ...}')
    if answer["send"]:
        return Send()
    reason = answer.get("reason")
    return Skip(f"guard http: {reason}" if isinstance(reason, str) and reason else "guard http: no")
