"""The console's actions: requeue and cancel (one row or in bulk), campaigns, suppressions and
templates.

Each goes through the function the ``notifier`` command uses for it (``notifier.ops``,
``notifier.campaigns``, ``notifier.db.suppressions``), after a confirmation page. A single row's
requeue or cancel also writes an attempt row naming the operator (``console:<user>``), in the
transaction that changed the row; bulk changes and campaign actions are logged with the user,
what matched and what changed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from notifier import ops
from notifier.campaigns import CampaignError, Campaigns, Paused
from notifier.console import filters
from notifier.console.app import console, page, post, refuse, render, segment, session
from notifier.console.pages import db
from notifier.db import bulk, listing, producers, rows, suppressions
from notifier.db.templates import TemplateRow, list_templates
from notifier.delivery import prepare

log = logging.getLogger("notifier.console")

CAMPAIGN_ACTIONS = ("pause", "resume", "cancel")
#: A single row's actions, each with its past tense (the outcome its history row records).
ROW_ACTIONS = {"requeue": "requeued", "cancel": "cancelled"}


def _user(request: Request) -> str:
    s = session(request)
    assert s is not None
    return s.user


def _row_id(request: Request) -> int:
    value = str(request.path_params["id"])
    return int(value) if value.isdigit() and len(value) < 19 else 0


# --- one row ------------------------------------------------------------------------------------


@page
async def confirm_row(request: Request) -> Response:
    action = request.path_params["action"]
    row_id = _row_id(request)
    row = await db(request, lambda conn: rows.notification(conn, row_id))
    if row is None or action not in ROW_ACTIONS:
        return refuse(request, "no such notification or action", 404)
    return render(request, "confirm_row.html", n=row, action=action)


@post(admin=True)
async def act_on_row(request: Request, values: dict[str, str]) -> Response:
    action = request.path_params["action"]
    row_id = _row_id(request)
    user = _user(request)
    if action not in ROW_ACTIONS:
        return refuse(request, "no such action", 404)
    done_word = ROW_ACTIONS[action]
    reason = values.get("reason", "").strip()[:500] or f"{done_word} by operator {user}"
    if action == "requeue":

        def work(conn: Any) -> bool:
            params = ops.DeadFilter(ids=[row_id]).params(bulk.snapshot(conn))
            done = bool(bulk.requeue_dead(conn, params, 0, 1))
            if done:
                rows.record_action(conn, row_id, user, done_word, reason)
            return done

    elif action == "cancel":

        def work(conn: Any) -> bool:
            done = producers.cancel_by_id(conn, row_id, reason)
            if done:
                rows.record_action(conn, row_id, user, done_word, reason)
            return done

    else:
        return refuse(request, "no such action", 404)
    done = await db(request, work, begin=True)
    log.info(
        "console %s %s notification %d: %s",
        user,
        done_word if done else f"could not {action}",
        row_id,
        "done" if done else "it was not in a state that allows it",
        extra={"event": f"console_{action}", "id": row_id, "changed": done},
    )
    # Post/redirect/get: reloading the page shows the row, and does not post again.
    outcome = done_word if done else "unchanged"
    return RedirectResponse(f"/notifications/{segment(row_id)}?done={outcome}", status_code=303)


# --- bulk ---------------------------------------------------------------------------------------


def _list(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def _when(value: str | None, name: str) -> datetime | None:
    return filters.parse_time(value, name) if value and value.strip() else None


def _bulk_filter(values: dict[str, str]) -> ops.DeadFilter | ops.WaitingFilter:
    if values.get("action") == "requeue":
        ids = _list(values.get("ids"))
        if not all(i.isascii() and i.isdigit() and len(i) < 19 for i in ids):
            raise ValueError("ids are whole numbers, separated by commas")
        return ops.DeadFilter(
            ids=[int(i) for i in ids],
            channels=_list(values.get("channels")),
            since=_when(values.get("since"), "since"),
            until=_when(values.get("until"), "until"),
            error=values.get("error", "").strip() or None,
            campaign=values.get("campaign", "").strip() or None,
        )
    if values.get("action") == "cancel":
        statuses = tuple(s for s in ("pending", "processing") if values.get(f"status_{s}"))
        return ops.WaitingFilter(
            statuses=statuses or ("pending", "processing"),
            channels=_list(values.get("channels")),
            campaign=values.get("campaign", "").strip() or None,
            since=_when(values.get("since"), "since"),
            until=_when(values.get("until"), "until"),
        )
    raise ValueError("choose requeue or cancel")


@page
async def bulk_form(request: Request) -> Response:
    return render(request, "bulk.html", values={"action": "requeue"})


@post(admin=False)
async def bulk_count(request: Request, values: dict[str, str]) -> Response:
    """Step one: how many rows match, and the snapshot that step two changes."""
    try:
        f = _bulk_filter(values)
        engine = console(request).engine
        if isinstance(f, ops.DeadFilter):
            count, snap = await _thread(ops.count_requeue, engine, f)
        else:
            count, snap = await _thread(ops.count_cancel, engine, f)
    except ValueError as exc:
        return render(request, "bulk.html", 400, values=values, error=str(exc))
    return render(
        request,
        "bulk.html",
        values=values,
        count=count,
        max_id=snap.max_id,
        at=snap.now.isoformat(),
    )


@post(admin=True)
async def bulk_run(request: Request, values: dict[str, str]) -> Response:
    """Step two: change the rows the count saw (those up to its snapshot)."""
    try:
        f = _bulk_filter(values)
        max_id = values.get("max_id", "")
        if not (max_id.isascii() and max_id.isdigit() and len(max_id) < 19):
            raise ValueError("max_id: count the rows first (step one), then run")
        snap = bulk.Snapshot(int(max_id), filters.parse_time(values.get("at", ""), "at"))
    except ValueError as exc:
        return render(request, "bulk.html", 400, values=values, error=str(exc))
    engine = console(request).engine
    user = _user(request)
    if isinstance(f, ops.DeadFilter):
        change = await _thread(ops.requeue, engine, f, snap)
    else:
        reason = values.get("reason", "").strip()[:500] or f"cancelled by operator {user}"
        change = await _thread(ops.cancel, engine, f, snap, reason)
    log.info(
        "console %s bulk %s: %d changed, %d left (%s)",
        user,
        values.get("action"),
        change.changed,
        change.left,
        f,
        extra={"event": "console_bulk", "changed": change.changed, "left": change.left},
    )
    return render(request, "bulk.html", values=values, change=change)


async def _thread(fn: Any, *args: Any) -> Any:
    import asyncio

    return await asyncio.to_thread(fn, *args)


# --- campaigns ----------------------------------------------------------------------------------


@page
async def campaigns(request: Request) -> Response:
    listed = await db(request, listing.campaigns)
    for r in listed:
        rate = float(r["sent_per_minute"] or 0)
        r["minutes_left"] = round(r["waiting"] / rate) if rate and r["waiting"] else None
    return render(request, "campaigns.html", campaigns=listed)


@page
async def confirm_campaign(request: Request) -> Response:
    action = request.path_params["action"]
    if action not in CAMPAIGN_ACTIONS:
        return refuse(request, "no such action", 404)
    return render(request, "confirm_campaign.html", name=request.path_params["name"], action=action)


@post(admin=True)
async def act_on_campaign(request: Request, _values: dict[str, str]) -> Response:
    name, action = request.path_params["name"], request.path_params["action"]
    if action not in CAMPAIGN_ACTIONS:
        return refuse(request, "no such action", 404)
    ops_of = Campaigns(console(request).engine)
    try:
        result = await _thread(getattr(ops_of, action), name)
        said = result if isinstance(result, Paused) else f"{result} rows"
        message = f"Campaign {name}: {action} done ({said})."
    except CampaignError as exc:
        message = f"Campaign {name}: {exc}"
    log.info("console %s campaign %s: %s", _user(request), action, message)
    rows_now = await db(request, listing.campaigns)
    return render(request, "campaigns.html", campaigns=rows_now, message=message)


# --- suppressions -------------------------------------------------------------------------------


def _entries(
    channel: str | None, recipient: str | None = None
) -> Callable[[Any], list[suppressions.Suppression]]:
    """The newest 200 entries of the suppression list, of one channel or all, or those of
    ``recipient``."""
    return lambda conn: suppressions.list_suppressions(conn, channel, 200, recipient)


@page
async def suppression_list(request: Request) -> Response:
    channel = request.query_params.get("channel") or None
    entries = await db(request, _entries(channel))
    return render(request, "suppressions.html", rows=entries, channel=channel or "")


@post(admin=False)
async def suppression_search(request: Request, values: dict[str, str]) -> Response:
    channel = values.get("channel", "").strip() or None
    recipient = values.get("recipient", "").strip() or None
    entries = await db(request, _entries(channel, recipient))
    return render(
        request, "suppressions.html", rows=entries, channel=channel or "", searched=bool(recipient)
    )


@post(admin=True)
async def suppression_change(request: Request, values: dict[str, str]) -> Response:
    channel = values.get("channel", "").strip()
    recipient = values.get("recipient", "").strip()
    if not channel or not recipient:
        return refuse(request, "give a channel and a recipient", 400)
    if request.path_params["change"] not in ("add", "remove"):
        return refuse(request, "no such action", 404)
    add = request.path_params["change"] == "add"
    reason = values.get("reason", "").strip()[:500] or f"added by operator {_user(request)}"

    def work(conn: Any) -> bool:
        if add:
            return suppressions.suppress(conn, channel, recipient, reason)[1]
        return suppressions.unsuppress(conn, channel, recipient)

    changed = await db(request, work, begin=True)
    log.info(
        "console %s %s a suppression on %s", _user(request), "added" if add else "removed", channel
    )
    verb = (
        ("Added." if changed else "Already there.")
        if add
        else ("Removed." if changed else "Not found.")
    )
    entries = await db(request, _entries(None))
    return render(request, "suppressions.html", rows=entries, channel="", message=verb)


# --- templates ----------------------------------------------------------------------------------


@page
async def template_list(request: Request) -> Response:
    return render(request, "templates.html", templates=await db(request, list_templates))


async def _template_page(request: Request, values: dict[str, str] | None) -> Response:
    p = request.path_params
    found: list[TemplateRow] = await db(
        request, lambda conn: list_templates(conn, p["name"], p["channel"], p["locale"])
    )
    if not found:
        return refuse(request, "no such template", 404)
    sample = (values or {}).get("payload", "{}")
    recipient = (values or {}).get("recipient", "ann@example.com")
    preview, error = None, None
    if values is not None:
        try:
            try:
                data = json.loads(sample)
            except RecursionError:
                raise ValueError("the sample payload is nested too deeply") from None
            if not isinstance(data, dict):
                raise ValueError("the sample payload must be a JSON object")
            row = found[0]
            parts = prepare.compile_parts(row.subject, row.body, row.html)
            scope = {"recipient": recipient, **data}
            preview = {
                name: None if part is None else part.render(scope)
                for name, part in zip(("subject", "body", "html"), parts, strict=True)
            }
        except (ValueError, TemplateError) as exc:
            error = str(exc)
    return render(
        request,
        "template.html",
        t=found[0],
        sample=sample,
        recipient=recipient,
        preview=preview,
        error=error,
    )


@page
async def template(request: Request) -> Response:
    return await _template_page(request, None)


@post(admin=False)
async def preview(request: Request, values: dict[str, str]) -> Response:
    return await _template_page(request, values)


def routes() -> list[Route]:
    return [
        Route("/notifications/{id:segment}/{action:segment}", confirm_row, methods=["GET"]),
        Route("/notifications/{id:segment}/{action:segment}", act_on_row, methods=["POST"]),
        Route("/bulk", bulk_form, methods=["GET"]),
        Route("/bulk/count", bulk_count, methods=["POST"]),
        Route("/bulk/run", bulk_run, methods=["POST"]),
        Route("/campaigns", campaigns, methods=["GET"]),
        Route("/campaigns/{name:segment}/{action:segment}", confirm_campaign, methods=["GET"]),
        Route("/campaigns/{name:segment}/{action:segment}", act_on_campaign, methods=["POST"]),
        Route("/suppressions", suppression_list, methods=["GET"]),
        Route("/suppressions/search", suppression_search, methods=["POST"]),
        Route("/suppressions/{change:segment}", suppression_change, methods=["POST"]),
        Route("/templates", template_list, methods=["GET"]),
        Route(
            "/templates/{name:segment}/{channel:segment}/{locale:segment}",
            template,
            methods=["GET"],
        ),
        Route(
            "/templates/{name:segment}/{channel:segment}/{locale:segment}",
            preview,
            methods=["POST"],
        ),
    ]
