"""requirements.lock, what CI and the image install, agrees with pyproject.toml.

The image installs the lock, then notifier's wheel with ``--no-deps``: a dependency added to
pyproject.toml but not locked would be missing there. ``scripts/lock`` regenerates the lock.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", re.MULTILINE)


def _pins() -> dict[str, str]:
    return {
        canonicalize_name(name): version
        for name, version in _PIN.findall((REPO / "requirements.lock").read_text())
    }


def test_every_runtime_dependency_is_pinned_within_its_range() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = _pins()
    for spec in project["dependencies"]:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not in requirements.lock: run scripts/lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"requirements.lock pins {name}=={pins[name]}, outside {requirement.specifier}:"
            " run scripts/lock"
        )


def test_every_pin_carries_its_hashes() -> None:
    entries = re.split(r"\n(?=[A-Za-z0-9])", (REPO / "requirements.lock").read_text())
    pinned = [entry for entry in entries if _PIN.match(entry)]
    assert len(pinned) == len(_pins()) > 20
    for entry in pinned:
        assert "--hash=sha256:" in entry, f"no hash for {entry.splitlines()[0]}"
