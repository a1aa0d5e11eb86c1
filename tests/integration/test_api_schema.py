"""The API as a client nobody here wrote would call it: schemathesis generates requests from the
OpenAPI document (valid ones and invalid ones) and checks every answer against it: no 5xx, only
documented status codes, content types, headers and bodies of the documented shape, invalid
data refused. Each operation gets a fixed budget of examples."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance
from sqlalchemy import Engine

from notifier.api import keys, openapi
from notifier.api.app import create_app
from notifier.db import api as api_db
from tests.console_server import free_port, serving
from tests.factories import MakeSettings

schema = schemathesis.openapi.from_dict(openapi.document())

#: Requests a second a key may make: high enough that the budget below is never throttled.
RATE = 100_000


@pytest.fixture
def served(
    engine: Engine, make_settings: MakeSettings, redis_url: str
) -> Iterator[tuple[str, str]]:
    made = keys.make("schemathesis")
    with engine.begin() as conn:
        api_db.create_key(conn, made.row)
    counter = redis.Redis.from_url(redis_url, socket_timeout=2)
    app = create_app(make_settings(api_rate_per_second=RATE), engine, counter)
    with serving(app, free_port()) as url:
        yield url, made.key
    counter.close()


@schema.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_every_answer_keeps_the_document(case: schemathesis.Case, served: tuple[str, str]) -> None:
    url, key = served
    case.call_and_validate(
        base_url=url,
        headers={"Authorization": f"Bearer {key}"},
        # A request the document allows may still be no notification notifier could send (an
        # unknown channel, a time in the past with an expiry before it): 422, documented.
        excluded_checks=[positive_data_acceptance],
    )
