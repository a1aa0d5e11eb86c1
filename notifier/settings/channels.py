"""The settings of the channels' providers (SMTP, webhooks, Twilio, FCM), of the status webhook and
of the ``http`` guard: where each sends and how long it may take."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import Field
from pydantic_settings import BaseSettings, NoDecode

from notifier.settings.parsed import Networks, parsed
from notifier.specs import STATUS_EVENTS, parse_status_events


class SmtpTls(StrEnum):
    """How the SMTP connection is secured."""

    #: plain SMTP (a local relay or a mail catcher)
    none = "none"
    #: plain connection upgraded with STARTTLS before authenticating
    starttls = "starttls"
    #: TLS from the first byte (SMTPS, usually port 465)
    ssl = "ssl"


class ChannelSettings(BaseSettings):
    """Fields of ``Settings`` (``model.py``), the one class that reads them."""

    smtp_host: str = "localhost"
    """SMTP server for the ``email`` channel."""

    smtp_port: int = Field(25, gt=0, lt=65536)
    """Its port."""

    smtp_username: str | None = None
    """Login, if the server asks for one."""

    smtp_password: str | None = None
    """Password for ``smtp_username``."""

    smtp_tls: SmtpTls = SmtpTls.none
    """``none``, ``starttls`` or ``ssl``."""

    smtp_ca_file: Path | None = None
    """PEM file of the certificate authorities the SMTP server's certificate must chain to, in
    place of the system's (``starttls`` and ``ssl``): a relay whose certificate a private CA
    issued. Unset, the system's trusted CAs; the host name is checked either way."""

    smtp_timeout: float = Field(10.0, gt=0)
    """Seconds allowed for the connection, the TLS handshake and each SMTP reply (the one to
    a message's content included); a whole send is allowed ``longest_send_seconds``."""

    smtp_max_connections: int = Field(45, gt=0, le=1000)
    """SMTP connections a worker process keeps to its relay at most, reused across batches;
    sends past them wait for one to come free. Each carries a message per answer time (20/s
    at 50 ms), so 45 a process is 1,800 emails/s with two processes on 90 connections, under a
    relay that takes 100 from one client, with room for renewals. A relay that refuses more
    (421, a refused connection) shrinks the pool for a while; keep processes times this under
    its limit (Postfix's ``smtpd_client_connection_count_limit``), as refusals cost retries."""

    smtp_messages_per_connection: int = Field(100, gt=0)
    """Messages one SMTP connection carries before it is closed and a new one opened: relays
    limit the messages of a session, and a fresh session goes to a fresh relay behind a load
    balancer."""

    email_from: str = "notifier@localhost"
    """The ``From`` address of every email."""

    webhook_secret: str | None = None
    """Signs webhooks Standard-Webhooks style when set (``whsec_`` + base64, or any string)."""

    webhook_timeout: float = Field(10.0, gt=0)
    """Seconds allowed to connect to a webhook target and for each read; a whole send (connect,
    request, answer) is allowed three times that."""

    webhook_allow_http: bool = False
    """Accept plain ``http://`` webhook targets (local development and tests only)."""

    webhook_allowed_networks: Networks = Field(default_factory=list)
    """Networks a webhook target may resolve to although they are internal (loopback, private,
    link-local, ...), as comma-separated CIDRs: ``10.20.0.0/16,fd00:1::/64``. Empty by default,
    so a producer cannot make notifier call the deployment's own services (SSRF); see
    ``notifier/providers/netguard.py``."""

    status_webhook_url: str | None = None
    """Where notifier POSTs an event each time a row reaches a final status or a delivery state
    (docs/delivery-feedback.md); unset: no events are written at all."""

    status_webhook_secret: str | None = None
    """Signs the status webhook's requests as ``NOTIFIER_WEBHOOK_SECRET`` signs webhooks."""

    status_webhook_events: Annotated[list[str], NoDecode, parsed(parse_status_events)] = Field(
        default_factory=lambda: list(STATUS_EVENTS)
    )
    """The statuses and delivery states that make an event, comma-separated."""

    status_webhook_max_attempts: int = Field(30, gt=0)
    """POSTs of one event before it is given up as ``dead`` (with the retry backoff, about a
    day); a redirect or another 4xx than 408 and 429 gives it up at once."""

    twilio_account_sid: str | None = None
    """Account SID (``AC...``) of the Twilio account the ``sms`` channel sends through."""

    twilio_auth_token: str | None = None
    """Auth token of that account, the password of every request's HTTP basic auth."""

    twilio_from: str | None = None
    """Sender of every SMS: an E.164 number (``+14155550100``), an alphanumeric sender ID, or a
    Messaging Service SID (``MG`` + 32 hex digits), sent as ``MessagingServiceSid`` so that
    Twilio picks the number."""

    twilio_api_base: str = "https://api.twilio.com"
    """Base URL of Twilio's REST API; https, unless on loopback (tests, a local fake Twilio)."""

    sms_timeout: float = Field(10.0, gt=0)
    """Seconds allowed to connect to Twilio and for each write and read of one send."""

    # -- the email channel's HTTP APIs: SendGrid, Mailgun, Postmark (notifier/providers/esp.py) --

    sendgrid_api_key: str | None = None
    """API key (``SG.``...) the ``sendgrid`` provider sends with, as ``Authorization: Bearer``;
    it needs the Mail Send permission."""

    sendgrid_api_base: str = "https://api.sendgrid.com"
    """SendGrid's API, scheme and host (``https://api.eu.sendgrid.com`` for an EU subuser);
    https, unless on loopback (tests, a local fake)."""

    mailgun_api_key: str | None = None
    """Mailgun API key (a domain's sending key will do), sent as basic auth ``api:KEY``."""

    mailgun_domain: str | None = None
    """The Mailgun sending domain messages go out through: ``POST /v3/{domain}/messages``."""

    mailgun_api_base: str = "https://api.mailgun.net"
    """Mailgun's API for the domain's region: ``https://api.eu.mailgun.net`` for the EU; https,
    unless on loopback (tests, a local fake)."""

    postmark_server_token: str | None = None
    """Postmark server API token the ``postmark`` provider sends with
    (``X-Postmark-Server-Token``)."""

    postmark_api_base: str = "https://api.postmarkapp.com"
    """Postmark's API, scheme and host; https, unless on loopback (tests, a local fake)."""

    postmark_message_stream: str = Field("outbound", min_length=1)
    """The Postmark message stream every message goes to: ``outbound`` (transactional) or a
    broadcast stream's ID for campaigns."""

    esp_timeout: float = Field(10.0, gt=0)
    """Seconds the ``sendgrid``, ``mailgun`` and ``postmark`` providers allow to connect and for
    each read; one request (up to 1000 recipients) is allowed twice that, a batch that must be
    split after a refusal four times."""

    # -- Amazon SES (the ``ses`` provider of the ``email`` channel) -------------------------------
    # Credentials come from the AWS SDK's default chain, never from here: AWS_ACCESS_KEY_ID and
    # AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), AWS_PROFILE and the shared files, a web
    # identity token, the container's or the instance's role.

    ses_region: str | None = Field(None, pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9]+$")
    """AWS region whose SES sends (``eu-west-1``); unset, the SDK's own: AWS_DEFAULT_REGION, then
    the profile's ``region`` in the shared config file."""

    ses_endpoint_url: str | None = None
    """SES API endpoint instead of the region's public one: a VPC interface endpoint
    (``https://vpce-....email.eu-west-1.vpce.amazonaws.com``), or a local SES in tests; https,
    unless on loopback."""

    ses_configuration_set: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    """Configuration set every SES message is sent with: the one whose event destination
    publishes deliveries, bounces and complaints to the SNS topic ``notifier events`` reads (the
    message tag ``notifier_id`` names the row in those events)."""

    ses_timeout: float = Field(10.0, gt=0)
    """Seconds allowed to connect to SES and for each read; a whole send is allowed three times
    that. The SDK does not retry by itself (notifier does, with backoff and failover)."""

    fcm_credentials_file: Path | None = None
    """Firebase service-account JSON key the ``push`` channel sends with (FCM HTTP v1); until it
    is set, push rows are retried, never sent."""

    fcm_project_id: str | None = None
    """Firebase project to send through; the key file's ``project_id`` when unset."""

    fcm_api_base: str = "https://fcm.googleapis.com"
    """FCM's API as scheme and host only; ``https://`` (``http://`` only on loopback, for tests)."""

    push_timeout: float = Field(10.0, gt=0)
    """Seconds allowed to connect to FCM or its token endpoint and for each read."""

    guard_http_url: str | None = None
    """Where the built-in ``http`` guard asks whether a row may still be sent."""

    guard_http_timeout: float = Field(5.0, gt=0)
    """Seconds the ``http`` guard waits to connect and for the answer; then the row is retried."""

    @property
    def longest_send_seconds(self) -> float:
        """The longest one send can take before its provider's timeouts end it.

        SMTP waits up to ``smtp_timeout`` for the connection and for each of about six replies,
        and the email provider bounds a whole send (a pooled connection awaited included) by
        this; HTTP (webhooks, SMS, push) waits for the connection, the request and the response.
        """
        return max(
            6 * self.smtp_timeout,
            3 * self.webhook_timeout,
            3 * self.sms_timeout,
            6 * self.push_timeout,  # a token fetch, then the send
            4 * self.esp_timeout,  # a batch's request, then its rows one by one
            3 * self.ses_timeout,
        )
