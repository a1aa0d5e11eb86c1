"""What every provider of the ``email`` channel does with a row before it sends: the checks of
``validate`` and the one MIME message a row becomes (``_compose``, through ``email_message``), so
that SMTP and the ESPs' APIs send exactly the same message.

Every message carries ``Message-ID: <notification-{id}@{domain of email_from}>``, the same on
every attempt, so a receiver can drop the duplicate a retry may cause.

So that a provider's delivery reports (``notifier events``) find their row, every message also
names it in ``X-Notifier-Id: {id}`` and in the metadata headers the common relays hand back in
their events: ``X-Mailgun-Variables`` (Mailgun's ``user-variables``), ``X-SMTPAPI``
``unique_args`` (SendGrid) and ``X-PM-Metadata-notifier-id`` (Postmark); a row's own header of
one of those names wins over notifier's. Campaign rows and rows whose ``payload.unsubscribe``
is true carry RFC 8058 one-click ``List-Unsubscribe`` headers (``notifier.unsubscribe``), an
opt-out of the row's category, unless the row sets its own ``List-Unsubscribe``; a row without
a category is transactional and carries none.
"""

from __future__ import annotations

import json
import re
from email.utils import parseaddr
from typing import ClassVar

from notifier import unsubscribe
from notifier.models import Notification
from notifier.providers import hostname
from notifier.providers.base import InvalidNotification, Provider
from notifier.providers.email_message import (
    ADDRESS,
    build,
    check_headers,
    check_sender,
    check_text,
    date_header,
    json_type,
    parse_mailbox,
)
from notifier.settings import Settings

_ADDRESS = re.compile(ADDRESS)


class EmailRows(Provider):
    """The row's side of an email provider; a subclass adds the transport (``send``).

    Made with a ``NOTIFIER_EMAIL_FROM`` that some message can be sent from, or ``ValueError``:
    a sender every message would be refused for is the deployment's to fix, at start.
    """

    channel: ClassVar[str] = "email"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._sender = sender_address(settings.email_from)
        self._domain = sender_domain(settings.email_from)
        try:
            check_sender(settings.email_from, self._domain)
        except InvalidNotification as exc:
            raise ValueError(
                f"NOTIFIER_EMAIL_FROM {settings.email_from!r} is unusable: {exc}"
            ) from None

    def validate(self, notification: Notification) -> None:
        check_notification(notification)

    def validate_recipient(self, recipient: str) -> None:
        check_recipient(recipient)

    def _message_id(self, n: Notification) -> str:
        return message_id(n, self._domain)

    def _compose(self, n: Notification, message_id: str) -> bytes:
        headers, reply_to = row_headers(n, self._feedback_headers(n))
        return build(
            sender=self.settings.email_from,
            recipient=n.recipient,
            subject=n.subject or "",
            date=date_header(),
            message_id=message_id,
            headers=headers,
            reply_to=reply_to,
            body=n.body or "",
            html=n.payload.get("html"),
        )

    def _feedback_headers(self, n: Notification) -> dict[str, str]:
        """Headers that let delivery reports and unsubscribes find their way back."""
        found = {
            "X-Notifier-Id": str(n.id),
            "X-Mailgun-Variables": json.dumps({"notifier_id": str(n.id)}),
            "X-SMTPAPI": json.dumps({"unique_args": {"notifier_id": str(n.id)}}),
            "X-PM-Metadata-notifier-id": str(n.id),
        }
        return found | list_unsubscribe(self.settings, n)


# -- an email row, whatever carries it (SMTP or an email provider's HTTP API) -------------------


def sender_address(email_from: str) -> str:
    """The bare address of ``NOTIFIER_EMAIL_FROM`` (``Shop <news@shop.example>``)."""
    return parseaddr(email_from)[1] or email_from


def sender_domain(email_from: str) -> str:
    """The domain every ``Message-ID`` names: the sender's, ``notifier.localhost`` without one."""
    _, at, domain = sender_address(email_from).rpartition("@")
    return domain if at and domain else "notifier.localhost"


def message_id(n: Notification, domain: str) -> str:
    """A row's ``Message-ID``, the same on every attempt and through every transport, so that
    a receiver can drop the duplicate a retry may cause."""
    return f"<notification-{n.id}@{domain}>"


def check_notification(notification: Notification) -> None:
    """Raise ``InvalidNotification`` if the email row can never be sent as written: its
    recipient, subject, ``payload.html`` and ``payload.headers``."""
    check_recipient(notification.recipient)
    subject = notification.subject
    if subject is not None:
        check_text("subject", subject)
        if len(subject) > 998:
            raise InvalidNotification(f"subject is {len(subject)} characters; at most 998")
    html = notification.payload.get("html")
    if html is not None and not isinstance(html, str):
        raise InvalidNotification(
            f'payload.html must be a string of HTML like "<p>Hi</p>", not {json_type(html)}'
        )
    check_headers(notification.payload.get("headers"))


def check_recipient(recipient: str) -> None:
    """Raise ``InvalidNotification`` unless ``recipient`` is one plain address to a domain
    that can exist."""
    # An address the pattern takes passes every check before it (no space, line break,
    # list or display name can match): only its domain is left, and most are.
    if len(recipient) <= 254 and _ADDRESS.fullmatch(recipient):
        _check_domain(recipient)
        return
    shown = repr(recipient[:100])
    if not recipient.strip():
        raise InvalidNotification("recipient is empty; give the email address to send to")
    if "\r" in recipient or "\n" in recipient:
        raise InvalidNotification("recipient contains a line break; give one plain address")
    if "," in recipient or ";" in recipient:
        raise InvalidNotification(f"recipient {shown} lists several; send one row per address")
    if "<" in recipient or ">" in recipient:
        raise InvalidNotification(f"recipient {shown}: give the bare address, no display name")
    if len(recipient) > 254:
        raise InvalidNotification(f"recipient is {len(recipient)} characters; at most 254")
    if not _ADDRESS.fullmatch(recipient):
        raise InvalidNotification(
            f"recipient {shown} is not a plain ASCII email address like 'ada@example.com' "
            "(give an internationalised domain in punycode)"
        )


def _check_domain(recipient: str) -> None:
    domain_problem = hostname.problem(recipient.rpartition("@")[2])
    if domain_problem is not None:
        raise InvalidNotification(
            f"recipient {recipient[:100]!r} is not a valid email address: its domain"
            f" {domain_problem}"
        )


def list_unsubscribe(settings: Settings, n: Notification) -> dict[str, str]:
    """RFC 8058 one-click ``List-Unsubscribe`` headers for a campaign row, a row of a person
    (a profile) with a category that is not critical, or one whose ``payload.unsubscribe`` is
    true; none for a transactional row (no category), which has nothing to opt out of."""
    wanted = n.payload.get("unsubscribe") is True or n.payload.get("campaign") is not None
    personal = n.profile is not None and n.category not in (None, *settings.critical_categories)
    if wanted or personal:
        person = n.profile.id if n.profile is not None else None
        return unsubscribe.headers(settings, n.channel, n.recipient, n.category, person)
    return {}


def row_headers(
    n: Notification, feedback: dict[str, str]
) -> tuple[dict[str, str], tuple[str, str] | None]:
    """The row's ``payload.headers`` with notifier's ``feedback`` headers added (a row's own
    header of one of those names wins), and its ``Reply-To`` taken out as (name, address)."""
    headers = dict(n.payload.get("headers") or {})
    own = {name.lower() for name in headers}
    for name, value in feedback.items():
        if name.lower() not in own:
            headers[name] = value
    reply_to = next((k for k in headers if k.lower() == "reply-to"), None)
    return headers, None if reply_to is None else parse_mailbox(reply_to, headers.pop(reply_to))
