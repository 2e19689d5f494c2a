"""Input builders shared by the benchmarks: EAGLE-like random trees, batches, target choices.

A plain module the bench files import (conftest files are not meant for importing), like
tests/strategies.py. Every builder takes a seed and is called outside the timed code.

Trees look like the dynamic trees EAGLE-2 drafts: each node's parent is uniform among the
earlier nodes still shallower than the tree's depth cap (5..10), so trees are bushy near the
root and 5-10 deep at 64-128 nodes. Sibling tokens are distinct (a draft proposes each token
once per parent), which makes the accepted path unique: the walk and the peers' "longest
matching root-to-leaf path" then give the same answer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import specsched as ss

VOCAB = 32000
# Probability that the target's choice at a node is the token of that node's first child.
ACCEPT_P = 0.7


def eagle_parents(n: int, rng: np.random.Generator) -> list[int]:
    """Parents of an n-node tree: each parent uniform among earlier nodes of depth < cap."""
    cap = int(rng.integers(5, 11))
    parents = [-1]
    depth = [0]
    open_nodes = [0]  # nodes that may still get children (depth < cap)
    for i in range(1, n):
        p = open_nodes[int(rng.integers(len(open_nodes)))]
        parents.append(p)
        depth.append(depth[p] + 1)
        if depth[i] < cap:
            open_nodes.append(i)
    return parents


def first_children(parents: list[int]) -> list[int]:
    """Lowest-index child of every node, -1 for a leaf."""
    out = [-1] * len(parents)
    for i in range(len(parents) - 1, 0, -1):
        out[parents[i]] = i
    return out


def target_choices(
    parents: list[int], tokens: list[int], rng: np.random.Generator, vocab: int = VOCAB
) -> list[int]:
    """The target's greedy token at every node: the first child's token with probability
    ACCEPT_P, otherwise a random token (a rejection, or the bonus at a leaf)."""
    out = []
    for fc in first_children(parents):
        if fc >= 0 and rng.random() < ACCEPT_P:
            out.append(tokens[fc])
        else:
            out.append(int(rng.integers(vocab)))
    return out


@dataclass
class Batch:
    """B trees of N nodes each, in every form a contender wants.

    `parents`, `tokens` and `offsets` are the flat CSR arrays `TreeBatch.from_flat` takes;
    `padded_parents` / `sizes` are the `[B, Nmax]` layout the vectorized peers work on; the
    `*_list` fields are the plain lists the pure-Python reference takes.
    """

    parents: np.ndarray  # int64 [T], tree-local
    tokens: np.ndarray  # int64 [T]
    offsets: np.ndarray  # int64 [B + 1]
    prefix_lens: np.ndarray  # int64 [B]
    choices: np.ndarray  # int64 [T], the target's greedy token per node
    padded_parents: np.ndarray  # int64 [B, Nmax], -1 at roots and padding
    sizes: np.ndarray  # int64 [B]

    @property
    def num_trees(self) -> int:
        return len(self.sizes)

    def tree_batch(self) -> ss.TreeBatch:
        return ss.TreeBatch.from_flat(self.parents, self.tokens, self.offsets)

    def lists(self) -> dict[str, list[int]]:
        return {
            "parents": self.parents.tolist(),
            "tokens": self.tokens.tolist(),
            "offsets": self.offsets.tolist(),
            "prefix_lens": self.prefix_lens.tolist(),
            "choices": self.choices.tolist(),
        }


def make_batch(sizes: list[int], seed: int, vocab: int = VOCAB) -> Batch:
    """A batch of EAGLE-like trees with the given node counts (ragged if they differ)."""
    rng = np.random.default_rng(seed)
    parents: list[int] = []
    tokens: list[int] = []
    choices: list[int] = []
    nmax = max(sizes)
    padded = np.full((len(sizes), nmax), -1, dtype=np.int64)
    for b, n in enumerate(sizes):
        p = eagle_parents(n, rng)
        t = rng.choice(vocab, size=n, replace=False).tolist()  # distinct, so siblings differ
        parents += p
        tokens += t
        choices += target_choices(p, t, rng, vocab)
        padded[b, :n] = p
    return Batch(
        parents=np.asarray(parents, dtype=np.int64),
        tokens=np.asarray(tokens, dtype=np.int64),
        offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
        prefix_lens=rng.integers(100, 4000, size=len(sizes)).astype(np.int64),
        choices=np.asarray(choices, dtype=np.int64),
        padded_parents=padded,
        sizes=np.asarray(sizes, dtype=np.int64),
    )


@functools.cache
def uniform_batch(num_trees: int, num_nodes: int) -> Batch:
    """B trees of N nodes, seeded by the size; built once per session (callers must not mutate)."""
    return make_batch([num_nodes] * num_trees, seed=1000 * num_trees + num_nodes)


def run(benchmark: Any, fn: Callable[[], Any], *, rounds: int | None = None) -> Any:
    """Time `fn()` and return its result (for the equality checks that follow).

    `rounds=None` lets pytest-benchmark calibrate; an int pins that many single-call rounds,
    for pure-Python reference runs that take a large fraction of a second each. With
    `--benchmark-disable` either way calls `fn` exactly once.
    """
    if rounds is None:
        return benchmark(fn)
    return benchmark.pedantic(fn, rounds=rounds, iterations=1, warmup_rounds=0)
