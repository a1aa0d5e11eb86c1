"""The message an email row becomes, with headers that no input can add to or change.

Python before 3.11.10 / 3.12.5 decodes an encoded word written in a header's value
(``=?utf-8?q?Hi=0D=0ABcc:_eve@evil.example?=``) and, folding the header, writes the CR LF it
decoded back raw: the text after it becomes a header of its own. So notifier does not hand a
value that a row can influence (subject, recipient, ``payload.headers``) to the standard
library's header parser. It writes each one itself, in a form that decodes to exactly the text
given, whatever the Python:

* a value of printable ASCII words without ``=?`` goes out as written, folded at its spaces;
* any other value goes out as RFC 2047 ``=?utf-8?b?...?=`` words of base64 (each a whole
  number of characters), so a ``=?...?=`` in the input is text that reads back as written;
* a ``Reply-To`` is one address, bare or with a display name; the name is written like a value.

Then ``build`` checks each header as written for the wire (``email_wire``): one that could
hold something to decode (an encoded word, a display name, a sender) is parsed back alone
with the standard library's parser, and refused (``InvalidNotification``) unless it reads
back as one header of its name, meaning exactly what was intended; one that cannot (printable
ASCII words in a text header, a plain address, notifier's own ``Message-ID`` and ``Date``) is
taken as written. A header never runs into the next (each begins with its name), so a message
of such headers has exactly the intended ones, in order; ``tests/unit/test_email_message.py``
parses whole messages back to prove it. Parses are remembered, and so is the MIME part a
campaign's messages share: a message costs little more than its own few headers. Characters
no header can carry (``check_text``) are refused before anything is written.
"""

from __future__ import annotations

import base64
import functools
import re
import time
import unicodedata
from collections.abc import Iterable
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

from notifier.providers.base import InvalidNotification
from notifier.providers.email_wire import FOLD_AT as _FOLD_AT
from notifier.providers.email_wire import PLAIN as _PLAIN
from notifier.providers.email_wire import content, put, sender_line

#: A plain ASCII addr-spec: dot-atom local part, a domain with at least one dot.
ADDRESS = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+"
_MAILBOX = re.compile(rf"\s*(?:(?P<name>[^<>]*?)\s*<(?P<angle>{ADDRESS})>|(?P<bare>{ADDRESS}))\s*")

# C0 and C1 controls except TAB (legal whitespace in a header), DEL, the Unicode line and
# paragraph separators, and lone surrogates (not text; they cannot be encoded).
_FORBIDDEN = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_SEPARATORS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
_CONTROL_NAMES = {
    0x00: "NULL",
    0x0A: "LINE FEED",
    0x0B: "LINE TABULATION",
    0x0C: "FORM FEED",
    0x0D: "CARRIAGE RETURN",
    0x1B: "ESCAPE",
    0x7F: "DELETE",
    0x85: "NEXT LINE",
}

_TOKEN = re.compile(r"[ \t]*[^ \t]+")
_ATOMS = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?: [A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*")
_BLANKS = re.compile(r"[ \t]+")
_LONGEST_LINE = 998  # its limit
_CHUNK = 45  # UTF-8 bytes per encoded word: 60 base64 characters, 72 with "=?utf-8?b?" "?="
_HEADER_NAME = re.compile(r"[!-9;-~]{1,64}")  # RFC 5322 field-name: printable ASCII except ':'
_RESERVED = frozenset(
    {"from", "to", "subject", "message-id", "date", "cc", "bcc", "mime-version", "x-notifier-id"}
)
# Structured headers other than Reply-To: they would change who sent the message, or when.
_STRUCTURED = frozenset({"sender", "orig-date"})
#: A display name goes out as one encoded word: 42 bytes fit "Reply-To: " and it in 78 columns.
DISPLAY_NAME_BYTES = 42


def check_text(field: str, value: str) -> None:
    """Raise ``InvalidNotification`` naming ``field`` and the character if ``value`` holds one
    that no header can carry: a control character other than TAB, or a line or paragraph
    separator (CR, LF, VT, FF, NEL, U+2028, U+2029), or a lone surrogate."""
    bad = _FORBIDDEN.search(value)
    if bad is None:
        return
    char = bad.group()
    code = ord(char)
    if char in _SEPARATORS:
        name = _CONTROL_NAMES.get(code) or unicodedata.name(char, "INFORMATION SEPARATOR")
        why = "headers cannot carry line or paragraph separators; keep it on one line"
    elif 0xD800 <= code <= 0xDFFF:
        name, why = "SURROGATE", "a lone surrogate is not text; check the producer's encoding"
    else:
        name = _CONTROL_NAMES.get(code, "CONTROL")
        why = "headers cannot carry control characters"
    raise InvalidNotification(
        f"{field} contains U+{code:04X} {name} at position {bad.start()}; {why}"
    )


def parse_mailbox(field: str, value: str) -> tuple[str, str]:
    """``"Help Desk <help@shop.example>"`` -> ``("Help Desk", "help@shop.example")``.

    One address, bare or after a display name; a display name in double quotes loses them, and
    its runs of spaces and tabs become one space (as a receiver reads them anyway). A name of
    anything but plain words goes out as one encoded word (see ``_mailbox``), so it may take
    ``DISPLAY_NAME_BYTES`` bytes of UTF-8 at most.
    """
    found = _MAILBOX.fullmatch(value)
    if found is None:
        raise InvalidNotification(
            f"{field} {value[:100]!r} is not one address like 'help@shop.example' or "
            "'Help Desk <help@shop.example>' (plain ASCII; give a domain in punycode)"
        )
    name = found["name"] or ""
    if len(name) >= 2 and name[0] == name[-1] == '"':
        name = re.sub(r"\\(.)", r"\1", name[1:-1])
    check_text(f"the display name in {field}", name)
    name = _BLANKS.sub(" ", name).strip(" ")
    size = len(name.encode())
    if size > DISPLAY_NAME_BYTES and not _is_atoms(name):
        raise InvalidNotification(
            f"{field} has a display name of {size} bytes in UTF-8; at most {DISPLAY_NAME_BYTES} "
            "unless it is plain ASCII words (letters and digits, single spaces between them)"
        )
    return name, found["angle"] or found["bare"]


def build(
    *,
    sender: str,
    recipient: str,
    subject: str,
    date: str,
    message_id: str,
    headers: dict[str, str],
    reply_to: tuple[str, str] | None,
    body: str,
    html: str | None,
) -> bytes:
    """The message as it goes on the wire; ``InvalidNotification`` if a header would not read
    back exactly as intended.

    ``sender`` goes through the standard library (once per sender); ``date`` and
    ``message_id`` are notifier's own; the rest is written by this module (see the module
    docstring). ``headers`` are extra unstructured headers; ``reply_to`` is (display name,
    address). The MIME part (``body``, ``html``) is as the standard library writes it, made
    once for every message that shares it (a campaign's).
    """
    lines = [sender_line(sender)]
    put(lines, "To", recipient, (("", recipient),))
    put(lines, "Subject", _text("Subject", subject), subject)
    if not _PLAIN.fullmatch(date):  # notifier's own, never a row's: only kept to one line
        raise InvalidNotification(f"the date {date[:100]!r} cannot be written")
    lines.append(f"Date: {date}\r\n")
    put(lines, "Message-ID", message_id, message_id)
    if reply_to is not None:
        put(lines, "Reply-To", _mailbox("Reply-To", *reply_to), (reply_to,))
    for name, value in headers.items():
        if not _HEADER_NAME.fullmatch(name):
            raise InvalidNotification(f"the header name {name[:100]!r} cannot be written")
        put(lines, name, _text(name, value), value)
    return "".join(lines).encode("ascii") + content(body, html)


def date_header(now: float | None = None) -> str:
    """The ``Date`` of a message made at ``now`` (a Unix time; by default now), in UTC as
    RFC 5322 writes it (``+0000``)."""
    return _date_of(int(time.time() if now is None else now))


@functools.lru_cache(maxsize=4)
def _date_of(second: int) -> str:
    return format_datetime(datetime.fromtimestamp(second, UTC))


def check_headers(headers: Any) -> None:
    """Raise ``InvalidNotification`` unless ``payload.headers`` is an object of header names
    a row may set to one-line strings (``Reply-To`` one address)."""
    if headers is None:
        return
    if not isinstance(headers, dict):
        raise InvalidNotification(
            'payload.headers must be an object of header name to string like {"X-Campaign": '
            f'"spring"}}, not {json_type(headers)}'
        )
    for name, value in headers.items():
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            raise InvalidNotification(
                f"payload.headers has an invalid header name {str(name)[:100]!r}; use up to 64 "
                "printable ASCII characters without spaces or ':', e.g. 'X-Campaign'"
            )
        lowered = name.lower()
        if lowered in _RESERVED or lowered.startswith("content-"):
            raise InvalidNotification(
                f"payload.headers may not set {name!r}; notifier writes it "
                "(use recipient, subject, body and payload.html instead)"
            )
        if lowered in _STRUCTURED or lowered.startswith("resent-"):
            raise InvalidNotification(
                f"payload.headers may not set {name!r}; of the address and date headers a row "
                "may set Reply-To only"
            )
        if not isinstance(value, str):
            raise InvalidNotification(
                f"payload.headers[{name!r}] must be a one-line string, not {json_type(value)}"
            )
        field = f"payload.headers[{name!r}]"
        check_text(field, value)
        if lowered == "reply-to":
            parse_mailbox(field, value)


def json_type(value: object) -> str:
    """What a value is called in the JSON the producer wrote, for messages addressed to them."""
    if isinstance(value, bool):  # before int: bool is an int in Python
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"a number ({value})"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if value is None:
        return "null"
    return "a string" if isinstance(value, str) else type(value).__name__


def check_sender(sender: str, domain: str) -> None:
    """Raise ``InvalidNotification`` if every message from ``sender`` would be refused."""
    build(
        sender=sender,
        recipient="probe@example.com",
        subject="",
        date=date_header(0),
        message_id=f"<probe@{domain}>",
        headers={},
        reply_to=None,
        body="",
        html=None,
    )


def _text(name: str, value: str) -> str:
    """``value`` written to follow ``Name: `` so that it unfolds and decodes to ``value``."""
    check_text(f"the {name} header", value)
    if _PLAIN.fullmatch(value) and "=?" not in value:
        lines, line, width = [], "", len(name) + 2
        for token in _TOKEN.findall(value):  # each but the first starts with its whitespace
            if line and width + len(token) > _FOLD_AT:
                lines.append(line)
                line, width = "", 0
            line += token
            width += len(token)
        lines.append(line)
        if len(name) + 2 + max(len(line) for line in lines) <= _LONGEST_LINE:
            return "\r\n".join(lines)
    return "\r\n ".join(_encoded_words(value, first=_FOLD_AT - len(name) - 2))


def _mailbox(name: str, display_name: str, address: str) -> str:
    """``Display Name <address>``, the name written like ``_text`` writes a value."""
    if not display_name:
        return address
    check_text(f"the {name} header's display name", display_name)
    if _is_atoms(display_name):
        phrase = display_name
    else:  # one word: Python's address parser puts a space between adjacent encoded words
        words = list(_encoded_words(display_name, first=_FOLD_AT))
        if len(words) != 1:
            raise InvalidNotification(f"the {name} header's display name is too long")
        phrase = words[0]
    last = phrase.rpartition("\n")[2]
    fits = len(name) + 2 + len(last) + len(address) + 3 <= _FOLD_AT
    separator = " " if fits else "\r\n "
    return f"{phrase}{separator}<{address}>"


def _is_atoms(text: str) -> bool:
    return _ATOMS.fullmatch(text) is not None and "=?" not in text


def _encoded_words(value: str, first: int) -> Iterable[str]:
    """``=?utf-8?b?...?=`` words of at most ``_CHUNK`` bytes, never splitting a character; the
    first one short enough to take ``first`` columns at most (or 6 bytes, one character)."""
    data = value.encode()
    start, chunk = 0, min(_CHUNK, max(6, (first - 12) // 4 * 3))
    while start < len(data):
        end = min(start + chunk, len(data))
        while end < len(data) and data[end] & 0xC0 == 0x80:  # a UTF-8 continuation byte
            end -= 1
        yield f"=?utf-8?b?{base64.b64encode(data[start:end]).decode('ascii')}?="
        start, chunk = end, _CHUNK
