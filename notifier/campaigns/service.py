"""Campaigns: one message to a large audience, each recipient with a code of their own.

A campaign is created as a draft; its audience (a CSV file, or an operator's SQL query) and
its code pool (a file, or generated) are imported; ``launch`` then writes one notification per
recipient in set-based chunks (``notifier.campaigns.launch``). Every step can be repeated:
re-running a launch after a crash finishes it without a second row or a second code for anyone.

Messages are filled from ``{placeholders}`` inside the fan-out statement, or a campaign names a
stored Jinja2 template (``notifier template add``): each row is written naming it, with the
recipient's fields, ``code``, ``campaign`` and ``recipient`` in its payload, and the worker
renders subject, text and HTML per recipient at send time, as for any templated row. Either
way a field missing for any recipient stops the launch before anything is written, naming it
(``notifier.campaigns.messages``).

A running campaign becomes ``finished`` once it is fully launched and none of its rows is
pending or processing (``finish``: beat's sweep, and every ``status``).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Engine

from notifier.campaigns.launch import CHUNK, PARALLEL, finish_one, launch_campaign, named
from notifier.campaigns.messages import CampaignError, render_sql, stored_template
from notifier.db import audience as audience_db
from notifier.db import campaigns as campaigns_db
from notifier.db.audience import AudienceImport
from notifier.db.campaigns import CampaignRow, Counts
from notifier.delivery.intake import intake_for
from notifier.models import CampaignStatus
from notifier.settings import get_settings
from notifier.specs import normalize_locale, parse_category, parse_profile_id


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a campaign stands: the campaign, and its notifications by status."""

    campaign: CampaignRow
    counts: Counts

    @property
    def sent(self) -> int:
        return self.counts.by_status.get("sent", 0)

    @property
    def dead(self) -> int:
        return self.counts.by_status.get("dead", 0)

    @property
    def unfinished(self) -> int:
        return sum(self.counts.by_status.get(s, 0) for s in ("pending", "processing"))


@dataclass(frozen=True, slots=True)
class Paused:
    """What a pause did: the pending rows it held back, and the rows workers had claimed,
    which they hand back before their send (held back too, then) unless it had begun."""

    held: int
    claimed: int

    def __str__(self) -> str:
        return f"{self.held} rows held back, {self.claimed} claimed by workers"


class Campaigns:
    """The operations on campaigns, each in its own transactions; a launch holds its lock on
    a connection of ``session`` (``engine`` when None), which must keep one server connection:
    PostgreSQL itself, not a transaction pooler."""

    def __init__(self, engine: Engine, session: Engine | None = None) -> None:
        self.engine = engine
        self.session = session

    def create(
        self,
        name: str,
        channel: str,
        *,
        subject: str | None = None,
        body: str | None = None,
        template: str | None = None,
        locale: str | None = None,
        payload: Mapping[str, Any] | None = None,
        priority: int = -10,
        max_attempts: int = 5,
        category: str = "marketing",
        audience: str = "addresses",
    ) -> int:
        """A draft campaign; its message is ``subject`` and ``body`` with ``{placeholders}``, or
        the stored ``template`` (in ``locale``, else ``NOTIFIER_DEFAULT_LOCALE``), which must
        exist for ``channel`` already. Its rows are of ``category``: a one-click unsubscribe
        from one of them opts out of that category only. ``audience="profiles"``: its audience
        is profiles' ids, and each row goes to its person's address when it is sent, with
        their preferences, quiet hours and caps."""
        render_sql(subject, body)  # refuse a bad template now, not at launch
        if audience not in ("addresses", "profiles"):
            raise CampaignError(f"audience is addresses or profiles, not {audience!r}")
        if audience == "profiles" and "{recipient}" in f"{subject or ''}{body or ''}":
            raise CampaignError(
                "a campaign to profiles does not know addresses at launch: leave {recipient}"
                " out, or use a stored template ({{ recipient }} is the address sent to)"
            )
        if max_attempts < 1:
            raise CampaignError("max_attempts must be at least 1")
        try:
            parse_category(category)
        except ValueError as exc:
            raise CampaignError(str(exc)) from None
        if template is not None and (subject is not None or body is not None):
            raise CampaignError(
                "a campaign takes a stored template or a subject and body, not both"
            )
        if locale is not None:
            if template is None:
                raise CampaignError("a locale goes with a stored template; name one")
            try:
                locale = normalize_locale(locale)
            except ValueError as exc:
                raise CampaignError(str(exc)) from None
        with self.engine.begin() as conn:
            if campaigns_db.by_name(conn, name) is not None:
                raise CampaignError(f"a campaign named {name!r} exists already")
            if template is not None:
                stored_template(conn, template, channel, locale)
            return campaigns_db.create(
                conn,
                {
                    "name": name,
                    "channel": channel,
                    "subject": subject,
                    "body": body,
                    "template": template,
                    "locale": locale,
                    "payload": json.dumps(dict(payload or {})),
                    "priority": priority,
                    "max_attempts": max_attempts,
                    "category": category,
                    "audience": audience,
                },
            )

    def import_audience(
        self,
        name: str,
        rows: Iterable[str],
        recipient_column: str = "recipient",
        *,
        on_duplicate: str = "skip",
        skip_invalid: bool = False,
    ) -> int:
        """``import_csv``, returning only how many recipients it added."""
        return self.import_csv(
            name, rows, recipient_column, on_duplicate=on_duplicate, skip_invalid=skip_invalid
        ).added

    def import_csv(
        self,
        name: str,
        rows: Iterable[str],
        recipient_column: str = "recipient",
        *,
        on_duplicate: str = "skip",
        skip_invalid: bool = False,
    ) -> AudienceImport:
        """Add a CSV file's recipients (its lines: ``audience_file.text_lines`` reads its
        bytes); its other columns become their fields.

        A recipient on several lines keeps its first line's fields. ``on_duplicate="skip"``
        drops the later lines and reports them (how many, and the first few); ``"refuse"``
        refuses the whole file, naming the first repeat, with nothing imported. A recipient
        the campaign has from an earlier import stays as it was. A recipient the campaign's
        channel refuses (``Intake.recipient_check``) refuses the file, with nothing imported,
        unless ``skip_invalid`` leaves its line out and reports it.
        """
        if on_duplicate not in ("skip", "refuse"):
            raise CampaignError(f"on_duplicate is skip or refuse, not {on_duplicate!r}")
        with self.engine.begin() as conn:
            campaign = named(conn, name)
            return audience_db.import_audience(
                conn,
                campaign.id,
                rows,
                recipient_column,
                refuse_duplicates=on_duplicate == "refuse",
                check=_recipient_check(campaign),
                skip_invalid=skip_invalid,
            )

    def audience_from_query(self, name: str, query: str) -> int:
        """``import_query``, returning only how many recipients it added."""
        return self.import_query(name, query).added

    def import_query(self, name: str, query: str, *, skip_invalid: bool = False) -> AudienceImport:
        """Add the recipients of an operator's query, each checked like a CSV file's."""
        with self.engine.begin() as conn:
            campaign = named(conn, name)
            return audience_db.audience_from_query(
                conn,
                campaign.id,
                query,
                check=_recipient_check(campaign),
                skip_invalid=skip_invalid,
            )

    def import_codes(self, name: str, codes: Iterable[str]) -> int:
        with self.engine.begin() as conn:
            return audience_db.import_codes(conn, named(conn, name).id, codes)

    def generate_codes(self, name: str, count: int, length: int = 12) -> int:
        """Add ``count`` random codes (``length`` hex characters, from the operating system's
        cryptographic random source) to the pool."""
        if not 8 <= length <= 32:
            raise CampaignError("generated codes are 8 to 32 characters long")
        added = 0
        for _ in range(10):  # a collision skips a code; top the pool up until it is full
            fresh = (secrets.token_hex(16)[:length].upper() for _ in range(count - added))
            added += self.import_codes(name, fresh)
            if added >= count:
                return added
        raise CampaignError(f"could only generate {added} of {count} distinct codes; use longer")

    def launch(
        self,
        name: str,
        progress: Callable[[int], None] = lambda n: None,
        chunk: int = CHUNK,
        parallel: int = PARALLEL,
    ) -> int:
        """Write the campaign's notifications; run it again to finish an interrupted launch.

        Recipients are written in chunks of ``chunk`` positions, each chunk one statement and
        one transaction, ``parallel`` chunks at a time on connections of their own. Returns the
        number of notifications written by this run; ``progress`` is called with each chunk's
        count, from the calling thread. A second launch of the same campaign waits until the
        first is over, then writes what is left: the positions no earlier chunk wrote (new
        recipients, or the rest of a launch that died), never rows that were written, sent and
        purged since. A cancel, even one during the launch, is final.
        """
        return launch_campaign(self.engine, name, progress, chunk, parallel, self.session)

    def status(self, name: str) -> Progress:
        """The campaign and its counts; a running campaign they show done is marked finished
        (``finish``) first."""
        with self.engine.connect() as conn:
            campaign = named(conn, name)
            counts = campaigns_db.counts(conn, campaign.id)
        progress = Progress(campaign, counts)
        done = campaign.status == CampaignStatus.running and not progress.unfinished
        if done and finish_one(self.engine, campaign.id):
            progress = Progress(replace(campaign, status=CampaignStatus.finished), counts)
        return progress

    def finish(self) -> list[str]:
        """Mark ``finished`` every running campaign that is fully launched (no launch under
        way, every audience position written) and has no notification pending or processing;
        the names of those marked. A later launch of new audience members makes one ``running``
        again. Beat runs it periodically (``notifier.finish_campaigns``)."""
        with self.engine.begin() as conn:
            return campaigns_db.finish(conn)

    def pause(self, name: str) -> Paused:
        """Stop sending now; the rows held back, and those claimed by workers. Sends already
        under way finish; the other claimed rows are handed back before their send, and then
        count as held back (``Counts.held``, which ``status`` shows)."""
        with self.engine.begin() as conn:
            campaign = named(conn, name)
            # Chunks of a launch under way finish first; those after write their rows parked.
            campaigns_db.hold_writes(conn, campaign.id, exclusive=True)
            movable = (CampaignStatus.launching, CampaignStatus.running)
            if not campaigns_db.set_status(conn, campaign.id, CampaignStatus.paused, movable):
                _refuse_if_finished(campaign, "pause")
                raise CampaignError(f"campaign {name!r} is {campaign.status}; it cannot pause")
            return Paused(*campaigns_db.park(conn, campaign.id))

    def resume(self, name: str) -> int:
        with self.engine.begin() as conn:
            campaign = named(conn, name)
            # A chunk that saw the pause has committed its parked rows before they are unparked.
            campaigns_db.hold_writes(conn, campaign.id, exclusive=True)
            paused = [CampaignStatus.paused]
            if not campaigns_db.set_status(conn, campaign.id, CampaignStatus.running, paused):
                _refuse_if_finished(campaign, "resume")
                raise CampaignError(f"campaign {name!r} is {campaign.status}, not paused")
            return campaigns_db.unpark(conn, campaign.id)

    def cancel(self, name: str) -> int:
        """Cancel every unsent notification of the campaign, for good; returns how many.

        Final for the rows a launch under way writes too: the cancel waits for the chunks
        being written and cancels their rows with the others, and no chunk writes after it.
        A cancelled campaign cannot be launched again.
        """
        with self.engine.begin() as conn:
            campaign = named(conn, name)
            campaigns_db.hold_writes(conn, campaign.id, exclusive=True)
            final = (CampaignStatus.cancelled, CampaignStatus.finished)
            live = [s for s in CampaignStatus if s not in final]
            if not campaigns_db.set_status(conn, campaign.id, CampaignStatus.cancelled, live):
                _refuse_if_finished(campaign, "cancel")
                raise CampaignError(f"campaign {name!r} is cancelled already")
            return campaigns_db.cancel_unsent(conn, campaign.id)


def _recipient_check(campaign: CampaignRow) -> audience_db.RecipientCheck:
    """What an audience entry of ``campaign`` must be: an address its channel takes, or for a
    campaign to profiles a profile's id."""
    if campaign.audience == "profiles":
        return _profile_problem
    try:
        return intake_for(get_settings()).recipient_check(campaign.channel)
    except ValueError as exc:
        raise CampaignError(f"the campaign's channel: {exc}") from None


def _profile_problem(entry: str) -> str | None:
    try:
        parse_profile_id(entry)
    except ValueError as exc:
        return str(exc)
    return None


def _refuse_if_finished(campaign: CampaignRow, verb: str) -> None:
    if campaign.status == CampaignStatus.finished:
        raise CampaignError(
            f"campaign {campaign.name!r} is finished: every notification was sent, dead or"
            f" cancelled, so there is nothing to {verb}"
        )
