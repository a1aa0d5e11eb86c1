"""The push provider against a real local token endpoint and a real local FCM stand-in.

Each test writes a service-account key with a freshly generated RSA key whose ``token_uri``
points at pytest-httpserver, which also plays FCM (``NOTIFIER_FCM_API_BASE``). The token
endpoint checks each JWT assertion's signature with the public key, independently of
google-auth. Answers follow FCM's documented error shapes (its ``ErrorCode`` reference).
"""

from __future__ import annotations

import base64
import json
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from pytest_httpserver import HTTPServer
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError
from werkzeug import Request, Response

from notifier import client
from notifier.db import profiles
from notifier.delivery.dispatcher import Dispatcher
from notifier.models import Notification
from notifier.providers import load_registry, registry_of
from notifier.providers.base import InvalidNotification, Permanent, Retry, Sent
from notifier.providers.push import PushProvider
from notifier.settings import get_settings
from tests.factories import MakeSettings, SetEnv
from tests.raw_server import Behaviour, RawServer, silence

DEVICE = "fGx3:APA91bH-" + "x" * 140  # the shape of a real registration token
PROJECT = "demo-project"
SEND_PATH = f"/v1/projects/{PROJECT}/messages:send"
CLIENT_EMAIL = "notifier@demo-project.iam.gserviceaccount.com"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
FCM_ERROR = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest"


def notification(recipient: str = DEVICE, id: int = 42, **fields: Any) -> Notification:
    values: dict[str, Any] = {
        "subject": "Your order shipped",
        "body": "It left the warehouse.",
        "payload": {"order": "7"},
    }
    values.update(fields)
    return Notification(
        id=id,
        channel="push",
        recipient=recipient,
        attempts=1,
        max_attempts=5,
        claim_token=uuid4(),
        created_at=datetime.now(UTC),
        **values,
    )


@pytest.fixture(scope="module")
def private_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _b64decode(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


class TokenEndpoint:
    """Answers the JWT-bearer grant after checking the assertion with the public key."""

    def __init__(self, server: HTTPServer, key: rsa.RSAPrivateKey, expires_in: int) -> None:
        self.url = server.url_for("/token")
        self.public_key = key.public_key()
        self.expires_in = expires_in
        self.grants: list[dict[str, Any]] = []
        self.failures: list[str] = []
        self.issued = 0
        server.expect_request("/token", method="POST").respond_with_handler(self.answer)

    def answer(self, request: Request) -> Response:
        try:
            assert request.form["grant_type"] == JWT_BEARER
            header, claims, signature = request.form["assertion"].split(".")
            self.public_key.verify(  # raises InvalidSignature
                _b64decode(signature),
                f"{header}.{claims}".encode(),
                padding.PKCS1v15(),
                hashes.SHA256(),
            )
            assert json.loads(_b64decode(header))["alg"] == "RS256"
            self.grants.append(json.loads(_b64decode(claims)))
        except Exception as exc:
            self.failures.append(repr(exc))
            return Response('{"error": "invalid_grant"}', status=400)
        self.issued += 1
        token = {"access_token": f"tok{self.issued}", "expires_in": self.expires_in}
        return Response(json.dumps(token | {"token_type": "Bearer"}), mimetype="application/json")

    def check(self) -> None:
        assert self.failures == []
        for claims in self.grants:
            assert claims["iss"] == CLIENT_EMAIL
            # google-auth always names Google's endpoint as the audience, wherever it posts
            assert claims["aud"] == "https://oauth2.googleapis.com/token"
            assert claims["scope"] == SCOPE
            assert 0 < claims["exp"] - claims["iat"] <= 3600


MakeProvider = Callable[..., PushProvider]


@pytest.fixture
def key_file(tmp_path: Path, private_key: rsa.RSAPrivateKey) -> Callable[..., Path]:
    def write(token_uri: str, /, **changes: Any) -> Path:
        pem = private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        info = {
            "type": "service_account",
            "project_id": PROJECT,
            "private_key_id": "k1",
            "private_key": pem,
            "client_email": CLIENT_EMAIL,
            "token_uri": token_uri,
        } | changes
        path = tmp_path / "service-account.json"
        path.write_text(json.dumps({k: v for k, v in info.items() if v is not None}))
        return path

    return write


@pytest.fixture
def make_provider(set_env: SetEnv) -> Iterator[MakeProvider]:
    """Builds providers from the environment, the way the registry does; shuts them down after."""
    made: list[PushProvider] = []

    def make(
        key: Path | None, api_base: str, timeout: float = 5, project: str | None = None
    ) -> PushProvider:
        set_env(
            fcm_credentials_file=key,
            fcm_api_base=api_base,
            fcm_project_id=project,
            push_timeout=timeout,
        )
        made.append(PushProvider(get_settings()))
        return made[-1]

    yield make
    for provider in made:
        provider.shutdown()


@pytest.fixture
def token_endpoint(httpserver: HTTPServer, private_key: rsa.RSAPrivateKey) -> TokenEndpoint:
    return TokenEndpoint(httpserver, private_key, expires_in=3600)


@pytest.fixture
def provider(
    make_provider: MakeProvider,
    key_file: Callable[..., Path],
    httpserver: HTTPServer,
    token_endpoint: TokenEndpoint,
) -> PushProvider:
    """A provider whose token endpoint and FCM are both the local httpserver."""
    return make_provider(key_file(token_endpoint.url), httpserver.url_for("/").rstrip("/"))


def fcm_error(code: int, status: str, message: str, *details: dict[str, Any]) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "status": status, "details": details}}


def fcm_code(code: str) -> dict[str, str]:
    return {"@type": FCM_ERROR, "errorCode": code}


def violation(field: str, description: str) -> dict[str, Any]:
    return {"@type": BAD_REQUEST, "fieldViolations": [{"field": field, "description": description}]}


NAME = f"projects/{PROJECT}/messages/0:1712345678%abc"
RESPONSES: list[tuple[str, int, dict[str, str], Any, type, str | None, float | None]] = [
    # id, status, headers, body (JSON unless str), outcome, error fragment, retry_after
    ("sent", 200, {}, {"name": NAME}, Sent, None, None),
    ("sent-unreadable", 200, {}, "<html>ok</html>", Sent, None, None),
    (
        "unregistered",
        404,
        {},
        fcm_error(404, "NOT_FOUND", "Requested entity was not found.", fcm_code("UNREGISTERED")),
        Permanent,
        "push token is unregistered (FCM UNREGISTERED): the app was uninstalled",
        None,
    ),
    (
        "invalid-token-field",
        400,
        {},
        fcm_error(
            400,
            "INVALID_ARGUMENT",
            "Request contains an invalid argument.",
            fcm_code("INVALID_ARGUMENT"),
            violation("message.token", "Invalid registration token"),
        ),
        Permanent,
        "not a valid FCM registration token",
        None,
    ),
    (
        "invalid-token-message",
        400,
        {},
        fcm_error(
            400,
            "INVALID_ARGUMENT",
            "The registration token is not a valid FCM registration token",
            fcm_code("INVALID_ARGUMENT"),
        ),
        Permanent,
        "stop sending to it",
        None,
    ),
    (
        "invalid-data",
        400,
        {},
        fcm_error(
            400,
            "INVALID_ARGUMENT",
            "Invalid value at 'message.data[0].value' (TYPE_STRING), 12",
            violation("message.data[0].value", "Invalid value (TYPE_STRING), 12"),
        ),
        Permanent,
        "FCM HTTP 400 INVALID_ARGUMENT: Invalid value at 'message.data[0].value'",
        None,
    ),
    (
        "sender-mismatch",
        403,
        {},
        fcm_error(403, "PERMISSION_DENIED", "SenderId mismatch", fcm_code("SENDER_ID_MISMATCH")),
        Permanent,
        "another Firebase project (FCM SENDER_ID_MISMATCH)",
        None,
    ),
    (
        "permission-denied",
        403,
        {},
        fcm_error(403, "PERMISSION_DENIED", "Permission 'cloudmessaging.messages.create' denied"),
        Retry,
        "FCM HTTP 403 PERMISSION_DENIED",
        None,
    ),
    (
        "third-party-auth",
        401,
        {},
        fcm_error(401, "UNAUTHENTICATED", "APNs auth failed", fcm_code("THIRD_PARTY_AUTH_ERROR")),
        Retry,
        "FCM HTTP 401 THIRD_PARTY_AUTH_ERROR: APNs auth failed",
        None,
    ),
    (
        "unauthenticated",
        401,
        {},
        fcm_error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials."),
        Retry,
        "NOTIFIER_FCM_CREDENTIALS_FILE",
        None,
    ),
    (
        "quota",
        429,
        {"Retry-After": "30"},
        fcm_error(429, "RESOURCE_EXHAUSTED", "Quota exceeded", fcm_code("QUOTA_EXCEEDED")),
        Retry,
        "FCM HTTP 429 QUOTA_EXCEEDED",
        30.0,
    ),
    (
        "unavailable",
        503,
        {"Retry-After": "7"},
        fcm_error(503, "UNAVAILABLE", "The service is unavailable.", fcm_code("UNAVAILABLE")),
        Retry,
        "FCM HTTP 503 UNAVAILABLE",
        7.0,
    ),
    (
        "internal",
        500,
        {},
        fcm_error(500, "INTERNAL", "Internal error encountered.", fcm_code("INTERNAL")),
        Retry,
        "FCM HTTP 500 INTERNAL",
        None,
    ),
    ("bad-gateway-html", 502, {}, "<html>Error 502</html>", Retry, "HTTP 502 with no FCM", None),
    ("400-not-json", 400, {}, "bad request", Permanent, "HTTP 400 with no FCM error", None),
    ("404-not-json", 404, {}, "<html>Not Found</html>", Retry, "HTTP 404 with no FCM", None),
]


@pytest.mark.parametrize(
    ("status", "headers", "body", "kind", "fragment", "retry_after"),
    [r[1:] for r in RESPONSES],
    ids=[r[0] for r in RESPONSES],
)
def test_outcome_follows_fcm_answer(
    provider: PushProvider,
    httpserver: HTTPServer,
    token_endpoint: TokenEndpoint,
    status: int,
    headers: dict[str, str],
    body: Any,
    kind: type[Sent | Retry | Permanent],
    fragment: str | None,
    retry_after: float | None,
) -> None:
    text = body if isinstance(body, str) else json.dumps(body)
    httpserver.expect_oneshot_request(SEND_PATH, method="POST").respond_with_response(
        Response(text, status=status, headers=headers, mimetype="application/json")
    )
    outcome = provider.send(notification())
    httpserver.check_assertions()
    token_endpoint.check()
    assert type(outcome) is kind
    fcm_requests = [r for r, _ in httpserver.log if r.path == SEND_PATH]
    assert len(fcm_requests) == 1
    request = fcm_requests[0]
    assert request.headers["Authorization"] == "Bearer tok1"
    assert request.json == {
        "message": {
            "token": DEVICE,
            "notification": {"title": "Your order shipped", "body": "It left the warehouse."},
            "data": {"order": "7"},
        }
    }
    if isinstance(outcome, Sent):
        assert outcome.provider_message_id == (NAME if status == 200 and "name" in text else None)
        return
    assert fragment is not None
    assert fragment in outcome.error
    assert "tok1" not in outcome.error
    if isinstance(outcome, Permanent):  # an uninstalled app's token goes on the suppression list
        assert outcome.suppress is ("UNREGISTERED" in fragment)
    if isinstance(outcome, Retry):
        assert outcome.throttled is (status == 429)
        assert outcome.retry_after == retry_after


def test_token_is_cached_across_sends(
    provider: PushProvider, httpserver: HTTPServer, token_endpoint: TokenEndpoint
) -> None:
    httpserver.expect_request(SEND_PATH, method="POST").respond_with_json({"name": NAME})
    with ThreadPoolExecutor(5) as pool:  # concurrent first sends still fetch one token
        outcomes = list(pool.map(provider.send, [notification(id=i) for i in range(5)]))
    assert all(isinstance(o, Sent) for o in outcomes)
    token_endpoint.check()
    assert token_endpoint.issued == 1
    tokens = {r.headers["Authorization"] for r, _ in httpserver.log if r.path == SEND_PATH}
    assert tokens == {"Bearer tok1"}


def test_token_near_expiry_is_refreshed(
    make_provider: MakeProvider,
    key_file: Callable[..., Path],
    httpserver: HTTPServer,
    private_key: rsa.RSAPrivateKey,
) -> None:
    endpoint = TokenEndpoint(httpserver, private_key, expires_in=60)  # inside the refresh margin
    httpserver.expect_request(SEND_PATH, method="POST").respond_with_json({"name": NAME})
    provider = make_provider(key_file(endpoint.url), httpserver.url_for("/").rstrip("/"))
    for i in range(2):
        assert isinstance(provider.send(notification(id=i)), Sent)
    endpoint.check()
    assert endpoint.issued == 2


def test_a_refused_token_is_dropped(
    provider: PushProvider, httpserver: HTTPServer, token_endpoint: TokenEndpoint
) -> None:
    refusal = fcm_error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials.")
    httpserver.expect_oneshot_request(SEND_PATH).respond_with_json(refusal, status=401)
    httpserver.expect_oneshot_request(SEND_PATH).respond_with_json({"name": NAME})
    assert isinstance(provider.send(notification()), Retry)
    assert isinstance(provider.send(notification()), Sent)
    assert token_endpoint.issued == 2
    tokens = [r.headers["Authorization"] for r, _ in httpserver.log if r.path == SEND_PATH]
    assert tokens == ["Bearer tok1", "Bearer tok2"]


@pytest.mark.parametrize("status", [500, 503, 400])
def test_token_endpoint_failure_is_retried_at_once(
    make_provider: MakeProvider,
    key_file: Callable[..., Path],
    httpserver: HTTPServer,
    status: int,
) -> None:
    httpserver.expect_request("/token").respond_with_json({"error": "server_error"}, status)
    provider = make_provider(key_file(httpserver.url_for("/token")), httpserver.url_for("/")[:-1])
    started = time.monotonic()
    outcome = provider.send(notification())
    assert isinstance(outcome, Retry)
    assert f"no FCM access token from the token endpoint: HTTP {status} from" in outcome.error
    # Exactly one call and no backoff sleep: google-auth's own retries are not used.
    assert [r.path for r, _ in httpserver.log] == ["/token"]
    assert time.monotonic() - started < 1


def test_token_endpoint_down_is_retried(
    make_provider: MakeProvider, key_file: Callable[..., Path], httpserver: HTTPServer
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # closed on leaving the block: nothing listens there now
    provider = make_provider(key_file(f"http://127.0.0.1:{port}/token"), "https://fcm.example")
    outcome = provider.send(notification())
    assert isinstance(outcome, Retry)
    assert "ConnectError" in outcome.error


@pytest.mark.parametrize("where", ["fcm", "token-endpoint"])
def test_silent_server_times_out(
    make_provider: MakeProvider,
    key_file: Callable[..., Path],
    httpserver: HTTPServer,
    token_endpoint: TokenEndpoint,
    raw_server: Callable[[Behaviour], RawServer],
    where: str,
) -> None:
    silent = raw_server(silence)
    token_uri = silent.url + "/token" if where == "token-endpoint" else token_endpoint.url
    api_base = silent.url if where == "fcm" else httpserver.url_for("/")[:-1]
    provider = make_provider(key_file(token_uri), api_base, timeout=1)
    started = time.monotonic()
    outcome = provider.send(notification())
    elapsed = time.monotonic() - started
    assert silent.accepted == 1  # the fault happened: it took the request and said nothing
    assert isinstance(outcome, Retry)
    assert "timed out" in outcome.error
    assert 0.9 <= elapsed < 3


# -- configuration the operator must fix: retried, never sent -----------------------------------

CONFIG = [
    # key file changes (None: no file), api base, project id, error fragment
    ("no-file", None, "https://fcm.example", None, "set NOTIFIER_FCM_CREDENTIALS_FILE"),
    ("http-api", {}, "http://fcm.example", None, "NOTIFIER_FCM_API_BASE must be an https://"),
    ("api-path", {}, "https://fcm.example/v1", None, "must be scheme://host only"),
    ("http-token", {"token_uri": "http://oauth.example/token"}, "", None, "token_uri in"),
    ("no-project", {"project_id": None}, "", None, "set NOTIFIER_FCM_PROJECT_ID"),
    ("no-email", {"client_email": None}, "", None, "cannot load NOTIFIER_FCM_CREDENTIALS_FILE"),
    ("bad-key", {"private_key": "-----BEGIN PRIVATE KEY-----\nAAAA\n"}, "", None, "cannot load"),
]


@pytest.mark.parametrize(
    ("changes", "api_base", "project", "fragment"),
    [c[1:] for c in CONFIG],
    ids=[c[0] for c in CONFIG],
)
def test_bad_configuration_is_retried(
    make_provider: MakeProvider,
    key_file: Callable[..., Path],
    httpserver: HTTPServer,
    changes: dict[str, Any] | None,
    api_base: str,
    project: str | None,
    fragment: str,
) -> None:
    key = None if changes is None else key_file(httpserver.url_for("/token"), **changes)
    provider = make_provider(key, api_base or httpserver.url_for("/")[:-1], project=project)
    outcome = provider.send(notification())
    assert isinstance(outcome, Retry)
    assert fragment in outcome.error
    assert "PRIVATE KEY" not in outcome.error
    assert httpserver.log == []


def test_unreadable_key_file_is_retried(make_provider: MakeProvider, tmp_path: Path) -> None:
    for content in (None, "not json", "[1, 2]"):
        path = tmp_path / "key.json"
        if content is not None:
            path.write_text(content)
        outcome = make_provider(path, "https://fcm.example").send(notification())
        assert isinstance(outcome, Retry)
        assert outcome.error.startswith(f"cannot load NOTIFIER_FCM_CREDENTIALS_FILE {path}")


def test_project_id_setting_wins(
    make_provider: MakeProvider,
    key_file: Callable[..., Path],
    httpserver: HTTPServer,
    token_endpoint: TokenEndpoint,
) -> None:
    httpserver.expect_request("/v1/projects/other/messages:send").respond_with_json({"name": "n"})
    key = key_file(token_endpoint.url)
    provider = make_provider(key, httpserver.url_for("/")[:-1], project="other")
    assert provider.send(notification()) == Sent("n")


def test_registered_and_idle_without_configuration(make_provider: MakeProvider) -> None:
    make_provider(None, "https://fcm.example")  # clears the environment for load_registry
    registry = load_registry(get_settings())
    assert isinstance(registry["push"], PushProvider)
    registry.close()


# -- rows that can never be sent -----------------------------------------------------------------

INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("", {}, "recipient is empty"),
    ("   ", {}, "recipient is empty"),
    ("abc def", {}, "whitespace or control characters"),
    ("abc\r\nX: 1", {}, "whitespace or control characters"),
    ("a" * 4097, {}, "an FCM token is at most 4096"),
    (DEVICE, {"subject": None, "body": None}, "needs a subject"),
    (DEVICE, {"subject": "", "body": ""}, "needs a subject"),
    (DEVICE, {"payload": {"count": 3}}, "payload.count must be a string for push data"),
    (DEVICE, {"payload": {"flag": True}}, "FCM data values are strings"),
    (DEVICE, {"payload": {"nested": {"a": "b"}}}, "payload.nested must be a string"),
    (DEVICE, {"payload": {"from": "x"}}, "reserved by FCM"),
    (DEVICE, {"payload": {"google.c.a": "x"}}, "reserved by FCM"),
]


@pytest.mark.parametrize(
    ("recipient", "fields", "message"),
    INVALID,
    ids=[f"{i}-{m[:20]}" for i, (_, _, m) in enumerate(INVALID)],
)
def test_invalid_rows_are_refused(
    make_provider: MakeProvider, recipient: str, fields: dict[str, Any], message: str
) -> None:
    provider = make_provider(None, "https://fcm.example")
    with pytest.raises(InvalidNotification, match=message):
        provider.validate(notification(recipient, **fields))


@pytest.mark.parametrize(
    "fields",
    [{}, {"subject": None}, {"body": None}, {"payload": {}}, {"payload": {"a": "", "b": "ü"}}],
)
def test_valid_rows_pass(make_provider: MakeProvider, fields: dict[str, Any]) -> None:
    make_provider(None, "https://fcm.example").validate(notification(**fields))


def test_title_only_push_omits_the_body(
    provider: PushProvider, httpserver: HTTPServer, token_endpoint: TokenEndpoint
) -> None:
    httpserver.expect_request(SEND_PATH).respond_with_json({"name": NAME})
    assert isinstance(provider.send(notification(body=None, payload={})), Sent)
    request = next(r for r, _ in httpserver.log if r.path == SEND_PATH)
    assert request.json == {
        "message": {"token": DEVICE, "notification": {"title": "Your order shipped"}, "data": {}}
    }


def test_a_push_row_to_a_person_reaches_each_of_their_devices_once(
    provider: PushProvider,
    httpserver: HTTPServer,
    token_endpoint: TokenEndpoint,
    engine: Engine,
    make_settings: MakeSettings,
) -> None:
    phone, tablet = DEVICE, DEVICE.replace("x", "y")
    httpserver.expect_request(SEND_PATH, method="POST").respond_with_json({"name": NAME})
    with engine.begin() as conn:
        client.upsert_profile(conn, "ann", push_tokens=[phone, tablet, phone], locale="de",
                              fields={"name": "Ann"})  # fmt: skip
        client.upsert_profile(conn, "bob", push_tokens=[DEVICE.replace("x", "z")])
        ann = client.enqueue(conn, channel="push", profile="ann", subject="Hi", body="Order 7",
                             payload={"order": "7"}, category="orders").id  # fmt: skip
        bob = client.enqueue(conn, channel="push", profile="bob", subject="Hi", body="x").id
        client.upsert_profile(conn, "bob", push_tokens=[])  # the app uninstalled meanwhile
        with pytest.raises(ValueError, match="profile 'bob' has no push token: set push_tokens"):
            client.enqueue(conn, channel="push", profile="bob", subject="Hi", body="x")
    dispatcher = Dispatcher(engine, registry_of([provider]), make_settings())
    try:
        dispatcher.run_once()  # the person's row: written out, one row per device
        dispatcher.run_once()  # the devices' rows: sent
    finally:
        dispatcher.close()

    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT id, parent_id, recipient, status, provider, last_error, payload, locale,"
                " category FROM notifications ORDER BY id"
            )
        ).all()
        history = conn.execute(
            text("SELECT outcome, error FROM notification_attempts WHERE notification_id = :id"),
            {"id": ann},
        ).all()
    by_id = {r.id: r for r in rows}
    assert (by_id[ann].status, by_id[ann].provider) == ("sent", "devices")
    assert history == [("fanned_out", "to 2 of 2 devices")]
    assert by_id[bob].status == "dead"
    assert "profile 'bob' has no push token" in by_id[bob].last_error
    devices = [r for r in rows if r.parent_id == ann]
    assert sorted(r.recipient for r in devices) == sorted([phone, tablet])
    for r in devices:
        assert (r.status, r.provider, r.locale, r.category) == ("sent", "push", "de", "orders")
        assert r.payload == {"name": "Ann", "order": "7"}
    sent_to = [r.json["message"]["token"] for r, _ in httpserver.log if r.path == SEND_PATH]
    assert sorted(sent_to) == sorted([phone, tablet])
    token_endpoint.check()


def _claimed(engine: Engine, *people: tuple[str, list[str]]) -> tuple[UUID, list[int]]:
    """A push row to each person (with these tokens), claimed under one new token."""
    token = uuid4()
    with engine.begin() as conn:
        for name, tokens in people:
            client.upsert_profile(conn, name, push_tokens=tokens)
        ids = [
            client.enqueue(conn, channel="push", profile=name, subject="Hi", body="x").id
            for name, _ in people
        ]
        conn.execute(
            text(
                "UPDATE notifications SET status = 'processing', claim_token = :token,"
                " locked_until = now() + interval '1 minute', attempts = 1"
                " WHERE id = ANY(:ids)"
            ),
            {"token": token, "ids": ids},
        )
    return token, ids


def test_a_person_s_row_is_written_out_only_by_the_claim_that_holds_it(engine: Engine) -> None:
    with engine.begin() as conn:
        client.upsert_profile(conn, "bob", push_tokens=[DEVICE])
        bob = client.enqueue(conn, channel="push", profile="bob", subject="Hi", body="x").id
        assert profiles.fan_out(conn, uuid4(), [bob], "w") == {bob: None}  # not claimed
    token, [ann] = _claimed(engine, ("ann", [DEVICE]))
    with engine.begin() as conn:
        assert profiles.fan_out(conn, uuid4(), [ann], "w") == {ann: None}  # another claim's
        assert profiles.fan_out(conn, token, [ann], "w") == {ann: "sent"}
        assert profiles.fan_out(conn, token, [ann], "w") == {ann: None}  # once only
        (count,) = conn.execute(text("SELECT count(*) FROM notifications")).one()
    assert count == 3


def test_devices_rows_that_cannot_be_written_end_their_person_s_row_not_the_batch(
    engine: Engine,
) -> None:
    poison = DEVICE.replace("x", "p")
    with engine.begin() as conn:  # a fault for real: the database refuses one device's row
        conn.execute(
            text(
                f"""
                CREATE FUNCTION refuse_device() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF NEW.recipient = '{poison}' THEN
                        RAISE EXCEPTION 'this device is refused';
                    END IF;
                    RETURN NEW;
                END $$;
                CREATE TRIGGER refuse_device BEFORE INSERT ON notifications
                   FOR EACH ROW EXECUTE FUNCTION refuse_device();
                """
            )
        )
    with pytest.raises(DBAPIError, match="this device is refused"), engine.begin() as conn:
        conn.execute(
            text("INSERT INTO notifications (channel, recipient) VALUES ('push', :t)"),
            {"t": poison},
        )
    token, [ann, bob] = _claimed(engine, ("ann", [DEVICE, poison]), ("bob", [DEVICE]))
    with engine.begin() as conn:
        assert profiles.fan_out(conn, token, [ann, bob], "w") == {ann: "dead", bob: "sent"}
        rows = conn.execute(
            text("SELECT id, parent_id, status, last_error FROM notifications ORDER BY id")
        ).all()
    assert [(r.parent_id, r.status) for r in rows] == [
        (None, "dead"),
        (None, "sent"),
        (bob, "pending"),
    ]
    assert rows[0].last_error == (
        "its devices' rows could not be written (SQLSTATE P0001): this device is refused"
    )
