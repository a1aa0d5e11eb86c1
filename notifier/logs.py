"""Log lines: plain text or one JSON object per line, and never a whole recipient.

``configure(settings)`` sets up the command line's logging; the Celery worker and beat call
``configure(settings, logger)`` from the ``after_setup_logger`` signals, which swaps the
formatters of the handlers Celery installed. ``NOTIFIER_LOG_FORMAT=json`` gives each record as
one object: ``ts``, ``level``, ``logger``, ``message`` and every field the caller passed in
``extra=`` (the per-batch summary's ``claimed``, ``sent``, ... ``took``), plus ``exc_info``.

Masking is a second line of defence, in both formats: an ``extra`` field named ``recipient`` is
masked by ``mask_recipient``, and email addresses, URLs, E.164 numbers and push tokens found
anywhere in a message or a traceback are masked the same way. In free text a push token is a
run of token characters shaped like an FCM registration token (``instance:rest``, both parts
long) or any such run of 64 or more with a digit in it, which no identifier, UUID or time is.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import IO, Any
from urllib.parse import urlsplit

from notifier.settings import Settings

_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
#: What ends a sentence or closes a bracket after a URL, rather than belonging to it.
_URL_TAIL = ".,;:!?)]}"
#: Any local part RFC 5322 allows, quoted or not, and unicode ones (RFC 6531); a dotted domain.
#: Before it, ``keep``: a ``name=`` (or ``name='``) that starts a word, as in ``recipient='...'``,
#: or an opening quote; both may be part of a local part too, and are read as text instead.
_EMAIL = re.compile(
    r"(?P<keep>(?<![\w!#$%&'*+/=?^`{|}~.-])[A-Za-z_][\w.-]*=[\"']?|[\"'](?=[^\s\"]*@))?"
    r"(?P<address>(?:\"[^\"\r\n]+\"|[\w!#$%&'*+/=?^`{|}~.-]+)@[\w-]+(?:\.[\w-]+)+)"
)
_PHONE = re.compile(r"(?<![\w+])\+[1-9](?:[ ().-]?\d){7,14}\b")
_TOKEN = re.compile(
    r"(?<![\w:-])(?:[\w-]{16,}:[\w-]{32,}|(?=[\w-]*\d)[\w-]{64,})(?![\w:-])", re.ASCII
)
_PHONE_LIKE = re.compile(r"\+?\d[\d ().-]{6,}\d")
#: ITU country codes of two digits; ``1`` and ``7`` are the one-digit ones, the rest have three.
_TWO_DIGIT_CODES = frozenset(
    [
        "20",
        "27",
        "30",
        "31",
        "32",
        "33",
        "34",
        "36",
        "39",
        "40",
        "41",
        "43",
        "44",
        "45",
        "46",
        "47",
        "48",
        "49",
        "51",
        "52",
        "53",
        "54",
        "55",
        "56",
        "57",
        "58",
        "60",
        "61",
        "62",
        "63",
        "64",
        "65",
        "66",
        "81",
        "82",
        "84",
        "86",
        "90",
        "91",
        "92",
        "93",
        "94",
        "95",
        "98",
    ]
)
_HIDDEN = "***"


def mask_recipient(value: str) -> str:
    """Enough of a recipient to tell two apart in a log, not enough to reach them.

    ``ann@example.com`` -> ``a***@example.com`` (first character and domain);
    ``+14155550100`` -> ``+1***0100`` (country code and last four digits; the last two of a
    short number, no country code without a ``+``); ``https://hooks.example.com/T0/secret`` ->
    ``https://hooks.example.com/***`` (scheme, host and port; a URL that is no more than those
    stays as it is); anything else, a push token, -> its
    first four characters and ``***`` (its first one, if shorter than 16).
    """
    value = value.strip()
    if not value:
        return value
    if "://" in value:
        return _mask_url(value)
    if "@" in value:
        local, _, domain = value.rpartition("@")
        return f"{local[:1]}{_HIDDEN}@{domain}"
    if _PHONE_LIKE.fullmatch(value):
        return _mask_phone(value)
    return f"{value[: 4 if len(value) >= 16 else 1]}{_HIDDEN}"


def scrub(text: str) -> str:
    """``text`` with every URL, email address, E.164 number and push token in it masked, and
    nothing else changed: the words, quotes, ``key=`` names and punctuation around them stay."""
    text = _URL.sub(_mask_url_match, text)
    text = _EMAIL.sub(lambda m: (m["keep"] or "") + mask_recipient(m["address"]), text)
    text = _PHONE.sub(lambda m: _mask_phone(m[0]), text)
    return _TOKEN.sub(lambda m: mask_recipient(m[0]), text)


def _mask_url_match(match: re.Match[str]) -> str:
    url = match[0]
    while url and url[-1] in _URL_TAIL:
        if url[-1] == "]" and url.count("[") >= url.count("]"):  # it closes an IPv6 host
            break
        url = url[:-1]
    return _mask_url(url) + match[0][len(url) :]


def _mask_url(value: str) -> str:
    """Scheme, host and port; the rest (user, path, query, fragment), where there is any, is
    what makes a webhook's address a secret, and becomes ``/***``."""
    try:
        parts = urlsplit(value)
    except ValueError:
        return f"{value.split(':', 1)[0]}://{_HIDDEN}"
    _, at, host = parts.netloc.rpartition("@")
    if not (at or parts.path.strip("/") or parts.query or parts.fragment):
        return value
    return f"{parts.scheme}://{host}/{_HIDDEN}"


def _mask_phone(value: str) -> str:
    digits = re.sub(r"\D", "", value)
    if len(digits) < 8:
        return f"{value[:1]}{_HIDDEN}"
    if not value.startswith("+") or len(digits) < 10:  # no country code to tell, or too short
        return f"{_HIDDEN}{digits[-4 if len(digits) >= 10 else -2 :]}"
    if digits[0] in "17":
        code = digits[:1]
    elif digits[:2] in _TWO_DIGIT_CODES:
        code = digits[:2]
    else:
        code = digits[:3]
    return f"+{code}{_HIDDEN}{digits[-4:]}"


#: Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with the record's ``extra`` fields as keys."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": scrub(record.getMessage()),
            "process": record.process,
        }
        for key, value in record.__dict__.items():
            if key in _STANDARD or key.startswith("_") or key in entry:
                continue
            entry[key] = _safe(key, value)
        if record.exc_info:
            entry["exc_info"] = scrub(self.formatException(record.exc_info))
        if record.stack_info:
            entry["stack_info"] = scrub(self.formatStack(record.stack_info))
        return json.dumps(entry, default=str, ensure_ascii=False)


def _safe(key: str, value: object) -> object:
    """A JSON-ready copy of an ``extra`` value, its strings masked."""
    if isinstance(value, str):
        return mask_recipient(value) if key.endswith("recipient") else scrub(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, dict):
        return {str(k): _safe(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        item_key = key.removesuffix("s")  # the items of "recipients" are recipients
        return [_safe(item_key, v) for v in value]
    return scrub(str(value))


class MaskingFormatter(logging.Formatter):
    """Another formatter's plain-text line, with recipients masked."""

    def __init__(self, inner: logging.Formatter | None = None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        return scrub(self.inner.format(record))


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: Paths whose rest is a secret a log must not keep: unsubscribe and preference-center tokens.
SECRET_PATHS = ("/u/", "/p/")


class RedactPaths(logging.Filter):
    """Shows a request path under one of ``SECRET_PATHS`` as that prefix and ``…``, in every
    argument of a record (uvicorn's access log passes the path, query included, as one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_redacted(a) for a in record.args)
        return True


def _redacted(value: object) -> object:
    if not isinstance(value, str):
        return value
    return next((f"{p}…" for p in SECRET_PATHS if value.startswith(p)), value)


def redact_access_paths(logger_name: str = "uvicorn.access") -> None:
    """Redact ``SECRET_PATHS`` in ``logger_name``'s records (once, however often called)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, RedactPaths) for f in logger.filters):
        logger.addFilter(RedactPaths())


def formatter(settings: Settings, current: logging.Formatter | None = None) -> logging.Formatter:
    """The formatter for ``settings.log_format``; text keeps ``current``'s layout."""
    if settings.log_format == "json":
        return JsonFormatter()
    if isinstance(current, MaskingFormatter):
        return current
    return MaskingFormatter(current)


def configure(
    settings: Settings,
    logger: logging.Logger | None = None,
    *,
    stream: IO[str] | None = None,
    level: int = logging.INFO,
) -> None:
    """Apply ``settings.log_format`` and masking.

    With ``logger`` (Celery's, from its ``after_setup_*logger`` signals), its existing handlers
    get the new formatter. Without, the root logger gets one handler writing to ``stream``
    (stderr), replacing the one a previous call installed.
    """
    if logger is not None:
        for existing in logger.handlers:
            existing.setFormatter(formatter(settings, existing.formatter))
        return
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    handler = _Handler(stream)
    handler.setFormatter(formatter(settings))
    root.addHandler(handler)
    root.setLevel(level)


class _Handler(logging.StreamHandler[Any]):
    """The command line's handler: to ``stream``, or to whatever ``sys.stderr`` is at the time
    of each record (tests swap it)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._own = stream
        super().__init__(stream)

    @property
    def stream(self) -> Any:
        return self._own or sys.stderr

    @stream.setter
    def stream(self, _: Any) -> None:
        return
