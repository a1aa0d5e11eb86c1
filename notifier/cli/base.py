"""What every ``notifier`` command shares: its exit statuses, its click classes and checks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from notifier import logs
from notifier.settings import get_settings

#: The exit statuses, the same for every command.
DONE = 0
NOTHING_MATCHED = 1  # or, for ``show``, no such row; for ``cancel KEY``/``--id``, not waiting
BAD_USAGE = 2  # bad arguments or settings; nothing was done
DECLINED = 3  # the operator answered no to the confirmation; nothing changed
DATABASE_UNREACHABLE = 4  # or it refuses the login (user, password, TLS)
DATABASE_MISSING = 5
REDIS_UNREACHABLE = 6

CONTEXT = {
    "help_option_names": ["-h", "--help"],
    "max_content_width": 100,
    "show_default": True,
}


class Command(click.Command):
    """A command that sets up logging (``NOTIFIER_LOG_FORMAT``) once its arguments are read, so
    ``--help`` and usage errors need no settings."""

    def invoke(self, ctx: click.Context) -> Any:
        logs.configure(get_settings())
        return super().invoke(ctx)


class Group(click.Group):
    """Lists its commands in the order they were added, under ``sections`` if it has them."""

    command_class = Command
    group_class = type  # subgroups are Groups too

    def __init__(
        self, *args: Any, sections: Sequence[tuple[str, Sequence[str]]] = (), **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.sections = sections

    def list_commands(self, ctx: click.Context) -> list[str]:
        named = [name for _, names in self.sections for name in names if name in self.commands]
        return named + [name for name in self.commands if name not in named]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        shown = {
            name: command
            for name in self.list_commands(ctx)
            if (command := self.get_command(ctx, name)) is not None and not command.hidden
        }
        if not shown:
            return
        widest = max(len(name) for name in shown)
        limit = formatter.width - 6 - widest
        sections = [*self.sections, ("Other commands" if self.sections else "Commands", shown)]
        placed: set[str] = set()
        for title, names in sections:
            rows = [
                (name.ljust(widest), shown[name].get_short_help_str(limit))
                for name in names
                if name in shown and name not in placed
            ]
            placed.update(name.rstrip() for name, _ in rows)
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


def exclusive(ctx: click.Context, *names: str, required: bool = False) -> None:
    """Refuse more than one of the options ``names`` (or none, if one is ``required``)."""
    given = [name for name in names if ctx.params.get(name) not in (None, (), False)]
    shown = [_option(ctx, name) for name in names]
    if len(given) > 1:
        both = " and ".join(_option(ctx, name) for name in given)
        raise click.UsageError(f"{both} cannot be used together: give one", ctx)
    if required and not given:
        raise click.UsageError(f"give one of {', '.join(shown)}", ctx)


def _option(ctx: click.Context, name: str) -> str:
    for param in ctx.command.params:
        if param.name == name:
            return param.opts[0]
    return name
