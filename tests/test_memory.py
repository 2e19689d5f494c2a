"""Memory: repeated calls of every hot function leave the resident set flat, and returned
arrays own (or keep alive) their memory after the inputs and parent objects are gone.

Call counts: 10^5 for every call (layouts, walks over target tokens, plans, slots, tree
construction, and the calls that read logits or sample). Outputs are sized (32-node trees: a
1 KiB mask per call) so that a leak of one output per call would grow the resident set by
far more than the margin; the smallest output, a single tree's VerifyResult (~90 B), leaked
once per call, passes it too (a second control: at 2·10^4 calls and a 24 MiB margin it
stayed under). The measurements run in a fresh process:
in a long pytest session, memory earlier tests freed stays resident and would hide a leak.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import specsched as ss
from specsched import sglang

PAGE = os.sysconf("SC_PAGE_SIZE")
# Bytes of growth tolerated (allocator arenas, interned objects): every call here measures 0
# after its warm-up; a VerifyResult leaked per call (~90 B: the smallest output) grows ~9 MiB.
MARGIN = 4 << 20


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def _tree(n: int = 32) -> ss.Tree:
    rng = np.random.default_rng(0)
    parents = np.array([-1] + [int(rng.integers(max(0, i - 3), i)) for i in range(1, n)])
    return ss.Tree(parents, rng.integers(0, 3, n))


TREE = _tree()
BATCH = ss.TreeBatch([TREE] * 8)
N = TREE.num_nodes
V = 256
LOGITS = np.random.default_rng(1).normal(size=(N, V)).astype(np.float32)
TARGET = np.zeros(N, dtype=np.int64)
BTARGET = np.zeros(BATCH.num_nodes, dtype=np.int64)
RESULT = ss.verify(TREE, target_tokens=TARGET)
BRESULT = ss.verify(BATCH, target_tokens=BTARGET)
CACHE = np.zeros((2, N + 8, 16), dtype=np.float32)
SLOTS = np.arange(N, dtype=np.int64)
POOL_PARENTS = np.r_[-1, np.arange(0, 63)]
POOL_SCORES = -np.arange(1, 65, dtype=np.float64) / 64


def _sglang_inputs() -> tuple[Any, ...]:
    scores = [
        np.array([[-0.1, -0.2]], np.float32),
        np.array([[-0.3, -0.4, -0.5, -0.6]], np.float32),
    ]
    tokens = [np.array([[3, 4]]), np.array([[5, 6, 7, 8]])]
    parents = [np.array([[-1, 0]]), np.array([[0, 1]])]
    pl, sel, dt = sglang.organize_draft_results(scores, tokens, parents, 4)
    return scores, tokens, parents, pl, sel, dt


SG = _sglang_inputs()

CHEAP: dict[str, Callable[[], Any]] = {
    "Tree": lambda: ss.Tree(TREE.parents, TREE.tokens),
    "Tree.from_choices": lambda: ss.Tree.from_choices([(0,), (1,), (0, 0), (0, 1)]),
    "attention_mask": lambda: TREE.attention_mask(4),
    "attention_bias": lambda: TREE.attention_bias(4),
    "packed_mask": lambda: TREE.packed_mask(),
    "positions": lambda: TREE.positions(7),
    "paths": lambda: TREE.paths(),
    "sglang_links": lambda: TREE.sglang_links(),
    "batch.attention_mask": lambda: BATCH.attention_mask(2),
    "verify(target_tokens)": lambda: ss.verify(TREE, target_tokens=TARGET),
    "verify(batch, target_tokens)": lambda: ss.verify(BATCH, target_tokens=BTARGET),
    "kv_compaction_plan": lambda: ss.kv_compaction_plan(BRESULT, 3),
    "compact_kv": lambda: ss.compact_kv(CACHE, RESULT, 4, seq_dim=1),
    "commit_slots": lambda: ss.commit_slots(SLOTS, RESULT),
    "top_n_tree": lambda: ss.top_n_tree(POOL_PARENTS, POOL_SCORES, 16, cumulative=False),
    "sglang.build_tree_kernel_efficient": lambda: sglang.build_tree_kernel_efficient(
        np.array([1]), SG[3], SG[4], SG[5], np.array([5]), 5, 2, 2, 4
    ),
}

COSTLY: dict[str, Callable[[], Any]] = {
    "verify(logits)": lambda: ss.verify(TREE, LOGITS),
    "verify(sampled)": lambda: ss.verify(TREE, LOGITS, temperature=0.8, top_p=0.9, seed=5),
}


def _errors() -> None:
    """Error paths allocate messages and exceptions; they must not leak either."""
    try:
        ss.Tree([-1, 5], [1, 2])
    except ValueError:
        pass


CHEAP["error path (invalid tree)"] = _errors


def _flat_rss(call: Callable[[], Any], calls: int) -> int:
    for _ in range(min(calls, 2000)):  # warm-up: caches, arenas, thread pools
        call()
    gc.collect()
    before = rss()
    for _ in range(calls):
        call()
    gc.collect()
    return rss() - before


def _leaky(make: Callable[[], Any]) -> Callable[[], Any]:
    kept: list[Any] = []
    return lambda: kept.append(make())


def measure() -> dict[str, int]:
    """RSS growth per function (bytes). Runs in a fresh process (see `growth`), so memory that
    earlier tests freed but the allocator kept resident cannot absorb a leak."""
    out = {name: _flat_rss(call, 100_000) for name, call in CHEAP.items()}
    out |= {name: _flat_rss(call, 100_000) for name, call in COSTLY.items()}
    out["control: a leak of one output per call"] = _flat_rss(
        _leaky(lambda: TREE.attention_mask(4)), 100_000
    )
    out["control: a leak of one result per call"] = _flat_rss(
        _leaky(lambda: ss.verify(TREE, LOGITS)), 100_000
    )
    return out


@pytest.fixture(scope="module")
def growth() -> dict[str, int]:
    proc = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, int] = json.loads(proc.stdout)
    return result


@pytest.mark.parametrize("name", sorted(CHEAP))
def test_rss_flat_cheap(growth: dict[str, int], name: str) -> None:
    grown = growth[name]
    assert grown < MARGIN, f"{name}: RSS grew {grown / 2**20:.1f} MiB over 10^5 calls"


@pytest.mark.parametrize("name", sorted(COSTLY))
def test_rss_flat_costly(growth: dict[str, int], name: str) -> None:
    grown = growth[name]
    assert grown < MARGIN, f"{name}: RSS grew {grown / 2**20:.1f} MiB over 10^5 calls"


def test_rss_detects_a_leak(growth: dict[str, int]) -> None:
    """The measurement has teeth: keeping every output of 10^5 mask calls is seen, and so is
    keeping every result of 10^5 verify calls (the smallest output there is)."""
    assert growth["control: a leak of one output per call"] > MARGIN
    assert growth["control: a leak of one result per call"] > MARGIN


def _churn() -> None:
    """Allocate and free enough to reuse any memory freed by the deletions before."""
    junk = [np.full(1024, 0x5A, dtype=np.uint8) for _ in range(2000)]
    del junk
    gc.collect()


def test_tree_arrays_outlive_the_tree_and_inputs() -> None:
    parents = np.array([-1, 0, 0, 1, 1], dtype=np.int64)
    tokens = np.array([9, 8, 7, 6, 5], dtype=np.int64)
    t = ss.Tree(parents, tokens)
    p, k, d = t.parents, t.tokens, t.depths
    parents[:] = 99  # the tree holds its own copy: mutating the inputs changes nothing
    tokens[:] = -1
    del t, parents, tokens
    _churn()
    assert p.tolist() == [-1, 0, 0, 1, 1]
    assert k.tolist() == [9, 8, 7, 6, 5]
    assert d.tolist() == [0, 1, 1, 2, 2]
    assert not p.flags.writeable
    with pytest.raises(ValueError):
        p[0] = 3


def test_batch_arrays_outlive_the_batch() -> None:
    b = ss.TreeBatch([ss.Tree.chain([1, 2, 3]), ss.Tree.chain([4, 5])])
    offsets, parents, tree1 = b.offsets, b.parents, b[1]
    del b
    _churn()
    assert offsets.tolist() == [0, 3, 5]
    assert parents.tolist() == [-1, 0, 1, -1, 0]
    assert tree1.tokens.tolist() == [4, 5]


def test_result_arrays_outlive_the_result_and_logits() -> None:
    tree = ss.Tree.chain([0, 1, 2])
    logits = np.zeros((3, 4), dtype=np.float32)
    logits[0, 1] = logits[1, 2] = logits[2, 3] = 1.0
    r = ss.verify(tree, logits)
    acc, toks = r.accepted_nodes, r.tokens
    logits[:] = np.nan
    del r, logits, tree
    _churn()
    assert acc.tolist() == [0, 1, 2]
    assert toks.tolist() == [1, 2, 3]
    rb = ss.verify(ss.TreeBatch([ss.Tree.chain([0, 1])] * 2), target_tokens=[1, 5, 1, 5])
    num, row = rb.num_accepted, rb[1]
    del rb
    _churn()
    assert num.tolist() == [1, 1]
    assert row.accepted_nodes.tolist() == [0, 1]


def test_layout_outputs_own_their_memory() -> None:
    t = ss.Tree.chain([0, 1, 2, 3])
    mask, (nt, ns), paths = t.attention_mask(2), t.sglang_links(), t.paths()
    plan = ss.kv_compaction_plan(ss.verify(t, target_tokens=[1, 2, 9, 9]), 0)
    del t
    _churn()
    assert mask.sum() == 2 * 4 + 10
    assert nt.tolist() == [1, 2, 3, -1] and ns.tolist() == [-1, -1, -1, -1]
    assert paths.tolist() == [[0, 1, 2, 3]]
    assert [a.tolist() for a in plan] == [[], []]
    mask[0, 0] = False  # fresh outputs are writeable and owned
    assert mask.flags.writeable


if __name__ == "__main__":
    print(json.dumps(measure()))
