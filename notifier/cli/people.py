"""``notifier profile ...``: the people rows may address, and what they chose.

Exit status: 0 done; 1 no such profile (``show``); 2 bad arguments (nothing is saved then).
"""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from notifier import client, db
from notifier.cli import output
from notifier.cli.base import NOTHING_MATCHED, Group
from notifier.cli.output import Fields, Table, Text
from notifier.cli.terminal import shown
from notifier.db import profiles
from notifier.specs import parse_category, parse_profile_id


@click.group(
    cls=Group,
    short_help="The people rows may address by your id for them, and their preferences.",
    help="Profiles: a person by the id your service knows them by, with their addresses,"
    " locale, time zone and fields for templates. A row that names a profile and no recipient"
    " goes to the profile's address on its channel as it is when the row is sent; the"
    " person's preferences per category and channel decide whether it goes at all.",
)
def profile() -> None:
    pass


@profile.command(
    "set",
    short_help="Create a profile, or change what is given of it.",
    help="Create profile ID or change what is given of it; what is not given keeps its value."
    "\n\n\b\nExample:\n"
    "  notifier profile set user-42 --email ann@example.com --time-zone Europe/Vienna \\\n"
    "      --locale de-AT --field first_name=Ann",
)
@click.argument("profile_id", metavar="ID")
@click.option("--email", metavar="ADDRESS", help="Where email rows without a recipient go.")
@click.option(
    "--phone", metavar="NUMBER", help="Where sms rows without a recipient go (E.164, +14155550100)."
)
@click.option("--push-token", "push_tokens", multiple=True, metavar="TOKEN",
              help="A device's token; repeat for each device (replaces the list).")  # fmt: skip
@click.option("--locale", metavar="LOCALE", help="The templates' locale, e.g. de-AT.")
@click.option("--time-zone", metavar="ZONE", help="An IANA name, e.g. Europe/Vienna.")
@click.option(
    "--quiet-hours",
    metavar="HH:MM-HH:MM",
    help="The person's own quiet hours in their time zone, e.g. 22:00-07:00; '' for none.",
)
@click.option("--field", "fields", multiple=True, metavar="NAME=VALUE",
              help="A value for templates; repeat for each (replaces the fields).")  # fmt: skip
@output.json_option
def set_profile(
    profile_id: str,
    email: str | None,
    phone: str | None,
    push_tokens: tuple[str, ...],
    locale: str | None,
    time_zone: str | None,
    quiet_hours: str | None,
    fields: tuple[str, ...],
) -> int:
    values = dict(_field(f) for f in fields) if fields else None
    with db.engine().begin() as conn:
        client.upsert_profile(
            conn, profile_id, email=email, phone=phone,
            push_tokens=list(push_tokens) if push_tokens else None,
            locale=locale, time_zone=time_zone, fields=values, quiet_hours=quiet_hours,
        )  # fmt: skip
    output.emit(
        {"id": profile_id, "saved": True}, Text(f"profile {output.quoted(profile_id)} saved")
    )
    return 0


def _quiet(found: profiles.StoredProfile) -> str:
    if found.quiet_start is None or found.quiet_end is None:
        return "-"
    return f"{found.quiet_start:%H:%M}-{found.quiet_end:%H:%M}"


def _field(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise ValueError(f"--field {text!r} is not NAME=VALUE, e.g. first_name=Ann")
    return name, value


@profile.command(
    short_help="A profile, its preferences and their history.",
    help="Profile ID as stored, the person's preferences, and the last changes of them (who"
    " made each: the person, an operator, a producer). Exit status 1 if there is none.",
)
@click.argument("profile_id", metavar="ID")
@output.json_option
def show(profile_id: str) -> int:
    parse_profile_id(profile_id)
    with db.engine().connect() as conn:
        found = profiles.get(conn, profile_id)
        chosen = profiles.preferences(conn, profile_id)
        changes = profiles.history(conn, profile_id, limit=20)
    if found is None:
        output.emit(None, Text(f"no profile {output.quoted(profile_id)}"))
        return NOTHING_MATCHED
    output.emit(
        {
            "profile": asdict(found),
            "preferences": [asdict(p) for p in chosen],
            "history": [asdict(p) for p in changes],
        },
        Fields(
            [
                ("id", shown(found.id)),
                ("email", shown(found.email)),
                ("phone", shown(found.phone)),
                ("push tokens", str(len(found.push_tokens))),
                ("locale", shown(found.locale)),
                ("time zone", shown(found.time_zone)),
                ("quiet hours", _quiet(found)),
                ("fields", shown(json.dumps(found.fields, ensure_ascii=False))),
                ("updated", shown(found.updated_at)),
            ]
        ),
        Table(
            ["CATEGORY", "CHANNEL", "ON", "BY", "SINCE"],
            [
                (
                    p.category,
                    p.channel,
                    "yes" if p.enabled else "no",
                    p.source,
                    f"{p.at:%Y-%m-%d %H:%M:%S%z}",
                )
                for p in chosen
            ],
        ),
    )
    return 0


@profile.command(
    short_help="Turn a category on or off for a person, on their behalf.",
    help="Turn CATEGORY on or off on CHANNEL for profile ID, as an operator acting on the"
    " person's behalf (recorded as such in the history). Rows already waiting are held to it"
    " when they are sent.\n\nExample: notifier profile prefer user-42 marketing email off",
)
@click.argument("profile_id", metavar="ID")
@click.argument("category")
@click.argument("channel")
@click.argument("state", type=click.Choice(["on", "off"]))
@output.json_option
def prefer(profile_id: str, category: str, channel: str, state: str) -> int:
    parse_profile_id(profile_id)
    parse_category(category)
    with db.engine().begin() as conn:
        if profiles.get(conn, profile_id) is None:
            raise ValueError(f"no profile {profile_id!r}: notifier profile set it first")
        profiles.set_preferences(conn, profile_id, {(category, channel): state == "on"}, "operator")
    output.emit(
        {"id": profile_id, "category": category, "channel": channel, "enabled": state == "on"},
        Text(f"{category} on {channel} is {state} for {output.quoted(profile_id)}"),
    )
    return 0


COMMANDS = (profile,)
