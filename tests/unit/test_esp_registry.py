"""The ``sendgrid``, ``mailgun`` and ``postmark`` providers as a deployment finds them: entry
points of the ``notifier.providers`` group, serving ``email``, chosen by ``NOTIFIER_FAILOVER``."""

from __future__ import annotations

import importlib
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from notifier.providers import ENTRY_POINT_GROUP, can_send_async, chains, load_registry
from notifier.providers.email import EmailProvider
from notifier.providers.mailgun import MailgunProvider
from notifier.providers.postmark import PostmarkProvider
from notifier.providers.sendgrid import SendGridProvider
from notifier.settings import Settings
from tests.factories import claimed

REPO = Path(__file__).resolve().parents[2]
ESPS = {
    "sendgrid": "notifier.providers.sendgrid:SendGridProvider",
    "mailgun": "notifier.providers.mailgun:MailgunProvider",
    "postmark": "notifier.providers.postmark:PostmarkProvider",
}


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The entry points pyproject.toml declares, as an installed distribution would carry
    them, for those the environment's installed copy of notifier does not have yet."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    assert {k: declared[ENTRY_POINT_GROUP][k] for k in ESPS} == ESPS
    have = {e.name for e in entry_points(group=ENTRY_POINT_GROUP)}
    lines = [f"{name} = {target}" for name, target in ESPS.items() if name not in have]
    dist = tmp_path / "notifier_esp_check-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: notifier-esp-check\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n" + "\n".join(lines) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize(
    ("failover", "expected"),
    [
        ("email=sendgrid", [SendGridProvider]),
        ("email=mailgun,email", [MailgunProvider, EmailProvider]),
        ("email=postmark,sendgrid,email", [PostmarkProvider, SendGridProvider, EmailProvider]),
    ],
)
def test_a_deployment_chooses_them_by_failover(failover: str, expected: list[type]) -> None:
    settings = Settings(failover=failover)  # type: ignore[arg-type]
    chain = chains(load_registry(settings), settings.failover)["email"]
    assert [type(p) for p in chain] == expected
    assert all(p.channel == "email" for p in chain)


@pytest.mark.usefixtures("installed")
def test_they_send_on_the_event_loop_and_name_what_is_missing() -> None:
    registry = load_registry(Settings())
    for name in ESPS:
        provider = registry[name]
        assert can_send_async(provider)
        problem = provider.problem()
        assert problem is not None
        assert f"NOTIFIER_{name.upper()}_" in problem


def test_rows_share_a_request_only_when_their_content_is_the_same() -> None:
    settings = Settings(sendgrid_api_key="SG.k", email_from="shop@shop.example")
    provider = SendGridProvider(settings)

    def key(body: str, payload: dict[str, object] | None = None) -> object:
        row = claimed("email", "ada@example.com", subject="Hi", body=body, payload=payload or {})
        return provider.batch_key(row)

    assert key("Hi") == key("Hi")
    assert key("Hi") != key("Hi!")
    # a row whose html is the text "null" is not a row without html
    assert key("Hi", {"html": "null"}) != key("Hi", {})
    assert key("Hi", {"html": "<p>x</p>"}) != key("Hi", {})
