"""All SQL of a campaign's imports: its audience (a CSV file, a query) and its codes.

Like ``notifier.db.campaigns``, a module that talks to the driver. A recipient is staged once
(primary key ``(campaign_id, recipient)``), a code once (primary key ``(campaign_id, code)``);
both get dense positions per campaign as they are imported, and recipient N is given code N.
Imports into one campaign take turns (an advisory lock), so their positions never collide.

A CSV file's stage records each line's number: a recipient on several lines keeps its first
line, and the later ones are reported (or refuse the file).
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import Connection, text

from notifier import db
from notifier.db.engine import driver_errors
from notifier.db.sql import for_driver
from notifier.settings import get_settings

LOCK_CAMPAIGN = text(
    "SELECT pg_advisory_xact_lock(hashtext('notifier.campaign'), CAST(:id AS int))"
)

# The new recipients among {source}'s rows (recipient, fields), each recipient once (its first
# row by {first}), numbered on from the campaign's last position. Sorted once; the primary key
# is then filled in order.
NEW_RECIPIENTS = """
    INSERT INTO campaign_recipients (campaign_id, position, recipient, fields)
    SELECT :id,
           (SELECT coalesce(max(position), 0) FROM campaign_recipients WHERE campaign_id = :id)
             + row_number() OVER (ORDER BY s.recipient),
           s.recipient, s.fields
      FROM (SELECT DISTINCT ON (recipient) recipient, fields
              FROM ({source}) AS source ORDER BY recipient{first}) AS s
     WHERE NOT EXISTS (SELECT 1 FROM campaign_recipients AS r
                        WHERE r.campaign_id = :id AND r.recipient = s.recipient)
"""

# A CSV staged by ``import_audience``: c0 the recipient, c1... the fields ({fields} pairs them
# with their names), line its line in the file.
STAGED = """
    SELECT trim(c0) AS recipient, {fields} AS fields, line
      FROM stage WHERE coalesce(trim(c0), '') <> ''
"""

# The staged lines that repeat an earlier line's recipient: how many, and the first :few of
# them with that earlier line. One sort of (recipient, line) pairs, without the fields.
DUPLICATE_LINES = text(
    """
    SELECT count(*) OVER (), line, recipient, first
      FROM (SELECT line, recipient,
                   min(line) OVER (PARTITION BY recipient) AS first
              FROM (SELECT trim(c0) AS recipient, line FROM stage
                     WHERE coalesce(trim(c0), '') <> '') AS s) AS d
     WHERE line <> first
     ORDER BY line
     LIMIT :few
    """
)

#: How many repeated lines an import names (it counts them all).
DUPLICATES_NAMED = 5

#: How many lines with a recipient that cannot be sent to an import names (it counts them all).
INVALID_NAMED = 5

#: Why no notification can be sent to a recipient, or ``None`` if one may be.
RecipientCheck = Callable[[str], str | None]

#: The role an audience query runs as: it reads only what operators GRANT it (migration 0010).
AUDIENCE_ROLE = "notifier_audience"

# An operator's query with a ``recipient`` column, its other columns the fields, run by
# ``notifier_audience_rows`` (migration 0010) as notifier_audience, which no query can leave.
QUERIED = "COPY (SELECT recipient, fields FROM notifier_audience_rows({query})) TO STDOUT"

# Each row numbered as the query returned it, so that a refused recipient can be named.
QUERIED_STAGE = (
    "CREATE TEMP TABLE stage (recipient text, fields jsonb,"
    " row_number bigint GENERATED ALWAYS AS IDENTITY) ON COMMIT DROP"
)

STAGED_QUERY = "SELECT recipient, fields FROM stage"

STAGED_RECIPIENTS = "SELECT row_number, recipient FROM stage ORDER BY row_number"

DROP_STAGED = text("DELETE FROM stage WHERE row_number = ANY(CAST(:rows AS bigint[]))")

CODES_FROM_STAGE = for_driver(
    """
    INSERT INTO campaign_codes (campaign_id, position, code)
    SELECT :campaign_id,
           (SELECT coalesce(max(position), 0) FROM campaign_codes
             WHERE campaign_id = :campaign_id) + row_number() OVER (ORDER BY s.code),
           s.code
      FROM (SELECT DISTINCT trim(code) AS code FROM stage
             WHERE coalesce(trim(code), '') <> '') AS s
     WHERE NOT EXISTS (SELECT 1 FROM campaign_codes AS k
                        WHERE k.campaign_id = :campaign_id AND k.code = s.code)
"""
)


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A CSV line skipped because an earlier line has its recipient."""

    line: int
    recipient: str
    #: the line kept for that recipient
    first_line: int


@dataclass(frozen=True, slots=True)
class Invalid:
    """A line (of a CSV file, or a row of a query) whose recipient cannot be sent to."""

    line: int
    recipient: str
    #: what the worker would say of a row to it
    reason: str


@dataclass(frozen=True, slots=True)
class AudienceImport:
    """What an import did."""

    #: recipients new to the campaign
    added: int
    #: the CSV's other columns, each recipient's fields
    fields: list[str]
    #: lines skipped because an earlier line of the file has their recipient
    duplicates: int
    #: the first of those lines (up to ``DUPLICATES_NAMED``), in line order
    examples: list[Duplicate]
    #: lines skipped (``skip_invalid``) because their recipient cannot be sent to
    invalid: int = 0
    #: the first of those lines (up to ``INVALID_NAMED``), in line order
    invalid_examples: list[Invalid] = field(default_factory=list)


class DuplicateRecipients(ValueError):
    """A CSV imported with ``refuse_duplicates`` repeats a recipient; nothing was imported."""


class InvalidRecipients(ValueError):
    """Recipients that cannot be sent to, imported without ``skip_invalid``; nothing was
    imported."""


def _refuse_invalid(what: str, count: int, examples: list[Invalid]) -> InvalidRecipients:
    named = "; ".join(
        f"{what} {i.line}: {i.recipient[:100]!r}: {i.reason}" for i in examples[:INVALID_NAMED]
    )
    more = "; ..." if count > len(examples) else ""
    return InvalidRecipients(
        f"{count} {what}s of the audience have a recipient that cannot be sent to ({named}{more});"
        " nothing was imported: fix them, or import the rest skipping them (--skip-invalid)"
    )


def import_audience(
    conn: Connection,
    campaign_id: int,
    rows: Iterable[str],
    recipient_column: str,
    *,
    refuse_duplicates: bool = False,
    check: RecipientCheck | None = None,
    skip_invalid: bool = False,
) -> AudienceImport:
    """COPY a CSV audience in; its other columns become each recipient's fields.

    A recipient on several lines is imported from its first; the later lines are counted and
    the first few named, or with ``refuse_duplicates`` they raise ``DuplicateRecipients``
    before anything is written. A recipient ``check`` refuses raises ``InvalidRecipients``
    (counting them all, naming the first few), before anything is written; with
    ``skip_invalid`` its line is left out and reported instead. Whatever the file holds, what
    it raises is a ``ValueError`` of one line.
    """
    reader = csv.reader(rows)
    try:
        header = next(reader, None)
    except csv.Error as exc:
        raise ValueError(f"the audience CSV's header row cannot be read: {exc}") from None
    if not header:
        raise ValueError("the audience CSV is empty; it needs a header row")
    if header[0].startswith("\ufeff"):  # a byte order mark, read as text
        header[0] = header[0][1:]
    header = [h.strip() for h in header]
    if recipient_column not in header:
        raise ValueError(
            f"the audience CSV has no {recipient_column!r} column (it has:"
            f" {', '.join(h if h.isprintable() else repr(h) for h in header)})"
        )
    if len(set(header)) != len(header):
        raise ValueError("the audience CSV repeats a column name")
    order = [header.index(recipient_column)] + [
        i for i, h in enumerate(header) if h != recipient_column
    ]
    fields = [header[i] for i in order[1:]]
    conn.execute(LOCK_CAMPAIGN, {"id": campaign_id})
    raw = db.driver(conn)
    with driver_errors(conn), raw.cursor() as cur:
        names = [f"c{i}" for i in range(len(order))]
        columns = ", ".join(f"{c} text" for c in names)
        cur.execute(f"CREATE TEMP TABLE stage ({columns}, line bigint) ON COMMIT DROP")
        with cur.copy(f"COPY stage ({', '.join(names)}, line) FROM STDIN") as copy:
            end = reader.line_num  # a record starts on the line after the last one's end
            staged = 0  # records with a recipient, as STAGED reads them (trim() takes spaces)
            invalid: list[Invalid] = []
            refused = 0
            for record in _records(reader):
                line, end = end + 1, reader.line_num
                if len(record) != len(header):
                    raise ValueError(
                        f"audience CSV line {reader.line_num} has {len(record)} values;"
                        f" the header has {len(header)}"
                    )
                recipient = record[order[0]].strip(" ")
                if recipient and check is not None:
                    reason = check(recipient)
                    if reason is not None:
                        refused += 1
                        if len(invalid) < INVALID_NAMED:
                            invalid.append(Invalid(line, recipient, reason))
                        continue
                copy.write_row([*(record[i] for i in order), line])
                staged += recipient != ""
            if refused and not skip_invalid:
                raise _refuse_invalid("line", refused, invalid)
    duplicates, examples = _duplicates(conn) if refuse_duplicates else (0, [])
    if duplicates:
        first = examples[0]
        raise DuplicateRecipients(
            f"audience CSV line {first.line} repeats {first.recipient!r} from line"
            f" {first.first_line} ({duplicates} repeated lines in all); nothing was imported:"
            " remove the repeats, or import keeping each recipient's first line"
        )
    pairs = ", ".join(f"CAST(:f{i} AS text), c{i + 1}" for i in range(len(fields)))
    expression = f"jsonb_build_object({pairs})" if fields else "'{}'::jsonb"
    params: dict[str, Any] = {"id": campaign_id}
    params.update({f"f{i}": name for i, name in enumerate(fields)})
    statement = NEW_RECIPIENTS.format(source=STAGED.format(fields=expression), first=", line")
    added = int(conn.execute(text(statement), params).rowcount)
    if added < staged and not refuse_duplicates:
        # Some lines gave no new recipient: repeats, or recipients the campaign had. When every
        # line gave one (a first import without repeats), the stage need not be read again.
        duplicates, examples = _duplicates(conn)
    conn.execute(text("DROP TABLE stage"))
    return AudienceImport(added, fields, duplicates, examples, refused, invalid)


def _records(reader: Any) -> Iterable[list[str]]:
    """The CSV reader's records, its errors as one ``ValueError`` line naming the line."""
    while True:
        try:
            record: list[str] = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise ValueError(f"audience CSV line {reader.line_num} cannot be read: {exc}") from None
        yield record


def _duplicates(conn: Connection) -> tuple[int, list[Duplicate]]:
    """How many staged lines repeat an earlier line's recipient, and the first few."""
    rows = conn.execute(DUPLICATE_LINES, {"few": DUPLICATES_NAMED}).all()
    examples = [Duplicate(int(line), str(r), int(first)) for _, line, r, first in rows]
    return (int(rows[0][0]) if rows else 0), examples


def audience_from_query(
    conn: Connection,
    campaign_id: int,
    query: str,
    timeout_seconds: float | None = None,
    *,
    check: RecipientCheck | None = None,
    skip_invalid: bool = False,
) -> AudienceImport:
    """Stage the rows of an operator's query; it must return a ``recipient`` column.

    The query runs on a connection of its own, closed afterwards, in a read-only transaction
    as ``notifier_audience`` with a ``statement_timeout`` (``NOTIFIER_AUDIENCE_QUERY_TIMEOUT``
    by default): it reads only the tables that role was granted, and nothing it sets or locks
    outlives it. Its rows are copied into ``conn``'s transaction, which alone writes. A
    recipient ``check`` refuses raises ``InvalidRecipients``, naming its row's number among
    the rows with a recipient (NULL ones are left out); with ``skip_invalid`` that row is left
    out and reported.
    """
    timeout = get_settings().audience_query_timeout if timeout_seconds is None else timeout_seconds
    conn.execute(LOCK_CAMPAIGN, {"id": campaign_id})
    raw = db.driver(conn)
    with driver_errors(conn):
        raw.execute(QUERIED_STAGE)
    with conn.engine.connect() as reader:
        try:
            source = db.driver(reader)
            source.execute("SET TRANSACTION READ ONLY")
            source.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(AUDIENCE_ROLE)))
            milliseconds = str(int(timeout * 1000))
            source.execute("SELECT set_config('statement_timeout', %s, true)", [milliseconds])
            with (
                source.cursor().copy(sql.SQL(QUERIED).format(query=sql.Literal(query))) as rows,
                raw.cursor().copy("COPY stage (recipient, fields) FROM STDIN") as stage,
            ):
                for data in rows:
                    stage.write(data)
        except psycopg.Error as exc:
            raise ValueError(_refused(exc, timeout)) from None
        finally:
            reader.invalidate()  # closed, not pooled: whatever the query set or locked goes with it
    refused, invalid = _check_staged(conn, check)
    if refused and not skip_invalid:
        raise _refuse_invalid("row", len(refused), invalid)
    if refused:
        conn.execute(DROP_STAGED, {"rows": refused})
    statement = text(NEW_RECIPIENTS.format(source=STAGED_QUERY, first=""))
    added = int(conn.execute(statement, {"id": campaign_id}).rowcount)
    conn.execute(text("DROP TABLE stage"))
    return AudienceImport(added, [], 0, [], len(refused), invalid)


def _check_staged(
    conn: Connection, check: RecipientCheck | None
) -> tuple[list[int], list[Invalid]]:
    """The staged rows whose recipient ``check`` refuses: their numbers, and the first few in
    full. Read in one pass, ten thousand rows at a time."""
    refused: list[int] = []
    invalid: list[Invalid] = []
    with driver_errors(conn), db.driver(conn).cursor(name="staged_recipients") as cur:
        cur.itersize = 10_000
        cur.execute(STAGED_RECIPIENTS)
        for row, recipient in cur:
            reason = None if check is None else check(recipient)
            if reason is not None:
                refused.append(int(row))
                if len(invalid) < INVALID_NAMED:
                    invalid.append(Invalid(int(row), recipient, reason))
    return refused, invalid


def _refused(exc: psycopg.Error, timeout: float) -> str:
    """One line saying why an audience query failed, and what to do about it."""
    reason = (str(exc).splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return (
            f"the audience query was refused ({reason}): it runs as {AUDIENCE_ROLE}, so grant"
            f" {AUDIENCE_ROLE} SELECT on the tables your audience query reads"
        )
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return (
            f"the audience query ran longer than {timeout:g}s and was stopped"
            " (NOTIFIER_AUDIENCE_QUERY_TIMEOUT)"
        )
    if isinstance(exc, psycopg.errors.UndefinedColumn) and "q.recipient" in reason:
        return "the audience query must return a column named recipient"
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction | psycopg.errors.FeatureNotSupported):
        return f"the audience query may only read ({reason}); give a single SELECT"
    return f"the audience query failed: {reason}"


def import_codes(conn: Connection, campaign_id: int, codes: Iterable[str]) -> int:
    """COPY codes in, one per item; codes already in the pool are skipped."""
    conn.execute(LOCK_CAMPAIGN, {"id": campaign_id})
    raw = db.driver(conn)
    with driver_errors(conn), raw.cursor() as cur:
        cur.execute("CREATE TEMP TABLE stage (code text) ON COMMIT DROP")
        with cur.copy("COPY stage (code) FROM STDIN") as copy:
            for code in codes:
                copy.write_row((code,))
        cur.execute(CODES_FROM_STAGE.encode(), {"campaign_id": campaign_id})
        added = cur.rowcount
        cur.execute("DROP TABLE stage")
    return added
