"""The ``notifier`` command: its root group, its help and the wiring of its commands, which live
beside it one module a group (``sending``, ``looking``, ``changes``, ``campaigns``, ``content``,
``running``, ``console``).

``main`` runs it for the console script, ``python -m notifier.cli`` and the tests, and turns
what went wrong into one line on stderr and an exit status (see ``notifier.cli.base``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click
import redis

from notifier import redis_access
from notifier.cli import api as api_cli
from notifier.cli import campaigns as campaign_cli
from notifier.cli import changes, looking, output, running, sending, terminal
from notifier.cli import console as console_cli
from notifier.cli import content as content_cli
from notifier.cli import people as people_cli
from notifier.cli.base import (
    BAD_USAGE,
    CONTEXT,
    DATABASE_MISSING,
    DATABASE_UNREACHABLE,
    REDIS_UNREACHABLE,
    Group,
)
from notifier.db import errors
from notifier.settings import get_settings

__all__ = ["DATABASE_MISSING", "DATABASE_UNREACHABLE", "REDIS_UNREACHABLE", "cli", "main"]

#: Exit status after Ctrl-C, as a shell reports a process SIGINT stopped.
INTERRUPTED = 130

SECTIONS = (
    ("Notifications", ("send", "show", "cancel", "requeue", "stats")),
    ("Campaigns and content", ("campaign", "template", "suppress", "profile")),
    ("Running notifier", ("migrate", "health", "purge", "metrics", "events", "console")),
)

HELP = """\
notifier delivers the notifications other services write into a PostgreSQL table, by email,
SMS, push or webhook: it retries transient failures with backoff, gives up on the ones that
can never work with a reason, and sends nothing twice. Celery workers do the sending; these
commands are for the people who run it.

Settings are NOTIFIER_* environment variables (docs/configuration.md); a misspelt one
stops every command with exit status 2, naming it.

\b
Exit statuses:
  0  done
  1  nothing matched (no such row; nothing to change)
  2  bad arguments or settings; nothing was done
  3  the operator answered no to the confirmation; nothing changed
  4  the database cannot be reached or refuses the login (NOTIFIER_DATABASE_URL)
  5  the database does not exist (notifier migrate creates it)
  6  Redis cannot be reached (NOTIFIER_REDIS_URL, or NOTIFIER_REDIS_SENTINELS)

'notifier COMMAND --help' shows a command's options. Every command that prints takes --json:
one JSON document on stdout with the same data.

\b
Tab completion: add to ~/.bashrc (zsh and fish: docs/operations.md)
  eval "$(_NOTIFIER_COMPLETE=bash_source notifier)"
"""


@click.group(cls=Group, context_settings=CONTEXT, sections=SECTIONS, help=HELP)
@click.version_option(
    package_name="notifier",
    prog_name="notifier",
    message="%(prog)s %(version)s",
    help="Print notifier's version and exit.",
)
def cli() -> None:
    pass


for _command in (
    *sending.COMMANDS,
    *looking.COMMANDS,
    *changes.COMMANDS,
    campaign_cli.campaign,
    *content_cli.COMMANDS,
    *people_cli.COMMANDS,
    *running.COMMANDS,
    console_cli.command,
    *api_cli.COMMANDS,
):
    cli.add_command(_command)


# --- running it ----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``notifier ARGV`` (default: this process's arguments); return its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        with terminal.guarded():
            status = cli.main(args, prog_name="notifier", standalone_mode=False)
            _flush()
        return int(status or 0)
    except click.ClickException as exc:  # usage errors: exit status 2
        exc.show()
        return exc.exit_code
    except click.Abort:  # Ctrl-C
        output.error("interrupted")
        return INTERRUPTED
    except errors.DRIVER_ERRORS as exc:
        problem = errors.diagnose(exc, get_settings().database_url)
        if problem is None:
            raise
        output.error(problem.line)
        return DATABASE_MISSING if problem.missing else DATABASE_UNREACHABLE
    except redis.ConnectionError as exc:
        output.error(f"cannot connect to Redis ({redis_access.named_by(get_settings())}): {exc}")
        return REDIS_UNREACHABLE
    except BrokenPipeError:  # stdout's reader has gone (notifier stats | head -1)
        output.stdout_closed()
        return 0
    except (ValueError, OSError) as exc:
        output.error(exc)
        return BAD_USAGE


def _flush() -> None:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        output.stdout_closed()
