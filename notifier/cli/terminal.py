"""What the ``notifier`` command prints, safe to print to a terminal.

Rows hold text that producers, receivers and providers wrote: recipients, subjects, bodies,
errors, keys, names. Printed raw, an escape sequence in one could clear the screen, retitle the
window, rewrite an earlier line with ``\\r`` or reorder what follows with a bidi override. Every
value the command prints goes through ``shown`` (``notifier.cli.output`` applies it to every
cell and field; ``--json`` goes through ``json_text``), which spells such characters out
visibly (``\\x1b``, ``\\u202e``); and ``guarded`` wraps the command's standard output so that
text printed any other way cannot carry them either (it keeps newlines and tabs, the one thing
only ``shown`` can tell from a row's own).
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import IO, Any

#: Characters a terminal acts on rather than shows, besides the C0 controls: DEL, the C1
#: controls, the bidi embeddings, overrides, isolates and marks, and the line separators.
_OTHERS = r"\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(rf"[\x00-\x1f{_OTHERS}]")
_UNSAFE_IN_LINES = re.compile(rf"[\x00-\x08\x0b-\x1f{_OTHERS}]")  # keeps \t and \n
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _spelled(match: re.Match[str]) -> str:
    char = match[0]
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """``text`` with every control, bidi and line-separator character spelled out."""
    return _UNSAFE.sub(_spelled, text)


def shown(value: object) -> str:
    """A row's value as one safe line: times in UTC, JSON for structures, the rest as text."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat(sep=" ", timespec="milliseconds")
    if isinstance(value, dict | list):
        return escape(json.dumps(value, ensure_ascii=False))
    return escape(str(value))


def escape_lines(text: str) -> str:
    """``text`` with what a terminal would act on spelled out, except its newlines and tabs."""
    return _UNSAFE_IN_LINES.sub(_spelled, text)


def json_text(data: object) -> str:
    """``data`` as one line of JSON; characters a terminal acts on as ``\\u`` escapes."""
    text = json.dumps(data, default=_jsonable, ensure_ascii=False)
    return _UNSAFE.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


def _jsonable(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


class _Guard:
    """A text stream that spells out what a terminal would act on, except newlines and tabs."""

    def __init__(self, inner: IO[str]) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        self._inner.write(escape_lines(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """Standard output guarded for the length of the block."""
    inner = sys.stdout
    sys.stdout = _Guard(inner)
    try:
        yield
    finally:
        sys.stdout = inner
