"""The ``push`` channel: one message to one device through Firebase Cloud Messaging's HTTP v1 API.

``recipient`` is the device's FCM registration token; ``subject`` and ``body`` become the
notification's title and text, and ``payload`` its ``data``, whose values FCM takes as strings
only. notifier authenticates as the service account in ``NOTIFIER_FCM_CREDENTIALS_FILE``: it
signs a JWT, trades it at the key's ``token_uri`` for an access token, and keeps that token until
shortly before it expires (google-auth's refresh margin).

FCM's answers (firebase.google.com/docs/reference/fcm/rest/v1/ErrorCode) are JSON errors with a
``status`` and ``details[].errorCode``. The token is dead on ``UNREGISTERED`` or an
``INVALID_ARGUMENT`` about ``message.token``, and on ``SENDER_ID_MISMATCH``; auth failures are the
operator's to fix and are retried, as is anything FCM or the token endpoint cannot do right now.
An ``UNREGISTERED`` token (the app was uninstalled) also goes on the suppression list
(``Permanent(suppress=True)``), so no later row is sent to it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from ipaddress import ip_address
from typing import Any, ClassVar
from urllib.parse import urlsplit

import httpx
from google.auth import exceptions as auth_errors
from google.auth import transport
from google.oauth2 import service_account

from notifier.models import Notification, truncate
from notifier.providers.base import InvalidNotification, Outcome, Permanent, Provider, Retry, Sent
from notifier.providers.http import SharedClient, parse_retry_after
from notifier.settings import Settings

SCOPES = ["https://www.googleapis.com/auth/firebase.messaging"]
MAX_TOKEN_LENGTH = 4096
#: data keys FCM keeps for itself (an INVALID_ARGUMENT "invalid data key" otherwise)
RESERVED_DATA_KEYS = frozenset({"from", "gcm"})
UNREGISTERED = (
    "push token is unregistered (FCM UNREGISTERED): the app was uninstalled or the token "
    "expired; stop sending to it"
)
MALFORMED_RECIPIENT = (
    "push token is not a valid FCM registration token (FCM INVALID_ARGUMENT): it was truncated "
    "or mangled; stop sending to it"
)
SENDER_MISMATCH = (
    "push token belongs to another Firebase project (FCM SENDER_ID_MISMATCH); stop sending to it"
)


class _NotReady(Exception):
    """Configuration or credentials are missing or broken: the operator's to fix, so retried."""


def _require_https(url: str, what: str, *, bare: bool = False) -> None:
    """Operator URLs are trusted but must be https; plain http only on loopback (tests)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        loopback = host == "localhost" or ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not host or not (parts.scheme == "https" or (parts.scheme == "http" and loopback)):
        raise _NotReady(f"{what} must be an https:// URL (http:// only on loopback); got {url!r}")
    if bare and (parts.path or parts.query):
        raise _NotReady(f"{what} must be scheme://host only; got {url!r}")


class _TokenRequest(transport.Request):  # type: ignore[misc]
    """google-auth's way to call the token endpoint, on the provider's httpx client.

    Any status but 200 is raised, not returned: google-auth would retry a 5xx itself, sleeping
    1 s and then 2 s inside a send thread, where notifier's own retry policy should decide.
    """

    def __init__(self, client: httpx.Client) -> None:
        self._client = client

    def __call__(
        self,
        url: str,
        method: str = "GET",
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> _TokenResponse:
        host = httpx.URL(url).netloc.decode()
        try:
            response = self._client.request(method, url, content=body, headers=headers)
        except httpx.HTTPError as exc:  # a timeout reads "ReadTimeout at host: timed out"
            raise auth_errors.TransportError(f"{type(exc).__name__} at {host}: {exc}") from None
        if response.status_code != 200:
            raise auth_errors.TransportError(
                f"HTTP {response.status_code} from {host}: {truncate(response.text, 200)}"
            )
        return _TokenResponse(response.status_code, response.headers, response.content)


@dataclass(frozen=True, slots=True)
class _TokenResponse:
    """The ``google.auth.transport.Response`` google-auth reads (it only reads these three)."""

    status: int
    headers: Mapping[str, str]
    data: bytes


class PushProvider(Provider):
    """Sends through one ``httpx.Client`` (FCM and the token endpoint) shared by all threads.

    Nothing is read before the first send, so a deployment without push still starts; until
    the settings are right every push row is retried with an error that says what is missing.
    """

    channel: ClassVar[str] = "push"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._settings = settings
        self._timeout = self._settings.push_timeout
        self._client = SharedClient(
            lambda: httpx.Client(timeout=httpx.Timeout(self._timeout), follow_redirects=False)
        )
        self._auth_lock = threading.Lock()  # guards the credentials and their refresh
        self._credentials: service_account.Credentials | None = None
        self._send_url = ""

    def validate(self, notification: Notification) -> None:
        self.validate_recipient(notification.recipient)
        if not notification.subject and not notification.body:
            raise InvalidNotification(
                "a push needs a subject (its title) or a body; both are empty"
            )
        for key, value in notification.payload.items():
            if key in RESERVED_DATA_KEYS or key.lower().startswith("google"):
                raise InvalidNotification(
                    f"payload key {key!r} is reserved by FCM (from, gcm, google*); rename it"
                )
            if not isinstance(value, str):
                raise InvalidNotification(
                    f"payload.{key} must be a string for push data; FCM data values are strings "
                    f"(got {type(value).__name__})"
                )

    def validate_recipient(self, token: str) -> None:
        if not token.strip():
            raise InvalidNotification("recipient is empty; put the device's FCM token there")
        if any(c.isspace() or not c.isprintable() for c in token):
            raise InvalidNotification(
                "recipient (an FCM registration token) contains whitespace or control characters"
            )
        if len(token) > MAX_TOKEN_LENGTH:
            raise InvalidNotification(
                f"recipient is {len(token)} characters; an FCM token is at most {MAX_TOKEN_LENGTH}"
            )

    def problem(self) -> str | None:
        if self._settings.fcm_credentials_file is None:
            return (
                "push is not configured: set NOTIFIER_FCM_CREDENTIALS_FILE to a Firebase "
                "service-account JSON key"
            )
        return None

    def send(self, notification: Notification) -> Outcome:
        try:
            access_token = self._access_token()
        except _NotReady as exc:
            return Retry(truncate(str(exc)))
        message: dict[str, Any] = {"token": notification.recipient, "data": notification.payload}
        shown = {"title": notification.subject, "body": notification.body}
        message["notification"] = {k: v for k, v in shown.items() if v}
        headers = {"Authorization": f"Bearer {access_token}"}
        try:
            response = self._client.get().post(
                self._send_url, json={"message": message}, headers=headers
            )
        except httpx.TimeoutException as exc:
            name = type(exc).__name__
            return Retry(f"timed out ({name}) after the {self._timeout:g}s limit sending to FCM")
        except httpx.TransportError as exc:
            return Retry(truncate(f"{type(exc).__name__} sending to FCM: {exc}"))
        if response.status_code == 401:  # the token was revoked or is stale: fetch a new one
            with self._auth_lock:
                if self._credentials is not None and self._credentials.token == access_token:
                    self._credentials.token = None
        return _outcome(response)

    def close(self) -> None:
        """Called after every batch; keeps the client and the access token for the next one."""

    def shutdown(self) -> None:
        """Close the client and its connections; a later send opens a new one."""
        self._client.close()

    def _access_token(self) -> str:
        with self._auth_lock:
            credentials = self._credentials or self._load()
            if not credentials.valid:
                try:
                    credentials.refresh(_TokenRequest(self._client.get()))
                except auth_errors.GoogleAuthError as exc:
                    raise _NotReady(f"no FCM access token from the token endpoint: {exc}") from None
            self._credentials = credentials
            return str(credentials.token)

    def _load(self) -> service_account.Credentials:
        settings = self._settings
        path = settings.fcm_credentials_file
        if path is None:
            raise _NotReady(
                "push is not configured: set NOTIFIER_FCM_CREDENTIALS_FILE to a Firebase "
                "service-account JSON key"
            )
        base = settings.fcm_api_base.rstrip("/")
        _require_https(base, "NOTIFIER_FCM_API_BASE", bare=True)
        try:
            info = json.loads(path.read_bytes())
            if not isinstance(info, dict):
                raise ValueError("not a JSON object")
            credentials = service_account.Credentials.from_service_account_info(info, scopes=SCOPES)
        except (OSError, ValueError, TypeError, auth_errors.GoogleAuthError) as exc:
            # These texts name fields and formats, never the key itself.
            raise _NotReady(f"cannot load NOTIFIER_FCM_CREDENTIALS_FILE {path}: {exc}") from None
        _require_https(str(info["token_uri"]), f"token_uri in {path}")
        project = settings.fcm_project_id or info.get("project_id")
        if not project:
            raise _NotReady(f"{path} names no project_id; set NOTIFIER_FCM_PROJECT_ID")
        self._send_url = f"{base}/v1/projects/{project}/messages:send"
        return credentials


def _outcome(response: httpx.Response) -> Outcome:
    """What an FCM answer means for the row (the table is in the module docstring)."""
    status = response.status_code
    try:
        document = response.json()
    except ValueError:
        document = None
    if status == 200:  # accepted: a body we cannot read must not cause a second message
        name = document.get("name") if isinstance(document, dict) else None
        return Sent(name if isinstance(name, str) else None)
    retry_after = parse_retry_after(response.headers.get("retry-after"))
    error = document.get("error") if isinstance(document, dict) else None
    if not isinstance(error, dict):
        text = f"FCM answered HTTP {status} with no FCM error: {truncate(response.text, 200)}"
        if status in (401, 403, 404, 408, 429) or status >= 500:  # not about this row
            return Retry(text, retry_after, throttled=status == 429)
        return Permanent(text)
    details = [d for d in _list(error.get("details")) if isinstance(d, dict)]
    codes = {d.get("errorCode") for d in details}
    violations = [v for d in details for v in _list(d.get("fieldViolations"))]
    fields = {v.get("field") for v in violations if isinstance(v, dict)}
    message = str(error.get("message", ""))
    code = next((c for c in codes if isinstance(c, str)), None) or error.get("status", "")
    text = truncate(f"FCM HTTP {status} {code}: {message}")
    if "UNREGISTERED" in codes:
        return Permanent(UNREGISTERED, suppress=True)
    if "SENDER_ID_MISMATCH" in codes:
        return Permanent(SENDER_MISMATCH)
    if status == 429 or "QUOTA_EXCEEDED" in codes:
        return Retry(text, retry_after, throttled=True)
    if status >= 500 or status == 408:
        return Retry(text, retry_after)
    if status in (401, 403):
        return Retry(f"{text} (fix the credentials in NOTIFIER_FCM_CREDENTIALS_FILE or Firebase)")
    if status == 404:  # not a token: FCM says UNREGISTERED for those; a wrong project is ours
        return Retry(f"{text} (check NOTIFIER_FCM_PROJECT_ID)")
    if "message.token" in fields or "registration token" in message.lower():
        return Permanent(MALFORMED_RECIPIENT)
    return Permanent(text)


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []
