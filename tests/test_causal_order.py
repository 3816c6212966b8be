"""The causal launch-order model notebook 02 uses: each causal query block's key blocks
(v3's loop bound), launch orders, and the list-scheduling makespan."""
from __future__ import annotations

import pytest

from workbench.views import causal_order


def test_key_blocks_stop_at_each_blocks_diagonal_and_at_s_k():
    assert causal_order.key_blocks(100, 90, 32, 16) == [2, 4, 6, 6]   # S_k's 6 blocks cap the last
    assert causal_order.key_blocks(40, 100, 32, 16) == [2, 4]          # the kernel bounds by rows, not S
    assert causal_order.key_blocks(4096, 4096, 128, 64) == [2 * (i + 1) for i in range(32)]


def test_orders_within_a_head_and_across_heads():
    assert causal_order.within_head(5, "v4") == [0, 1, 2, 3, 4]
    assert causal_order.within_head(5, "longest_first") == [4, 3, 2, 1, 0]
    assert causal_order.within_head(5, "zigzag") == [4, 0, 3, 1, 2]
    assert causal_order.within_head(4, "zigzag") == [3, 0, 2, 1]
    assert causal_order.launch_work([1, 2, 3], 2, "v4") == [1, 2, 3, 1, 2, 3]
    assert causal_order.launch_work([1, 2, 3], 2, "longest_first") == [3, 2, 1, 3, 2, 1]
    assert causal_order.launch_work([1, 2, 3], 2, "lpt") == [3, 3, 2, 2, 1, 1]


def test_makespan_is_list_scheduling_in_launch_order():
    assert causal_order.makespan([1, 1, 2], 2) == 3    # the long program starts last
    assert causal_order.makespan([2, 1, 1], 2) == 2    # longest first fills the gap
    assert causal_order.makespan([5, 1, 1], 8) == 5    # more slots than programs
    assert causal_order.makespan([], 4) == 0


@pytest.mark.parametrize("call,name", [
    (lambda: causal_order.key_blocks(0, 8, 4, 4), "s"),
    (lambda: causal_order.key_blocks(8, 8, 4, 0), "block_n"),
    (lambda: causal_order.makespan([1], 0), "slots"),
    (lambda: causal_order.within_head(3, "lpt"), "order"),
    (lambda: causal_order.launch_work([1], 2, "random"), "order"),
])
def test_bad_arguments_are_named(call, name):
    with pytest.raises(ValueError, match=name):
        call()
