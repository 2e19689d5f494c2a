"""Tree construction: SGLang's tree build, Sequoia's DP and heap, and EAGLE-2 dynamic drafting.

Groups (one per kernel and size), each with Rust, the pure-Python reference where it finishes
in reasonable time, and the vectorized peer a serving engineer would write:
- "sglang build bs=64 N=64 QLEN": `specsched.sglang.build_tree_kernel_efficient` in QLEN_ONLY
  mode into preallocated buffers (as SGLang's CUDA-graph path passes them; `rust_alloc` lets
  it allocate), vs a numpy port of sgl-kernel's `build_tree_efficient` (parents by sorted
  search, ancestors by climbing one level per step for all nodes at once) and the reference.
  Inputs: a topk=8, 4-step SGLang draft (pool of 200 per request), organized outside the timer.
  `write_floor` only fills the same outputs (the 256 KiB mask and four int64 `[bs, N]`
  arrays) with numpy's `fill`: the memory traffic any implementation pays, for scale.
- "sequoia dp budget=128 depth=16": the exact DP for a non-monotone 32-rank vector, vs the
  same recurrence in numpy (vectorized over the split for every size at once).
- "sequoia heap budget=128 depth=16": the greedy heap for a non-increasing vector, vs a
  `heapq` peer and the reference's quadratic best-first growth.
- "dynamic B={1,64} K=8 depth=6 budget=64": `DynamicTreeBuilder` start + 5 expands + build,
  vs the reference class and a batched torch formulation in the style of EAGLE's
  `topK_genrate` bookkeeping (topk over K² children, gathered mask rows, final rerank).
  `rust_in_place` is the decode loop's form: one builder per batch, the roots and each level's
  top-k copied into its `buffers` (in the timer) and `start_in_place` / `expand_in_place`
  writing there.
Every contender's result is checked against Rust's after timing.
"""

from __future__ import annotations

import heapq

import numpy as np
import pytest
import specsched as ss
from bench_inputs import run
from specsched import reference as ref
from specsched import sglang as sg
from specsched.testing import sglang_draft

# ---------------------------------------------------------------------------------------------
# SGLang build


def numpy_sglang_build(parent_list, sel, seq_lens, topk, n):
    """sgl-kernel `build_tree_efficient` (QLEN_ONLY) vectorized over the batch in numpy."""
    bs = sel.shape[0]
    tb = sel // topk
    pg = np.take_along_axis(parent_list, tb, axis=1)
    # Global search keys: row b's sorted selection shifted by b * big stays sorted overall.
    big = parent_list.max() + sel.max() + 2
    shift = (np.arange(bs) * big)[:, None]
    pos = np.searchsorted((sel + shift).ravel(), (pg + shift).ravel()).reshape(bs, n - 1)
    parent = np.zeros((bs, n), dtype=np.int64)
    parent[:, 1:] = np.where(tb == 0, 0, pos - np.arange(bs)[:, None] * (n - 1) + 1)
    # Climb: every node marks its current ancestor and moves one level up per step.
    mask = np.zeros((bs, n, n), dtype=bool)
    rows = np.arange(bs)[:, None]
    nodes = np.arange(n)[None, :]
    cur = np.broadcast_to(nodes, (bs, n)).copy()
    depth = np.zeros((bs, n), dtype=np.int64)
    alive = np.ones((bs, n), dtype=bool)
    while alive.any():
        mask[rows, nodes, cur] |= alive
        up = np.take_along_axis(parent, cur, axis=1)
        alive &= cur != 0
        depth += alive
        cur = np.where(alive, up, cur)
    positions = (seq_lens[:, None] + depth).ravel()
    retrive_index = np.arange(bs * n).reshape(bs, n)
    next_token = np.full((bs, n), -1, dtype=np.int64)
    rev = np.arange(n - 1, 0, -1)
    next_token[rows, parent[:, rev]] = rev  # last write wins: the lowest child index
    # Next sibling: nodes sorted by (parent, index); consecutive equal parents are siblings.
    order = np.argsort(parent[:, 1:] * n + np.arange(1, n), axis=1) + 1
    par_sorted = np.take_along_axis(parent, order, axis=1)
    next_sibling = np.full((bs, n), -1, dtype=np.int64)
    same = par_sorted[:, 1:] == par_sorted[:, :-1]
    vals = np.where(same, order[:, 1:], -1)
    next_sibling[rows, order[:, :-1]] = vals
    return mask.ravel(), positions, retrive_index, next_token, next_sibling


SGLANG = ["rust", "rust_alloc", "numpy_peer", "reference", "write_floor"]


@pytest.mark.parametrize("contender", SGLANG)
def test_sglang_build(benchmark, contender):
    bs, topk, steps, n = 64, 8, 4, 64
    benchmark.group = f"sglang build bs={bs} N={n} QLEN"
    score_list, token_list, parents_list = sglang_draft(np.random.default_rng(5), bs, topk, steps)
    pl, sel, draft = sg.organize_draft_results(score_list, token_list, parents_list, n)
    seq = np.random.default_rng(1).integers(100, 2000, size=bs)
    vid = np.arange(bs)
    total = int(seq.sum())
    mode = sg.TreeMaskMode.QLEN_ONLY
    if contender in ("rust", "rust_alloc"):
        mask_buf = np.empty(bs * n * n, dtype=bool) if contender == "rust" else None
        pos_buf = np.empty(bs * n, dtype=np.int64) if contender == "rust" else None

        def fn():
            return sg.build_tree_kernel_efficient(
                vid, pl, sel, draft, seq, total, topk, steps, n, mode, mask_buf, pos_buf
            )[:5]

        got = run(benchmark, fn)
    elif contender == "write_floor":
        outs = np.empty(bs * n * n, dtype=bool), np.empty((4, bs * n), dtype=np.int64)

        def fill():
            outs[0].fill(False)
            outs[1].fill(-1)

        benchmark(fill)
        return
    elif contender == "numpy_peer":
        got = run(benchmark, lambda: numpy_sglang_build(pl, sel, seq, topk, n))
    else:
        lists = pl.tolist(), sel.tolist(), seq.tolist()
        got = run(benchmark, lambda: ref.sglang_build_tree(*lists, topk, n, 1), rounds=3)
    want = sg.build_tree_kernel_efficient(vid, pl, sel, draft, seq, total, topk, steps, n, mode)
    for g, w in zip(got, want[:5], strict=True):
        np.testing.assert_array_equal(np.asarray(g).ravel(), np.asarray(w).ravel())


# ---------------------------------------------------------------------------------------------
# Sequoia

DP_PROBS = np.random.default_rng(3).uniform(0.0, 0.6, size=32)  # arbitrary, non-monotone
HEAP_PROBS = np.sort(DP_PROBS)[::-1].copy()
BUDGET, DEPTH = 128, 16


def numpy_dp(p: np.ndarray, n: int, depth: int) -> float:
    """Sequoia's recurrence in numpy: for each level and rank, the best split of every size at
    once (an [n, n] candidate matrix, max over the split)."""
    ranks = min(len(p), n - 1)
    t = np.ones(n + 1)
    t[0] = 0.0
    m_idx = np.arange(n + 1)[:, None]
    y_idx = np.arange(n + 1)[None, :]
    for _ in range(depth):
        below = t
        g_prev = np.zeros(n + 1)
        best = np.zeros(n + 1)
        for b in range(1, ranks + 1):
            rest = m_idx - y_idx  # nodes left for ranks 0..b-2
            ok = (y_idx >= 1) & (rest >= b - 1)
            cand = np.where(ok, g_prev[np.clip(rest, 0, n)] + p[b - 1] * below[None, :], -np.inf)
            g = cand.max(axis=1)
            g[:b] = -np.inf
            best = np.maximum(best, g)
            g_prev = g
        t = np.concatenate(([0.0], 1.0 + best[:-1]))
    return float(t[n])


@pytest.mark.parametrize("contender", ["rust", "numpy_peer"])
def test_sequoia_dp(benchmark, contender):
    benchmark.group = f"sequoia dp budget={BUDGET} depth={DEPTH}"
    p = DP_PROBS
    if contender == "rust":
        value = run(benchmark, lambda: ss.optimal_tree(p, BUDGET, DEPTH, method="dp"))[1]
        want = numpy_dp(p, BUDGET, DEPTH)  # each checked against the other implementation
    else:
        value = run(benchmark, lambda: numpy_dp(p, BUDGET, DEPTH))
        want = ss.optimal_tree(p, BUDGET, DEPTH, method="dp")[1]
    assert value == pytest.approx(want, rel=1e-9)


def heapq_peer(p: list[float], n: int, depth: int) -> float:
    """Best-first growth with heapq: pop the best node, offer its first child and next sibling."""
    heap = [(-p[0], 1, 0, 1.0)]  # (-value, depth, rank, parent value)
    total, size = 1.0, 1
    while heap and size < n:
        neg, d, r, pv = heapq.heappop(heap)
        total -= neg
        size += 1
        if r + 1 < len(p):
            heapq.heappush(heap, (-pv * p[r + 1], d, r + 1, pv))
        if d < depth:
            heapq.heappush(heap, (neg * p[0], d + 1, 0, -neg))
    return total


@pytest.mark.parametrize("contender", ["rust", "heapq_peer", "reference"])
def test_sequoia_heap(benchmark, contender):
    benchmark.group = f"sequoia heap budget={BUDGET} depth={DEPTH}"
    p = HEAP_PROBS
    plist = p.tolist()
    if contender == "rust":
        value = run(benchmark, lambda: ss.optimal_tree(p, BUDGET, DEPTH, method="heap"))[1]
    elif contender == "heapq_peer":
        value = run(benchmark, lambda: heapq_peer(plist, BUDGET, DEPTH))
    else:
        value = run(benchmark, lambda: ref.optimal_tree_heap(plist, BUDGET, DEPTH)[1], rounds=3)
    # The exact DP, in numpy: optimal for any vector, so the heap must reach its value.
    assert value == pytest.approx(numpy_dp(p, BUDGET, DEPTH), rel=1e-9)


# ---------------------------------------------------------------------------------------------
# Dynamic EAGLE-2 drafting

K, LEVELS, NODES = 8, 6, 64


def dynamic_inputs(batch: int, seed: int):
    """Per-step draft outputs: continuous log probabilities (no ties), sorted like a top-k."""
    rng = np.random.default_rng(seed)
    roots = rng.integers(0, 32000, size=batch)
    tok0 = rng.integers(0, 32000, size=(batch, K))
    lp0 = -np.sort(rng.exponential(size=(batch, K)), axis=-1).astype(np.float32)
    steps = []
    for _ in range(LEVELS - 1):
        tok = rng.integers(0, 32000, size=(batch, K, K))
        lp = -np.sort(rng.exponential(size=(batch, K, K)), axis=-1).astype(np.float32)
        steps.append((tok, lp))
    return roots, tok0, lp0, steps


def rust_dynamic(batch, roots, tok0, lp0, steps):
    b = ss.DynamicTreeBuilder(batch, K, LEVELS, NODES)
    b.start(roots, tok0, lp0)
    for tok, lp in steps:
        b.expand(tok, lp)
    tb, idx = b.build()
    return tb.parents, tb.tokens, idx


def rust_dynamic_in_place(b, roots, tok0, lp0, steps):
    buf = b.buffers
    buf.topk_tokens[:, 0], buf.topk_logprobs[:, 0] = tok0, lp0
    buf.root_tokens[:] = roots
    b.start_in_place()
    for tok, lp in steps:
        buf.topk_tokens[:], buf.topk_logprobs[:] = tok, lp
        b.expand_in_place()
    tb, idx = b.build()
    return tb.parents, tb.tokens, idx


def reference_dynamic(batch, roots, tok0, lp0, steps):
    b = ref.DynamicTreeBuilder(batch, K, LEVELS, NODES)
    b.start(roots, tok0, lp0)
    for tok, lp in steps:
        b.expand(tok, lp)
    return b.build()


def torch_dynamic(torch, batch, roots, tok0, lp0, steps):
    """EAGLE `topK_genrate` bookkeeping, batched: cumulative scores, topk of K² children per
    step, mask rows gathered from the parents' rows, then a global rerank of the pool."""
    scores = lp0
    frontier = torch.arange(K).expand(batch, K)  # pool ids of the frontier
    score_pool, token_pool, parent_pool = [lp0], [tok0], [torch.full((batch, K), -1)]
    mask = torch.eye(K, dtype=torch.bool).expand(batch, K, K)
    base = K
    for tok, lp in steps:
        cu = (scores[:, :, None] + lp).reshape(batch, K * K)
        top = torch.topk(cu, K, dim=-1)
        slot = top.indices // K
        scores = top.values
        score_pool.append(cu)
        token_pool.append(tok.reshape(batch, K * K))
        parent_pool.append(frontier.repeat_interleave(K, dim=1))
        rows = torch.gather(mask, 1, slot[:, :, None].expand(-1, -1, mask.shape[2]))
        mask = torch.cat((rows, torch.eye(K, dtype=torch.bool).expand(batch, K, K)), dim=2)
        frontier = base + top.indices
        base += K * K
    all_scores = torch.cat(score_pool, dim=1)
    chosen = torch.sort(torch.topk(all_scores, NODES - 1, dim=-1).indices, dim=-1).values
    par = torch.gather(torch.cat(parent_pool, dim=1), 1, chosen)
    node = torch.searchsorted(chosen, par.clamp(min=0)) + 1
    parents = torch.cat((torch.full((batch, 1), -1), torch.where(par < 0, 0, node)), dim=1)
    tokens = torch.cat((roots[:, None], torch.gather(torch.cat(token_pool, 1), 1, chosen)), 1)
    return parents, tokens, chosen


@pytest.mark.parametrize("contender", ["rust", "rust_in_place", "torch_peer", "reference"])
@pytest.mark.parametrize("batch", [1, 64])
def test_dynamic_builder(benchmark, batch, contender):
    benchmark.group = f"dynamic B={batch} K={K} depth={LEVELS} budget={NODES}"
    roots, tok0, lp0, steps = dynamic_inputs(batch, seed=batch)
    want = rust_dynamic(batch, roots, tok0, lp0, steps)
    if contender == "rust":
        got = run(benchmark, lambda: rust_dynamic(batch, roots, tok0, lp0, steps))
    elif contender == "rust_in_place":
        b = ss.DynamicTreeBuilder(batch, K, LEVELS, NODES)
        got = run(benchmark, lambda: rust_dynamic_in_place(b, roots, tok0, lp0, steps))
    elif contender == "torch_peer":
        torch = pytest.importorskip("torch")
        t_args = [torch.from_numpy(a) for a in (roots, tok0, lp0)]
        t_steps = [(torch.from_numpy(t), torch.from_numpy(lp)) for t, lp in steps]
        got = run(benchmark, lambda: torch_dynamic(torch, batch, *t_args, t_steps))
    else:
        args = (roots.tolist(), tok0.tolist(), lp0.tolist())
        l_steps = [(t.tolist(), lp.tolist()) for t, lp in steps]
        got = run(benchmark, lambda: reference_dynamic(batch, *args, l_steps), rounds=3)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g).ravel(), np.asarray(w).ravel())
