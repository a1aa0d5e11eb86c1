"""How the headers ``email_message`` writes are checked, and the MIME part made, for the wire.

Each header is checked alone (``put``): one that could hold something to decode is parsed back
with the standard library's parser, exactly as a receiver on this Python would, and refused
(``InvalidNotification``) unless it reads back as one header of its name, meaning exactly what
was intended; one that cannot is taken as written. The parses are remembered, and so is the
MIME part a campaign's messages share (``content``).
"""

from __future__ import annotations

import functools
import re
from email.headerregistry import HeaderRegistry, UnstructuredHeader
from email.message import EmailMessage
from email.parser import BytesHeaderParser
from email.policy import SMTP as SMTP_POLICY
from email.policy import default as DEFAULT_POLICY
from typing import Any

from notifier.providers.base import InvalidNotification


class _HeaderClasses(HeaderRegistry):
    """The standard library's header classes, each made once: ``HeaderRegistry`` makes a new
    class for every header it parses or writes, half the time a message took to build."""

    def __init__(self) -> None:
        super().__init__()
        self._made: dict[str, type[Any]] = {}

    def __getitem__(self, name: str) -> type[Any]:
        key = name.lower()
        made = self._made.get(key)
        if made is None:
            made = self._made[key] = super().__getitem__(name)
        return made


# CRLF line ends for the wire; 7bit so that any server takes the body, 8BITMIME or not; and
# "none" so that the headers written here go out exactly as written, never refolded.
POLICY = SMTP_POLICY.clone(cte_type="7bit", refold_source="none", header_factory=_HeaderClasses())
#: How a receiver reads the headers back: the standard library's default policy.
_READ_CLASSES = _HeaderClasses()
_READ = DEFAULT_POLICY.clone(header_factory=_READ_CLASSES)

#: Printable ASCII words with spaces or tabs between them: safe to write as they are.
PLAIN = re.compile(r"[!-~]+(?:[ \t]+[!-~]+)*")
FOLD_AT = 78  # RFC 5322's recommended line length, the policy's max_line_length
#: Shapes that read back exactly as written, for want of anything to decode (see ``put``).
_MESSAGE_ID = re.compile(r"<[A-Za-z0-9_.+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*>")
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_DOT_ATOM_ADDRESS = re.compile(rf"{_ATEXT}(?:\.{_ATEXT})*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")
#: Characters of body and html up to which a message's MIME part is remembered (``content``).
_REMEMBERED_CONTENT = 262_144


def put(lines: list[str], name: str, wire: str, meaning: object) -> None:
    """Append header ``name: wire`` to ``lines``, or raise unless it reads back alone as one
    header ``name`` meaning ``meaning``. A header a message is made of reads back as the same
    header whatever comes after it (the next begins with a name, never with a space), so a
    message whose every header does has exactly the intended ones."""
    if not _reads_back_plainly(name, wire, meaning):
        _expect(name, wire, meaning)
    lines.append(f"{name}: {wire}\r\n")


def _expect(name: str, wire: str, meaning: object) -> None:
    """Raise unless ``name: wire``, parsed back alone, means ``meaning``."""
    got = _read_alone(name, wire)
    if got != meaning:
        raise InvalidNotification(
            f"the email's {name} header would read back as {got!r}, not as written; "
            "nothing was sent"
        )


def _reads_back_plainly(name: str, wire: str, meaning: object) -> bool:
    """Whether ``name: wire`` reads back as ``meaning`` for want of anything to decode: a
    header the standard library takes as text, of printable ASCII words without ``=?``, only
    folded; an addr-spec of plain atoms in ``To``; a ``Message-ID`` of plain atoms. The rest
    is parsed back (``_read_alone``)."""
    if isinstance(meaning, str):
        if "=?" in meaning or not PLAIN.fullmatch(meaning):
            return False
        if name == "Message-ID":
            return wire == meaning and _MESSAGE_ID.fullmatch(wire) is not None
        return wire.replace("\r\n", "") == meaning and _is_text_header(name)
    if name == "To" and meaning == (("", wire),):
        return "=?" not in wire and _DOT_ATOM_ADDRESS.fullmatch(wire) is not None
    return False


@functools.lru_cache(maxsize=256)
def _is_text_header(name: str) -> bool:
    return issubclass(_READ_CLASSES[name], UnstructuredHeader)


@functools.lru_cache(maxsize=1024)
def _read_alone(name: str, wire: str) -> object:
    """What a receiver reads in ``name: wire`` as a message's only header; ``InvalidNotification``
    unless it is one header of that name. Remembered: a campaign's subject and the like come
    back in every message, and their parse is costly."""
    try:
        head = f"{name}: {wire}\r\n\r\n".encode("ascii")
    except UnicodeEncodeError:
        message = f"the email's {name} header is not ASCII; nothing was sent"
        raise InvalidNotification(message) from None
    parsed = BytesHeaderParser(policy=_READ).parsebytes(head)
    if parsed.keys() != [name]:
        raise InvalidNotification(
            f"the email's headers would not read back as written: they would be "
            f"{parsed.keys()}, not {[name]}; nothing was sent"
        )
    [(_, raw)] = parsed.raw_items()
    return _meaning(_READ.header_fetch_parse(name, raw))


@functools.lru_cache(maxsize=16)
def sender_line(sender: str) -> str:
    """The ``From`` line the standard library writes of ``sender``, checked to read back as
    what it made of it; the same for every message of a deployment, so made once."""
    try:
        header = POLICY.header_store_parse("From", sender)[1]
    except ValueError as exc:  # the Python may refuse it: a CR or LF that it decoded
        raise InvalidNotification(f"the sender {sender!r} cannot be written: {exc}") from None
    line = str(POLICY.fold("From", header))
    _expect("From", line.removeprefix("From: ").removesuffix("\r\n"), _meaning(header))
    return line


def content(body: str, html: str | None) -> bytes:
    """The MIME headers and body of a message of ``body`` (and ``html``), as the standard
    library writes them; remembered up to ``_REMEMBERED_CONTENT`` characters, since a
    campaign's messages share theirs (the boundary of a multipart message is then made once;
    the standard library makes sure no line of the content is it)."""
    if len(body) + len(html or "") <= _REMEMBERED_CONTENT:
        return _remembered_content(body, html)
    return mime_part(body, html)


@functools.lru_cache(maxsize=32)
def _remembered_content(body: str, html: str | None) -> bytes:
    return mime_part(body, html)


def mime_part(body: str, html: str | None) -> bytes:
    """What ``stdlib_part`` writes, written here for the usual text: a plain ASCII body whose
    lines fit (it goes out as it is, ``7bit``); the standard library writes any other."""
    if html is None and body.isascii():
        lines = body.encode("ascii").splitlines()
        if max((len(line) for line in lines), default=0) <= FOLD_AT:
            return _PLAIN_TEXT_PART + b"".join(line + b"\r\n" for line in lines or [b""])
    return stdlib_part(body, html)


#: The MIME headers the standard library gives a plain ASCII body that fits its lines.
_PLAIN_TEXT_PART = (
    b'Content-Type: text/plain; charset="utf-8"\r\nContent-Transfer-Encoding: 7bit\r\n'
    b"MIME-Version: 1.0\r\n\r\n"
)


def stdlib_part(body: str, html: str | None) -> bytes:
    """The MIME headers and body of a message of ``body`` (and ``html``), as the standard
    library writes them."""
    message = EmailMessage(policy=POLICY)
    message.set_content(body)
    if html is not None:
        message.add_alternative(html, subtype="html")
    return message.as_bytes()


def _meaning(header: Any) -> object:
    """What a parsed header says: its addresses for an address header, else its decoded text."""
    addresses = getattr(header, "addresses", None)
    if addresses is not None:
        return tuple((a.display_name, a.addr_spec) for a in addresses)
    return str(header)
