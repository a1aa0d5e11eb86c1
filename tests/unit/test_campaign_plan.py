"""Which positions a launch writes: those no recorded chunk covers, in chunks."""

from __future__ import annotations

import pytest

from notifier.campaigns import CampaignError, unwritten


@pytest.mark.parametrize(
    ("last", "written", "chunk", "todo"),
    [
        (0, [], 10, []),
        (23, [], 10, [(0, 10), (10, 20), (20, 23)]),
        (23, [(1, 10)], 10, [(10, 20), (20, 23)]),
        (23, [(11, 20), (1, 10), (21, 23)], 10, []),
        (30, [(1, 7), (15, 21)], 5, [(7, 12), (12, 14), (21, 26), (26, 30)]),
        (5, [(1, 9)], 5, []),  # recorded beyond the last recipient: nothing to do
    ],
)
def test_a_launch_plans_only_the_positions_no_chunk_has_written(
    last: int, written: list[tuple[int, int]], chunk: int, todo: list[tuple[int, int]]
) -> None:
    assert unwritten(last, written, chunk) == todo


def test_a_chunk_holds_at_least_one_recipient() -> None:
    with pytest.raises(CampaignError, match="at least 1"):
        unwritten(10, [], 0)
