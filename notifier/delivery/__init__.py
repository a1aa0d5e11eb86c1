"""Delivering a batch: claim, prepare, check, guard, rate-limit, send, record (no Celery here).

``dispatcher`` runs a batch; ``prepare`` applies suppressions, templates and overrides;
``checks`` validates each row; ``guards`` asks a producer's service right before a send;
``ratelimit`` shares each provider's windows in Redis; ``sender`` sends through a channel's
providers in order; ``outcomes`` decides each row's writes; ``retry`` is the backoff policy.
"""
