"""Top-N tree selection (`ss.top_n_tree`) and the batched EAGLE-2 `ss.DynamicTreeBuilder`,
against the plain-Python twins in `specsched.reference`.

Pools are generated with coarse log scores so ties are common: the selection must still be the
reference's (higher score, then shallower, then lower pool index) and ancestor-closed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import specsched as ss
from hypothesis import event, given, settings
from hypothesis import strategies as st
from specsched import reference as ref

EDGE_LOGPROBS = [0.0, -0.5, -1.0, -2.0, -math.inf]


@st.composite
def pools(draw: st.DrawFn, max_size: int = 40):
    """`(parents, edge log scores, tokens)` of a candidate pool; parents precede children."""
    m = draw(st.integers(0, max_size))
    parents = [draw(st.integers(-1, i - 1)) for i in range(m)]
    edges = [draw(st.sampled_from(EDGE_LOGPROBS)) for _ in range(m)]
    tokens = [draw(st.integers(0, 5)) for _ in range(m)]
    return parents, edges, tokens


def cumulative(parents: list[int], edges: list[float]) -> list[float]:
    out: list[float] = []
    for p, e in zip(parents, edges, strict=True):
        out.append(e if p == -1 else out[p] + e)
    return out


@settings(max_examples=150, deadline=None)
@given(
    pools(),
    st.data(),
    st.sampled_from([np.int32, np.int64]),
    st.sampled_from([np.float32, np.float64]),
)
def test_top_n_matches_reference_and_is_ancestor_closed(pool, data, pdt, sdt):
    parents, edges, tokens = pool
    budget = data.draw(st.integers(1, len(parents) + 1))
    cum = cumulative(parents, edges)
    for scores, is_cum in ((cum, True), (edges, False)):
        tree, idx = ss.top_n_tree(
            np.asarray(parents, dtype=pdt),
            np.asarray(scores, dtype=sdt),
            budget,
            tokens=np.asarray(tokens, dtype=np.int64),
            root_token=99,
            cumulative=is_cum,
        )
        # f32 rounding of sums could reorder near-ties; the coarse scores here are exact in f32.
        want_p, want_t, want_idx = ref.top_n_tree(parents, scores, budget, tokens, 99, is_cum)
        assert tree.parents.tolist() == want_p
        assert tree.tokens.tolist() == want_t
        assert idx.tolist() == want_idx
        chosen = set(idx.tolist())
        assert all(parents[g] == -1 or parents[g] in chosen for g in chosen)
        assert idx.dtype == np.int64 and tree.num_nodes == budget


def test_top_n_ties_prefer_shallower_then_pool_index():
    # Candidates 0 and 1 under the root, 2 under 0, all with the same cumulative score.
    tree, idx = ss.top_n_tree([-1, -1, 0], [-1.0, -1.0, -1.0], 3)
    assert idx.tolist() == [0, 1]
    tree, idx = ss.top_n_tree([-1, 0, -1], [-1.0, -1.0, -1.0], 3)
    assert idx.tolist() == [0, 2]
    assert tree.parents.tolist() == [-1, 0, 0]
    # Without tokens every node carries its pool index; the root carries root_token.
    assert tree.tokens.tolist() == [0, 0, 2]


@pytest.mark.parametrize(
    ("parents", "scores", "budget", "exc", "match"),
    [
        ([-1, -1], [-1.0, math.nan], 2, ValueError, r"scores\[1\].*candidate 1"),
        ([-1, -1], [-1.0, math.inf], 2, ValueError, r"candidate 1"),
        ([-1, -1], [-1.0, 0.5], 2, ValueError, r"scores\[1\]"),
        ([-1, 1], [-1.0, -1.0], 2, ValueError, r"parents\[1\] = 1"),
        ([-1, 5], [-1.0, -1.0], 2, ValueError, r"parents\[1\] = 5"),
        ([-1, -2], [-1.0, -1.0], 2, ValueError, r"parents\[1\] = -2"),
        ([-1, 0], [-1.0, -0.5], 2, ValueError, r"above its parent"),
        ([-1, 0], [-1.0, -2.0], 4, ValueError, r"budget"),
        ([-1, 0], [-1.0, -2.0], 0, ValueError, r"budget"),
        ([-1, 0], [-1.0], 2, ValueError, r"scores"),
        ([-1.0, 0.0], [-1.0, -2.0], 2, TypeError, r"parents"),
        ([-1, 0], [1, 2], 2, TypeError, r"scores"),
    ],
)
def test_top_n_bad_input(parents, scores, budget, exc, match):
    with pytest.raises(exc, match=match):
        ss.top_n_tree(parents, np.asarray(scores), budget)


def test_flags_are_bools_named():
    # PyO3's own message for a non-bool flag names no argument.
    with pytest.raises(TypeError, match=r"^cumulative: expected a bool, got int"):
        ss.top_n_tree([-1, 0], np.array([-1.0, -2.0]), 2, cumulative=1)
    d = ss.SuffixDrafter()
    d.start_request(1, [1, 2, 1])
    for call, arg in [
        (lambda: d.propose(1, 4, chain=1), "chain"),
        (lambda: d.propose(1, 4, use_global=None), "use_global"),
        (lambda: d.propose_batch([1], 4, chain="yes"), "chain"),
        (lambda: d.finish_request(1, cache=1), "cache"),
    ]:
        with pytest.raises(TypeError, match=f"^{arg}: expected a bool"):
            call()
    assert d.propose_batch([1], 4, chain=np.bool_(True)).num_trees == 1  # numpy's bool is one


def random_step(rng, shape, *, sort=True):
    """Top-k tokens and coarse (tie-prone) log probabilities, sorted like a draft's top-k
    unless `sort` is False (any order is valid input)."""
    tokens = rng.integers(0, 50, size=shape)
    lps = -rng.choice([0.0, 0.25, 0.5, 1.0, 3.0], size=shape)
    if sort:
        lps = -np.sort(-lps, axis=-1)
    return tokens, lps


def strided(a):
    """`a`'s values in a non-contiguous view (every other element of a wider array)."""
    wide = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), dtype=a.dtype)
    wide[..., ::2] = a
    return wide[..., ::2]


def drawn_budget_and_rng(data, topk, depth):
    """A budget the builder's pool can fill (root included) and a seeded generator."""
    pool = topk + (depth - 1) * topk * topk
    budget = data.draw(st.integers(1, pool + 1))
    return budget, np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))


def as_lists(step):
    return [np.asarray(a).tolist() for a in step]


def drawn_active(data, batch):
    """Which requests run: None (all), or flags with some finished (as a list or array)."""
    flags = data.draw(st.none() | st.lists(st.booleans(), min_size=batch, max_size=batch))
    if flags is not None and data.draw(st.booleans()):
        return np.array(flags)
    return flags


def expected_max_nodes(budget, active):
    """The built batch's largest tree: `budget` nodes when any request runs."""
    return budget if active is None or any(active) else 1


# (batch, topk, depth, data) of the builder tests.
BUILDER_DRAWS = (st.integers(1, 3), st.integers(1, 3), st.integers(1, 4), st.data())


@settings(max_examples=60, deadline=None)
@given(
    *BUILDER_DRAWS,
    st.sampled_from([np.float32, np.float64]),
    st.sampled_from([np.int32, np.int64]),
)
def test_dynamic_builder_matches_reference(batch, topk, depth, data, fdt, idt):
    budget, rng = drawn_budget_and_rng(data, topk, depth)
    steps = data.draw(st.integers(1, depth))
    rust = ss.DynamicTreeBuilder(batch, topk, depth, budget)
    oracle = ref.DynamicTreeBuilder(batch, topk, depth, budget)
    roots = rng.integers(0, 50, size=batch)
    tok, lp = random_step(rng, (batch, topk))
    prefix = rng.integers(0, 9, size=batch)
    active = drawn_active(data, batch)
    # Token and length arrays in either index width: the binding widens int32 itself.
    got = rust.start(
        roots.astype(idt),
        tok.astype(idt),
        lp.astype(fdt),
        prefix_lens=prefix.astype(idt),
        active=active,
    )
    want = oracle.start(roots.tolist(), tok.tolist(), lp.tolist(), prefix.tolist(), active)
    assert as_lists(got) == [list(w) for w in want]
    # Unsorted rows and strided inputs reach the same selection as a draft's sorted top-k.
    sort, layout = data.draw(st.booleans()), data.draw(st.sampled_from([np.asarray, strided]))
    for _ in range(steps - 1):
        tok, lp = random_step(rng, (batch, topk, topk), sort=sort)
        got = rust.expand(layout(tok.astype(idt)), layout(lp.astype(fdt)))
        want = oracle.expand(tok.tolist(), lp.tolist())
        assert as_lists(got) == [list(w) for w in want]
        assert got[2].shape == (batch, topk, rust.level * topk)
        assert rust.settled == oracle.settled
    assert rust.level == steps
    drafted = topk + (steps - 1) * topk * topk
    if budget - 1 > drafted and expected_max_nodes(budget, active) > 1:
        with pytest.raises(ValueError, match="budget"):
            rust.build()
        return
    for order in ("pool", "depth_first"):
        tb, idx = rust.build(order)
        parents, tokens, pool_index = oracle.build(order)
        assert tb.parents.tolist() == parents
        assert tb.tokens.tolist() == tokens
        assert idx.tolist() == pool_index
        assert tb.num_trees == batch and tb.max_nodes == expected_max_nodes(budget, active)


def in_place_step(builder):
    """The step `builder` wrote into its buffers, cut to the returned form (mask width
    level * K), after checking the mask's unused columns are False."""
    buf, width = builder.buffers, builder.level * builder.topk
    assert not buf.attention_mask[..., width:].any()
    return [buf.tokens, buf.parent_index, buf.attention_mask[..., :width], buf.positions]


@settings(max_examples=60, deadline=None)
@given(*BUILDER_DRAWS)
def test_dynamic_builder_in_place_matches_reference(batch, topk, depth, data):
    """`start_in_place` / `expand_in_place` read the inputs the caller wrote into `buffers`
    and write the reference's steps there; `build` is the reference's too. The same builder
    then drafts a second tree (of another depth) as a fresh reference does."""
    budget, rng = drawn_budget_and_rng(data, topk, depth)
    rust = ss.DynamicTreeBuilder(batch, topk, depth, budget)
    buf = rust.buffers
    buf.attention_mask[:] = True  # stale contents must not leak into a step
    assert buf.active.tolist() == [True] * batch  # every request runs until told otherwise
    for levels in (depth, data.draw(st.integers(1, depth))):
        oracle = ref.DynamicTreeBuilder(batch, topk, depth, budget)
        roots = rng.integers(0, 50, size=batch)
        tok, lp = random_step(rng, (batch, topk))
        prefix = rng.integers(0, 9, size=batch)
        active = data.draw(st.lists(st.booleans(), min_size=batch, max_size=batch))
        buf.topk_tokens[:, 0], buf.topk_logprobs[:, 0] = tok, lp
        buf.root_tokens[:], buf.prefix_lens[:] = roots, prefix  # int64 buffers
        buf.active[:] = active
        settled = rust.start_in_place()
        want = oracle.start(roots.tolist(), tok.tolist(), lp.tolist(), prefix.tolist(), active)
        assert as_lists(in_place_step(rust)) == [list(w) for w in want]
        assert settled is rust.settled is oracle.settled
        for _ in range(levels - 1):
            tok, lp = random_step(rng, (batch, topk, topk))
            buf.topk_tokens[:], buf.topk_logprobs[:] = tok, lp
            settled = rust.expand_in_place()
            want = oracle.expand(tok.tolist(), lp.tolist())
            assert as_lists(in_place_step(rust)) == [list(w) for w in want]
            assert settled is rust.settled is oracle.settled
        too_few = budget - 1 > topk + (levels - 1) * topk * topk
        if too_few and any(active):
            continue  # too few candidates drafted: build refuses (tested above)
        order = data.draw(st.sampled_from(["pool", "depth_first"]))
        want = oracle.build(order)
        tb, idx = rust.build(order)
        assert (tb.parents.tolist(), tb.tokens.tolist(), idx.tolist()) == want
        buf.pool_index[:] = -7  # stale contents must be overwritten
        tb = rust.build_in_place(order)
        assert (tb.parents.tolist(), tb.tokens.tolist(), buf.pool_index.tolist()) == want


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(2, 6), st.data())
def test_a_settled_builder_builds_what_more_levels_would(batch, topk, depth, data):
    """Once `settled`, it stays so, and drafting further levels leaves `build` unchanged
    (trees and pool indices, both orders): a loop that stops there verifies the same trees
    with fewer draft forwards. Before, `settled` is the reference's (checked above), so it is
    not true too late either."""
    budget, rng = drawn_budget_and_rng(data, topk, depth)
    roots = rng.integers(0, 50, size=batch)
    steps = [random_step(rng, (batch, topk))]
    steps += [random_step(rng, (batch, topk, topk)) for _ in range(depth - 1)]

    def drafted(levels):
        b = ss.DynamicTreeBuilder(batch, topk, depth, budget)
        b.start(roots, *steps[0])
        settled = [b.settled]
        for tok, lp in steps[1:levels]:
            b.expand(tok, lp)
            settled.append(b.settled)
        return b, settled

    full, settled = drafted(depth)
    event(f"settled: {True in settled}")
    if True not in settled:
        return
    first = settled.index(True)
    assert all(settled[first:])
    early, _ = drafted(first + 1)
    for order in ("pool", "depth_first"):
        (want, want_idx), (got, got_idx) = full.build(order), early.build(order)
        assert (got.parents.tolist(), got.tokens.tolist()) == (
            want.parents.tolist(),
            want.tokens.tolist(),
        )
        assert got_idx.tolist() == want_idx.tolist()


@pytest.mark.parametrize("sort", [True, False])
def test_deep_dynamic_tree_matches_reference(sort):
    """The demo's deep configuration (K=8, 15 levels, 48 nodes): `build` selects from the
    candidates that score at least the frontiers' bound, with ties at that bound."""
    batch, topk, depth, budget = 3, 8, 15, 48
    rng = np.random.default_rng(7 + sort)
    rust = ss.DynamicTreeBuilder(batch, topk, depth, budget)
    oracle = ref.DynamicTreeBuilder(batch, topk, depth, budget)
    roots = rng.integers(0, 50, size=batch)
    tok, lp = random_step(rng, (batch, topk), sort=sort)
    rust.start(roots, tok, lp)
    oracle.start(roots.tolist(), tok.tolist(), lp.tolist())
    for _ in range(depth - 1):
        tok, lp = random_step(rng, (batch, topk, topk), sort=sort)
        rust.expand(tok, lp / 8)  # shallow steps: many near-equal paths compete
        oracle.expand(tok.tolist(), (lp / 8).tolist())
    for order in ("pool", "depth_first"):
        tb, idx = rust.build(order)
        assert (tb.parents.tolist(), tb.tokens.tolist(), idx.tolist()) == oracle.build(order)


def test_dynamic_builder_start_takes_prefix_lens_as_before():
    """`start` reads `prefix_lens` as every `prefix_lens` is read: an int (Python, numpy
    scalar, 0-d array or tensor) for every request or an int32 / int64 / uint32 array, one per
    request; not a bool, nor a one-element tensor for a batch of two."""
    lp = np.array([[-0.5, -1.0], [-0.25, -2.0]])
    for prefix, want in [
        (None, [1, 1]),
        (7, [8, 8]),
        (np.int32(7), [8, 8]),
        (np.array(7), [8, 8]),
        (np.array([3, 4], np.uint32), [4, 5]),
        (np.array([3, 4], np.int32), [4, 5]),
        ([3, 4], [4, 5]),
    ]:
        returned = ss.DynamicTreeBuilder(2, 2, 2, 3)
        positions = returned.start([1, 2], [[1, 2], [3, 4]], lp, prefix)[3]
        assert positions[:, 0].tolist() == want, prefix
    with pytest.raises(TypeError, match="prefix_lens"):
        ss.DynamicTreeBuilder(2, 2, 2, 3).start([1, 2], [[1, 2], [3, 4]], lp, [1.5, 2.0])
    with pytest.raises(
        TypeError, match="prefix_lens: expected an int or a 1-D int array, got bool"
    ):
        ss.DynamicTreeBuilder(2, 2, 2, 3).start([1, 2], [[1, 2], [3, 4]], lp, True)


def test_dynamic_builder_buffers_are_one_block_reused_without_allocation():
    """The buffers are the same arrays on every read, views of one writable block; in-place
    steps allocate no numpy memory (tracemalloc sees numpy's allocations), where returned
    steps allocate at least their mask."""
    import tracemalloc

    b, k, depth = 8, 4, 24
    builders = [ss.DynamicTreeBuilder(b, k, depth, 16) for _ in range(2)]
    buf = builders[0].buffers
    assert builders[0].buffers is buf and buf.tokens is buf.tokens
    views = [buf.topk_tokens, buf.topk_logprobs, buf.tokens, buf.parent_index]
    views += [buf.positions, buf.attention_mask, buf.pool_index, buf.active]
    block = buf.tokens.base
    while block.base is not None:
        block = block.base
    assert all(np.shares_memory(v, block) and v.flags.writeable for v in views)
    shapes = [(b, k, k)] * 2 + [(b, k)] * 3 + [(b, k, depth * k), (b, 15), (b,)]
    assert [v.shape for v in views] == shapes
    rng = np.random.default_rng(0)
    tok, lp = random_step(rng, (b, k, k))
    buf.topk_tokens[:], buf.topk_logprobs[:] = tok, lp
    buf.root_tokens[:] = np.arange(b)
    builders[0].start_in_place()
    builders[1].start(np.arange(b), tok[:, 0], lp[:, 0])
    peaks = []
    for run in (builders[0].expand_in_place, lambda: builders[1].expand(tok, lp)):
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(depth - 1):
                run()
            peaks.append(tracemalloc.get_traced_memory()[1] - before)
        finally:
            tracemalloc.stop()
    assert peaks[0] < 1024, peaks
    assert peaks[1] >= b * k * 2 * k, peaks  # the probe sees a returned mask
    # `build_in_place` writes the pool indices into the block (a view of it, checked above);
    # `build` returns them in a new array.
    pool_index = buf.pool_index
    trees, returned = builders[0].build_in_place(), builders[1].build()
    assert buf.pool_index is pool_index and np.array_equal(pool_index, returned[1])
    assert not np.shares_memory(returned[1], block) and trees == returned[0]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=40))
def test_depth_first_renumbering_keeps_the_tree(draws):
    """`build(order="depth_first")`'s renumbering (the reference's, which the builder matches
    above): every node keeps its parent, token and pool index, subtrees are contiguous, and
    each node's lowest-index child comes right after it."""
    parents = [-1] + [d % (i + 1) for i, d in enumerate(draws[1:])]
    tokens = [100 + i for i in range(len(parents))]
    pool = [1000 + i for i in range(1, len(parents))]
    p, t, idx = ref.renumber_depth_first(parents, tokens, pool)
    assert all(0 <= p[i] < i for i in range(1, len(p))) and p[0] == -1
    old = [tk - 100 for tk in t]  # the old index of each new node
    assert sorted(old) == list(range(len(parents)))
    assert all(old[p[i]] == parents[old[i]] for i in range(1, len(p)))
    assert idx == [1000 + o for o in old[1:]]
    kids = {v: [i for i in range(len(p)) if p[i] == v] for v in range(len(p))}
    for v, cs in kids.items():
        if cs:
            assert cs[0] == v + 1
    size = [1] * len(p)
    for i in range(len(p) - 1, 0, -1):
        size[p[i]] += size[i]
    for v in range(len(p)):  # v's subtree is v + 1 .. v + size[v] - 1
        assert all(v <= i < v + size[v] for i in range(len(p)) if _is_below(p, i, v))


def _is_below(parents, i, v):
    while i != -1:
        if i == v:
            return True
        i = parents[i]
    return False


def test_dynamic_builder_walkthrough():
    b = ss.DynamicTreeBuilder(1, 2, 3, 4)
    tokens, parent_index, mask, positions = b.start([9], [[10, 11]], [[-0.1, -1.0]], 5)
    assert tokens.tolist() == [[10, 11]] and parent_index.tolist() == [[0, 0]]
    assert mask.tolist() == [[[True, False], [False, True]]]
    assert positions.tolist() == [[6, 6]]
    tok = np.array([[[20, 21], [22, 23]]])
    lp = np.array([[[-0.2, -3.0], [-0.05, -2.0]]])
    tokens, parent_index, mask, positions = b.expand(tok, lp)
    # cumulative: 20: -0.3, 21: -3.1, 22: -1.05, 23: -3.0 -> frontier [20, 22]
    assert tokens.tolist() == [[20, 22]] and parent_index.tolist() == [[0, 1]]
    assert mask[0].tolist() == [[True, False, True, False], [False, True, False, True]]
    assert positions.tolist() == [[7, 7]]
    tb, idx = b.build()
    assert tb[0].parents.tolist() == [-1, 0, 0, 1]
    assert tb[0].tokens.tolist() == [9, 10, 11, 20]
    assert idx.tolist() == [[0, 1, 2]]
    # Depth first: the best path 9 -> 10 -> 20 is nodes 0, 1, 2.
    tb, idx = b.build("depth_first")
    assert tb[0].parents.tolist() == [-1, 0, 1, 0]
    assert tb[0].tokens.tolist() == [9, 10, 20, 11]
    assert idx.tolist() == [[0, 2, 1]]
    with pytest.raises(ValueError, match="order"):
        b.build("bfs")
    assert "level=2" in repr(b)


def test_dynamic_builder_refuses_a_mask_too_large_before_allocating():
    with pytest.raises(ValueError, match="draft mask"):
        ss.DynamicTreeBuilder(1, 2**20, 1, 2)
    with pytest.raises(ValueError, match="draft mask"):
        ss.DynamicTreeBuilder(2**14, 64, 8, 2)


def test_dynamic_builder_in_place_bad_input():
    b = ss.DynamicTreeBuilder(2, 2, 2, 3)
    with pytest.raises(ValueError, match="buffers"):
        b.start_in_place()
    buf = b.buffers
    buf.topk_logprobs[:] = -1.0
    with pytest.raises(ValueError, match="start"):
        b.expand_in_place()
    buf.prefix_lens[:] = [0, -1]
    with pytest.raises(ValueError, match=r"prefix_lens\[1\] = -1"):
        b.start_in_place()
    buf.prefix_lens[:] = [0, 2**63 - 1]
    with pytest.raises(ValueError, match=r"prefix_lens\[1\] = 9223372036854775807 \+ depth"):
        b.start_in_place()
    buf.prefix_lens[:] = 4
    buf.topk_logprobs[1, 0, 1] = 0.5
    # Named where it was written: the root's top-k is slot 0 of the [B, K, K] buffer.
    with pytest.raises(ValueError, match=r"topk_logprobs\[1, 0, 1\] = 0.5"):
        b.start_in_place()
    buf.topk_logprobs[1, 0, 1] = -1.0
    b.start_in_place()
    assert buf.positions.tolist() == [[5, 5], [5, 5]]
    step = [a.copy() for a in in_place_step(b)]
    buf.topk_logprobs[0, 1, 0] = np.nan
    with pytest.raises(ValueError, match=r"topk_logprobs\[0, 1, 0\] = NaN"):
        b.expand_in_place()
    # Refused before anything changed: the level and the step in the buffers.
    assert b.level == 1
    assert all(np.array_equal(x, y) for x, y in zip(step, in_place_step(b), strict=True))
    buf.topk_logprobs[0, 1, 0] = -2.0
    block = buf.tokens.base
    while block.base is not None:
        block = block.base
    block.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        b.expand_in_place()
    with pytest.raises(ValueError, match="read-only"):
        b.build_in_place()
    block.flags.writeable = True
    b.expand_in_place()
    with pytest.raises(ValueError, match="depth 2"):
        b.expand_in_place()
    with pytest.raises(ValueError, match="order"):
        b.build_in_place("bfs")
    assert b.build_in_place().num_nodes == 6
    with pytest.raises(ValueError, match="buffers"):
        ss.DynamicTreeBuilder(2, 2, 2, 3).build_in_place()
    unstarted = ss.DynamicTreeBuilder(2, 2, 2, 3)
    unstarted.buffers.pool_index[:] = 5
    with pytest.raises(ValueError, match="start"):
        unstarted.build_in_place()
    assert (unstarted.buffers.pool_index == 5).all()  # refused before anything was written


def test_dynamic_builder_bad_input():
    with pytest.raises(ValueError, match="topk"):
        ss.DynamicTreeBuilder(1, 0, 3, 2)
    with pytest.raises(ValueError, match="depth"):
        ss.DynamicTreeBuilder(1, 2, 0, 2)
    with pytest.raises(ValueError, match="batch"):
        ss.DynamicTreeBuilder(-1, 2, 2, 2)
    with pytest.raises(ValueError, match="batch: 1099511627776 requests"):
        ss.DynamicTreeBuilder(2**40, 2, 2, 2)
    with pytest.raises(ValueError, match="budget"):
        ss.DynamicTreeBuilder(1, 2, 1, 4)
    b = ss.DynamicTreeBuilder(2, 2, 2, 3)
    with pytest.raises(ValueError, match="start"):
        b.expand(np.zeros((2, 2, 2), np.int64), np.zeros((2, 2, 2)))
    with pytest.raises(ValueError, match="start"):
        b.build()
    with pytest.raises(ValueError, match=r"topk_logprobs\[1, 0\] = 0.5"):
        b.start([1, 2], [[1, 2], [3, 4]], [[-1.0, -2.0], [0.5, -1.0]])
    with pytest.raises(ValueError, match=r"topk_logprobs\[0, 1\] = NaN"):
        b.start([1, 2], [[1, 2], [3, 4]], [[-1.0, math.nan], [-0.5, -1.0]])
    with pytest.raises(ValueError, match=r"topk_tokens: expected shape \(2, 2\)"):
        b.start([1, 2], [[1, 2]], [[-1.0, -2.0], [-0.5, -1.0]])
    with pytest.raises(TypeError, match="topk_logprobs"):
        b.start([1, 2], [[1, 2], [3, 4]], [[1, 2], [3, 4]])
    lp = [[-1.0, -2.0], [-0.5, -1.0]]
    with pytest.raises(ValueError, match=r"active: expected 2 entries, got 3"):
        b.start([1, 2], [[1, 2], [3, 4]], lp, active=[True, False, True])
    with pytest.raises(TypeError, match="active: expected a bool array, got int64"):
        b.start([1, 2], [[1, 2], [3, 4]], lp, active=np.array([1, 0]))
    with pytest.raises(ValueError, match="active: expected a 1-D array, got 2-D"):
        b.start([1, 2], [[1, 2], [3, 4]], lp, active=[[True, False]])
    with pytest.raises(
        ValueError, match=r"prefix_lens: 18446744073709551616 does not fit in int64"
    ):
        b.start([1, 2], [[1, 2], [3, 4]], lp, prefix_lens=2**64)
    # A numpy integer scalar past int64 is an int out of range too, not a wrong type.
    with pytest.raises(ValueError, match=r"prefix_lens: 9223372036854775808 does not fit"):
        b.start([1, 2], [[1, 2], [3, 4]], lp, prefix_lens=np.uint64(2**63))
    # Positions run to prefix + depth: one past int64 would wrap.
    big = np.array([0, 2**63 - 2], np.int64)
    with pytest.raises(ValueError, match=r"prefix_lens\[1\] = 9223372036854775806 \+ depth 2"):
        b.start([1, 2], [[1, 2], [3, 4]], lp, prefix_lens=big)
    assert b.level == 0  # every refusal before anything changed
    b.start([1, 2], [[1, 2], [3, 4]], [[-1.0, -2.0], [-0.5, -1.0]])
    lp = np.full((2, 2, 2), -1.0)
    lp[1, 1, 0] = math.nan
    with pytest.raises(ValueError, match=r"topk_logprobs\[1, 1, 0\]"):
        b.expand(np.zeros((2, 2, 2), np.int64), lp)
    b.expand(np.zeros((2, 2, 2), np.int64), np.full((2, 2, 2), -1.0))
    with pytest.raises(ValueError, match="depth 2"):
        b.expand(np.zeros((2, 2, 2), np.int64), np.full((2, 2, 2), -1.0))


def test_top_n_pool_without_tokens_or_past_memory():
    # Without tokens each node carries its pool index (no pool-sized vector of them is made).
    tree, idx = ss.top_n_tree([-1, 0, -1], [-1.0, -1.0, -0.5], 3)
    assert idx.tolist() == [0, 2] and tree.tokens.tolist() == [0, 0, 2]
    # Empty lists are an empty pool, not int64 scores.
    tree, idx = ss.top_n_tree([], [], 1)
    assert tree.num_nodes == 1 and idx.size == 0
    # A broadcast pool of 2**32 - 2 candidates: its scratch is reserved fallibly (an abort).
    m = 2**32 - 2
    parents = np.broadcast_to(np.int64(-1), (m,))
    scores = np.broadcast_to(np.float32(-1), (m,))
    with pytest.raises(ValueError, match=f"scores: a pool of {m} candidates does not fit"):
        ss.top_n_tree(parents, scores, 3)
