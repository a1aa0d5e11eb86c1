"""The preference center: a page of a person's own where they turn categories on and off per
channel and set their quiet hours, served by ``notifier events`` at ``/p/{token}``.

The token names a profile and says nothing of it to whoever reads the URL: the profile's id
sealed like an unsubscribe token (``unsubscribe.preferences_token``, its own context, so
neither kind of token is the other), under ``NOTIFIER_UNSUBSCRIBE_SECRET``. Whoever holds the
link may change that person's preferences, as whoever holds an unsubscribe link may
unsubscribe: it reaches only the person's own inbox. No login, no address on the page or in
the URL.

The page is plain HTML: a form that works without JavaScript (the page carries none, and its
Content-Security-Policy allows none), one fieldset per category with a label per channel's
checkbox, keyboard order as read. Its texts are English unless the deployment stores templates
for channel ``page`` in the person's locale (the same lookup as a row's template: ``de-AT``,
``de``, ``NOTIFIER_DEFAULT_LOCALE``): ``preferences`` (subject: the title, body: the
introduction), ``preferences.saved`` (body), ``preferences.quiet`` (subject: the legend, body:
the note), ``category.NAME`` (subject: the label, body: a description), ``channel.NAME``
(subject: the label). They are rendered in the sandbox with the profile's fields and are
escaped on the page.

Saving writes every listed choice with the source ``person`` (``preference_history`` keeps
each change and its time) and the person's quiet hours.
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import time

from sqlalchemy import Connection

from notifier.db import producers, profiles, templates
from notifier.delivery.prepare import compile_parts, locale_chain
from notifier.settings import Settings
from notifier.specs import parse_quiet_window

#: The channel of the stored templates that localize the page.
PAGE_CHANNEL = "page"

DEFAULTS = {
    "preferences": ("Your notification preferences", "Choose what we may send you, and where."),
    "preferences.saved": (None, "Your choices are saved."),
    "preferences.quiet": (
        "Quiet hours",
        "Nothing but what is always sent reaches you between these times. Leave both empty"
        " for none.",
    ),
    "channel.email": ("Email", None),
    "channel.sms": ("Text messages (SMS)", None),
    "channel.push": ("Push notifications", None),
}
ALWAYS = "Always sent: these messages keep your account safe."

STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:40rem;margin:2rem auto;padding:0 1rem;"
    "line-height:1.5;color:#1b1b1b}fieldset{margin:1rem 0;border:1px solid #767676;"
    "border-radius:4px}label{display:inline-block;margin-right:1.5rem;padding:.4rem 0}"
    "input{margin-right:.4rem}button{font-size:1rem;padding:.5rem 1.25rem}"
    ".note{color:#3d3d3d}:focus-visible{outline:3px solid #1a5fb4;outline-offset:2px}"
)
_STYLE_HASH = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
#: Headers of every page: no script, no framing, the token never sent on as a Referer.
HEADERS = {
    "Content-Security-Policy": (
        f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; form-action 'self';"
        " frame-ancestors 'none'; base-uri 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}
_TIME = re.compile(r"([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9])?")


class Refused(ValueError):
    """A form the page did not make: nothing is saved."""


@dataclass(frozen=True, slots=True)
class Choices:
    """What a person saved: each listed (category, channel) on or off, and their quiet hours."""

    enabled: dict[tuple[str, str], bool]
    quiet: tuple[time, time] | None


def choices(settings: Settings, form: Mapping[str, str]) -> Choices:
    """The choices a submitted form holds; ``Refused`` for a field the page does not have."""
    listed = _editable(settings)
    names = {f"{category}/{channel}" for category, channel in listed}
    for name, value in form.items():
        if name in names:
            if value != "on":
                raise Refused(f"{name} is not on")
        elif name not in ("quiet_start", "quiet_end"):
            raise Refused("a field this page does not have")
    start, end = form.get("quiet_start", ""), form.get("quiet_end", "")
    quiet = None
    if start or end:
        if not (_TIME.fullmatch(start) and _TIME.fullmatch(end)):
            raise Refused("quiet hours need a start and an end, or neither")
        try:
            quiet = parse_quiet_window(f"{start[:5]}-{end[:5]}")
        except ValueError as exc:
            raise Refused(str(exc)) from None
    return Choices({pair: f"{pair[0]}/{pair[1]}" in form for pair in listed}, quiet)


def save(conn: Connection, profile_id: str, saved: Choices) -> None:
    """Write a person's choices as their own, in the caller's transaction."""
    profiles.set_preferences(conn, profile_id, saved.enabled, "person")
    start, end = saved.quiet if saved.quiet is not None else (None, None)
    producers.upsert_profile(conn, profile_id, {"quiet_start": start, "quiet_end": end})


def page(
    settings: Settings, conn: Connection, profile_id: str, *, saved: bool = False
) -> str | None:
    """The person's page as it stands, or ``None`` if there is no such profile."""
    person = profiles.get(conn, profile_id)
    if person is None:
        return None
    chosen = {(p.category, p.channel): p.enabled for p in profiles.preferences(conn, profile_id)}
    center = settings.preference_center
    keys = ["preferences", "preferences.saved", "preferences.quiet"]
    keys += [f"category.{c}" for c in center]
    keys += [f"channel.{ch}" for ch in {ch for chs in center.values() for ch in chs}]
    texts, lang = _texts(conn, keys, person.locale, settings.default_locale, person.fields)
    title, intro = texts["preferences"]
    parts = [f"<h1>{_e(title)}</h1>", f"<p>{_e(intro)}</p>"]
    if saved:
        parts.append(f'<p role="status"><strong>{_e(texts["preferences.saved"][1])}</strong></p>')
    parts.append('<form method="post">')
    for category, channels in center.items():
        label, description = texts[f"category.{category}"]
        critical = category in settings.critical_categories
        note = ALWAYS if critical else description
        boxes = []
        for channel in channels:
            on = critical or chosen.get(
                (category, channel), settings.preference_defaults.get(category, True)
            )
            attrs = " checked" if on else ""
            attrs += " disabled" if critical else f' name="{_e(category)}/{_e(channel)}" value="on"'
            if note:
                attrs += f' aria-describedby="d-{_e(category)}"'
            channel_label = texts[f"channel.{channel}"][0] or channel
            boxes.append(f'<label><input type="checkbox"{attrs}>{_e(channel_label)}</label>')
        described = f'<p class="note" id="d-{_e(category)}">{_e(note)}</p>' if note else ""
        parts.append(
            f"<fieldset><legend>{_e(label or category)}</legend>{described}{''.join(boxes)}"
            "</fieldset>"
        )
    legend, quiet_note = texts["preferences.quiet"]
    start = f"{person.quiet_start:%H:%M}" if person.quiet_start else ""
    end = f"{person.quiet_end:%H:%M}" if person.quiet_end else ""
    zone = person.time_zone or settings.default_time_zone
    parts.append(
        f'<fieldset><legend>{_e(legend)}</legend><p class="note" id="quiet-note">'
        f"{_e(quiet_note)} ({_e(zone)})</p>"
        f'<label>From <input type="time" name="quiet_start" value="{start}"'
        ' aria-describedby="quiet-note"></label>'
        f'<label>until <input type="time" name="quiet_end" value="{end}"'
        ' aria-describedby="quiet-note"></label></fieldset>'
    )
    parts.append('<button type="submit">Save</button></form>')
    return document(title or "", "".join(parts), lang)


def document(title: str, body: str, lang: str = "en") -> str:
    """A whole page: ``body`` (HTML, escaped by its maker) under ``title``."""
    return (
        f'<!doctype html><html lang="{_e(lang)}"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{STYLE}</style></head>"
        f"<body><main>{body}</main></body></html>"
    )


def _editable(settings: Settings) -> list[tuple[str, str]]:
    return [
        (category, channel)
        for category, channels in settings.preference_center.items()
        if category not in settings.critical_categories
        for channel in channels
    ]


def _texts(
    conn: Connection,
    keys: Sequence[str],
    locale: str | None,
    default_locale: str,
    fields: Mapping[str, object],
) -> tuple[dict[str, tuple[str | None, str | None]], str]:
    """Each text's (subject, body) in the person's locale, and the page's language."""
    chain = locale_chain(locale, default_locale)
    stored: dict[tuple[str, str], templates.TemplateRow] = {
        (t.name, t.locale): t
        for t in templates.templates_of(conn, [(k, PAGE_CHANNEL) for k in keys])
    }
    found: dict[str, tuple[str | None, str | None]] = {}
    lang = "en"
    for key in keys:
        default = DEFAULTS.get(key, (key.split(".", 1)[-1].replace("_", " ").capitalize(), None))
        row = next((stored[(key, loc)] for loc in chain if (key, loc) in stored), None)
        if row is None:
            found[key] = default
            continue
        if key == "preferences":
            lang = row.locale
        try:
            subject, body, _ = compile_parts(row.subject, row.body, None)
            found[key] = (
                subject.render(dict(fields)) if subject is not None else default[0],
                body.render(dict(fields)) if body is not None else default[1],
            )
        except Exception:  # a template's bug must not take the page down: English instead
            found[key] = default
    return found, lang


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)
