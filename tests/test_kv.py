"""KV cache after verification: compaction plans, in-place `compact_kv` on numpy caches of any
dtype and layout, and paged `commit_slots`, against the pure-Python oracle."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np
import pytest
import specsched as ss
from fresh import fresh_lines
from gil import heartbeat_gap
from hypothesis import given, settings
from hypothesis import strategies as st
from specsched import reference as ref
from strategies import P5, T5, as_array, batches, children, index_arrays, trees

VOCAB = 8
SETTINGS = settings(deadline=None, max_examples=60)
CACHE_DTYPES = (
    np.float16,
    np.float32,
    np.float64,
    np.int8,
    np.int64,
    np.bool_,
    np.complex64,
)
LAYOUTS = ("C", "F", "slice", "neg", "perm")


# ------------------------------------------------------------------------------- helpers


def walk_targets(rnd: random.Random, parents: list[int], tokens: list[int]) -> list[int]:
    """Per node: with probability 0.8 a random child's token (deep walks), else random."""
    out = []
    for kids in children(parents):
        if kids and rnd.random() < 0.8:
            out.append(tokens[rnd.choice(kids)])
        else:
            out.append(rnd.randrange(VOCAB))
    return out


def pairs(offsets):
    return list(itertools.pairwise(offsets))


def verified(tree, rnd):
    parents, tokens = tree
    return ss.verify(ss.Tree(parents, tokens), target_tokens=walk_targets(rnd, parents, tokens))


def verified_batch(batch, rnd):
    parents, tokens, offsets = batch
    target = []
    for s, e in pairs(offsets):
        target += walk_targets(rnd, parents[s:e], tokens[s:e])
    return ss.verify(ss.TreeBatch.from_flat(parents, tokens, offsets), target_tokens=target)


def values(shape, dtype, rng: np.random.Generator) -> np.ndarray:
    """Distinct-ish values of `dtype` in a C-ordered array of `shape`."""
    v = rng.permutation(int(np.prod(shape))).reshape(shape)
    if dtype == np.bool_:
        return (v % 2).astype(bool)
    if np.issubdtype(dtype, np.complexfloating):
        return (v + 1j * (v + 0.5)).astype(dtype)
    if dtype == np.float16:
        return (v % 2048 - 1024).astype(dtype)
    return v.astype(dtype)


def in_layout(vals: np.ndarray, kind: str, rng: np.random.Generator):
    """`(view, base)`: a writeable array equal to `vals` in memory layout `kind`, and the
    array owning its memory (whose other elements must stay untouched)."""
    if kind == "C":
        a = vals.copy()
        return a, a
    if kind == "F":
        a = np.array(vals, order="F", copy=True)
        return a, a
    if kind == "slice":  # every axis strided with an offset, inside a bigger array
        base = np.zeros(tuple(2 * n + 1 for n in vals.shape), dtype=vals.dtype)
        view = base[(slice(1, None, 2),) * vals.ndim]
        view[...] = vals
        return view, base
    if kind == "neg":  # negative strides on every axis
        flip = (slice(None, None, -1),) * vals.ndim
        base = vals[flip].copy()
        return base[flip], base
    if kind == "perm":  # axes stored in a random order
        perm = rng.permutation(vals.ndim)
        base = np.array(vals.transpose(perm), order="C", copy=True)
        return base.transpose(np.argsort(perm)), base
    raise AssertionError(kind)


def check_moved(old: np.ndarray, new: np.ndarray, seq: int, acc, prefix: int) -> None:
    """Semantics: position prefix + j now holds what prefix + a_j held; every position that is
    not a destination of a move is unchanged."""
    k = len(acc) - 1
    for j, a in enumerate(acc):
        assert np.array_equal(
            np.take(new, prefix + j, axis=seq), np.take(old, prefix + a, axis=seq)
        )
    dests = {prefix + j for j, a in enumerate(acc) if a != j}
    assert len(dests) == sum(1 for j, a in enumerate(acc) if a != j) <= k
    for pos in range(old.shape[seq]):
        if pos not in dests:
            assert np.array_equal(np.take(new, pos, axis=seq), np.take(old, pos, axis=seq))


# ------------------------------------------------------------------------------- plans


@SETTINGS
@given(trees(1, 64, VOCAB), st.randoms(use_true_random=False), st.integers(0, 10**6))
def test_plan_matches_reference(tree, rnd, prefix):
    r = verified(tree, rnd)
    acc = r.accepted_nodes.tolist()
    want = ref.kv_compaction_plan(acc, prefix)
    for p in (prefix, np.int64(prefix), np.int32(min(prefix, 2**31 - 1))):
        src, dst = ss.kv_compaction_plan(r, p)
        assert src.dtype == dst.dtype == np.int64
        assert (src.tolist(), dst.tolist()) == ref.kv_compaction_plan(acc, int(p))
    assert [s - prefix for s in want[0]] == [a for j, a in enumerate(acc) if a != j]


@SETTINGS
@given(
    batches(8, 32, VOCAB),
    st.randoms(use_true_random=False),
    st.integers(0, 1000),
    st.lists(st.integers(0, 10**6), min_size=8, max_size=8),
    index_arrays(),
)
def test_batch_plan_matches_reference(batch, rnd, prefix, per_request, opts):
    rb = verified_batch(batch, rnd)
    acc = rb.accepted_nodes.tolist()
    b = len(acc)
    for p, want_p in ((prefix, prefix), (np.int64(prefix), prefix)):
        req, src, dst = ss.kv_compaction_plan(rb, p)
        assert req.dtype == src.dtype == dst.dtype == np.int64
        assert (req.tolist(), src.tolist(), dst.tolist()) == ref.batch_kv_compaction_plan(
            acc, want_p
        )
    pl = per_request[:b]
    want = ref.batch_kv_compaction_plan(acc, pl)
    for p in (pl, as_array(pl, *opts)):
        req, src, dst = ss.kv_compaction_plan(rb, p)
        assert (req.tolist(), src.tolist(), dst.tolist()) == want
    # Requests that do not commit (finished, padding) move nothing.
    active = [rnd.random() < 0.5 for _ in range(b)]
    req, src, dst = ss.kv_compaction_plan(rb, pl, np.array(active))
    assert (req.tolist(), src.tolist(), dst.tolist()) == ref.batch_kv_compaction_plan(
        acc, pl, active
    )
    assert set(req.tolist()) <= {i for i in range(b) if active[i]}


@SETTINGS
@given(
    batches(8, 32, VOCAB),
    st.randoms(use_true_random=False),
    st.lists(st.integers(0, 50), min_size=8, max_size=8),
    st.integers(0, 2),
    st.booleans(),
)
def test_cache_moves_match_reference(batch, rnd, prefixes, layout, negative_axes):
    """The device path's moves (`_core.cache_moves`, applied by one indexed copy on the
    tensor's device) are the reference plan, with the axes normalized and the committed
    lengths `compact_kv` returns (prefix + path for rows that commit, prefix for the rest)."""
    from specsched import _core

    rb = verified_batch(batch, rnd)
    acc = rb.accepted_nodes.tolist()
    b = len(acc)
    pl = prefixes[:b]
    seq_len = max(pl) + max(np.diff(batch[2])) + 1
    # [B, H, S], [S, B, H] or [H, S, B]: the sequence and batch axes anywhere.
    seq_dim, batch_dim = [(2, 0), (0, 1), (1, 2)][layout]
    shape = [3, 3, 3]
    shape[seq_dim], shape[batch_dim] = seq_len, b
    args = (seq_dim - 3, batch_dim - 3) if negative_axes else (seq_dim, batch_dim)
    active = [rnd.random() < 0.7 for _ in range(b)]
    for act in (None, np.array(active)):
        req, src, dst, sd, bd, committed = _core.cache_moves(shape, rb, pl, *args, act)
        flags = None if act is None else active
        assert (req.tolist(), src.tolist(), dst.tolist()) == ref.batch_kv_compaction_plan(
            acc, pl, flags
        )
        assert (sd, bd) == (seq_dim, batch_dim)
        keeps = [True] * b if flags is None else flags
        want = [
            p + (len([a for a in row if a >= 0]) if k else 0)
            for p, row, k in zip(pl, acc, keeps, strict=True)
        ]
        assert committed.tolist() == want
    # A single tree's result: the plan of one request, no batch axis.
    one = rb[0]
    req, src, dst, sd, bd, committed = _core.cache_moves([seq_len, 3], one, pl[0], 0, None, None)
    assert (src.tolist(), dst.tolist()) == ref.kv_compaction_plan(
        one.accepted_nodes.tolist(), pl[0]
    )
    assert committed == pl[0] + len(one.accepted_nodes)


def test_plan_hand_case_and_errors():
    t = ss.Tree(P5, T5)
    r = ss.verify(t, target_tokens=[11, 14, 0, 0, 77])  # accepted 0, 1, 4
    src, dst = ss.kv_compaction_plan(r, 10)
    assert (src.tolist(), dst.tolist()) == ([14], [12])
    r0 = ss.verify(t, target_tokens=[11, 13, 0, 0, 0])  # 0, 1, 3: a_1 == 1 is no move
    assert [x.tolist() for x in ss.kv_compaction_plan(r0, 0)] == [[3], [2]]
    rb = ss.verify(ss.TreeBatch([t, t]), target_tokens=[11, 14, 0, 0, 77, 12, 0, 0, 0, 0])
    req, src, dst = ss.kv_compaction_plan(rb, [3, 100])
    assert (req.tolist(), src.tolist(), dst.tolist()) == ([0, 1], [7, 102], [5, 101])
    with pytest.raises(ValueError, match="prefix_lens"):
        ss.kv_compaction_plan(r, -1)
    with pytest.raises(ValueError, match="prefix_lens"):
        ss.kv_compaction_plan(rb, -1)
    with pytest.raises(ValueError, match="prefix_lens"):
        ss.kv_compaction_plan(rb, [0, -1])
    with pytest.raises(ValueError, match="prefix_lens"):
        ss.kv_compaction_plan(rb, [0, 0, 0])
    with pytest.raises(ValueError, match="prefix_lens"):
        ss.kv_compaction_plan(rb, [0])
    with pytest.raises(TypeError, match="prefix_lens"):
        ss.kv_compaction_plan(r, 1.5)
    with pytest.raises(TypeError, match="prefix_lens"):
        ss.kv_compaction_plan(rb, np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="result"):
        ss.kv_compaction_plan("not a result", 0)
    with pytest.raises(TypeError, match="result"):
        ss.kv_compaction_plan(t, 0)


def test_plan_positions_beyond_int64_are_an_error():
    """prefix + a_j must be an int64 position: a prefix that overflows it is refused, never
    wrapped to negative positions."""
    r = ss.verify(ss.Tree([-1, 0, 0], [0, 1, 2]), target_tokens=[2, 0, 0])  # 2 -> 1
    top = 2**63 - 1
    src, dst = ss.kv_compaction_plan(r, top - 2)
    assert (src.tolist(), dst.tolist()) == ([top], [top - 1])
    for prefix in (top - 1, top):
        with pytest.raises((ValueError, OverflowError), match="prefix_lens"):
            ss.kv_compaction_plan(r, prefix)
    rb = ss.verify(ss.TreeBatch([ss.Tree([-1, 0, 0], [0, 1, 2])]), target_tokens=[2, 0, 0])
    with pytest.raises((ValueError, OverflowError), match="prefix_lens"):
        ss.kv_compaction_plan(rb, np.array([top], dtype=np.int64))


# ---------------------------------------------------------------------- compact_kv, single


@st.composite
def single_caches(draw):
    """`(shape, seq_axis, seq_dim argument)` of a cache with 1-4 axes."""
    ndim = draw(st.integers(1, 4))
    seq = draw(st.integers(0, ndim - 1))
    shape = draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim))
    seq_dim = draw(st.sampled_from([seq, seq - ndim]))
    return shape, seq, seq_dim


@SETTINGS
@given(
    trees(1, 40, VOCAB),
    st.randoms(use_true_random=False),
    single_caches(),
    st.integers(0, 5),
    st.integers(0, 3),
    st.sampled_from(CACHE_DTYPES),
    st.sampled_from(LAYOUTS),
    st.integers(0, 2**32 - 1),
)
def test_compact_kv_matches_reference(tree, rnd, cache, prefix, extra, dtype, kind, seed):
    r = verified(tree, rnd)
    n = len(tree[0])
    shape, seq, seq_dim = cache
    shape[seq] = prefix + n + extra
    rng = np.random.default_rng(seed)
    vals = values(shape, dtype, rng)
    view, base = in_layout(vals, kind, rng)
    base_before = base.copy()
    expected = vals.copy()
    ref.compact_kv(expected, ref.kv_compaction_plan(r.accepted_nodes.tolist(), prefix), seq_dim)

    committed = ss.compact_kv(view, r, prefix, seq_dim)
    assert type(committed) is int and committed == prefix + r.num_accepted + 1
    assert view.tobytes() == expected.tobytes()
    check_moved(vals, view, seq, r.accepted_nodes.tolist(), prefix)
    # the moves happened in the caller's memory, and nowhere else in it
    assert np.shares_memory(view, base)
    if kind == "slice":
        outside = np.ones(base.shape, dtype=bool)
        outside[(slice(1, None, 2),) * base.ndim] = False
        assert np.array_equal(base[outside], base_before[outside])


@pytest.mark.parametrize("dtype", CACHE_DTYPES)
@pytest.mark.parametrize(("shape", "seq_dim"), [((12, 2, 3), 0), ((2, 12, 3), 1), ((2, 3, 12), -1)])
def test_compact_kv_hand_case(dtype, shape, seq_dim):
    t = ss.Tree(P5, T5)
    r = ss.verify(t, target_tokens=[11, 14, 0, 0, 77])  # accepted 0, 1, 4: 4 -> 2 at prefix
    vals = values(shape, dtype, np.random.default_rng(0))
    cache = vals.copy()
    ss.compact_kv(cache, r, 6, seq_dim)
    src = np.take(vals, 10, axis=seq_dim)
    assert np.array_equal(np.take(cache, 8, axis=seq_dim), src)
    assert not np.array_equal(np.take(vals, 8, axis=seq_dim), src)
    keep = [i for i in range(12) if i != 8]
    assert np.array_equal(np.take(cache, keep, axis=seq_dim), np.take(vals, keep, axis=seq_dim))


def test_compact_kv_no_moves_leaves_the_cache_alone():
    t = ss.Tree(P5, T5)
    r = ss.verify(t, target_tokens=[11, 13, 0, 0, 0])  # accepted 0, 1, 3 at prefix 0 ...
    cache = np.arange(5.0)
    ss.compact_kv(cache, r, 0, 0)
    assert cache.tolist() == [0, 1, 3, 3, 4]
    r = ss.verify(t, target_tokens=[11, 99, 0, 0, 0])  # ... 0, 1: nothing to move
    cache = np.arange(5.0)
    ss.compact_kv(cache, r, 0, 0)
    assert cache.tolist() == [0, 1, 2, 3, 4]
    # an empty axis besides the sequence: nothing to move, no error
    r = ss.verify(t, target_tokens=[12, 0, 0, 0, 0])
    ss.compact_kv(np.zeros((5, 0)), r, 0, 0)


# ----------------------------------------------------------------------- compact_kv, batch


@st.composite
def batch_caches(draw):
    """`(other axes shape, batch axis, seq axis, batch_dim argument or None, seq_dim arg)`."""
    ndim = draw(st.integers(2, 4))
    bax, sax = draw(st.permutations(range(ndim)))[:2]
    shape = draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim))
    if bax == 0 and draw(st.booleans()):
        batch_dim = None  # the default
    else:
        batch_dim = draw(st.sampled_from([bax, bax - ndim]))
    seq_dim = draw(st.sampled_from([sax, sax - ndim]))
    return shape, bax, sax, batch_dim, seq_dim


# A verified batch, a cache layout for it and per-request prefixes: `(batch, rnd, cache,
# per_request)` of the batch tests below.
BATCH_CASE = (
    batches(6, 24, VOCAB),
    st.randoms(use_true_random=False),
    batch_caches(),
    st.lists(st.integers(0, 6), min_size=6, max_size=6),
)


@SETTINGS
@given(
    *BATCH_CASE,
    st.booleans(),
    st.sampled_from(CACHE_DTYPES),
    st.sampled_from(LAYOUTS),
    st.integers(0, 2**32 - 1),
)
def test_batch_compact_kv_matches_reference(
    batch, rnd, cache, per_request, use_int, dtype, kind, seed
):
    """Every layout and dtype, with every request committing or (`active`) some not."""
    rb = verified_batch(batch, rnd)
    offsets = batch[2]
    b = len(offsets) - 1
    shape, bax, sax, batch_dim, seq_dim = cache
    prefixes = [per_request[0]] * b if use_int else per_request[:b]
    prefix_arg = per_request[0] if use_int else np.asarray(prefixes)
    shape[bax] = b
    shape[sax] = max(p + e - s for p, (s, e) in zip(prefixes, pairs(offsets), strict=True))
    shape[sax] += rnd.randrange(3)
    rng = np.random.default_rng(seed)
    vals = values(shape, dtype, rng)
    view, base = in_layout(vals, kind, rng)
    expected = vals.copy()
    active = None if rnd.random() < 0.5 else [rnd.random() < 0.6 for _ in range(b)]
    plan = ref.batch_kv_compaction_plan(rb.accepted_nodes.tolist(), prefixes, active)
    ref.compact_kv(expected, plan, seq_dim, bax)

    options = {} if batch_dim is None else {"batch_dim": batch_dim}
    if active is not None:
        options["active"] = np.array(active)
    committed = ss.compact_kv(view, rb, prefix_arg, seq_dim, **options)
    commits = [True] * b if active is None else active
    assert committed.dtype == np.int64
    assert committed.tolist() == [
        p + (k + 1 if c else 0)
        for p, k, c in zip(prefixes, rb.num_accepted.tolist(), commits, strict=True)
    ]
    assert view.tobytes() == expected.tobytes()
    assert np.shares_memory(view, base)
    # per request: its own semantics, on its own batch row; one that does not commit is left
    for i in range(b):
        row_old = np.take(vals, i, axis=bax)
        row_new = np.take(view, i, axis=bax)
        if not commits[i]:
            assert row_new.tobytes() == row_old.tobytes()
            continue
        s = sax - (sax > bax)
        k = int(rb.num_accepted[i])
        check_moved(row_old, row_new, s, rb.accepted_nodes[i, : k + 1].tolist(), prefixes[i])


def skip_tree(n: int) -> ss.Tree:
    """Node 2j has children 2j+1 (token 1) and 2j+2 (token 2); all-2 targets accept 0, 2, 4,
    ...: every accepted node moves, and each move's destination was an earlier move's source."""
    parents = [-1, *[2 * ((i - 1) // 2) for i in range(1, n)]]
    return ss.Tree(parents, [0] + [1, 2] * ((n - 1) // 2))


def large_layout(vals: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    if kind == "step":  # axis 0 strided, inside an array twice as big
        base = np.zeros((2 * vals.shape[0], *vals.shape[1:]), dtype=vals.dtype)
        base[1::2] = vals
        return base[1::2]
    return in_layout(vals, kind, rng)[0]


@pytest.mark.parametrize("kind", ["C", "F", "neg", "perm", "step"])
@pytest.mark.parametrize(
    ("shape", "seq_dim", "batch_dim"),
    [
        ((32, 40, 16, 64), 1, None),
        ((32, 16, 64, 40), -1, None),
        ((3, 40, 64, 256), 1, 0),
        ((64, 40, 3, 256), 1, 2),
    ],
)
def test_large_caches_match_reference(kind, shape, seq_dim, batch_dim):
    """Caches where megabytes move (the parallel, block-major path) in many layouts."""
    rng = np.random.default_rng(sum(shape) + seq_dim)
    t = skip_tree(31)
    r = ss.verify(t, target_tokens=[2] * 31)
    assert r.num_accepted == 15
    vals = values(shape, np.float32, rng)
    cache = large_layout(vals, kind, rng)
    expected = vals.copy()
    if batch_dim is None:
        result, prefix = r, 6
        ref.compact_kv(expected, ref.kv_compaction_plan(r.accepted_nodes.tolist(), 6), seq_dim)
    else:
        b = ss.TreeBatch([t, ss.Tree.chain(list(range(20))), t])
        target = [2] * 31 + list(range(1, 21)) + [2] * 28 + [7, 2, 2]  # the last stops at 28
        result = ss.verify(b, target_tokens=target)
        assert result.num_accepted.tolist() == [15, 19, 14]
        prefix = [9, 3, 0]
        plan = ref.batch_kv_compaction_plan(result.accepted_nodes.tolist(), prefix)
        ref.compact_kv(expected, plan, seq_dim, batch_dim)
    ss.compact_kv(cache, result, prefix, seq_dim, batch_dim=batch_dim)
    assert cache.tobytes() == expected.tobytes()


# ------------------------------------------------------------------ zero copy, GIL release


COMPACT_IN_PLACE = """
import resource, numpy as np, specsched as ss
# A skip tree accepting 0, 2, 4, ...: 15 moves through every (layer, head) block.
n = 31
parents = [-1] + [max(0, i - 2) for i in range(1, n)]
tree = ss.Tree(parents, list(range(n)))
r = ss.verify(tree, target_tokens=[i + 2 for i in range(n)])
assert r.num_accepted == 15, r.num_accepted
for order, heads in (("C", 64), ("F", 128)):  # 128 MB, then 256 MB resident
    cache = np.ones((2, heads, 2048, 128), dtype=np.float32, order=order)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ss.compact_kv(cache, r, 100, 2)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(order, (after - before) * 1024, cache.nbytes)
    del cache
"""


def test_compact_kv_allocates_nothing_of_the_caches_size():
    """The peak resident size, which sees every allocator (Rust's, malloc, numpy's), not only
    the ones tracemalloc traces: compacting resident caches of 128 and 256 MB raises it by far
    less than a copy would (each cache is twice the previous, so a copy beats the earlier
    peak). Measured in a fresh interpreter, whose earlier peak is small."""
    for order, grew, nbytes in fresh_lines(COMPACT_IN_PLACE, 2):
        assert int(grew) < int(nbytes) / 8, f"{order}: peak RSS grew by {grew} for {nbytes} B"


@pytest.mark.parametrize(("shape", "seq_dim"), [((2, 64, 1024, 128), 2), ((8, 128, 16384), 2)])
@pytest.mark.parametrize("order", ["C", "F"])
def test_compact_kv_is_in_place_without_copies(shape, seq_dim, order):
    """A 32 MB cache is compacted in place with no allocation of its size."""
    n = 31
    r = ss.verify(skip_tree(n), target_tokens=[2] * n)  # accepts 0, 2, 4, ...
    acc = r.accepted_nodes.tolist()
    assert acc == list(range(0, n, 2))
    dtype = np.float16 if len(shape) == 4 else np.float32
    cache = np.zeros(shape, dtype=dtype, order=order)
    assert cache.nbytes >= 32e6
    prefix = 40
    idx = [slice(None)] * len(shape)
    for a in acc:  # tag every source position
        idx[seq_dim] = prefix + a
        cache[tuple(idx)] = a + 1
    ptr = cache.__array_interface__["data"][0]
    tracemalloc.start()
    try:
        ss.compact_kv(cache, r, prefix, seq_dim)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < cache.nbytes / 64  # no numpy copy (numpy reports its buffers to tracemalloc)
    assert cache.__array_interface__["data"][0] == ptr
    for j, a in enumerate(acc):
        idx[seq_dim] = prefix + j
        assert np.all(cache[tuple(idx)] == a + 1)
    idx[seq_dim] = slice(0, prefix)
    assert not cache[tuple(idx)].any()


@SETTINGS
@given(
    *BATCH_CASE,
    st.lists(
        st.tuples(st.sampled_from(CACHE_DTYPES), st.sampled_from(LAYOUTS)), min_size=1, max_size=4
    ),
    st.booleans(),
    st.integers(0, 2**32 - 1),
)
def test_compact_kv_of_several_buffers_equals_one_call_each(
    batch, rnd, cache, per_request, buffers, as_tuple, seed
):
    """A list or tuple of buffers of one shape (any dtypes and layouts): each ends as one call
    on it alone leaves it, in place, with the same committed lengths."""
    rb = verified_batch(batch, rnd)
    offsets = batch[2]
    b = len(offsets) - 1
    shape, bax, sax, batch_dim, seq_dim = cache
    prefixes = per_request[:b]
    shape[bax] = b
    shape[sax] = max(p + e - s for p, (s, e) in zip(prefixes, pairs(offsets), strict=True))
    rng = np.random.default_rng(seed)
    views, bases, expected = [], [], []
    for dtype, kind in buffers:
        vals = values(shape, dtype, rng)
        view, base = in_layout(vals, kind, rng)
        views.append(view)
        bases.append(base)
        alone = vals.copy()
        expected.append(alone)
    options = {} if batch_dim is None else {"batch_dim": batch_dim}
    if rnd.random() < 0.5:
        options["active"] = np.array([rnd.random() < 0.6 for _ in range(b)])
    want = [ss.compact_kv(alone, rb, np.array(prefixes), seq_dim, **options) for alone in expected]
    got = ss.compact_kv(
        tuple(views) if as_tuple else views, rb, np.array(prefixes), seq_dim, **options
    )
    assert got.tolist() == want[0].tolist()
    for view, base, alone in zip(views, bases, expected, strict=True):
        assert view.tobytes() == alone.tobytes()
        assert np.shares_memory(view, base)


def test_compact_kv_of_several_buffers_bad_input_writes_nothing():
    """Each refusal names the entry (or the pair that may share memory) and leaves every buffer
    as it was."""
    r = result5()
    keys, values_ = np.arange(24.0).reshape(8, 3), np.arange(100.0, 124.0).reshape(8, 3)
    before = keys.copy(), values_.copy()

    def refused(exc, match, caches):
        with pytest.raises(exc, match=match):
            ss.compact_kv(caches, r, 0, 0)
        assert np.array_equal(keys, before[0]) and np.array_equal(values_, before[1])

    read_only = values_.copy()
    read_only.setflags(write=False)
    refused(ValueError, "empty", [])
    refused(ValueError, "empty", ())
    refused(TypeError, r"cache\[1\]: expected a numpy array, got list", [keys, [[0.0] * 3] * 8])
    refused(ValueError, r"cache\[1\]: is read-only", [keys, read_only])
    refused(TypeError, r"cache\[1\]: dtype object", [keys, np.empty((8, 3), dtype=object)])
    refused(ValueError, r"cache\[1\]: shape \[8, 2\] differs", [keys, values_[:, :2]])
    refused(ValueError, "cache: sequence axis", [keys[:4], values_[:4]])  # 5 nodes > 4
    refused(ValueError, "entries 0 and 1 may share memory", [keys, keys])
    refused(
        ValueError, "entries 1 and 2 may share memory", [values_[:, :2], keys[:, :2], keys[:, 1:]]
    )
    # Interleaved views share no element but their address ranges overlap: refused too
    # (numpy's `may_share_memory` rule), never moved twice.
    wide = np.arange(48.0).reshape(8, 6)
    refused(ValueError, "may share memory", [wide[:, ::2], wide[:, 1::2]])
    # Entirely disjoint slices of one array are fine.
    tall = np.arange(48.0).reshape(16, 3)
    top, bottom = tall[:8], tall[8:]
    assert not np.may_share_memory(top, bottom)
    alone = top.copy(), bottom.copy()
    ss.compact_kv([top, bottom], r, 0, 0)
    for view, copy in zip((top, bottom), alone, strict=True):
        ss.compact_kv(copy, r, 0, 0)
        assert np.array_equal(view, copy)


@pytest.mark.parametrize("buffers", [1, 2])
def test_compact_kv_releases_the_gil(buffers):
    """While one thread compacts a large strided cache (or two, given as a list), Python keeps
    running in another."""
    n = 39
    r = ss.verify(skip_tree(n), target_tokens=[2] * n)
    # seq last: one strided byte per element
    caches = [np.zeros(((1 << 18) // buffers, 40), dtype=np.int8) for _ in range(buffers)]
    for cache in caches:
        cache[:, 2::2] = 5
    arg = caches[0] if buffers == 1 else caches
    ratios = []
    for _ in range(3):
        ratios.append(heartbeat_gap(lambda: ss.compact_kv(arg, r, 0, 1)))
        if ratios[-1] < 0.5:
            break
    assert min(ratios) < 0.5, f"Python was blocked during compact_kv: {ratios}"
    for cache in caches:
        assert np.all(cache[:, :20] == [0] + [5] * 19)


# ------------------------------------------------------------------- compact_kv, bad input


def result5():
    return ss.verify(ss.Tree(P5, T5), target_tokens=[11, 14, 0, 0, 77])  # 0, 1, 4


def batch_result():
    t = ss.Tree(P5, T5)
    return ss.verify(ss.TreeBatch([t, t]), target_tokens=[11, 14, 0, 0, 77, 12, 0, 0, 0, 0])


def unchanged_after(exc, match, cache, *args, **kwargs):
    before = np.array(cache, copy=True)
    with pytest.raises(exc, match=match):
        ss.compact_kv(cache, *args, **kwargs)
    assert np.array_equal(np.asarray(cache), before)


def test_compact_kv_bad_input():
    r, rb = result5(), batch_result()
    cache = np.arange(24.0).reshape(8, 3)
    ro = cache.copy()
    ro.setflags(write=False)
    unchanged_after(ValueError, "read-only", ro, r, 0, 0)
    unchanged_after(ValueError, "cache", cache, r, 4, 0)  # 4 + 5 nodes > 8 positions
    unchanged_after(ValueError, "cache", cache[:4], r, 0, 0)
    unchanged_after(ValueError, "prefix_lens", cache, r, -1, 0)
    unchanged_after(TypeError, "prefix_lens", cache, r, [0], 0)
    unchanged_after(ValueError, "seq_dim", cache, r, 0, 2)
    unchanged_after(ValueError, "seq_dim", cache, r, 0, -3)
    unchanged_after(ValueError, "batch_dim", cache, r, 0, 0, batch_dim=1)
    unchanged_after(TypeError, "result", cache, "not a result", 0, 0)
    unchanged_after(TypeError, "result", cache, ss.Tree(P5, T5), 0, 0)
    with pytest.raises(TypeError, match="cache"):
        ss.compact_kv(cache.tolist(), r, 0, 0)
    with pytest.raises(ValueError, match="seq_dim"):
        ss.compact_kv(np.zeros(()), r, 0, 0)

    bcache = np.arange(2 * 8 * 3.0).reshape(2, 8, 3)
    unchanged_after(ValueError, "batch_dim", bcache, rb, 0, 0)  # batch_dim defaults to 0
    unchanged_after(ValueError, "batch_dim", bcache, rb, 0, 1, batch_dim=-2)
    unchanged_after(ValueError, "batch_dim", bcache, rb, 0, 1, batch_dim=3)
    unchanged_after(ValueError, "seq_dim", bcache, rb, 0, 3)
    # Axes are ints, named when they are not: no PyO3 "cannot be interpreted" or OverflowError.
    unchanged_after(
        TypeError, "batch_dim: expected an int, got float", bcache, rb, 0, 1, batch_dim=0.0
    )
    unchanged_after(
        TypeError, "batch_dim: expected an int, got bool", bcache, rb, 0, 1, batch_dim=False
    )
    unchanged_after(ValueError, "batch_dim: .* does not fit", bcache, rb, 0, 1, batch_dim=2**70)
    unchanged_after(TypeError, "seq_dim: expected an int, got bool", bcache, rb, 0, True)
    unchanged_after(ValueError, "cache", bcache[:1], rb, 0, 1)  # batch axis != B
    unchanged_after(ValueError, "cache", np.zeros((3, 8, 3)), rb, 0, 1)
    unchanged_after(ValueError, "cache", bcache, rb, 0, 2, batch_dim=0)  # 3 < 5 positions
    unchanged_after(ValueError, "cache", bcache, rb, [0, 4], 1)  # request 1 too short
    unchanged_after(ValueError, "prefix_lens", bcache, rb, [0, 0, 0], 1)
    unchanged_after(ValueError, "prefix_lens", bcache, rb, [0, -1], 1)
    unchanged_after(ValueError, "prefix_lens", bcache, rb, -2, 1)
    unchanged_after(TypeError, "prefix_lens", bcache, rb, [0.0, 1.0], 1)
    unchanged_after(ValueError, "active", bcache, rb, 0, 1, active=np.array([True]))
    unchanged_after(TypeError, "active", bcache, rb, 0, 1, active=np.array([1, 0]))
    unchanged_after(ValueError, "active", bcache, rb, 0, 1, active=np.ones((1, 2), bool))
    unchanged_after(ValueError, "active", cache, r, 0, 0, active=np.array([True]))
    with pytest.raises(ValueError, match="active"):
        ss.kv_compaction_plan(rb, 0, [True, False, True])


def test_compact_kv_refuses_overlapping_views():
    r = result5()
    base = np.arange(8.0)
    bcast = np.broadcast_to(base[:, None], (8, 4))  # read-only
    with pytest.raises(ValueError, match="read-only"):
        ss.compact_kv(bcast, r, 0, 0)
    zero = np.lib.stride_tricks.as_strided(base, shape=(8, 4), strides=(8, 0), writeable=True)
    assert zero.flags.writeable
    unchanged_after(ValueError, "overlap", zero, r, 0, 0)
    # rows that share elements: row i is base2[i : i + 4]
    base2 = np.arange(12.0)
    rows = np.lib.stride_tricks.as_strided(base2, shape=(8, 4), strides=(8, 8), writeable=True)
    unchanged_after(ValueError, "overlap", rows, r, 0, 0)
    # ... the same along the sequence axis (seq stride 0, other axis contiguous)
    seq0 = np.lib.stride_tricks.as_strided(base, shape=(8, 8), strides=(0, 8), writeable=True)
    unchanged_after(ValueError, "overlap", seq0, r, 0, 0)
    assert base.tolist() == list(range(8)) and base2.tolist() == list(range(12))
    # In a list (a model's layers), the overlapping entry is named, the others untouched.
    layers = [np.arange(32.0).reshape(8, 4), np.zeros((8, 4)), zero]
    with pytest.raises(ValueError, match=r"^cache\[2\]: has overlapping memory"):
        ss.compact_kv(layers, r, 0, 0)
    assert layers[0].ravel().tolist() == list(range(32)) and base.tolist() == list(range(8))
    with pytest.raises(ValueError, match=r"^cache: has overlapping memory"):
        ss.compact_kv(zero, r, 0, 0)


def test_compact_kv_refuses_object_arrays():
    """Moving PyObject pointers by memcpy would corrupt reference counts (a use-after-free),
    so arrays holding Python objects must be refused. Runs in a subprocess: if they are not,
    the corruption must not take down the test run."""
    code = textwrap.dedent(
        """
        import sys
        import numpy as np
        import specsched as ss

        r = ss.verify(ss.Tree([-1, 0, 0], [0, 1, 2]), target_tokens=[2, 0, 0])  # 2 -> 1
        objs = [object() for _ in range(3)]
        for dtype in (object, np.dtype([("k", object), ("v", "i4")])):
            cache = np.empty(3, dtype=dtype)
            for i in range(3):
                cache[i] = objs[i] if dtype is object else (objs[i], i)
            refs = [sys.getrefcount(o) for o in objs]
            try:
                ss.compact_kv(cache, r, 0, 0)
            except (TypeError, ValueError) as e:
                assert "cache" in str(e), e
            else:
                shared = (cache[1] if dtype is object else cache[1][0]) is objs[2]
                print(f"{dtype} accepted; cache[1] now holds objs[2]: {shared}, refcounts "
                      f"{refs} -> {[sys.getrefcount(o) for o in objs]}")
                sys.exit(1)
            assert [sys.getrefcount(o) for o in objs] == refs
            del cache
        print("ok")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr


# ------------------------------------------------------------------------------ commit_slots


@SETTINGS
@given(trees(1, 64, VOCAB), st.randoms(use_true_random=False), index_arrays(), st.integers(0, 99))
def test_commit_slots_matches_reference(tree, rnd, opts, base):
    r = verified(tree, rnd)
    n = len(tree[0])
    slots = list(rnd.sample(range(base, base + 10 * n), n))
    kept, freed = ss.commit_slots(as_array(slots, *opts), r)
    assert kept.dtype == freed.dtype == np.int64
    want = ref.commit_slots(slots, r.accepted_nodes.tolist())
    assert (kept.tolist(), freed.tolist()) == want
    assert sorted(kept.tolist() + freed.tolist()) == sorted(slots)
    kept2, _ = ss.commit_slots(slots, r)  # a list works too
    assert kept2.tolist() == want[0]


@SETTINGS
@given(batches(8, 32, VOCAB), st.randoms(use_true_random=False), index_arrays())
def test_batch_commit_slots_matches_reference(batch, rnd, opts):
    rb = verified_batch(batch, rnd)
    parents, _, offsets = batch
    slots = rnd.sample(range(10 * len(parents)), len(parents))
    kept, freed = ss.commit_slots(as_array(slots, *opts), rb)
    assert kept.dtype == freed.dtype == np.int64
    assert kept.shape == rb.accepted_nodes.shape
    want = ref.batch_commit_slots(slots, offsets, rb.accepted_nodes.tolist())
    assert (kept.tolist(), freed.tolist()) == want


def test_commit_slots_hand_case_and_errors():
    r, rb = result5(), batch_result()
    kept, freed = ss.commit_slots(np.array([50, 51, 52, 53, 54]), r)
    assert (kept.tolist(), freed.tolist()) == ([50, 51, 54], [52, 53])
    kept, freed = ss.commit_slots(np.arange(100, 110, dtype=np.int32), rb)
    assert kept.tolist() == [[100, 101, 104], [105, 107, -1]]
    assert freed.tolist() == [102, 103, 106, 108, 109]
    with pytest.raises(ValueError, match="slots"):
        ss.commit_slots(np.arange(4), r)
    with pytest.raises(ValueError, match="slots"):
        ss.commit_slots(np.arange(6), r)
    with pytest.raises(ValueError, match="slots"):
        ss.commit_slots(np.arange(5), rb)
    with pytest.raises(ValueError, match="slots"):
        ss.commit_slots(np.arange(10).reshape(2, 5), rb)
    with pytest.raises(TypeError, match="slots"):
        ss.commit_slots(np.arange(5.0), r)
    with pytest.raises(TypeError, match="result"):
        ss.commit_slots(np.arange(5), "not a result")
    with pytest.raises(TypeError, match="result"):
        ss.commit_slots(np.arange(5), ss.Tree(P5, T5))


def test_bool_prefix_is_refused() -> None:
    r = ss.verify(ss.Tree([-1, 0, 0], [0, 1, 2]), target_tokens=[2, 0, 0])
    with pytest.raises(TypeError, match="prefix_lens"):
        ss.kv_compaction_plan(r, True)


def test_bool_arguments_read_any_nonzero_byte_as_true():
    # numpy lets any byte sit in a bool array (a uint8 array viewed as bool); Rust reads the
    # bytes, so 2 or 255 is True, never a `bool` holding an invalid value.
    t = ss.Tree([-1, 0, 0], [0, 1, 2])
    rb = ss.verify(ss.TreeBatch([t, t, t]), target_tokens=[2, 0, 0] * 3)  # accepts node 2
    odd = np.array([2, 0, 255], np.uint8).view(bool)
    plain = np.array([True, False, True])
    want = ss.kv_compaction_plan(rb, [0, 0, 0], active=plain)
    got = ss.kv_compaction_plan(rb, [0, 0, 0], active=odd)
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    assert [g.tolist() for g in want] == [[0, 2], [2, 2], [1, 1]]
    b = ss.DynamicTreeBuilder(3, 2, 2, 3)
    b.start([1, 2, 3], [[4, 5]] * 3, [[-0.1, -1.0]] * 3, active=odd)
    assert b.build()[0].offsets.tolist() == [0, 3, 4, 7]


def test_buffer_descriptions_past_the_address_space_are_refused():
    # The device path's descriptions come from tensors; a hostile one must not wrap the
    # overlap arithmetic into "disjoint".
    from specsched import _core

    with pytest.raises(ValueError, match="cache: has overlapping memory"):
        _core.check_cache_buffers([(4096, [3, 2**62], [8, 4], 4)], False)
    with pytest.raises(ValueError, match="may share memory"):
        # The first ends past the top of the address space: it would wrap to look disjoint.
        _core.check_cache_buffers([(2**64 - 64, [16], [8], 8), (64, [16], [8], 8)])
    with pytest.raises(ValueError, match=r"cache\[0\]: 2 axes but 1 strides"):
        _core.check_cache_buffers([(4096, [4, 4], [16], 4)])
    _core.check_cache_buffers([(4096, [4, 4], [16, 4], 4), (8192, [4, 4], [16, 4], 4)])


def test_broadcast_flags_and_cuts_are_measured_before_they_are_copied():
    # `active` and `keep` views of 2**40 entries were copied first: the process aborted.
    batch = ss.TreeBatch.from_flat([-1, 0, -1, 0], [1, 2, 3, 4], [0, 2, 4])
    result = ss.verify(batch, target_tokens=np.array([2, 0, 4, 0]))
    huge_flags = np.broadcast_to(np.True_, (2**40,))
    for call in (
        lambda: ss.kv_compaction_plan(result, [1, 1], active=huge_flags),
        lambda: ss.compact_kv(
            np.zeros((2, 8, 2), np.float32), result, [1, 1], 1, batch_dim=0, active=huge_flags
        ),
    ):
        with pytest.raises(ValueError, match="active: has 1099511627776 entries, more than"):
            call()
    with pytest.raises(ValueError, match="keep: has 1099511627776 entries, more than"):
        result.truncate(np.broadcast_to(np.int64(1), (2**40,)))
