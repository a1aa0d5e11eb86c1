"""The ``ses`` provider of the ``email`` channel: Amazon SES v2 ``SendEmail``, on the event loop.

The message is ``Content.Raw``: the very bytes the SMTP provider sends (``email_rows``), so one
row makes one message shape whichever provider carries it, with the same header checks,
``List-Unsubscribe`` and ``X-Notifier-Id``. ``Content.Simple`` would have SES build the MIME
from parts, and what a row's headers become would be SES's to decide. SES replaces the
``Message-ID`` and ``Date`` headers with its own; the row is named instead by the message tag
``notifier_id`` (published with the events of a configuration set), by ``X-Notifier-Id``
(in notifications that include the original headers) and by SES's ``MessageId``, which the
send stores as the row's ``provider_message_id`` (``notifier.events.sns`` reads all three).

The client follows the AWS SDK's conventions (aiobotocore on botocore): its default credential
chain, the region of ``NOTIFIER_SES_REGION`` or else the SDK's own, ``NOTIFIER_SES_ENDPOINT_URL``
for a VPC endpoint. The SDK retries nothing (``total_max_attempts=1``): a ``SendEmail`` retried
after a read timeout may send the message twice (the API has no idempotency key), SDK retries
would stretch one send past ``longest_send_seconds``, and notifier's own retry already backs
off, holds every worker back on a throttle, and fails over to the next provider of the chain.

What SES answers (the ``SendEmail`` errors of the SES v2 API reference):

* ``TooManyRequestsException``, ``Throttling`` (HTTP 429): ``Retry(throttled=True)``;
* ``LimitExceededException`` (the sending quota), ``SendingPausedException`` (the account or the
  configuration set is paused), ``AccountSuspendedException``: the deployment's problem, never
  the row's: ``Retry(throttled=True)`` for ``DEPLOYMENT_PAUSE_SECONDS``, which holds every worker
  back and uses no attempt, with an error saying what to fix;
* ``MailFromDomainNotVerifiedException``, ``NotFoundException`` (the configuration set), a
  ``MessageRejected`` about an unverified identity (the sender, or a recipient in the
  sandbox), a refused credential (401, 403): ``Retry`` naming what to fix;
* any other ``MessageRejected``, ``BadRequestException`` and other 4xx: ``Permanent``;
* 5xx, timeouts, refused connections, an unreadable answer: ``Retry``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar
from urllib.parse import urlsplit

import aiohttp
import botocore.exceptions as boto
from aiobotocore.config import AioConfig
from aiobotocore.httpsession import AIOHTTPSession
from aiobotocore.session import AioSession, get_session

from notifier import eventloop
from notifier.models import Notification, truncate
from notifier.providers.base import InvalidNotification, Outcome, Permanent, Retry, Sent
from notifier.providers.email_rows import EmailRows
from notifier.providers.http import ERROR_BODY_BYTES, parse_retry_after
from notifier.providers.netguard import is_loopback
from notifier.settings import Settings

#: The message tag that names the row; SES publishes it with every event of the message.
TAG = "notifier_id"
#: How long every worker holds back from SES when the account cannot send at all (paused,
#: suspended, quota spent): long enough not to hammer it, short enough to resume soon after an
#: operator fixes it. Throttled rows use no attempt (up to ``NOTIFIER_MAX_DEFERRALS`` of them).
DEPLOYMENT_PAUSE_SECONDS = 600.0
#: Seconds an idle keep-alive connection to SES is kept (as for webhooks).
KEEPALIVE_SECONDS = 5.0
_THROTTLED = frozenset({"TooManyRequestsException", "Throttling", "ThrottlingException"})
_CREDENTIALS = frozenset(
    {
        "UnrecognizedClientException",
        "InvalidClientTokenId",
        "InvalidSignatureException",
        "SignatureDoesNotMatch",
        "IncompleteSignature",
        "MissingAuthenticationToken",
        "ExpiredToken",
        "ExpiredTokenException",
        "AccessDeniedException",
        "AccessDenied",
    }
)
_PAUSED = {
    "SendingPausedException": "sending is paused for the account or for the configuration set"
    " (resume it in the SES console, or with PutAccountSendingAttributes /"
    " PutConfigurationSetSendingOptions)",
    "AccountSuspendedException": "the account's ability to send is suspended; see the SES"
    " console's reputation page",
    "LimitExceededException": "the account's sending quota is spent; wait, or ask AWS for more",
}
#: What a MessageRejected says when an identity is not verified: the sender, or in the sandbox
#: the recipient too (moto says "Did not have authority to send from email ...").
_UNVERIFIED = re.compile(r"not verified|authority to send|sandbox", re.IGNORECASE)
_CHAIN = (
    "check the AWS credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or the"
    " container's or instance's role"
)
#: An SES message id: printable ASCII, bounded (it is indexed in ``provider_message_id``).
_MESSAGE_ID = re.compile(r"[!-~]{1,256}")


class SesProvider(EmailRows):
    """Sends through one aiobotocore ``sesv2`` client per process, made on first use on the
    loop that sends and kept across batches (its pool of keep-alive connections with it);
    ``shutdown`` closes it. The blocking ``send`` waits on that loop for ``send_async``.
    """

    name = "ses"
    #: the other email provider's channel: a chain ``email=ses,email`` fails over to SMTP
    channel: ClassVar[str] = "email"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._timeout = settings.ses_timeout
        self._total = 3 * settings.ses_timeout
        self._session: AioSession = get_session()
        self._region, self._problem = _configuration(settings, self._session)
        self._config = AioConfig(
            connect_timeout=self._timeout,
            read_timeout=self._timeout,
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=settings.async_send_concurrency + settings.send_concurrency,
            connector_args={"keepalive_timeout": KEEPALIVE_SECONDS},
            http_session_cls=_Unredirected,
        )
        self._where = settings.ses_endpoint_url or f"SES in {self._region}"
        self._making: asyncio.Task[tuple[Any, contextlib.AsyncExitStack]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def problem(self) -> str | None:
        """What keeps SES from sending, when a ``NOTIFIER_FAILOVER`` chain uses it: a deployment
        that never picks ``ses`` has nothing to fix. Credentials are not looked for here: the
        chain may ask the instance's metadata service, which is the first send's to wait for."""
        used = any(self.name in names for names in self.settings.failover.values())
        return self._problem if used else None

    def send(self, notification: Notification) -> Outcome:
        """``send_async``, waited for on the process's event loop: for a caller in a thread."""
        return eventloop.run(self.send_async(notification))

    async def send_async(self, notification: Notification) -> Outcome:
        """One ``SendEmail``; every failure becomes an outcome, within ``3 * ses_timeout``."""
        if self._problem is not None:
            return Retry(self._problem)
        try:
            raw = self._compose(notification, self._message_id(notification))
        except InvalidNotification as exc:
            return Permanent(truncate(f"invalid notification: {exc}"))
        request: dict[str, Any] = {
            "FromEmailAddress": self._sender,
            "Destination": {"ToAddresses": [notification.recipient]},
            "Content": {"Raw": {"Data": raw}},
            "EmailTags": [{"Name": TAG, "Value": str(notification.id)}],
        }
        if self.settings.ses_configuration_set:
            request["ConfigurationSetName"] = self.settings.ses_configuration_set
        try:
            async with asyncio.timeout(self._total):
                client = await self._client()
                answer = await client.send_email(**request)
        except boto.ClientError as exc:
            return self._refused(exc.response)
        except (boto.ConnectTimeoutError, boto.ReadTimeoutError) as exc:
            kind = "ConnectTimeout" if isinstance(exc, boto.ConnectTimeoutError) else "ReadTimeout"
            return Retry(
                f"timed out ({kind}) after the {self._timeout:g}s limit (NOTIFIER_SES_TIMEOUT)"
                f" sending to {self._where}"
            )
        except TimeoutError:
            return Retry(
                f"timed out (the whole send) after its {self._total:g}s limit (3 x"
                f" NOTIFIER_SES_TIMEOUT) sending to {self._where}"
            )
        except (boto.NoCredentialsError, boto.PartialCredentialsError) as exc:
            return Retry(truncate(f"{exc} for {self._where}; {_CHAIN}"))
        except (boto.BotoCoreError, aiohttp.ClientError, OSError) as exc:
            return Retry(truncate(f"{type(exc).__name__} sending to {self._where}: {exc}"))
        found = answer.get("MessageId") if isinstance(answer, Mapping) else None
        # An unreadable success is still a sent message: a retry would send a second one.
        return Sent(found if isinstance(found, str) and _MESSAGE_ID.fullmatch(found) else None)

    def close(self) -> None:
        """Called after every batch; keeps the client so the next batch reuses its connections."""

    def shutdown(self) -> None:
        """Close the client and its connections; a later send makes a new one.

        Call it from a thread, not from a coroutine on the client's loop.
        """
        making, loop = self._making, self._loop
        self._making = self._loop = None
        if making is None or loop is None or loop.is_closed():
            return

        async def close() -> None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                _, stack = await making
                await stack.aclose()

        eventloop.finish_on(loop, close())

    async def _client(self) -> Any:
        """The client of the running loop, made once: concurrent first sends wait for the same
        one, and a send cancelled meanwhile does not cancel it for the others."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None and self._loop.is_running():
                raise RuntimeError("SesProvider is already sending on another event loop")
            self._making, self._loop = None, loop  # its loop is gone, and its connections
        making = self._making
        if making is None or (making.done() and (making.cancelled() or making.exception())):
            making = self._making = loop.create_task(self._new_client())
        client, _ = await asyncio.shield(making)
        return client

    async def _new_client(self) -> tuple[Any, contextlib.AsyncExitStack]:
        stack = contextlib.AsyncExitStack()
        client = await stack.enter_async_context(
            self._session.create_client(
                "sesv2",
                region_name=self._region,
                endpoint_url=self.settings.ses_endpoint_url,
                config=self._config,
            )
        )
        client.meta.events.register("before-parse.sesv2.SendEmail", _readable)
        return client, stack

    def _refused(self, response: Mapping[str, Any]) -> Retry | Permanent:
        """What an SES error answer means for the row; any answer at all is an outcome."""
        error = response.get("Error")
        error = error if isinstance(error, Mapping) else {}
        meta = response.get("ResponseMetadata")
        meta = meta if isinstance(meta, Mapping) else {}
        status = meta.get("HTTPStatusCode")
        status = status if isinstance(status, int) else 0
        code = str(error.get("Code") or "")
        said = truncate(
            f"SES {code or 'error'} (HTTP {status}) from {self._where}:"
            f" {error.get('Message') or '(no message)'}",
            400,
        )
        if code in _THROTTLED or status == 429:
            headers = meta.get("HTTPHeaders")
            retry_after = (
                parse_retry_after(str(headers.get("retry-after") or ""))
                if isinstance(headers, Mapping)
                else None
            )
            return Retry(said, retry_after, throttled=True)
        if code in _PAUSED:
            return Retry(
                truncate(f"{said}; {_PAUSED[code]}"), DEPLOYMENT_PAUSE_SECONDS, throttled=True
            )
        if code == "MailFromDomainNotVerifiedException":
            return Retry(truncate(f"{said}; check the MAIL FROM domain's MX record in SES"))
        if code == "NotFoundException":
            return Retry(
                truncate(f"{said}; check NOTIFIER_SES_CONFIGURATION_SET and NOTIFIER_SES_REGION")
            )
        if code == "MessageRejected" and _UNVERIFIED.search(said):
            return Retry(
                truncate(
                    f"{said}; verify NOTIFIER_EMAIL_FROM's address or domain in SES"
                    " (in the sandbox, the recipients too) in NOTIFIER_SES_REGION"
                )
            )
        if 300 <= status < 400:  # redirects are not followed: the endpoint is wrong
            return Retry(
                truncate(f"{said}; check NOTIFIER_SES_ENDPOINT_URL and NOTIFIER_SES_REGION")
            )
        if code in _CREDENTIALS or status in (401, 403):
            return Retry(truncate(f"{said}; {_CHAIN}"))
        if status >= 500 or status in (0, 408):
            return Retry(said)
        return Permanent(said)


class Redirected(boto.HTTPClientError):  # type: ignore[misc]
    """SES's address answered with a redirect: the endpoint or the region is wrong."""

    fmt = (
        "SES answered HTTP {status} redirecting to {location}; redirects are not followed, check"
        " NOTIFIER_SES_ENDPOINT_URL and NOTIFIER_SES_REGION"
    )


class _Unredirected(AIOHTTPSession):  # type: ignore[misc]
    """aiohttp follows redirects unless told not to, and aiobotocore does not tell it. Refused
    here once the answer is in, so that whatever answers at the new address (a 200) cannot pass
    for SES; the request itself has gone there by then (re-sent whole after a 307 or 308)."""

    async def send(self, request: Any) -> Any:
        response = await super().send(request)
        history = getattr(response.raw, "history", ())
        if history:
            first = history[0]
            location = truncate(str(first.headers.get("location") or "nowhere"), 200)
            raise Redirected(status=first.status, location=location, error="redirect")
        return response


def _readable(response_dict: dict[str, Any], **_: Any) -> None:
    """Make the body botocore is about to parse a JSON object of UTF-8 text, at most
    ``ERROR_BODY_BYTES`` of it as the ``message`` when it is not: botocore raises on a body that
    is not UTF-8, or JSON but not an object (``0``, ``[]``, ``null``), whatever the status."""
    body = response_dict.get("body")
    if not isinstance(body, bytes) or not body:
        return
    text = body.decode("utf-8", "replace")
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        response_dict["body"] = text.encode()
    else:
        response_dict["body"] = json.dumps({"message": text[:ERROR_BODY_BYTES]}).encode()


def _configuration(settings: Settings, session: AioSession) -> tuple[str, str | None]:
    """The region to send in, and why SES cannot send here (``None`` when it can)."""
    try:
        region = settings.ses_region or session.get_config_variable("region")
    except boto.BotoCoreError as exc:  # AWS_PROFILE names no profile, say
        return "", truncate(f"SES cannot read the AWS configuration: {exc}")
    if not isinstance(region, str) or not region:
        return "", (
            "SES has no region: set NOTIFIER_SES_REGION (or the SDK's AWS_DEFAULT_REGION, or a"
            " region in the AWS profile)"
        )
    url = settings.ses_endpoint_url
    if url is None:
        return region, None
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number in range
    except ValueError:
        parts = parts._replace(netloc="")
    host = parts.hostname or ""
    if not host or parts.scheme not in ("http", "https") or parts.query or parts.fragment:
        return region, f"NOTIFIER_SES_ENDPOINT_URL {url!r} is not an https:// URL"
    if parts.scheme == "http" and not is_loopback(host):
        return region, (
            f"NOTIFIER_SES_ENDPOINT_URL {url!r} uses plain http; use https (every message goes"
            " through it; http is only accepted on loopback)"
        )
    return region, None
