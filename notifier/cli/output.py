"""Everything a ``notifier`` command prints, and where it goes.

A command hands its result to ``emit``: the data for ``--json`` (one JSON document on stdout)
and the blocks people read (``Table``: aligned columns; ``Fields``: a key/value block;
``Text``: lines of its own). Every cell and field goes through ``terminal.shown``, and any
other text through ``terminal.escape_lines``, so nothing a row holds can drive the terminal.
Messages about the command rather than its result (errors, questions) go to stderr, and so do
progress bars, which are drawn only when stderr is a terminal and the output is not ``--json``.

Once stdout is closed by its reader (``notifier stats | head -1``) the rest of the output is
dropped, and the command ends as it would have, quietly.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any, AnyStr, TypeVar

import click

from notifier.cli import terminal

F = TypeVar("F", bound=Callable[..., Any])

#: Where the ``--json`` flag of the command being run is kept: its click context's ``meta``,
#: which every context of one invocation shares.
_JSON = "notifier.output.json"


def json_option(command: F) -> F:
    """Give ``command`` the ``--json`` flag: its result as one JSON document on stdout."""
    return click.option(
        "--json",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=_remember_json,
        help="Print one JSON document on stdout instead, with the same data; no progress bar.",
    )(command)


def _remember_json(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[_JSON] = True


def json_wanted() -> bool:
    """Whether the command being run was given ``--json``."""
    ctx = click.get_current_context(silent=True)
    return ctx is not None and bool(ctx.meta.get(_JSON))


# --- the result -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """Columns aligned: text to the left, whole numbers to the right; no header if ``None``."""

    header: Sequence[str] | None
    rows: Sequence[Sequence[object]]
    indent: str = ""


@dataclass(frozen=True)
class Fields:
    """``key  value`` lines under an optional title, the values aligned."""

    pairs: Sequence[tuple[str, object]]
    title: str | None = None
    indent: str = "  "


@dataclass(frozen=True)
class Text:
    """Lines as they are written, newlines and tabs kept; values in them should be ``shown``."""

    text: str


Block = Table | Fields | Text


def emit(data: object, *blocks: Block) -> None:
    """The command's result: ``data`` as JSON with ``--json``, else ``blocks`` for people."""
    if json_wanted():
        _write(terminal.json_text(data) + "\n")
    else:
        _write("".join(render(block) for block in blocks))


def render(block: Block) -> str:
    """``block`` as the text printed for it, each line ending in a newline."""
    if isinstance(block, Text):
        return terminal.escape_lines(block.text) + "\n"
    if isinstance(block, Fields):
        return _fields(block)
    return _table(block)


def _table(table: Table) -> str:
    header = list(table.header or ())
    rows = [[terminal.shown(c) for c in r] for r in table.rows]
    cells = ([header] if table.header is not None else []) + rows
    if not cells:
        return ""
    columns = len(cells[0])
    widths = [max(len(r[i]) for r in cells) for i in range(columns)]
    numeric = [
        bool(table.rows) and all(_is_count(r[i]) for r in table.rows) for i in range(columns)
    ]
    lines = []
    for r in cells:
        line = "  ".join(
            c.rjust(w) if numeric[i] else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        lines.append(table.indent + line.rstrip() + "\n")
    return "".join(lines)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fields(fields: Fields) -> str:
    pairs = [(key, terminal.shown(value)) for key, value in fields.pairs]
    width = max((len(key) for key, _ in pairs), default=0)
    lines = [] if fields.title is None else [terminal.escape_lines(fields.title) + "\n"]
    lines += [f"{fields.indent}{key:<{width}}  {value}".rstrip() + "\n" for key, value in pairs]
    return "".join(lines)


def quoted(value: object) -> str:
    """A name or key inside a sentence: quoted as Python would, control characters spelled."""
    return terminal.shown(repr(value))


# --- stdout ---------------------------------------------------------------------------------


def _write(text: str) -> None:
    if not text:
        return
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        stdout_closed()


def stdout_closed() -> None:
    """The reader of stdout has gone: send whatever is still to come, buffered or not, nowhere."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a file (a test's capture): nothing is flushed to it at exit
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


# --- stderr ---------------------------------------------------------------------------------


def error(message: object) -> None:
    """One line about why the command failed: ``notifier: ...`` on stderr."""
    _say(f"notifier: {terminal.shown(message)}")


def note(message: str) -> None:
    """One line on stderr that is not the command's result (``no notification 7``)."""
    _say(terminal.escape_lines(message))


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def confirm(question: str) -> bool:
    """Ask ``question [y/N]`` on stderr and read the answer from stdin; only yes says yes."""
    sys.stderr.write(f"{terminal.escape_lines(question)} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline()
    if not answer.endswith("\n"):
        sys.stderr.write("\n")
    return answer.strip().lower() in ("y", "yes")


# --- progress -------------------------------------------------------------------------------


def progress_wanted() -> bool:
    """Progress is drawn only on a terminal's stderr, and never with ``--json``."""
    return not json_wanted() and _is_terminal(sys.stderr)


def _is_terminal(stream: IO[str] | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    """A progress bar on stderr, or nothing: ``advance`` by a count, or ``show`` a position."""

    #: Redraw at most this often: a bar advanced per line of a large file costs nothing more.
    EVERY = 0.1

    def __init__(self, bar: Any | None = None) -> None:
        self._bar = bar
        self._done = 0
        self._total: int | None = None if bar is None else bar.length
        self._note: str | None = None
        self._drawn = 0.0

    @property
    def shown(self) -> bool:
        return self._bar is not None

    def advance(self, n: int) -> None:
        self.show(self._done + n)

    def show(self, done: int, total: int | None = None, note: str | None = None) -> None:
        if self._bar is None:
            return
        self._done = done
        if total is not None:
            self._total = total
        if note is not None:
            self._note = note
        if time.monotonic() - self._drawn >= self.EVERY:
            self._draw()

    def _draw(self) -> None:
        bar = self._bar
        assert bar is not None
        if self._total is not None and bar.length != self._total:
            bar.length = max(self._total, 1)
        bar.update(self._done - bar.pos, self._note)
        self._drawn = time.monotonic()

    def finish(self) -> None:
        if self._bar is not None:
            self._draw()


@contextlib.contextmanager
def progress(
    label: str, total: int | None = None, *, drawn: bool = True, counted: bool = True
) -> Iterator[Progress]:
    """A bar labelled ``label`` going to ``total`` (a counter if ``None``), drawn only where
    ``progress_wanted`` (and ``drawn``), showing the position unless it is not ``counted``
    (bytes); ended with a newline on stderr, so what follows starts a line of its own."""
    if not (drawn and progress_wanted()):
        yield Progress()
        return
    bar: Any
    if total is None:
        # click's bar needs a length or an iterable; an endless one draws a bouncing marker.
        bar = click.progressbar(iter(int, 1), label=label, show_pos=True, file=sys.stderr)
    else:
        bar = click.progressbar(
            length=max(total, 1),
            label=label,
            show_pos=counted,
            show_percent=True,
            file=sys.stderr,
            width=30,
            item_show_func=lambda note: note,
        )
    with bar:
        shown = Progress(bar)
        try:
            yield shown
        finally:
            shown.finish()


def read_with_progress(file: IO[AnyStr], label: str) -> Iterator[AnyStr]:
    """The lines of ``file``, with a bar of the bytes read so far where progress is drawn."""
    size = _size(file)
    if size is None or not progress_wanted():
        yield from file
        return
    with progress(label, size, counted=False) as bar:
        for line in file:
            bar.show(_position(file, size))
            yield line
        bar.show(size)


def _size(file: IO[AnyStr]) -> int | None:
    try:
        return os.fstat(file.fileno()).st_size or None
    except (AttributeError, OSError, ValueError):
        return None


def _position(file: IO[AnyStr], size: int) -> int:
    try:
        # A text file cannot tell() while it is iterated; its buffer, like a binary file, can.
        return min(int(getattr(file, "buffer", file).tell()), size)
    except (AttributeError, OSError, ValueError):
        return 0
