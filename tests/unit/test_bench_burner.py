"""``bench/burner.py``: the CPU load a figure measured beside a load is read against."""

from __future__ import annotations

import time

import pytest

from bench.burner import Burner
from bench.common import cpu_seconds, process_tree
from tests.server_process import process_gone


def _busy(pids: list[int]) -> float:
    return sum(cpu_seconds(pid) or 0.0 for pid in pids)


def test_a_burner_spins_in_its_own_processes_and_leaves_none_behind() -> None:
    with Burner(0.2) as burner:
        deadline = time.monotonic() + 60
        while len(tree := process_tree(burner.pid)) < 3:  # the parent and its two spinners
            assert time.monotonic() < deadline, "the spinners did not start"
            time.sleep(0.05)
        spinners = tree[1:]
        # each holds its CPU time to a tenth of the wall time since it began: it keeps spinning
        start = _busy(spinners)
        while _busy(spinners) < start + 0.05:
            assert time.monotonic() < deadline, "the spinners took no CPU"
            time.sleep(0.05)
    for pid in tree:
        deadline = time.monotonic() + 10
        while not process_gone(pid):
            assert time.monotonic() < deadline, f"process {pid} outlived the burner"
            time.sleep(0.05)


@pytest.mark.parametrize("cores", [0, -1, 2.5])
def test_a_burner_takes_up_to_one_core_a_process(cores: float) -> None:
    with pytest.raises(ValueError, match="cores must be in"):
        Burner(cores)
