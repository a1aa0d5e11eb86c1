"""Campaigns: one message to a large audience, each recipient with a code of their own.

``service`` runs them (create, import, launch, pause, resume, cancel, finish); ``launch`` writes
their notifications in chunks; ``messages`` says what their messages are made of.
"""

from notifier.campaigns.launch import CHUNK, MOST_PARALLEL, PARALLEL, unwritten
from notifier.campaigns.messages import CampaignError, placeholders, render_sql
from notifier.campaigns.service import Campaigns, Paused, Progress

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
