"""Hypothesis strategies shared by the test suite: random trees, batches and index arrays.

Trees are generated as parent lists (`parents[i]` uniform in `[0, i)`, or biased towards deep
chains / wide stars), so every valid shape is reachable, including single-node trees.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import strategies as st

INDEX_DTYPES = (np.int32, np.int64)
TOKEN_DTYPES = (np.int32, np.int64, np.uint32)


@st.composite
def parent_lists(draw: st.DrawFn, min_nodes: int = 1, max_nodes: int = 64) -> list[int]:
    """A valid parent list: `[-1]` then `parents[i] in [0, i)`; shapes from chains to stars."""
    n = draw(st.integers(min_nodes, max_nodes))
    shape = draw(st.sampled_from(["uniform", "chain", "star", "recent"]))
    parents = [-1]
    for i in range(1, n):
        if shape == "chain":
            p = i - 1 if draw(st.integers(0, 9)) else draw(st.integers(0, i - 1))
        elif shape == "star":
            p = 0 if draw(st.integers(0, 9)) else draw(st.integers(0, i - 1))
        elif shape == "recent":
            p = draw(st.integers(max(0, i - 3), i - 1))
        else:
            p = draw(st.integers(0, i - 1))
        parents.append(p)
    return parents


@st.composite
def trees(draw: st.DrawFn, min_nodes: int = 1, max_nodes: int = 64, vocab: int = 8):
    """`(parents, tokens)` lists; a small vocabulary makes sibling collisions and matches common."""
    parents = draw(parent_lists(min_nodes, max_nodes))
    tokens = draw(st.lists(st.integers(0, vocab - 1), min_size=len(parents), max_size=len(parents)))
    return parents, tokens


@st.composite
def batches(draw: st.DrawFn, max_trees: int = 8, max_nodes: int = 32, vocab: int = 8):
    """`(parents, tokens, offsets)` flat lists of a ragged batch (tree-local parents)."""
    b = draw(st.integers(1, max_trees))
    parents: list[int] = []
    tokens: list[int] = []
    offsets = [0]
    for _ in range(b):
        p, t = draw(trees(1, max_nodes, vocab))
        parents += p
        tokens += t
        offsets.append(len(parents))
    return parents, tokens, offsets


def as_array(values: list[int], dtype: type, strided: bool) -> np.ndarray:
    """`values` as an array of `dtype`; `strided` gives a non-contiguous view of the same values."""
    if not strided:
        return np.asarray(values, dtype=dtype)
    backing = np.zeros(2 * len(values), dtype=dtype)
    backing[::2] = values
    view = backing[::2]
    assert not view.flags.c_contiguous or len(values) <= 1
    return view


def index_arrays():
    """`(dtype, strided)` choices for index and token inputs."""
    return st.tuples(st.sampled_from(INDEX_DTYPES), st.booleans())


# The published EAGLE / Medusa trees, copied from the project's read-only shared/data (beside
# the checkout in CI, absent from a plain clone) so that the suite runs from the repository
# alone; tests/test_tree.py checks the copy against shared/ wherever that is present.
PUBLISHED_TREES = Path(__file__).with_name("data") / "published_trees.json"
SHARED_PUBLISHED_TREES = (
    Path(__file__).resolve().parents[2] / "shared" / "data" / "published_trees.json"
)


# A 5-node tree used by hand-checked cases:
#                   0
#                 /   \
#                1     2        tokens: 100, 11, 12, 13, 14
#               / \
#              3   4
P5 = [-1, 0, 0, 1, 1]
T5 = [100, 11, 12, 13, 14]


def children(parents: list[int]) -> list[list[int]]:
    """Children of every node, in increasing index."""
    kids: list[list[int]] = [[] for _ in parents]
    for i in range(1, len(parents)):
        kids[parents[i]].append(i)
    return kids
