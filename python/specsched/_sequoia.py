"""Sequoia-optimal trees: the hardware-aware `choose_tree` result as a named tuple.

The DP, the heap and `expected_accept_length` are Rust (`specsched._core`); this module only
names the fields of `choose_tree`'s answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from specsched import _core


class TreeChoice(NamedTuple):
    """The tree `choose_tree` picked and why."""

    choices: list[tuple[int, ...]]  # the tree as choice paths (root implicit)
    budget: int  # verify budget n (nodes, root included)
    depth: int  # depth limit d (draft forwards per step)
    expected_length: float  # expected tokens per step (bonus included)
    time_per_token: float  # (d * t_draft + t_verify[n]) / expected_length


def choose_tree(
    accept_probs: Any, t_draft: float, t_verify: Mapping[int, float], max_depth: int
) -> TreeChoice:
    """The (budget, depth) minimizing `(depth * t_draft + t_verify[budget]) / E[len]`.

    `accept_probs[r]`: probability that a reached node's rank-r child is accepted; `t_draft`:
    seconds per draft forward; `t_verify`: measured seconds of one target forward per budget
    (nodes, root included). One exact DP covers every budget and depth up to `max_depth`.
    """
    if not isinstance(t_verify, Mapping):
        raise TypeError(
            f"t_verify: expected a mapping {{budget: seconds}}, got {type(t_verify).__name__}"
        )
    return TreeChoice(*_core.choose_tree(accept_probs, t_draft, dict(t_verify), max_depth))
