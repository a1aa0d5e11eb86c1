"""What a request's body may hold, read strictly: one ``ApiError`` naming the field and the
fix for anything else, before anything is written.

A notification is the producer contract's row in JSON (``docs/api.md``): ``channel`` and ``to``
or ``profile``, the rest optional. Unknown fields are refused (a misspelt ``subjet`` must not
send a message without a subject), as are wrong types, non-finite numbers and times without a
zone. What the row's values must be beyond their types is ``notifier.client.enqueue``'s check,
the worker's own, which the API runs too.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import accumulate
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

from notifier.delivery.checks import MAX_PAYLOAD_DEPTH, payload_depth

#: The deepest JSON a request may nest: a payload's limit and the request's own levels.
MAX_JSON_DEPTH = MAX_PAYLOAD_DEPTH + 3
#: The longest Idempotency-Key: with its producer's name it stays within ``dedupe_key``'s
#: 1,000 bytes.
MAX_IDEMPOTENCY_KEY = 255

DELAY = "delay_seconds"
TEXTS = ("to", "profile", "subject", "body", "template", "locale", "category", "guard")
FIELDS = {
    "channel",
    *TEXTS,
    "payload",
    "send_at",
    "delay_seconds",
    "expires_at",
    "max_attempts",
    "priority",
    "idempotency_key",
}


@dataclass
class ApiError(Exception):
    """A request refused: its status, a code a program can switch on, the field if one is to
    blame, and a sentence for a person."""

    status: int
    code: str
    message: str
    field: str | None = None
    retry_after: int | None = None

    def document(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "field": self.field}}


def read_json(body: bytes) -> Any:
    """The body as JSON: UTF-8, nested at most ``MAX_JSON_DEPTH`` levels, no NaN."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "invalid_json", "the body is not UTF-8") from None
    if _nesting(body) > MAX_JSON_DEPTH:
        raise ApiError(400, "too_deep", f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, "invalid_json", f"the body is not JSON: {exc}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


#: The bytes that shape a JSON document: quotes and brackets (UTF-8 never uses them inside
#: another character's bytes). The rest is dropped before the count.
_SHAPE = b'"[]{}'
_NOT_SHAPE = bytes(b for b in range(256) if b not in _SHAPE)
#: What each byte adds to the depth.
_DEPTH_STEP = [1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256)].__getitem__


def _nesting(body: bytes) -> int:
    """The document's nesting, counted without parsing it: the deepest running count of its
    brackets outside strings (a string's ``"]]]"`` neither hides a level nor adds one). Escaped
    backslashes, then escaped quotes, go first (read left to right, as a parser does), then
    all but quotes and brackets; what lies between the quotes is then strings' insides. Of a
    body that is not JSON, some number: the parse refuses it anyway."""
    shape = body.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_SHAPE)
    outside = b"".join(shape.split(b'"')[0::2])
    return max(accumulate(map(_DEPTH_STEP, outside), initial=0))


#: A request's JSON in one spelling (keys sorted, no spaces). Stored hashes depend on this
#: spelling (``notifications.request_hash``, ``api_requests.body_hash``): it must not change.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
#: The same spelling by the C encoder that ``_CANONICAL.encode`` makes anew for every call
#: (a third of a batch item's hash), made once: no check for circular references, which a
#: parsed body cannot hold, nested at most ``MAX_JSON_DEPTH`` levels. ``None`` without it.
_CANONICAL_C = (
    None
    if c_make_encoder is None
    else c_make_encoder(
        None, _CANONICAL.default, encode_basestring, None, ":", ",", True, False, True
    )
)


def canonical(doc: Any) -> str:
    """A parsed body's JSON in the one spelling the hashes are made of."""
    if _CANONICAL_C is None:
        return _CANONICAL.encode(doc)
    return "".join(_CANONICAL_C(doc, 0))


def request_hash(doc: Any) -> bytes:
    """The SHA-256 of a request's JSON in one spelling (keys sorted, no spaces): two bodies that
    say the same thing hash alike, whatever their whitespace or key order."""
    return hashlib.sha256(canonical(doc).encode()).digest()


def idempotency_key(value: str | None, field: str = "Idempotency-Key") -> str | None:
    """A key as given, if it is one: 1-255 printable ASCII characters."""
    if value is None:
        return None
    if not (0 < len(value) <= MAX_IDEMPOTENCY_KEY and value.isascii() and value.isprintable()):
        raise ApiError(
            400,
            "invalid_idempotency_key",
            f"{field} must be 1-{MAX_IDEMPOTENCY_KEY} printable ASCII characters (a UUID will do)",
            field,
        )
    return value


def notification(doc: Any, *, now: datetime) -> dict[str, Any]:
    """``notifier.client.enqueue``'s arguments from one notification's JSON (without ``key``:
    the caller makes it from the idempotency key)."""
    if not isinstance(doc, dict):
        raise ApiError(422, "invalid_body", "a notification is a JSON object")
    unknown = sorted(set(doc) - FIELDS)
    if unknown:
        raise ApiError(
            422,
            "unknown_field",
            f"{unknown[0][:64]!r} is not a field of a notification; see the API document",
            unknown[0][:64],
        )
    channel = doc.get("channel")
    if not isinstance(channel, str) or not channel:
        raise ApiError(422, "invalid_field", "channel is required: email, sms, push ...", "channel")
    found: dict[str, Any] = {"channel": channel}
    for name in TEXTS:
        value = doc.get(name)
        if value is not None and not isinstance(value, str):
            raise ApiError(422, "invalid_field", f"{name} must be a string", name)
        found[name] = value
    payload = doc.get("payload")
    if payload is not None:
        if not isinstance(payload, dict):
            raise ApiError(422, "invalid_field", "payload must be a JSON object", "payload")
        if payload_depth(payload) > MAX_PAYLOAD_DEPTH:
            raise ApiError(
                422, "invalid_field", f"payload nests over {MAX_PAYLOAD_DEPTH} levels", "payload"
            )
    found["payload"] = payload
    found["send_at"] = _time(doc, "send_at")
    found["expires_at"] = _time(doc, "expires_at")
    delay = doc.get("delay_seconds")
    if delay is not None:
        if isinstance(delay, bool) or not isinstance(delay, int | float) or not delay >= 0:
            raise ApiError(
                422, "invalid_field", "delay_seconds must be a number >= 0", "delay_seconds"
            )
        if not math.isfinite(delay) or delay > 10 * 366 * 86400:
            raise ApiError(422, "invalid_field", "delay_seconds is over ten years", "delay_seconds")
        if found["send_at"] is not None:
            raise ApiError(
                422, "invalid_field", "give send_at or delay_seconds, not both", "delay_seconds"
            )
        found["send_at"] = now + timedelta(seconds=delay)
    found["max_attempts"] = _integer(doc, "max_attempts", 5, 1, 100)
    found["priority"] = _integer(doc, "priority", 0, -1000, 1000)
    found["to"] = found.pop("to")
    return found


def _time(doc: dict[str, Any], name: str) -> datetime | None:
    value = doc.get(name)
    if value is None:
        return None
    fix = f"{name} must be an RFC 3339 time with its offset, e.g. 2026-12-24T18:00:00Z"
    if not isinstance(value, str) or len(value) > 64:
        raise ApiError(422, "invalid_field", fix, name)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ApiError(422, "invalid_field", fix, name) from None
    if parsed.tzinfo is None:
        raise ApiError(422, "invalid_field", fix, name)
    return parsed


def _integer(doc: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = doc.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ApiError(422, "invalid_field", f"{name} must be a whole number {low}..{high}", name)
    return value
