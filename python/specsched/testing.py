"""Workload builders shared by the CLI, the benchmarks and the tests.

Trees shaped like EAGLE's dynamic trees (a few candidates per level, depth ~5-8) and target
outputs with a controllable acceptance rate, all seeded so runs are comparable.
"""

from __future__ import annotations

import numpy as np


def eagle_like_parents(num_nodes: int, rng: np.random.Generator, branching: int = 4) -> np.ndarray:
    """Tree-local parents of an EAGLE-like tree: node i hangs under one of the `branching`
    nodes before it, so depth grows roughly as N / branching while siblings stay common."""
    parents = np.empty(num_nodes, dtype=np.int32)
    parents[0] = -1
    for i in range(1, num_nodes):
        parents[i] = rng.integers(max(0, i - branching), i)
    return parents


def random_batch(
    num_trees: int, num_nodes: int, vocab: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flat `(parents int32, tokens int64, offsets int64)` of `num_trees` EAGLE-like trees."""
    rng = np.random.default_rng(seed)
    parents = np.concatenate([eagle_like_parents(num_nodes, rng) for _ in range(num_trees)])
    tokens = rng.integers(0, vocab, size=num_trees * num_nodes, dtype=np.int64)
    offsets = np.arange(num_trees + 1, dtype=np.int64) * num_nodes
    return parents, tokens, offsets


def target_choices(
    parents: np.ndarray,
    tokens: np.ndarray,
    offsets: np.ndarray,
    vocab: int,
    accept_rate: float = 0.7,
    seed: int = 0,
) -> np.ndarray:
    """A target choice per node: with probability `accept_rate` the token of one of the node's
    children (so the walk goes deeper), otherwise a random token."""
    rng = np.random.default_rng(seed)
    choice = rng.integers(0, vocab, size=len(parents), dtype=np.int64)
    for b in range(len(offsets) - 1):
        start, end = int(offsets[b]), int(offsets[b + 1])
        children: dict[int, list[int]] = {}
        for local in range(1, end - start):
            children.setdefault(int(parents[start + local]), []).append(local)
        for v, kids in children.items():
            if rng.random() < accept_rate:
                choice[start + v] = tokens[start + kids[rng.integers(len(kids))]]
    return choice


def logits_with_choices(choice: np.ndarray, vocab: int, seed: int = 0) -> np.ndarray:
    """float32 logits `[T, vocab]` whose row argmax is `choice` (random elsewhere)."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((len(choice), vocab), dtype=np.float32)
    logits[np.arange(len(choice)), choice] = 10.0
    return logits
