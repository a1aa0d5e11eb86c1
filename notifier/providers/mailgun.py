"""The ``mailgun`` provider of the ``email`` channel: Mailgun's messages API.

A send is ``POST {NOTIFIER_MAILGUN_API_BASE}/v3/{NOTIFIER_MAILGUN_DOMAIN}/messages``, form-encoded,
with basic auth ``api:{NOTIFIER_MAILGUN_API_KEY}``: ``from``, ``to``, ``subject``, ``text``,
``html``, each header as ``h:Name``, and ``v:notifier_id`` (the row's id), which Mailgun's
webhooks hand back in ``user-variables`` (``notifier.events.mailgun``).

Rows whose body, html, ``Reply-To``, sender and header names are the same (``batch_key``: a
campaign's rows) share a request of up to 1000 ``to`` addresses, Mailgun's batch-sending limit,
with ``recipient-variables``: a JSON object by address, from which Mailgun writes each
recipient's own message. Its subject, header values and ``v:notifier_id`` are
``%recipient.KEY%`` references into that object, so every recipient keeps its own. A row whose
text already holds ``%recipient`` never shares a request: Mailgun would substitute it.

Mailgun answers 200 ``{"id": "<...>", "message": "Queued. Thank you."}`` (every row of the
request gets the id), or refuses the request as a whole: a 400 ``{"message": ...}`` does not
say which recipient is at fault, so a refused batch is sent again row by row and only the bad
row is ``Permanent``. 401/403 and a 404 (an unknown domain) are the operator's to fix.
"""

from __future__ import annotations

import json
from base64 import b64encode
from collections.abc import Hashable, Sequence
from email.utils import formataddr
from typing import ClassVar
from urllib.parse import quote, urlencode

import yarl

from notifier.models import Notification, truncate
from notifier.providers.base import Permanent
from notifier.providers.esp import (
    RECIPIENT_VARIABLE,
    EspProvider,
    Message,
    Outcomes,
    Reply,
    Request,
    missing,
)
from notifier.providers.http import operator_url_problem

#: Mailgun's limit of recipients in one batch send.
MAX_RECIPIENTS = 1000


class MailgunProvider(EspProvider):
    """Sends through Mailgun; see the module docstring for the request and its answers."""

    name = "mailgun"
    label: ClassVar[str] = "Mailgun"
    credentials: ClassVar[str] = "NOTIFIER_MAILGUN_API_KEY and NOTIFIER_MAILGUN_DOMAIN"
    endpoint: ClassVar[str] = (
        "NOTIFIER_MAILGUN_API_BASE (the domain's region) and NOTIFIER_MAILGUN_DOMAIN"
    )
    max_batch: ClassVar[int] = MAX_RECIPIENTS
    max_request_bytes: ClassVar[int] = 20_000_000  # Mailgun takes 25 MB in all

    def _configuration_error(self) -> str | None:
        s = self._settings
        return missing(
            "Mailgun", mailgun_api_key=s.mailgun_api_key, mailgun_domain=s.mailgun_domain
        ) or operator_url_problem(s.mailgun_api_base, "NOTIFIER_MAILGUN_API_BASE")

    def batch_key(self, n: Notification) -> Hashable | None:
        headers = n.payload.get("headers") or {}
        texts = [n.body or "", n.payload.get("html") or "", n.subject or "", *headers.values()]
        if any(RECIPIENT_VARIABLE in str(text) for text in texts):
            return None
        unsubscribes = n.payload.get("unsubscribe") is True or n.payload.get("campaign") is not None
        names = tuple(sorted(str(name).lower() for name in headers))
        return self.content_key(n, names, unsubscribes)

    def _size(self, message: Message) -> int:
        return len(message.subject) + sum(map(len, message.headers.values())) + 512

    def _request(self, messages: Sequence[Message]) -> Request:
        first = messages[0]  # the content is the same in every row of a request (batch_key)
        form: list[tuple[str, str]] = [("from", self._settings.email_from)]
        form += [("to", m.recipient) for m in messages]
        if first.text:
            form.append(("text", first.text))
        if first.html:
            form.append(("html", first.html))
        if first.reply_to is not None:
            form.append(("h:Reply-To", formataddr(first.reply_to)))
        if len(messages) == 1:
            form.append(("subject", first.subject))
            form += [(f"h:{name}", value) for name, value in first.headers.items()]
            form.append(("v:notifier_id", first.id))
        else:
            names = list(first.headers)
            form.append(("subject", "%recipient.subject%"))
            form += [(f"h:{name}", f"%recipient.h{j}%") for j, name in enumerate(names)]
            form.append(("v:notifier_id", "%recipient.notifier_id%"))
            variables = {
                m.recipient: {
                    "subject": m.subject,
                    "notifier_id": m.id,
                    **{f"h{j}": m.headers.get(name, "") for j, name in enumerate(names)},
                }
                for m in messages
            }
            form.append(("recipient-variables", json.dumps(variables, separators=(",", ":"))))
        s = self._settings
        base, domain = s.mailgun_api_base.rstrip("/"), quote(s.mailgun_domain or "", safe="")
        token = b64encode(f"api:{s.mailgun_api_key}".encode()).decode()
        return Request(
            url=yarl.URL(f"{base}/v3/{domain}/messages", encoded=True),
            body=urlencode(form).encode(),
            headers={
                "Authorization": f"Basic {token}",
                "Content-Type": "application/x-www-form-urlencoded",
                "Accept": "application/json",
            },
        )

    def _outcomes(self, messages: Sequence[Message], reply: Reply) -> Outcomes:
        doc = reply.json()
        if 200 <= reply.status < 300:
            message_id = doc.get("id") if isinstance(doc, dict) else None
            return [self.accepted(reply, message_id, "id")] * len(messages)
        said = doc.get("message") if isinstance(doc, dict) else None
        error = truncate(
            f"Mailgun HTTP {reply.status}: {said if isinstance(said, str) else reply.text()}"
        )
        common = self.refused(reply, error)
        if common is not None:
            return [common] * len(messages)
        if len(messages) > 1:  # Mailgun names no culprit: each alone gets its own answer
            return [None] * len(messages)
        return [Permanent(error)]
