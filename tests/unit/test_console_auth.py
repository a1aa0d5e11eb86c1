"""Console passwords and the user list."""

from __future__ import annotations

import pytest

from notifier.console.auth import hash_password, verify_password
from notifier.specs import Role, parse_users


def test_a_hash_checks_its_password_only() -> None:
    encoded = hash_password("correct horse", n=2**10)
    assert verify_password("correct horse", encoded)
    assert not verify_password("correct horsf", encoded)
    assert hash_password("correct horse", n=2**10) != encoded  # a fresh salt each time


def test_a_hash_sits_in_the_user_list_and_an_env_file() -> None:
    encoded = hash_password("p")
    assert not set(encoded) & set(":,$ \"'")
    users = parse_users(f"alice:{encoded}:admin, bob:{encoded}:viewer")
    assert users["alice"].role is Role.admin
    assert users["bob"].role is Role.viewer


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("alice:x:admin", "user 'alice': the password hash is not a hash"),
        ("alice:{h}:root", "role must be admin or viewer"),
        ("alice:{h}", "entry 1 is not name:hash:role"),
        ("alice:{h}:admin,alice:{h}:viewer", "listed twice"),
        ("alice:scrypt.1024.8.1.AA.AA:admin", "too weak"),
    ],
)
def test_a_bad_user_list_is_refused_naming_the_entry(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_users(spec.format(h=hash_password("p", n=2**10)))


def test_an_empty_password_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        hash_password("")
