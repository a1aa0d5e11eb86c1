"""What a campaign's messages say: ``{placeholders}`` rendered in the fan-out statement, or a
stored Jinja2 template rendered by the worker, and the fields either needs from each recipient.

Placeholders are ``{recipient}``, ``{code}`` and any audience field (a CSV column, a query
column), filled inside the fan-out statement from bound parameters only. A stored template's
variables are read with ``jinja2.meta`` from the version rows will find, by the worker's locale
fallback. Either way a field missing for any recipient stops the launch before anything is
written, naming the field (``notifier.campaigns.launch``).
"""

from __future__ import annotations

import contextlib
import re
import string

from jinja2 import Environment, TemplateSyntaxError, meta
from sqlalchemy import Connection

from notifier.db.templates import TemplateRow, templates_of
from notifier.delivery.prepare import compile_parts, locale_chain
from notifier.settings import get_settings
from notifier.specs import normalize_locale


class CampaignError(ValueError):
    """An operator's request that cannot be carried out; the message says why and what to do."""


_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
BUILT_IN = {"recipient": "r.recipient", "code": "k.code"}
#: What a stored template's rows carry besides the audience fields (``TEMPLATED_PAYLOAD``).
TEMPLATE_BUILT_IN = {"recipient", "code", "campaign"}
#: Parses stored templates to find their variables; what Jinja2 itself provides is not one.
#: (Only parses: the worker renders, with its own environments.)
_JINJA = Environment(autoescape=True)


def placeholders(template: str | None) -> list[str]:
    """The placeholder names of a template, in order; refuses anything but ``{name}``."""
    if template is None:
        return []
    names = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise CampaignError(
            f"template {template[:60]!r}: {exc} (write a literal brace as {{{{)"
        ) from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if spec or conversion or not _FIELD.fullmatch(name):
            raise CampaignError(
                f"template placeholder {{{name}{'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}}} is not a plain {{name}}"
            )
        names.append(name)
    return names


def render_sql(subject: str | None, body: str | None) -> tuple[str, str, dict[str, str]]:
    """SQL expressions that fill both templates for each fan-out row, and their parameters."""
    params: dict[str, str] = {}

    def expression(template: str | None, prefix: str) -> str:
        if template is None:
            return "NULL"
        parts: list[str] = []
        for i, (literal, name, _, _) in enumerate(string.Formatter().parse(template)):
            if literal:
                params[f"{prefix}l{i}"] = literal
                parts.append(f"CAST(:{prefix}l{i} AS text)")
            if name is not None:
                if name in BUILT_IN:
                    parts.append(BUILT_IN[name])
                else:
                    params[f"{prefix}f{i}"] = name
                    parts.append(f"(r.fields ->> CAST(:{prefix}f{i} AS text))")
        return f"concat({', '.join(parts)})" if parts else "''"

    placeholders(subject)
    placeholders(body)
    return expression(subject, "s"), expression(body, "b"), params


def template_variables(
    conn: Connection, template: str, channel: str, locale: str | None
) -> set[str]:
    """The variables a stored template reads from each row, as ``jinja2.meta`` finds them: of
    the version rows naming it and ``locale`` will find, by the worker's locale fallback."""
    found = stored_template(conn, template, channel, locale)
    where = f"template {found.name!r} ({found.channel}, {found.locale})"
    try:
        compile_parts(found.subject, found.body, found.html)
        names: set[str] = set()
        for source in (found.subject, found.body, found.html):
            if source is not None:
                names |= meta.find_undeclared_variables(_JINJA.parse(source))
    except (ValueError, TemplateSyntaxError) as exc:
        raise CampaignError(
            f"{where} does not compile: {exc}; fix it with notifier template add"
        ) from None
    return names - set(_JINJA.globals)


def stored_template(conn: Connection, name: str, channel: str, locale: str | None) -> TemplateRow:
    """The stored template a row naming ``name`` and ``locale`` on ``channel`` would get."""
    chain = locale_chain(locale, get_settings().default_locale)
    by_locale: dict[str, TemplateRow] = {}
    for row in templates_of(conn, [(name, channel)]):
        with contextlib.suppress(ValueError):  # a locale written in SQL that no row can match
            by_locale[normalize_locale(row.locale)] = row
    for wanted in chain:
        if wanted in by_locale:
            return by_locale[wanted]
    raise CampaignError(
        f"no stored template {name!r} for channel {channel} in locale {' or '.join(chain)};"
        " add it first with notifier template add"
    )
