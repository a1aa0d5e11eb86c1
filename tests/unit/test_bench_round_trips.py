"""The benchmarks' ``--round-trip``: what it takes, and the command it runs again."""

from __future__ import annotations

import argparse

import pytest

from bench.harness import milliseconds
from bench.testhost import without_round_trip


def test_round_trips_are_positive_milliseconds() -> None:
    assert milliseconds("0.6, 2") == [0.6, 2.0]
    for bad in ("", "0", "-1", "2ms", "1,,x"):
        with pytest.raises(argparse.ArgumentTypeError):
            milliseconds(bad)


@pytest.mark.parametrize(
    ("given", "again"),
    [
        (["--rows", "10", "--round-trip", "1,2"], ["--rows", "10"]),
        (["--round-trip=2", "--set", "BATCH_SIZE=5"], ["--set", "BATCH_SIZE=5"]),
        (["--keep"], ["--keep"]),
    ],
)
def test_the_run_against_a_host_is_the_same_command_without_round_trip(
    given: list[str], again: list[str]
) -> None:
    assert without_round_trip(given) == again
