"""The ``sendgrid`` provider of the ``email`` channel: SendGrid's v3 Mail Send API.

A send is ``POST {NOTIFIER_SENDGRID_API_BASE}/v3/mail/send`` with ``Authorization: Bearer
{NOTIFIER_SENDGRID_API_KEY}`` and a JSON body: ``from``, ``reply_to``, ``content`` (text/plain
first, then text/html) and one ``personalizations`` entry per row, each with its own ``to``,
``subject``, ``headers`` and ``custom_args`` ``{"notifier_id": "<row id>"}``, which SendGrid's
Event Webhook hands back as a top-level field of every event (``notifier.events.sendgrid``).

Rows whose body, html, ``Reply-To`` and sender are the same (``batch_key``: a campaign's rows)
share a request of up to 1000 personalizations, the API's limit. SendGrid answers ``202`` with
``X-Message-Id`` (every row of the request gets it) or refuses the request as a whole: a 400
lists ``errors`` whose ``field`` names the personalization at fault
(``personalizations.3.to.0.email``); those rows are ``Permanent`` and the others are sent
again without them. A 400 or 413 that names none is sent again row by row, so that one bad
recipient costs its neighbours a request, never their message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Hashable, Sequence
from typing import Any, ClassVar

import yarl

from notifier.models import Notification, truncate
from notifier.providers.base import InvalidNotification, Permanent
from notifier.providers.email_message import parse_mailbox
from notifier.providers.esp import EspProvider, Message, Outcomes, Reply, Request, missing
from notifier.providers.http import operator_url_problem

#: SendGrid's limit of personalizations (and of recipients) in one request.
MAX_PERSONALIZATIONS = 1000
_BLAMED = re.compile(r"personalizations\.(\d{1,4})(?:\.|$)")


class SendGridProvider(EspProvider):
    """Sends through SendGrid; see the module docstring for the request and its answers."""

    name = "sendgrid"
    label: ClassVar[str] = "SendGrid"
    credentials: ClassVar[str] = "NOTIFIER_SENDGRID_API_KEY (it needs Mail Send access)"
    endpoint: ClassVar[str] = "NOTIFIER_SENDGRID_API_BASE"
    max_batch: ClassVar[int] = MAX_PERSONALIZATIONS
    max_request_bytes: ClassVar[int] = 25_000_000  # SendGrid takes 30 MB in all

    def _configuration_error(self) -> str | None:
        s = self._settings
        return missing("SendGrid", sendgrid_api_key=s.sendgrid_api_key) or operator_url_problem(
            s.sendgrid_api_base, "NOTIFIER_SENDGRID_API_BASE"
        )

    def validate(self, notification: Notification) -> None:
        super().validate(notification)
        if not (notification.subject or "").strip():
            raise InvalidNotification("subject is empty; SendGrid sends no email without one")

    def batch_key(self, n: Notification) -> Hashable | None:
        return self.content_key(n)

    def _size(self, message: Message) -> int:
        return len(message.subject) + sum(map(len, message.headers.values())) + 512

    def _request(self, messages: Sequence[Message]) -> Request:
        first = messages[0]  # the content is the same in every row of a request (batch_key)
        name, address = parse_mailbox("NOTIFIER_EMAIL_FROM", self._settings.email_from)
        doc: dict[str, Any] = {
            "personalizations": [
                {
                    "to": [{"email": m.recipient}],
                    "subject": m.subject,
                    "headers": m.headers,
                    "custom_args": {"notifier_id": m.id},
                }
                for m in messages
            ],
            "from": {"email": address, **({"name": name} if name else {})},
            "content": [
                *([{"type": "text/plain", "value": first.text}] if first.text else []),
                *([{"type": "text/html", "value": first.html}] if first.html else []),
            ],
        }
        if first.reply_to is not None:
            reply_name, reply_address = first.reply_to
            doc["reply_to"] = {
                "email": reply_address,
                **({"name": reply_name} if reply_name else {}),
            }
        base = self._settings.sendgrid_api_base.rstrip("/")
        return Request(
            url=yarl.URL(f"{base}/v3/mail/send"),
            body=json.dumps(doc, separators=(",", ":")).encode(),
            headers={
                "Authorization": f"Bearer {self._settings.sendgrid_api_key}",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
        )

    def _outcomes(self, messages: Sequence[Message], reply: Reply) -> Outcomes:
        if 200 <= reply.status < 300:
            sent = self.accepted(reply, reply.headers.get("x-message-id"), "X-Message-Id")
            return [sent] * len(messages)
        errors = _errors(reply.json())
        said = "; ".join(truncate(f"{m} (field {f})" if f else m, 200) for m, f in errors[:3])
        error = truncate(f"SendGrid HTTP {reply.status}: {said or reply.text()}")
        common = self.refused(reply, error)
        if common is not None:
            return [common] * len(messages)
        blamed: dict[int, str] = {}
        for message, field in errors:
            found = _BLAMED.match(field or "")
            if found is not None and int(found[1]) < len(messages):
                blamed.setdefault(int(found[1]), message)
        if blamed:
            return [
                Permanent(truncate(f"SendGrid HTTP {reply.status}: {blamed[i]}"))
                if i in blamed
                else None
                for i in range(len(messages))
            ]
        if len(messages) > 1:  # refused as a whole, no row named: each alone finds the culprit
            return [None] * len(messages)
        return [Permanent(error)]


def _errors(doc: object) -> list[tuple[str, str | None]]:
    """(message, field) of each entry of a SendGrid error document's ``errors``."""
    entries = doc.get("errors") if isinstance(doc, dict) else None
    found = []
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict):
            message, field = entry.get("message"), entry.get("field")
            found.append(
                (
                    message if isinstance(message, str) else "error",
                    field if isinstance(field, str) else None,
                )
            )
    return found
