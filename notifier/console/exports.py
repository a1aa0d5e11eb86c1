"""The console's downloads: a campaign's failed recipients as CSV, the same file as
``notifier campaign failures`` writes (``notifier.campaigns.failures``).

A viewer may download it, as an admin may: the viewer role sees every page and acts on
nothing, and an export changes nothing. The file holds whole recipients, which the pages show
masked, so it is handed out as a reveal is: only to a POST carrying the session's CSRF token
(a link or an image on another site cannot fetch it, and no URL with it lands in a history or
a proxy's log), and logged with the user. The file is streamed a page of 5,000 rows at a time,
each page read on a connection of its own, so neither a million rows nor a slow download hold
memory or a database connection.
"""

from __future__ import annotations

import asyncio
import logging
import re
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from notifier.campaigns import CampaignError
from notifier.campaigns.failures import campaign_id, failures_csv
from notifier.console.app import console, post, refuse, session

log = logging.getLogger("notifier.console")


def attachment(name: str) -> str:
    """A ``Content-Disposition`` naming the file after the campaign: ASCII letters, digits and
    ``._-`` as they are in the plain name (anything else ``_``), the whole name in
    ``filename*`` (RFC 6266), percent-encoded so no quote or line break reaches the header."""
    plain = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:100]
    return (
        f'attachment; filename="{plain}-failures.csv";'
        f" filename*=UTF-8''{quote(name, safe='')}-failures.csv"
    )


@post(admin=False)
async def failures(request: Request, _values: dict[str, str]) -> Response:
    name = request.path_params["name"]
    engine = console(request).engine
    try:
        campaign = await asyncio.to_thread(campaign_id, engine, name)
    except CampaignError as exc:
        return refuse(request, str(exc), 404)
    s = session(request)
    assert s is not None
    log.info(
        "console %s downloaded the failed recipients of campaign %s",
        s.user,
        name,
        extra={"event": "console_export"},
    )
    return StreamingResponse(
        (piece.encode() for piece, _ in failures_csv(engine, campaign)),
        media_type="text/csv; charset=utf-8",
        headers={"content-disposition": attachment(name)},
    )


def routes() -> list[Route]:
    # Before the campaign actions' /campaigns/{name}/{action}, which would take the path.
    return [Route("/campaigns/{name:segment}/failures.csv", failures, methods=["POST"])]
