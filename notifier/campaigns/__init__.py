"""Campaigns: one message to a large audience, each recipient with a code of their own.

``service`` runs them (create, import, launch, pause, resume, cancel, finish); ``messages`` says
what their messages are made of.
"""

from notifier.campaigns.messages import CampaignError, placeholders, render_sql
from notifier.campaigns.service import (
    CHUNK,
    MOST_PARALLEL,
    PARALLEL,
    Campaigns,
    Paused,
    Progress,
    unwritten,
)

__all__ = [
    "CHUNK",
    "MOST_PARALLEL",
    "PARALLEL",
    "CampaignError",
    "Campaigns",
    "Paused",
    "Progress",
    "placeholders",
    "render_sql",
    "unwritten",
]
