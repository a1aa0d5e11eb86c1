"""The ``postmark`` provider of the ``email`` channel: Postmark's Email API.

One row is ``POST {NOTIFIER_POSTMARK_API_BASE}/email``, several are ``POST /email/batch`` (up to
500 messages and 50 MB a request, Postmark's limits), with ``X-Postmark-Server-Token`` and JSON
messages: ``From``, ``To``, ``Subject``, ``TextBody``, ``HtmlBody``, ``ReplyTo``, ``Headers``,
``MessageStream`` (``NOTIFIER_POSTMARK_MESSAGE_STREAM``) and ``Metadata``
``{"notifier-id": "<row id>"}``, which Postmark's webhooks hand back (``notifier.events.postmark``).
Every message of a batch is its own, so any rows may share a request (``batch_key``).

Postmark answers each message with an ``ErrorCode`` (0: accepted, with its ``MessageID``); a
single send's error comes as HTTP 422, a batch's per message inside a 200, in the order sent:

* 406 inactive recipient (a hard bounce or a spam complaint before): ``Permanent``, suppressed;
* 300 invalid email request, and any other code about the message: ``Permanent``;
* 10 bad token, 400/401 sender signature missing or unconfirmed, 405/412/413 the account may
  not send, 1235 no such message stream: the operator's, a ``Retry`` naming the setting;
* 429 rate limit: a throttled ``Retry``; 100 maintenance: a ``Retry``.

A batch refused as a whole with a 422 (too many messages, a body it cannot read) is sent again
message by message.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from email.utils import formataddr
from typing import Any, ClassVar

import yarl

from notifier.models import Notification, truncate
from notifier.providers.base import Outcome, Permanent, Retry
from notifier.providers.esp import (
    EspProvider,
    Message,
    Outcomes,
    Reply,
    Request,
    missing,
    retry_after,
)
from notifier.providers.http import operator_url_problem

MAX_BATCH = 500
_SENDER = "NOTIFIER_EMAIL_FROM (a confirmed sender signature) and the Postmark account"
#: ErrorCodes that are the deployment's to fix, with what to check.
_OPERATOR = {
    10: "NOTIFIER_POSTMARK_SERVER_TOKEN",
    400: _SENDER,
    401: _SENDER,
    405: _SENDER,
    412: _SENDER,
    413: _SENDER,
    1235: "NOTIFIER_POSTMARK_MESSAGE_STREAM",
}


class PostmarkProvider(EspProvider):
    """Sends through Postmark; see the module docstring for the requests and their answers."""

    name = "postmark"
    label: ClassVar[str] = "Postmark"
    credentials: ClassVar[str] = "NOTIFIER_POSTMARK_SERVER_TOKEN"
    endpoint: ClassVar[str] = "NOTIFIER_POSTMARK_API_BASE"
    max_batch: ClassVar[int] = MAX_BATCH
    max_request_bytes: ClassVar[int] = 45_000_000  # of Postmark's 50 MB
    #: 500 answers of about 200 bytes each, with room to spare
    max_response_bytes: ClassVar[int] = 1_048_576

    def _configuration_error(self) -> str | None:
        s = self._settings
        return missing(
            "Postmark", postmark_server_token=s.postmark_server_token
        ) or operator_url_problem(s.postmark_api_base, "NOTIFIER_POSTMARK_API_BASE")

    def batch_key(self, n: Notification) -> Hashable | None:
        return "postmark"  # each message of a batch is whole: any rows may share one

    def _size(self, message: Message) -> int:
        return 2 * (len(message.text) + len(message.html or "")) + 4096  # JSON may escape

    def _message(self, m: Message) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "From": self._settings.email_from,
            "To": m.recipient,
            "Subject": m.subject,
            "Headers": [{"Name": k, "Value": v} for k, v in m.headers.items()],
            "Metadata": {"notifier-id": m.id},
            "MessageStream": self._settings.postmark_message_stream,
        }
        if m.text:
            doc["TextBody"] = m.text
        if m.html:
            doc["HtmlBody"] = m.html
        if m.reply_to is not None:
            doc["ReplyTo"] = formataddr(m.reply_to)
        return doc

    def _request(self, messages: Sequence[Message]) -> Request:
        base = self._settings.postmark_api_base.rstrip("/")
        single = len(messages) == 1
        doc: Any = self._message(messages[0]) if single else [self._message(m) for m in messages]
        return Request(
            url=yarl.URL(f"{base}/email" if single else f"{base}/email/batch"),
            body=json.dumps(doc, separators=(",", ":")).encode(),
            headers={
                "X-Postmark-Server-Token": self._settings.postmark_server_token or "",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
        )

    def _outcomes(self, messages: Sequence[Message], reply: Reply) -> Outcomes:
        doc = reply.json()
        single = len(messages) == 1
        if 200 <= reply.status < 300:
            if single:
                return [self._answer(reply, doc if isinstance(doc, dict) else {})]
            answers = doc if isinstance(doc, list) else []
            if len(answers) != len(messages):
                self.accepted(reply, None, f"answer for each of {len(messages)} messages")
            padded = [*answers[: len(messages)], *[{}] * (len(messages) - len(answers))]
            return [self._answer(reply, a if isinstance(a, dict) else {}) for a in padded]
        code = doc.get("ErrorCode") if isinstance(doc, dict) else None
        said = _said(doc) or reply.text()
        named = f" ErrorCode {code}" if isinstance(code, int) else ""
        error = truncate(f"Postmark HTTP {reply.status}{named}: {said}")
        common = self.refused(reply, error)
        if common is not None:
            return [common] * len(messages)
        if not single:  # the batch itself was refused: each message alone gets its own answer
            return [None] * len(messages)
        return [_by_code(code, error, reply) if isinstance(code, int) else Permanent(error)]

    def _answer(self, reply: Reply, doc: dict[str, Any]) -> Outcome:
        """One message's answer within an accepted request."""
        code = doc.get("ErrorCode", 0)
        if code == 0 or not isinstance(code, int) or isinstance(code, bool):
            return self.accepted(reply, doc.get("MessageID"), "MessageID")
        return _by_code(code, truncate(f"Postmark ErrorCode {code}: {_said(doc)}"), reply)


def _by_code(code: int, error: str, reply: Reply) -> Outcome:
    if code == 406:
        return Permanent(error, suppress=True)
    if code == 429:
        return Retry(error, retry_after(reply.headers), throttled=True)
    if code == 100:
        return Retry(error)
    if code in _OPERATOR:
        return Retry(truncate(f"{error}; check {_OPERATOR[code]}"))
    return Permanent(error)


def _said(doc: object) -> str:
    message = doc.get("Message") if isinstance(doc, dict) else None
    return message if isinstance(message, str) else ""
