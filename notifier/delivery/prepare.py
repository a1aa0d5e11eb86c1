"""What a claimed row becomes right before it is sent: suppressed, rendered, redirected.

``Content.prepare`` takes a batch after the claim and before the checks and sends:

1. **Suppression.** A row whose (channel, recipient) is in ``suppressions``, or whose category
   its recipient opted out of (``category_opt_outs``), is ``cancelled`` with ``last_error``
   ``suppressed: <the entry's reason>`` and never reaches its provider. An entry of
   ``suppressions`` covers every row but for a ``complaint``, which spares transactional rows
   (no category). Producers add entries with plain SQL::

       INSERT INTO suppressions (channel, recipient, reason)
       VALUES ('email', 'ann@example.com', 'unsubscribed')
       ON CONFLICT (channel, recipient) DO NOTHING;

   and ``SELECT notifier_lift_opt_out('email', 'ann@example.com')`` lifts an opt-out (never a
   bounce or complaint). notifier adds one itself when a provider refuses the recipient for
   good (``Permanent(suppress=True)``: an SMTP ``RCPT TO`` answered ``550 5.1.1``, kind
   ``bounce``; a push token FCM calls unregistered, kind ``invalid``): the decision made of
   that answer carries the entry (``outcomes.plan``), and the ``recorder`` writes it with the
   outcome. Entries are stored and matched by one rule (``suppression_recipient``, see
   ``notifier.db.suppressions``): email addresses without surrounding whitespace and
   case-insensitively (``Ann@Example.COM`` is ``ann@example.com``), other channels' recipients
   exactly as written.

2. **Templates.** A row may name a ``template`` (and a ``locale``) instead of carrying its
   subject and body. The template's subject, body and html are rendered with Jinja2 in a
   sandbox, from the row's ``payload`` plus ``recipient`` (a payload key of that name wins).
   Payload values are data: template syntax inside them is printed as written, never run. The
   html part is autoescaped, the text parts are not; rendered html goes to ``payload.html``. A
   part the template lacks keeps the row's own value. The locale falls back from the row's
   (``de-AT``) to its language (``de``) to ``NOTIFIER_DEFAULT_LOCALE`` (``en``). No template,
   a variable the payload lacks, or a template that does not compile makes the row ``dead``
   with a reason that names it.

3. **Overrides** (staging). With ``NOTIFIER_OVERRIDE_RECIPIENTS`` (``email=qa@example.com``)
   every row of a listed channel goes to that recipient instead; the row keeps its own in the
   database, and the provider gets it as ``payload.original_recipient``.

Rows with no template, no suppression entry and no override come back as they were: a batch of
them costs one query, whatever its size. Templates are cached per process for
``TEMPLATE_CACHE_SECONDS``, so an edited template reaches every worker within that time.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from jinja2 import StrictUndefined, Template, TemplateSyntaxError, UndefinedError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from notifier import unsubscribe
from notifier.db import suppressions, templates
from notifier.delivery.checks import named
from notifier.delivery.outcomes import Cancelled, Result
from notifier.delivery.people import Wishes
from notifier.models import Notification
from notifier.providers.base import Permanent
from notifier.settings import Settings
from notifier.specs import normalize_locale

log = logging.getLogger(__name__)

#: The rows to send, and the results of those not to send.
Prepared = tuple[list[Notification], dict[int, Result]]

#: How long a worker uses a template it read before reading it again.
TEMPLATE_CACHE_SECONDS = 30.0

# Two environments because autoescaping belongs to the html part only: escaping a plain-text
# body would put "&amp;" into it. Both sandboxed (no access to internals, bounded ranges),
# immutable (a template cannot change the payload it reads, which is also the one sent), and
# strict (a missing variable is an error, not an empty string in a sent message).
_TEXT = ImmutableSandboxedEnvironment(undefined=StrictUndefined, autoescape=False)
_HTML = ImmutableSandboxedEnvironment(undefined=StrictUndefined, autoescape=True)

_UNDEFINED = re.compile(r"'([^']*)' is undefined")


class TemplateProblem(Exception):
    """The row's template cannot give it a message; the text is the row's ``last_error``."""


@dataclass(frozen=True, slots=True)
class Compiled:
    """One template version, compiled once per cache period."""

    name: str
    channel: str
    locale: str
    subject: Template | None
    body: Template | None
    html: Template | None
    #: why it does not compile (it was written behind ``notifier template add``'s back)
    error: str | None = None


def compile_parts(
    subject: str | None, body: str | None, html: str | None
) -> tuple[Template | None, Template | None, Template | None]:
    """Compile each part given; ``ValueError`` naming the part and line if one does not."""
    compiled: list[Template | None] = []
    for part, source, env in (
        ("subject", subject, _TEXT),
        ("body", body, _TEXT),
        ("html", html, _HTML),
    ):
        try:
            compiled.append(None if source is None else env.from_string(source))
        except TemplateSyntaxError as exc:
            raise ValueError(f"{part} line {exc.lineno}: {exc.message}") from None
    return compiled[0], compiled[1], compiled[2]


def compile_template(
    name: str, channel: str, locale: str, subject: str | None, body: str | None, html: str | None
) -> Compiled:
    """A template that does not compile is kept with its error: the rows that name it die with
    that reason, and the rest of their batch is sent."""
    try:
        parts = compile_parts(subject, body, html)
    except ValueError as exc:
        return Compiled(name, channel, locale, None, None, None, error=str(exc))
    return Compiled(name, channel, locale, *parts)


def render(
    template: Compiled, n: Notification, links: Mapping[str, str] | None = None
) -> Notification:
    """``n`` with the template's parts rendered from its payload (and its person's fields, and
    ``links``: ``preferences_url``); raises ``TemplateProblem``."""
    where = f"template {template.name!r} ({template.channel}, {template.locale})"
    if template.error is not None:
        raise TemplateProblem(f"{where} does not compile: {template.error}")
    fields = n.profile.fields if n.profile is not None else {}
    values: dict[str, Any] = {"recipient": n.recipient, **(links or {}), **fields, **n.payload}
    try:
        subject = n.subject if template.subject is None else template.subject.render(values)
        body = n.body if template.body is None else template.body.render(values)
        html = None if template.html is None else template.html.render(values)
    except UndefinedError as exc:
        missing = _UNDEFINED.fullmatch(str(exc))
        if missing is not None:
            raise TemplateProblem(
                f"template {template.name!r} needs {missing.group(1)!r}, which the payload lacks"
            ) from None
        raise TemplateProblem(f"{where} needs a value the payload lacks: {exc}") from None
    except Exception as exc:  # a template's bug must not lose the batch
        raise TemplateProblem(f"{where} failed: {type(exc).__name__}: {exc}") from None
    payload = n.payload if html is None else {**n.payload, "html": html}
    return replace(n, subject=subject, body=body, payload=payload)


def locale_chain(locale: str | None, default: str) -> list[str]:
    """The locales to look for, most specific first: ``de-AT``, ``de``, then ``default``."""
    chain: list[str] = []
    if locale is not None and locale.strip():
        parts = normalize_locale(locale).split("-")
        chain = ["-".join(parts[:i]) for i in range(len(parts), 0, -1)]
    if default not in chain:
        chain.append(default)
    return chain


def redirect(n: Notification, overrides: Mapping[str, str]) -> Notification:
    """``n`` addressed to its channel's override, if there is one."""
    target = overrides.get(n.channel)
    if target is None:
        return n
    payload = n.payload
    if isinstance(payload, dict):  # else its check refuses the row; the recipient moves anyway
        payload = {**payload, "original_recipient": n.recipient}
    return replace(n, recipient=target, payload=payload)


@dataclass(frozen=True, slots=True)
class _Cached:
    read_at: float
    by_locale: dict[str, Compiled]


class Content:
    """Suppression, templates and overrides for one worker process (see the module docstring).

    Not thread-safe: the dispatcher calls it from the thread that runs its batches.
    """

    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        *,
        cache_seconds: float = TEMPLATE_CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.engine = engine
        self.default_locale = settings.default_locale
        self.settings = settings
        self.overrides = settings.override_recipients
        self.wishes = Wishes(settings)
        self.now = now
        self.cache_seconds = cache_seconds
        self.clock = clock
        self._cache: dict[tuple[str, str], _Cached] = {}
        for channel, recipient in self.overrides.items():
            log.warning("override: every %s notification goes to %s", channel, recipient)

    def prepare(
        self,
        rows: list[Notification],
        conn: Connection | None = None,
        stopped: Mapping[suppressions.Addressee, str] | None = None,
    ) -> tuple[list[Notification], dict[int, Result]]:
        """The rows to send (rendered, redirected), and the results of those not to send.

        A suppressed row gets ``Cancelled``; a row whose template fails gets ``Permanent``.
        Rows come back in their order; without anything to do, ``rows`` itself comes back.
        One query for the batch's suppressions, unless ``stopped`` holds what it found (read
        with the look before sending), and, unless every template it names is cached, one for
        its templates: on ``conn`` if given (so the caller can retry it), else on a connection
        of its own.
        """
        if not rows:
            return rows, {}
        if conn is None:
            with self.engine.connect() as own:
                own.execution_options(isolation_level="AUTOCOMMIT")  # reads only: no BEGIN
                return self.prepare(rows, own, stopped)
        if stopped is None:
            stopped = suppressions.suppressed(
                conn, {(n.channel, n.recipient, n.category) for n in rows}
            )
        templated = [n for n in rows if n.template is not None and isinstance(n.payload, dict)]
        wished = self.wishes.apply_to(rows)
        if not stopped and not templated and not self.overrides and not wished:
            return rows, {}
        now = self.now()
        templates = self._templates(conn, templated) if templated else {}
        ready: list[Notification] = []
        results: dict[int, Result] = {}
        for n in rows:
            reason = stopped.get((n.channel, n.recipient, n.category))
            if reason is not None:
                results[n.id] = Cancelled(f"suppressed: {reason}")
                continue
            wish = self.wishes(n, now) if wished else None
            if wish is not None:  # the person's preference or quiet hours
                results[n.id] = wish
                continue
            found = templates.get(n.id)
            if found is not None:
                done = apply(found, n, self.settings)
                if isinstance(done, str):
                    results[n.id] = Permanent(done)
                    continue
                n = done
            ready.append(redirect(n, self.overrides) if self.overrides else n)
        return ready, results

    def _templates(self, conn: Connection, rows: list[Notification]) -> dict[int, Compiled | str]:
        """Each templated row's template, or why it has none.

        Served from the cache while it is fresh. A row the cache cannot serve (not read yet,
        stale, or no locale of its chain) has its template read again, all locales at once, in
        one query for the batch: a template added a moment ago is found, not reported missing.
        """
        now = self.clock()
        chains: dict[int, list[str]] = {}
        found: dict[int, Compiled | str] = {}
        for n in rows:
            chain = template_locales(n, self.default_locale)
            if isinstance(chain, str):
                found[n.id] = chain
            else:
                chains[n.id] = chain

        def cached(n: Notification) -> Compiled | None:
            entry = self._cache.get((n.template or "", n.channel))
            if entry is None or now - entry.read_at >= self.cache_seconds:
                return None
            return next((entry.by_locale[c] for c in chains[n.id] if c in entry.by_locale), None)

        missing = {(n.template or "", n.channel) for n in rows if n.id in chains and not cached(n)}
        if missing:
            self._read(conn, missing, now)
        for n in rows:
            if n.id in chains:
                found[n.id] = cached(n) or _no_template(n, chains[n.id])
        return found

    def _read(self, conn: Connection, keys: set[tuple[str, str]], now: float) -> None:
        fresh = {key: _Cached(now, {}) for key in keys}
        for key, by_locale in versions(templates.templates_of(conn, keys)).items():
            fresh[key].by_locale.update(by_locale)
        self._cache = {
            key: entry
            for key, entry in self._cache.items()
            if now - entry.read_at < self.cache_seconds
        }
        self._cache.update(fresh)


def template_locales(n: Notification, default: str) -> list[str] | str:
    """The locales to look for the row's template in (``locale_chain``), or why there are
    none, as the row's ``last_error``."""
    try:
        return locale_chain(n.locale, default)
    except ValueError as exc:
        return f"invalid notification: locale: {exc}"


def versions(rows: Iterable[templates.TemplateRow]) -> dict[tuple[str, str], dict[str, Compiled]]:
    """Stored templates compiled, by (name, channel) and then by locale."""
    found: dict[tuple[str, str], dict[str, Compiled]] = {}
    for row in rows:
        locale = _stored_locale(row.locale)
        found.setdefault((row.name, row.channel), {})[locale] = compile_template(
            row.name, row.channel, locale, row.subject, row.body, row.html
        )
    return found


def template_of(
    n: Notification, rows: Iterable[templates.TemplateRow], default: str
) -> Compiled | str:
    """The template version a worker would render ``n`` with, from the stored ``rows`` of its
    template (every locale), or why there is none, as the row's ``last_error``."""
    chain = template_locales(n, default)
    if isinstance(chain, str):
        return chain
    by_locale = versions(rows).get((n.template or "", n.channel), {})
    return next((by_locale[c] for c in chain if c in by_locale), None) or _no_template(n, chain)


def links(settings: Settings, n: Notification) -> dict[str, str]:
    """The links a template of ``n`` may use: ``preferences_url``, the preference center of
    the person the row addresses, where the deployment has one."""
    url = None if n.profile is None else unsubscribe.preferences_url(settings, n.profile.id)
    return {} if url is None else {"preferences_url": url}


def apply(
    found: Compiled | str, n: Notification, settings: Settings | None = None
) -> Notification | str:
    """``n`` rendered with the template ``found`` for it, or why it cannot be, as the row's
    ``last_error``: what ``prepare`` does with each templated row."""
    if isinstance(found, str):
        return found
    try:
        return render(found, n, links(settings, n) if settings is not None else None)
    except TemplateProblem as exc:
        return str(exc)


def _no_template(n: Notification, chain: list[str]) -> str:
    locales = chain[0] if len(chain) == 1 else f"{', '.join(chain[:-1])} or {chain[-1]}"
    return f"no template {n.template!r} for channel {n.channel} in locale {locales}"


def _stored_locale(locale: str) -> str:
    """A stored template's locale, normalized like the rows' (it may have been written in SQL)."""
    try:
        return normalize_locale(locale)
    except ValueError:
        return locale  # matches no row's chain; harmless


def prepare_each(
    content: Content,
    rows: list[Notification],
    durably: Callable[[Callable[[Connection], Prepared]], Prepared],
    stopped: Mapping[suppressions.Addressee, str] | None = None,
) -> Prepared:
    """``Content.prepare`` in ``durably``'s transaction, with one row's failure kept to that
    row: when preparing the batch raises anything but a database error, each row is prepared
    alone, and a row that still raises is ``dead``, naming the exception. ``stopped``: the
    suppression list's entries for the rows, when they were read already."""
    try:
        return durably(lambda c: content.prepare(rows, c, stopped))
    except DBAPIError:
        raise
    except Exception as exc:
        if len(rows) == 1:
            log.exception("preparing notification %d raised", rows[0].id)
            why = f"invalid notification: preparing it raised {named(exc)}"
            return [], {rows[0].id: Permanent(why)}
    prepared: list[Notification] = []
    results: dict[int, Result] = {}
    for n in rows:
        ready, decided = prepare_each(content, [n], durably, stopped)
        prepared += ready
        results.update(decided)
    return prepared, results
