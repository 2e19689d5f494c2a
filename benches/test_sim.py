"""Monte-Carlo verification: 10^6 simulated steps of a 64-node EAGLE-like tree (iid acceptance
0.8, the first match in sibling order wins).

Contenders return the histogram of accepted draft counts:
- `rust`: `specsched.sim.simulate(tree, 0.8, 10**6, seed)` (the real verify walk, rayon over
  fixed 16384-step chunks, one xoshiro256++ stream per chunk);
- `reference`: `reference.sim_simulate`, the pure-Python twin; same streams, so its histogram
  is bit-identical to Rust's (checked). One round: it takes ~20 s;
- `numpy_peer`: what a peer would vectorize: all steps advance one level per iteration; per
  level, one uniform per still-active step, the child index from a comparison against the
  padded cumulative probabilities of the current node's children (`[active, K]`), a gather
  of the next node, and a filter of the steps that moved. Its generator is numpy's, so it is
  checked against the exact expectation within its confidence interval.
The tree, the probability tables and the padded child matrix are built outside the timed call.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import specsched as ss
from bench_inputs import eagle_parents, run
from specsched import reference as ref
from specsched import sim

STEPS = 10**6
ALPHA = 0.8
SEED = 7
CONTENDERS = ["rust", "reference", "numpy_peer"]


@functools.cache
def tree() -> ss.Tree:
    parents = eagle_parents(64, np.random.default_rng(3))
    return ss.Tree(parents, np.arange(64))


class NumpyPeer:
    """Per-node children padded to `[N, K]` (-1) and their cumulative pick probabilities
    (`inf` past the last child), from the same model as Rust's."""

    def __init__(self, t: ss.Tree, alpha: float) -> None:
        parents = t.parents.tolist()
        kids: list[list[int]] = [[] for _ in parents]
        for v in range(1, len(parents)):
            kids[parents[v]].append(v)
        k = max(len(c) for c in kids)
        self.child = np.full((len(parents), k + 1), -1, dtype=np.int64)
        self.cum = np.full((len(parents), k + 1), np.inf)
        for v, cs in enumerate(kids):
            acc = 0.0
            for r, c in enumerate(cs):
                acc += alpha * (1 - alpha) ** r
                self.child[v, r] = c
                self.cum[v, r] = acc
        self.depth = t.max_depth

    def __call__(self, steps: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        cur = np.zeros(steps, dtype=np.int64)
        accepted = np.zeros(steps, dtype=np.int64)
        active = np.arange(steps)
        while active.size:
            v = cur[active]
            u = rng.random(active.size)
            idx = (u[:, None] >= self.cum[v]).sum(axis=1)  # first child with cum > u
            nxt = self.child[v, idx]
            moved = nxt >= 0
            active = active[moved]
            cur[active] = nxt[moved]
            accepted[active] += 1
        return np.bincount(accepted, minlength=self.depth + 1)


def contender_fn(name: str):  # type: ignore[no-untyped-def]
    t = tree()
    if name == "rust":
        return lambda: sim.simulate(t, ALPHA, STEPS, SEED).histogram
    if name == "reference":
        parents = t.parents.tolist()
        return lambda: np.asarray(ref.sim_simulate(parents, "iid", [ALPHA], STEPS, SEED))
    peer = NumpyPeer(t, ALPHA)
    return lambda: peer(STEPS, SEED)


@pytest.mark.parametrize("contender", CONTENDERS)
def test_simulate(benchmark, contender: str) -> None:  # type: ignore[no-untyped-def]
    t = tree()
    benchmark.group = f"simulate 10^6 steps, 64-node tree (depth {t.max_depth}), iid {ALPHA}"
    hist = run(benchmark, contender_fn(contender), rounds=1 if contender == "reference" else None)
    assert hist.sum() == STEPS
    rust = sim.simulate(t, ALPHA, STEPS, SEED)
    if contender == "reference":
        np.testing.assert_array_equal(hist, rust.histogram)
    else:
        peer = sim.SimResult(STEPS, hist, SEED)
        exact = sim.expected_accept_length(t, ALPHA)
        half = (peer.ci95[1] - peer.ci95[0]) / 2
        assert abs(peer.mean_tokens - exact) < 2 * half + 1e-12
