# One image for every notifier process: `notifier migrate`, the Celery worker, beat and Flower
# (docker-compose.yml picks the command). Two stages: the first turns the source into a wheel;
# the second installs the pinned dependencies (requirements.lock), then that wheel, and keeps
# no source tree.

FROM python:3.11-slim AS wheel

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /src
COPY pyproject.toml README.md celeryconfig.py ./
COPY alembic/ alembic/
COPY notifier/ notifier/
RUN pip wheel --no-deps --wheel-dir /wheels .


FROM python:3.11-slim

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

RUN useradd --system --uid 10001 --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin notifier

# The dependencies first, in a layer of their own: they change far less often than the code.
# Every one is pinned with its hashes, so a rebuild gets the very same files.
COPY requirements.lock /tmp/
RUN pip install --require-hashes --requirement /tmp/requirements.lock \
    && rm /tmp/requirements.lock

# notifier itself, its migrations (notifier/_migrations) and celeryconfig inside the wheel;
# --no-deps, since the lock brought them all, and `pip check` fails the build if it did not.
# pip compiles the bytecode here, as root: the user below cannot write to site-packages.
COPY --from=wheel /wheels/ /tmp/wheels/
RUN pip install --no-deps /tmp/wheels/*.whl \
    && rm -r /tmp/wheels \
    && pip check

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# An empty working directory: nothing is read from it (beat's schedule file goes where
# docker-compose.yml says).
WORKDIR /app
USER notifier
CMD ["celery", "-A", "notifier", "worker", "--loglevel=INFO"]
