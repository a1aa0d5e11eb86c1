"""An audience CSV file's bytes as lines of text: UTF-8, with or without a byte order mark.

Spreadsheets save "CSV UTF-8" with a byte order mark (``EF BB BF``) in front of the header;
it is dropped, never shown and never part of a column's name. Anything else is refused with
one line naming what was found and the fix: a UTF-16 or UTF-32 file (by its byte order mark,
or the NUL bytes every ASCII character of it has), or bytes that are not UTF-8 (Latin-1,
Windows-1252), named by byte offset and line.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator

SAVE_AS = "save it as CSV UTF-8 (in a spreadsheet: File, Save As, CSV UTF-8)"

# Longest first: UTF-32 LE's mark begins with UTF-16 LE's.
_MARKS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


def text_lines(raw: Iterable[bytes]) -> Iterator[str]:
    """The lines of a CSV file read in binary (each with its line break, as ``csv`` wants
    them); ``ValueError`` with one line when it is not UTF-8."""
    offset = 0  # bytes before the line
    for number, line in enumerate(raw, 1):
        if number == 1:
            for mark, encoding in _MARKS:
                if line.startswith(mark):
                    raise ValueError(
                        f"the audience CSV is {encoding} (it starts with a {encoding} byte order"
                        f" mark), not UTF-8: {SAVE_AS}"
                    )
            if line.startswith(codecs.BOM_UTF8):
                line, offset = line[len(codecs.BOM_UTF8) :], len(codecs.BOM_UTF8)
        nul = line.find(b"\x00")
        if nul >= 0:
            raise ValueError(
                f"the audience CSV is not UTF-8 text: byte {offset + nul + 1} (line {number})"
                f" is a NUL byte, as in UTF-16; {SAVE_AS}"
            )
        try:
            text = line.decode()
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"the audience CSV is not UTF-8: byte {offset + exc.start + 1} (line {number})"
                f" is 0x{line[exc.start]:02X}, which UTF-8 does not have there (Latin-1 or"
                f" Windows-1252?); {SAVE_AS}"
            ) from None
        offset += len(line)
        yield text
