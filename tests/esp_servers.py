"""SendGrid, Mailgun, Postmark and Amazon SES on loopback: aiohttp servers that take each API's
published request format, check every request against it (required fields, limits, credentials)
and answer as the provider documents, per message where the provider does.

Every request is recorded; what breaks the published format goes in ``violations`` (and is
refused with a 400 in the provider's error format), so a test can assert that notifier never
sent one. An address whose local part starts with ``bad`` is one the provider calls invalid;
with ``inactive`` (Postmark), one it has deactivated. ``answers`` holds scripted answers
(status, headers, body) that the next requests get instead, after being recorded; ``delay``
holds every answer back that many seconds.

Sources: SendGrid v3 Mail Send (``POST /v3/mail/send``, 202 with ``X-Message-Id``; 400
``{"errors": [{"message", "field"}]}``, 1000 personalizations and recipients at most, each
address once); Mailgun ``POST /v3/{domain}/messages`` (basic auth ``api:KEY``, 200
``{"id", "message"}``, 400 ``{"message"}``, batch sends of up to 1000 ``to`` with
``recipient-variables``); Postmark ``POST /email`` and ``/email/batch``
(``X-Postmark-Server-Token``,
500 messages and 50 MB a batch, ``ErrorCode`` per message, 422 for a single send's error); SES v2
``SendEmail`` (``POST /v2/email/outbound-emails``, a SigV4 ``Authorization``, the request checked
against the ``SendEmailRequest`` shape of the service model the AWS SDK ships, a raw message of
at most 40 MB; 200 ``{"MessageId"}``, errors named by ``x-amzn-ErrorType``). The SES tests talk
to moto (``tests.ses_server``); this server is for the benchmark's slowed answers.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email import policy
from email.parser import BytesParser
from typing import Any
from urllib.parse import parse_qsl

import botocore.session
from aiohttp import web

SENDGRID_KEY = "SG.test-key"
MAILGUN_KEY = "key-test-mailgun"
MAILGUN_DOMAIN = "mg.example.com"
POSTMARK_TOKEN = "postmark-test-token"
_RECIPIENT_VARIABLE = re.compile(r"%recipient\.([A-Za-z0-9_]+)%")


class Invalid(Exception):
    """The request breaks the provider's published format."""


@dataclass
class Seen:
    """One request as the server read it."""

    path: str
    headers: dict[str, str]
    body: bytes
    #: the messages it asks for, one per recipient, each as the recipient would get it:
    #: {"to", "subject", "headers", "metadata", "text", "html"}
    messages: list[dict[str, Any]] = field(default_factory=list)
    #: answered 429 by the server's rate limit
    throttled: bool = False


@dataclass
class EspServer:
    kind: str
    delay: float = 0.0
    answers: list[tuple[int, dict[str, str], bytes]] = field(default_factory=list)
    requests: list[Seen] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    url: str = ""
    #: messages a second the server takes, as a token bucket of a second's worth; a request
    #: whose messages would exceed it is answered 429 with ``Retry-After: 1`` (None: no limit)
    limit: float | None = None
    #: requests answered 429 by ``limit``, and the messages of the others (accepted or not)
    throttled: int = 0
    _tokens: float = 0.0
    _filled: float = 0.0

    @property
    def messages(self) -> list[dict[str, Any]]:
        """Every message the server was asked to send, in order."""
        return [m for seen in self.requests for m in seen.messages]

    @property
    def taken(self) -> list[dict[str, Any]]:
        """The messages of the requests the rate limit let through."""
        return [m for seen in self.requests if not seen.throttled for m in seen.messages]

    def _within_limit(self, count: int) -> bool:
        if self.limit is None:
            return True
        now = asyncio.get_running_loop().time()
        if not self._filled:
            self._tokens, self._filled = self.limit, now
        self._tokens = min(self.limit, self._tokens + (now - self._filled) * self.limit)
        self._filled = now
        if count > self._tokens:
            return False
        self._tokens -= count
        return True

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen = Seen(request.path, dict(request.headers), body)
        self.requests.append(seen)
        try:
            answer = _READERS[self.kind](request, seen)
        except (Invalid, ValueError) as exc:  # ValueError: a body that is not JSON or a form
            self.violations.append(f"{request.path}: {exc}")
            answer = _refusal(self.kind, 400, str(exc))
        if self.answers:
            answer = self.answers.pop(0)
        elif not self._within_limit(len(seen.messages)):
            seen.throttled = True
            self.throttled += 1
            status, headers, payload = _refusal(self.kind, 429, "rate limit exceeded", code=429)
            answer = status, {**headers, "Retry-After": "1"}, payload
        if self.delay:
            await asyncio.sleep(self.delay)
        status, headers, payload = answer
        return web.Response(status=status, headers=headers, body=payload)


def _refusal(
    kind: str, status: int, message: str, code: int = 300
) -> tuple[int, dict[str, str], bytes]:
    if kind == "ses":
        name = "TooManyRequestsException" if status == 429 else "BadRequestException"
        headers = {"Content-Type": "application/json", "x-amzn-ErrorType": name}
        return status, headers, json.dumps({"message": message}).encode()
    doc: Any = {
        "sendgrid": {"errors": [{"message": message, "field": None}]},
        "mailgun": {"message": message},
        "postmark": {"ErrorCode": code, "Message": message},
    }[kind]
    return status, {"Content-Type": "application/json"}, json.dumps(doc).encode()


def _bad(address: str) -> bool:
    return address.lower().startswith("bad")


def _require(condition: object, message: str) -> None:
    if not condition:
        raise Invalid(message)


def _strings(value: object, what: str) -> dict[str, str]:
    _require(isinstance(value, dict), f"{what} must be an object")
    assert isinstance(value, dict)
    for k, v in value.items():
        _require(isinstance(k, str) and isinstance(v, str), f"{what} must map strings to strings")
    return value


# -- SendGrid ------------------------------------------------------------------------------------

_SENDGRID_RESERVED = {"to", "from", "subject", "reply-to", "cc", "bcc", "content-type", "x-sg-id"}


def _sendgrid(request: web.Request, seen: Seen) -> tuple[int, dict[str, str], bytes]:
    if request.headers.get("Authorization") != f"Bearer {SENDGRID_KEY}":
        return 401, {}, json.dumps({"errors": [{"message": "authorization required"}]}).encode()
    _require(request.path == "/v3/mail/send", "unknown path")
    _require(request.content_type == "application/json", "Content-Type must be application/json")
    doc = json.loads(seen.body)
    _require(isinstance(doc, dict), "the body must be an object")
    people = doc.get("personalizations")
    _require(isinstance(people, list) and 1 <= len(people) <= 1000, "1-1000 personalizations")
    sender = doc.get("from")
    _require(isinstance(sender, dict) and isinstance(sender.get("email"), str), "from.email")
    content = doc.get("content")
    _require(isinstance(content, list) and content, "content must be a non-empty array")
    types = [c.get("type") for c in content]
    _require(all(isinstance(c.get("value"), str) and c["value"] for c in content), "empty content")
    _require("text/plain" not in types or types[0] == "text/plain", "text/plain must come first")
    bodies = {c["type"]: c["value"] for c in content}
    addresses: list[str] = []
    blamed = []
    for i, p in enumerate(people):
        to = p.get("to")
        _require(isinstance(to, list) and to, f"personalizations.{i}.to is required")
        subject = p.get("subject", doc.get("subject"))
        _require(isinstance(subject, str) and subject, f"personalizations.{i}: a subject")
        headers = _strings(p.get("headers", {}), f"personalizations.{i}.headers")
        _require(not {h.lower() for h in headers} & _SENDGRID_RESERVED, f"reserved header in {i}")
        custom = _strings(p.get("custom_args", {}), f"personalizations.{i}.custom_args")
        for j, recipient in enumerate(to):
            address = recipient.get("email") if isinstance(recipient, dict) else None
            if not isinstance(address, str):
                raise Invalid(f"personalizations.{i}.to.{j}.email")
            addresses.append(address.lower())
            if _bad(address):
                blamed.append(f"personalizations.{i}.to.{j}.email")
            seen.messages.append(
                {
                    "to": address,
                    "subject": subject,
                    "headers": headers,
                    "metadata": custom,
                    "text": bodies.get("text/plain"),
                    "html": bodies.get("text/html"),
                }
            )
    _require(len(addresses) <= 1000, "at most 1000 recipients")
    _require(len(set(addresses)) == len(addresses), "each address only once")
    if blamed:
        errors = [{"message": "Does not contain a valid address.", "field": f} for f in blamed]
        return 400, {"Content-Type": "application/json"}, json.dumps({"errors": errors}).encode()
    return 202, {"X-Message-Id": uuid.uuid4().hex[:22]}, b""


# -- Mailgun -------------------------------------------------------------------------------------


def _mailgun(request: web.Request, seen: Seen) -> tuple[int, dict[str, str], bytes]:
    expected = "Basic " + base64.b64encode(f"api:{MAILGUN_KEY}".encode()).decode()
    if request.headers.get("Authorization") != expected:
        return 401, {}, b"Forbidden"
    if request.path != f"/v3/{MAILGUN_DOMAIN}/messages":
        return 404, {"Content-Type": "application/json"}, b'{"message": "Domain not found"}'
    form = parse_qsl(seen.body.decode(), keep_blank_values=True, strict_parsing=True)
    fields: dict[str, list[str]] = {}
    for k, v in form:
        fields.setdefault(k, []).append(v)

    def one(name: str) -> str | None:
        values = fields.get(name, [])
        _require(len(values) <= 1, f"{name} given {len(values)} times")
        return values[0] if values else None

    _require(one("from"), "from parameter is missing")
    to = fields.get("to", [])
    _require(1 <= len(to) <= 1000, "1-1000 to parameters")
    _require(one("text") or one("html"), "need at least one of 'text' or 'html'")
    options = sum(len(k) + len(v) for k, v in form if k[:2] in ("h:", "v:", "o:", "t:"))
    _require(options <= 16_384, "send options are limited to 16KB")
    variables: dict[str, Any] = {}
    if len(to) > 1:
        raw = one("recipient-variables")
        _require(raw, "a batch send needs recipient-variables")
        variables = json.loads(raw or "")
        _require(isinstance(variables, dict), "recipient-variables must be an object")
        _require(all(a in variables for a in to), "recipient-variables for every to")
    _require(len({a.lower() for a in to}) == len(to), "each address once")
    headers = [(k[2:], v) for k, v in form if k.startswith("h:")]  # read once for every "to"
    metadata = [(k[2:], v) for k, v in form if k.startswith("v:")]
    subject, text, html = one("subject"), one("text"), one("html")
    for address in to:
        mine = variables.get(address, {})

        def fill(text: str | None, mine: dict[str, Any] = mine) -> str | None:
            if text is None or not variables:  # only a batch send substitutes
                return text
            return _RECIPIENT_VARIABLE.sub(lambda m: str(mine.get(m[1], "")), text)

        seen.messages.append(
            {
                "to": address,
                "subject": fill(subject),
                "headers": {k: fill(v) for k, v in headers},
                "metadata": {k: fill(v) for k, v in metadata},
                "text": fill(text),
                "html": fill(html),
            }
        )
    if any(_bad(a) for a in to):
        return _refusal(
            "mailgun", 400, "to parameter is not a valid address. please check documentation"
        )
    answer = {"id": f"<{uuid.uuid4().hex}@{MAILGUN_DOMAIN}>", "message": "Queued. Thank you."}
    return 200, {"Content-Type": "application/json"}, json.dumps(answer).encode()


# -- Postmark ------------------------------------------------------------------------------------


def _postmark(request: web.Request, seen: Seen) -> tuple[int, dict[str, str], bytes]:
    if request.headers.get("X-Postmark-Server-Token") != POSTMARK_TOKEN:
        return _refusal("postmark", 401, "Request does not contain a valid Server token.", 10)
    _require(request.headers.get("Accept") == "application/json", "Accept: application/json")
    _require(request.content_type == "application/json", "Content-Type: application/json")
    _require(len(seen.body) <= 50 * 1024 * 1024, "at most 50 MB a request")
    doc = json.loads(seen.body)
    batch = request.path == "/email/batch"
    _require(batch or request.path == "/email", "unknown path")
    messages = doc if batch else [doc]
    _require(isinstance(messages, list) and 1 <= len(messages) <= 500, "1-500 messages")
    answers = []
    for m in messages:
        _require(isinstance(m, dict), "a message is an object")
        _require(isinstance(m.get("From"), str) and isinstance(m.get("To"), str), "From, To")
        _require(m.get("TextBody") or m.get("HtmlBody"), "TextBody or HtmlBody")
        headers = m.get("Headers", [])
        _require(isinstance(headers, list), "Headers is an array")
        named = {}
        for h in headers:
            _require(isinstance(h, dict) and set(h) == {"Name", "Value"}, "Headers entries")
            named[h["Name"]] = h["Value"]
        metadata = _strings(m.get("Metadata", {}), "Metadata")
        _require(isinstance(m.get("MessageStream"), str), "MessageStream")
        seen.messages.append(
            {
                "to": m["To"],
                "subject": m.get("Subject"),
                "headers": named,
                "metadata": metadata,
                "text": m.get("TextBody"),
                "html": m.get("HtmlBody"),
            }
        )
        local = m["To"].lower()
        if _bad(local):
            answers.append({"ErrorCode": 300, "Message": "Invalid 'To' address."})
        elif local.startswith("inactive"):
            answers.append(
                {
                    "ErrorCode": 406,
                    "Message": "You tried to send to a recipient that has been marked as inactive.",
                }
            )
        else:
            answers.append(
                {
                    "To": m["To"],
                    "SubmittedAt": "2026-01-01T00:00:00Z",
                    "MessageID": str(uuid.uuid4()),
                    "ErrorCode": 0,
                    "Message": "OK",
                }
            )
    json_type = {"Content-Type": "application/json"}
    if batch:
        return 200, json_type, json.dumps(answers).encode()
    status = 200 if answers[0]["ErrorCode"] == 0 else 422
    return status, json_type, json.dumps(answers[0]).encode()


# -- Amazon SES v2 -------------------------------------------------------------------------------


def _ses(request: web.Request, seen: Seen) -> tuple[int, dict[str, str], bytes]:
    if not request.headers.get("Authorization", "").startswith("AWS4-HMAC-SHA256 Credential="):
        return 403, {"x-amzn-ErrorType": "MissingAuthenticationTokenException"}, b"{}"
    _require(request.path == "/v2/email/outbound-emails", "unknown path")
    doc = json.loads(seen.body)
    _conforms(_ses_request_shape(), doc, "SendEmailRequest")
    raw = doc["Content"].get("Raw")
    _require(isinstance(raw, dict), "Content.Raw: notifier sends the message it built")
    data = base64.b64decode(raw["Data"], validate=True)
    _require(len(data) <= 40 * 1024 * 1024, "at most 40 MB a raw message")
    message = BytesParser(policy=policy.default).parsebytes(data)
    destination = doc.get("Destination", {}).get("ToAddresses") or [str(message["To"])]
    _require(len(destination) <= 50, "at most 50 recipients a message")
    text = message.get_body(("plain",))
    html = message.get_body(("html",))
    seen.messages.append(
        {
            "to": destination[0],
            "subject": message["Subject"],
            "headers": {k: str(v) for k, v in message.items()},
            "metadata": {t["Name"]: t["Value"] for t in doc.get("EmailTags", [])},
            "text": text.get_content() if text is not None else None,
            "html": html.get_content() if html is not None else None,
        }
    )
    if _bad(destination[0]):
        return _refusal("ses", 400, "Illegal address")
    answer = {"MessageId": f"0100{uuid.uuid4().hex}-000000"}
    return 200, {"Content-Type": "application/json"}, json.dumps(answer).encode()


@functools.cache
def _ses_request_shape() -> Any:
    """``SendEmailRequest`` as the AWS SDK's own service model for SES v2 defines it."""
    model = botocore.session.get_session().get_service_model("sesv2")
    return model.operation_model("SendEmail").input_shape


_SCALARS: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "blob": str,
    "boolean": bool,
    "integer": int,
    "long": int,
    "timestamp": (int, float, str),
}


def _conforms(shape: Any, value: object, path: str) -> None:
    """``value`` is what ``shape`` of the service model allows: members known and typed,
    required ones present, lengths within the model's bounds, enums among their values."""
    kind = shape.type_name
    low, high = shape.metadata.get("min"), shape.metadata.get("max")
    if kind == "structure":
        _require(isinstance(value, dict), f"{path} must be an object")
        assert isinstance(value, dict)
        for name in shape.required_members:
            _require(name in value, f"{path}.{name} is required")
        for name, member in value.items():
            _require(name in shape.members, f"{path}.{name} is not a member")
            _conforms(shape.members[name], member, f"{path}.{name}")
        return
    if kind == "list":
        _require(isinstance(value, list), f"{path} must be an array")
        assert isinstance(value, list)
        size = len(value)
        for i, item in enumerate(value):
            _conforms(shape.member, item, f"{path}.{i}")
    elif kind == "map":
        _require(isinstance(value, dict), f"{path} must be an object")
        assert isinstance(value, dict)
        size = len(value)
        for k, v in value.items():
            _conforms(shape.key, k, f"{path} key")
            _conforms(shape.value, v, f"{path}.{k}")
    else:
        _require(isinstance(value, _SCALARS[kind]), f"{path} must be a {kind}")
        size = len(value) if isinstance(value, str) else 0
        enum = getattr(shape, "enum", None)  # only a string shape has one
        if enum:
            _require(value in enum, f"{path} must be one of {enum}")
        if kind not in ("string", "blob"):
            return
    _require(low is None or size >= low, f"{path}: at least {low}")
    _require(high is None or size <= high, f"{path}: at most {high}")


_READERS: dict[str, Callable[[web.Request, Seen], tuple[int, dict[str, str], bytes]]] = {
    "sendgrid": _sendgrid,
    "mailgun": _mailgun,
    "postmark": _postmark,
    "ses": _ses,
}


@contextmanager
def running(kind: str) -> Iterator[EspServer]:
    """A server of ``kind``'s format on a loopback port of its own, in a thread of its own."""
    server = EspServer(kind)
    loop = asyncio.new_event_loop()
    app = web.Application(client_max_size=60 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    server.url = f"http://127.0.0.1:{port}"
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
