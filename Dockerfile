# One image for every notifier process: `notifier migrate`, the Celery worker, beat and Flower
# (docker-compose.yml picks the command).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN useradd --system --uid 10001 --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin notifier

WORKDIR /app
COPY pyproject.toml README.md celeryconfig.py alembic.ini ./
COPY alembic/ alembic/
COPY notifier/ notifier/
# Editable, so the code stays in /app: `notifier migrate` looks for its migrations beside the
# package (/app/alembic), and a regular install would move the package into site-packages, away
# from them. The bytecode is compiled here because the user below cannot write to /app.
RUN pip install --no-cache-dir -e . \
    && python -m compileall -q notifier celeryconfig.py alembic

USER notifier
CMD ["celery", "-A", "notifier", "worker", "--loglevel=INFO"]
