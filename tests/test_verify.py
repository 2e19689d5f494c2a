"""Greedy verification (`ss.verify`) against the pure-Python oracle (`specsched.reference`).

Covers the walk given the target's choices (single tree and ragged batch, every index dtype and
strided inputs), the SGLang output layout, verification from host logits (float16/32/64 in any
memory layout, ties, NaN handling, laziness), result objects, bad input, zero-copy reads and
GIL release.
"""

from __future__ import annotations

import inspect
import itertools
import random
import subprocess
import sys
import textwrap
import threading
import tracemalloc

import numpy as np
import pytest
import specsched as ss
from fresh import assert_read_in_place
from gil import heartbeat_gap
from hypothesis import given, settings
from hypothesis import strategies as st
from specsched import reference as ref
from strategies import P5, T5, TOKEN_DTYPES, as_array, batches, children, index_arrays, trees

VOCAB = 8  # the strategies' default: sibling collisions and matches are common
LOGIT_DTYPES = (np.float16, np.float32, np.float64)
LAYOUTS = ("C", "F", "cols", "rows", "neg")
SETTINGS = settings(deadline=None, max_examples=60)


# ------------------------------------------------------------------------------- helpers


def walk_targets(rnd: random.Random, parents: list[int], tokens: list[int], vocab: int = VOCAB):
    """Per node: with probability 0.8 a random child's token (so walks go deep and sibling
    collisions matter), else a random token of the vocabulary."""
    out = []
    for kids in children(parents):
        if kids and rnd.random() < 0.8:
            out.append(tokens[rnd.choice(kids)])
        else:
            out.append(rnd.randrange(vocab))
    return out


def make_logits(
    rng: np.random.Generator, parents: list[int], tokens: list[int], vocab: int, dtype
) -> np.ndarray:
    """`[N, vocab]` logits of small integers (so ties are common, and exact in float16) whose
    argmax is often a child's token; some -0.0, -inf and +inf entries and all--inf rows; past
    1024 columns, some rows' maximum in a later block."""
    n = len(parents)
    x = rng.integers(-3, 3, size=(n, vocab)).astype(np.float64)
    x[rng.random((n, vocab)) < 0.05] = -np.inf
    x[(x == 0) & (rng.random((n, vocab)) < 0.5)] = -0.0
    for v, kids in enumerate(children(parents)):
        u = rng.random()
        if kids and u < 0.8:
            y = tokens[rng.choice(kids)]
            hi = 3.0 if rng.random() < 0.9 else np.inf
            x[v, y] = hi
            if rng.random() < 0.3:  # a tie with another id, lower or higher
                x[v, rng.integers(vocab)] = hi
        elif u < 0.85:
            x[v] = -np.inf
        if vocab > 1024 and rng.random() < 0.15:
            # The row's maximum in a later 1024-wide block (children's tokens are all in the
            # first): the merge across blocks and the tail must find it.
            x[v, rng.integers(1024, vocab)] = 4.0 if rng.random() < 0.8 else np.inf
    return x.astype(dtype)


def layout(x: np.ndarray, kind: str) -> np.ndarray:
    """A view with the values of `x` in memory layout `kind`."""
    if kind == "C":
        return np.ascontiguousarray(x)
    if kind == "F":
        out = np.asfortranarray(x)
        assert not out.flags.c_contiguous or min(x.shape) <= 1
        return out
    if kind == "cols":  # strided columns
        big = np.zeros((x.shape[0], 2 * x.shape[1]), dtype=x.dtype)
        big[:, ::2] = x
        return big[:, ::2]
    if kind == "rows":  # strided rows, contiguous within a row
        big = np.zeros((2 * x.shape[0], x.shape[1]), dtype=x.dtype)
        big[::2] = x
        return big[::2]
    if kind == "neg":  # negative strides on both axes
        return x[::-1, ::-1].copy()[::-1, ::-1]
    raise AssertionError(kind)


class Rows:
    """Lazy float rows of a numpy array for `reference.verify_logits` (reads visited rows only)."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = x

    def __getitem__(self, v: int) -> list[float]:
        return self.x[v].astype(np.float64).tolist()


def ref_batch_logits(parents, tokens, offsets, x):
    """`reference.verify_logits` per tree of a batch, padded as `batch_verify_walk`."""
    width = max(max(ref.depths(parents[s:e])) for s, e in itertools_pairs(offsets)) + 1
    num, acc, tok = [], [], []
    for s, e in itertools_pairs(offsets):
        a, t = ref.verify_logits(parents[s:e], tokens[s:e], Rows(x[s:e]))
        num.append(len(a) - 1)
        acc.append(a + [-1] * (width - len(a)))
        tok.append(t + [-1] * (width - len(t)))
    return num, acc, tok


def itertools_pairs(offsets):
    return list(itertools.pairwise(offsets))


def check_single(r, acc: list[int], tok: list[int], num_nodes: int) -> None:
    assert isinstance(r, ss.VerifyResult)
    assert r.accepted_nodes.dtype == np.int32
    assert r.tokens.dtype == np.int64
    assert r.accepted_nodes.tolist() == acc
    assert r.tokens.tolist() == tok
    assert r.num_accepted == len(acc) - 1
    assert r.bonus_token == tok[-1]
    assert r.num_nodes == num_nodes


def check_batch(rb, num, acc, tok) -> None:
    assert isinstance(rb, ss.BatchVerifyResult)
    assert rb.num_accepted.dtype == np.int32
    assert rb.accepted_nodes.dtype == np.int32
    assert rb.tokens.dtype == np.int64
    assert rb.num_accepted.tolist() == num
    assert rb.accepted_nodes.tolist() == acc
    assert rb.tokens.tolist() == tok


def sglang_verify_tree_greedy(parents, tokens, offsets, target, width):
    """SGLang's `verify_tree_greedy` kernel, transcribed (retrive_index = global flat index,
    retrive_next_token / retrive_next_sibling = first child / next sibling, candidates = draft
    tokens, target_predict = the target's choice per node; num_speculative_tokens = width)."""
    next_token, next_sibling = ref.batch_sglang_links(parents, offsets)
    predicts = [0] * offsets[-1]
    accept_index = [[-1] * width for _ in range(len(offsets) - 1)]
    accept_length = []
    for bx in range(len(offsets) - 1):
        base = offsets[bx]
        last = base
        accept_index[bx][0] = last
        num = 0
        cur = 0
        for _ in range(1, width):
            cur = next_token[base + cur]
            while cur != -1:
                draft = base + cur
                if tokens[draft] == target[last]:
                    predicts[last] = target[last]
                    num += 1
                    accept_index[bx][num] = draft
                    last = draft
                    break
                cur = next_sibling[base + cur]
            if cur == -1:
                break
        accept_length.append(num)
        predicts[last] = target[last]
    return predicts, accept_index, accept_length


# ------------------------------------------------------------------ walk: target_tokens


@SETTINGS
@given(
    trees(1, 64, VOCAB),
    st.randoms(use_true_random=False),
    index_arrays(),
    st.sampled_from(TOKEN_DTYPES),
    st.sampled_from(TOKEN_DTYPES),
    st.booleans(),
)
def test_verify_target_tokens_matches_reference(
    tree, rnd, parent_opts, token_dtype, target_dtype, target_strided
):
    parents, tokens = tree
    target = walk_targets(rnd, parents, tokens)
    t = ss.Tree(as_array(parents, *parent_opts), as_array(tokens, token_dtype, parent_opts[1]))
    r = ss.verify(t, target_tokens=as_array(target, target_dtype, target_strided))
    acc, tok = ref.verify_walk(parents, tokens, target)
    check_single(r, acc, tok, len(parents))


def test_verify_walk_hand_cases():
    t = ss.Tree(P5, T5)
    # root -> 11 (node 1) -> 14 (node 4, the second child) -> leaf, bonus = choice at node 4
    check_single(ss.verify(t, target_tokens=[11, 0, 0, 0, 77]), [0, 1], [11, 0], 5)
    check_single(ss.verify(t, target_tokens=[11, 14, 0, 0, 77]), [0, 1, 4], [11, 14, 77], 5)
    check_single(ss.verify(t, target_tokens=[12, 14, 55, 0, 77]), [0, 2], [12, 55], 5)
    check_single(ss.verify(t, target_tokens=[99, 11, 12, 13, 14]), [0], [99], 5)
    # sibling collision: two children with the same token -> the lower index is accepted
    t = ss.Tree([-1, 0, 0, 2], [0, 5, 5, 6])
    check_single(ss.verify(t, target_tokens=[5, 6, 6, 1]), [0, 1], [5, 6], 4)
    # single node tree: nothing to accept, the bonus is the root's choice
    check_single(ss.verify(ss.Tree([-1], [3]), target_tokens=[42]), [0], [42], 1)
    # A negative target token matches no draft, even a negative draft token: the walk stops
    # there with it as the bonus (docs/api.md; sim.replay's end-of-continuation marker).
    t = ss.Tree([-1, 0, 1], [0, -1, 5])
    check_single(ss.verify(t, target_tokens=[-1, 5, 0]), [0], [-1], 3)
    assert ref.verify_walk([-1, 0, 1], [0, -1, 5], [-1, 5, 0]) == ([0], [-1])


def test_verify_uint32_tokens_above_int32_range():
    big = 2**32 - 1
    t = ss.Tree([-1, 0, 0, 1], np.array([1, big - 1, big, big], dtype=np.uint32))
    target = np.array([big, 0, big, 0], dtype=np.uint32)
    r = ss.verify(t, target_tokens=target)
    check_single(r, [0, 2], [big, big], 4)
    r = ss.verify(t, target_tokens=np.array([big - 1, big, 0, 7], dtype=np.uint32))
    check_single(r, [0, 1, 3], [big - 1, big, 7], 4)


# ----------------------------------------------------------------- batch: target_tokens


@SETTINGS
@given(batches(8, 32, VOCAB), st.randoms(use_true_random=False), index_arrays(), st.booleans())
def test_batch_verify_target_tokens_matches_reference(batch, rnd, target_opts, from_flat):
    parents, tokens, offsets = batch
    target = []
    for s, e in itertools_pairs(offsets):
        target += walk_targets(rnd, parents[s:e], tokens[s:e])
    if from_flat:
        b = ss.TreeBatch.from_flat(parents, tokens, offsets)
    else:
        b = ss.TreeBatch([ss.Tree(parents[s:e], tokens[s:e]) for s, e in itertools_pairs(offsets)])
    rb = ss.verify(b, target_tokens=as_array(target, *target_opts))
    num, acc, tok = ref.batch_verify_walk(parents, tokens, offsets, target)
    check_batch(rb, num, acc, tok)
    # rb[i] is the single-tree verify of b[i]
    assert len(rb) == len(offsets) - 1
    for i, (s, e) in enumerate(itertools_pairs(offsets)):
        one = ss.verify(b[i], target_tokens=np.asarray(target[s:e], dtype=np.int64))
        for got in (rb[i], rb[i - len(rb)]):
            check_single(got, one.accepted_nodes.tolist(), one.tokens.tolist(), e - s)
    with pytest.raises(IndexError):
        rb[len(rb)]
    with pytest.raises(IndexError):
        rb[-len(rb) - 1]
    # SGLang layout: against the oracle and against a transcription of SGLang's kernel
    predicts, accept_index, accept_length = rb.to_sglang()
    want = ref.sglang_outputs(offsets, acc, tok, num)
    assert predicts.dtype == accept_index.dtype == accept_length.dtype == np.int32
    assert predicts.tolist() == want[0]
    assert accept_index.tolist() == want[1]
    assert accept_length.tolist() == want[2]
    kernel = sglang_verify_tree_greedy(parents, tokens, offsets, target, len(acc[0]))
    assert (predicts.tolist(), accept_index.tolist(), accept_length.tolist()) == kernel


def test_to_sglang_hand_case():
    # tree 0: root 5 -> {1: 7, 2: 8}, 1 -> {3: 9};  tree 1: chain 1 -> 2 -> 3 -> 4
    b = ss.TreeBatch.from_flat([-1, 0, 0, 1, -1, 0, 1, 2], [5, 7, 8, 9, 1, 2, 3, 4], [0, 4, 8])
    target = [8, 11, 21, 31, 2, 3, 99, 4]
    rb = ss.verify(b, target_tokens=target)
    assert rb.num_accepted.tolist() == [1, 2]
    assert rb.accepted_nodes.tolist() == [[0, 2, -1, -1], [0, 1, 2, -1]]
    assert rb.tokens.tolist() == [[8, 21, -1, -1], [2, 3, 99, -1]]
    predicts, accept_index, accept_length = rb.to_sglang()
    # accept_index: global flat node indices, -1 padded; accept_length excludes the bonus;
    # predicts: the target's choice at every accepted node (the next emitted token), else 0
    assert accept_index.tolist() == [[0, 2, -1, -1], [4, 5, 6, -1]]
    assert accept_length.tolist() == [1, 2]
    assert predicts.tolist() == [8, 0, 21, 0, 2, 3, 99, 0]
    assert (predicts.tolist(), accept_index.tolist(), accept_length.tolist()) == (
        sglang_verify_tree_greedy(
            [-1, 0, 0, 1, -1, 0, 1, 2], [5, 7, 8, 9, 1, 2, 3, 4], [0, 4, 8], target, 4
        )
    )


# ------------------------------------------------------------------------ verify: logits


@SETTINGS
@given(
    trees(1, 48, VOCAB),
    st.integers(0, 2**32 - 1),
    st.sampled_from(LOGIT_DTYPES),
    st.sampled_from(LAYOUTS),
    st.sampled_from([1, VOCAB, 9, 1025, 2100]),
)
def test_verify_logits_matches_reference(tree, seed, dtype, kind, vocab):
    parents, tokens = tree
    rng = np.random.default_rng(seed)
    x = make_logits(rng, parents, tokens, max(vocab, VOCAB), dtype)[:, :vocab]
    logits = layout(x, kind)
    assert np.array_equal(logits, x)
    r = ss.verify(ss.Tree(parents, tokens), logits)
    acc, tok = ref.verify_logits(parents, tokens, Rows(x))
    check_single(r, acc, tok, len(parents))


@SETTINGS
@given(
    batches(8, 24, VOCAB),
    st.integers(0, 2**32 - 1),
    st.sampled_from(LOGIT_DTYPES),
    st.sampled_from(LAYOUTS),
    st.sampled_from([VOCAB, 2100]),  # rows of several 1024-wide blocks
)
def test_batch_verify_logits_matches_reference(batch, seed, dtype, kind, vocab):
    parents, tokens, offsets = batch
    rng = np.random.default_rng(seed)
    x = np.concatenate(
        [
            make_logits(rng, parents[s:e], tokens[s:e], vocab, dtype)
            for s, e in itertools_pairs(offsets)
        ]
    )
    rb = ss.verify(ss.TreeBatch.from_flat(parents, tokens, offsets), layout(x, kind))
    check_batch(rb, *ref_batch_logits(parents, tokens, offsets, x))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_large_batch_from_logits_matches_reference(dtype, seed):
    """A batch big enough (B x depth x V in the millions) for the multi-threaded walk: results,
    laziness and the NaN row all as for small batches."""
    rnd = random.Random(seed)
    rng = np.random.default_rng(seed)
    vocab = 32768
    parents, tokens, offsets = [], [], [0]
    for _ in range(rnd.randint(12, 20)):
        n = rnd.randint(1, 24)
        p = [-1] + [i - 1 if rnd.random() < 0.7 else rnd.randrange(i) for i in range(1, n)]
        parents += p
        tokens += [rnd.randrange(VOCAB) for _ in p]
        offsets.append(len(parents))
    x = np.concatenate(
        [
            make_logits(rng, parents[s:e], tokens[s:e], vocab, dtype)
            for s, e in itertools_pairs(offsets)
        ]
    )
    choice = np.argmax(x, axis=1).tolist()  # numpy: the first maximum
    num, acc, tok = ref.batch_verify_walk(parents, tokens, offsets, choice)
    assert len(num) * len(acc[0]) * vocab >= 1 << 22
    b = ss.TreeBatch.from_flat(parents, tokens, offsets)
    check_batch(ss.verify(b, x), num, acc, tok)
    check_batch(ss.verify(b, np.asfortranarray(x)), num, acc, tok)
    visited = [
        s + a
        for (s, _), row in zip(itertools_pairs(offsets), acc, strict=True)
        for a in row
        if a >= 0
    ]
    poisoned = x.copy()
    poisoned[np.setdiff1d(np.arange(len(parents)), visited)] = np.nan
    check_batch(ss.verify(b, poisoned), num, acc, tok)
    row = visited[rnd.randrange(len(visited))]
    poisoned[row, rnd.randrange(vocab)] = np.nan
    with pytest.raises(ValueError, match=rf"row {row}\b"):
        ss.verify(b, poisoned)


@pytest.mark.parametrize("dtype", LOGIT_DTYPES)
@pytest.mark.parametrize("vocab", [5, 1024, 3000])
def test_ties_go_to_the_lowest_id(dtype, vocab):
    t = ss.Tree.chain([0, 1, vocab - 1])
    for ids in ([1, vocab - 1], [0, 1], [vocab - 1, 1, 2]):
        x = np.zeros((3, vocab), dtype=dtype)
        x[0, ids] = 2
        for kind in LAYOUTS:
            r = ss.verify(t, layout(x, kind))
            assert r.tokens[0] == min(ids)
    # -0.0 and 0.0 are equal: the lower id wins whichever sign it has
    x = np.full((3, vocab), -1, dtype=dtype)
    x[0, 1] = -0.0
    x[0, vocab - 1] = 0.0
    assert ss.verify(t, x).accepted_nodes.tolist() == [0, 1]
    # all -inf: every entry ties, id 0
    x = np.full((3, vocab), -np.inf, dtype=dtype)
    assert ss.verify(t, x).tokens.tolist() == [0]


@pytest.mark.parametrize("dtype", LOGIT_DTYPES)
def test_ties_across_blocks_in_a_large_vocabulary(dtype):
    vocab = 128256
    x = np.zeros((2, vocab), dtype=dtype)
    x[0, [70000, 1500, 128255]] = 7
    t = ss.Tree.chain([0, 1500])
    assert ss.verify(t, x).accepted_nodes.tolist() == [0, 1]
    assert ss.verify(t, np.asfortranarray(x)).tokens.tolist() == [1500, 0]
    x[0, 1500] = 6
    assert ss.verify(t, x).tokens.tolist() == [70000]


def chain_logits(n: int, vocab: int, dtype) -> tuple[ss.Tree, np.ndarray]:
    """A chain 0 -> 1 -> ... -> n-1 (node i has token i) whose logits accept every node."""
    t = ss.Tree.chain(list(range(n)))
    x = np.zeros((n, vocab), dtype=dtype)
    x[np.arange(n), np.arange(1, n + 1)] = 1
    return t, x


@pytest.mark.parametrize("dtype", LOGIT_DTYPES)
@pytest.mark.parametrize("vocab", [10, 2100])
@pytest.mark.parametrize("col", [0, 4, -1])
def test_nan_in_a_visited_row_names_the_row(dtype, vocab, col):
    t, x = chain_logits(6, vocab, dtype)
    x[3, col] = np.nan
    for kind in LAYOUTS:
        with pytest.raises(ValueError, match=r"row 3\b"):
            ss.verify(t, layout(x, kind))
    with pytest.raises(ValueError, match=r"row 3\b"):
        ref.verify_logits(list(range(-1, 5)), list(range(6)), Rows(x))
    # a NaN in a visited row that is not the argmax position also counts
    t, x = chain_logits(6, vocab, dtype)
    x[3, 4] = 5  # the walk stops at node 3 with bonus 4 ...
    x[3, -1] = np.nan  # ... but the row is invalid
    with pytest.raises(ValueError, match=r"row 3\b"):
        ss.verify(t, x)


def test_nan_in_a_visited_row_of_a_batch_names_the_global_row():
    b = ss.TreeBatch([ss.Tree.chain([0, 1, 2]), ss.Tree.chain([0, 1, 2, 3])])
    x = np.zeros((7, 2100), dtype=np.float32)
    x[[0, 1, 3, 4, 5], [1, 2, 1, 2, 3]] = 1
    assert ss.verify(b, x).num_accepted.tolist() == [2, 3]
    x[5, 1000] = np.nan  # tree 1, node 2
    with pytest.raises(ValueError, match=r"row 5\b"):
        ss.verify(b, x)


@pytest.mark.parametrize("dtype", LOGIT_DTYPES)
def test_nan_in_an_unvisited_row_is_not_an_error(dtype):
    t = ss.Tree(P5, T5)
    x = np.zeros((5, 20), dtype=dtype)
    x[0, 12] = 1  # root -> node 2 (token 12), a leaf; rows 1, 3, 4 are never read
    x[2, 7] = 1
    x[[1, 3, 4]] = np.nan
    for kind in LAYOUTS:
        check_single(ss.verify(t, layout(x, kind)), [0, 2], [12, 7], 5)


@SETTINGS
@given(
    batches(6, 24, VOCAB),
    st.integers(0, 2**32 - 1),
    st.sampled_from(LOGIT_DTYPES),
    st.sampled_from(LAYOUTS),
    st.sampled_from([VOCAB, 2100]),
)
def test_only_rows_on_the_accepted_path_are_read(batch, seed, dtype, kind, vocab):
    """NaN in every row off the accepted path: the result is unchanged (laziness proof)."""
    parents, tokens, offsets = batch
    rng = np.random.default_rng(seed)
    x = np.concatenate(
        [
            make_logits(rng, parents[s:e], tokens[s:e], vocab, dtype)
            for s, e in itertools_pairs(offsets)
        ]
    )
    num, acc, tok = ref_batch_logits(parents, tokens, offsets, x)
    visited = [
        s + a
        for (s, _), row in zip(itertools_pairs(offsets), acc, strict=True)
        for a in row
        if a >= 0
    ]
    poisoned = x.copy()
    off_path = np.setdiff1d(np.arange(len(parents)), visited)
    poisoned[off_path] = np.nan
    b = ss.TreeBatch.from_flat(parents, tokens, offsets)
    check_batch(ss.verify(b, layout(poisoned, kind)), num, acc, tok)
    s, e = offsets[0], offsets[1]
    r = ss.verify(b[0], layout(poisoned[s:e], kind))
    check_single(r, acc[0][: num[0] + 1], tok[0][: num[0] + 1], e - s)


def test_unaligned_logits():
    buf = np.zeros(5 * 20 * 4 + 1, dtype=np.uint8)
    x = buf[1:].view(np.float32).reshape(5, 20)
    assert not x.flags.aligned
    x[0, 12] = 1
    x[2, 7] = 1
    check_single(ss.verify(ss.Tree(P5, T5), x), [0, 2], [12, 7], 5)


def test_logits_from_a_list_and_readonly_logits():
    t = ss.Tree(P5, T5)
    rows = [[0.0] * 20 for _ in range(5)]
    rows[0][11] = 1.0
    rows[1][13] = 1.0
    check_single(ss.verify(t, rows), [0, 1, 3], [11, 13, 0], 5)
    x = np.asarray(rows, dtype=np.float32)
    x.setflags(write=False)
    check_single(ss.verify(t, x), [0, 1, 3], [11, 13, 0], 5)


# ------------------------------------------------------------------------------ results


def test_result_arrays_are_read_only():
    t = ss.Tree(P5, T5)
    r = ss.verify(t, target_tokens=[11, 14, 0, 0, 77])
    b = ss.TreeBatch([t, t])
    rb = ss.verify(b, target_tokens=[11, 14, 0, 0, 77] * 2)
    for arr in (
        r.accepted_nodes,
        r.tokens,
        rb.num_accepted,
        rb.accepted_nodes,
        rb.tokens,
        rb[1].accepted_nodes,
    ):
        assert not arr.flags.writeable
        with pytest.raises(ValueError):
            arr[0] = 5
        with pytest.raises(ValueError):
            arr.setflags(write=True)
    assert r.accepted_nodes.tolist() == [0, 1, 4]
    assert rb.num_accepted.tolist() == [2, 2]
    # results stay valid after the arrays' other owners are gone
    acc = ss.verify(ss.Tree(P5, T5), target_tokens=[12, 0, 3, 0, 0]).accepted_nodes
    del t, r
    assert acc.tolist() == [0, 2]
    assert isinstance(ss.verify(b, target_tokens=[0] * 10)[0].num_accepted, int)


def same_batch_result(a: ss.BatchVerifyResult, b: ss.BatchVerifyResult) -> None:
    for name in ("num_accepted", "accepted_nodes", "tokens", "offsets"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), name


@given(batches(max_trees=5, max_nodes=12), st.data())
@settings(max_examples=150, deadline=None)
def test_results_pickle_by_value(batch, data):
    import pickle

    parents, tokens, offsets = batch
    b = ss.TreeBatch.from_flat(parents, tokens, offsets)
    choice = data.draw(
        st.lists(st.integers(-1, VOCAB), min_size=len(parents), max_size=len(parents))
    )
    rb = ss.verify(b, target_tokens=choice)
    keep = [data.draw(st.integers(1, k + 1)) for k in rb.num_accepted.tolist()]
    for result in (rb, rb.truncate(keep)):
        back = pickle.loads(pickle.dumps(result))
        same_batch_result(back, result)
        assert back.to_sglang()[1].tolist() == result.to_sglang()[1].tolist()
        # The restored result plans the same KV moves (checked against its offsets).
        for got, want in zip(
            ss.kv_compaction_plan(back, 3), ss.kv_compaction_plan(result, 3), strict=True
        ):
            assert got.tolist() == want.tolist()
        for i in range(len(result)):
            one = pickle.loads(pickle.dumps(result[i]))
            assert one.accepted_nodes.tolist() == result[i].accepted_nodes.tolist()
            assert one.tokens.tolist() == result[i].tokens.tolist()
            assert one.num_nodes == result[i].num_nodes
            assert not one.tokens.flags.writeable


def test_restored_results_are_checked() -> None:
    from specsched import BatchVerifyResult, VerifyResult

    one = VerifyResult._from_parts  # what unpickling calls
    assert one(np.array([0, 2], np.int32), [5, 6], 4).tokens.tolist() == [5, 6]
    for parts, arg in (
        (([1], [5], 4), "accepted_nodes: a path starts at the root"),
        (([0, 2, 2], [5, 6, 7], 4), "accepted_nodes: entry 2 is 2"),
        (([0, 4], [5, 6], 4), "accepted_nodes: entry 1 is 4"),
        (([0, -1], [5, 6], 4), "accepted_nodes: entry 1 is -1"),
        (([0, 1], [5], 4), "tokens: expected 2 entries"),
        (([0], [5], 0), "num_nodes: 0: a verified tree has 1 to 65536 nodes"),
        # Past a tree's size the indices wrapped through i32 ([0, 2**32] came back [0, 0]).
        (([0, 2**32], [5, 6], 2**33), "num_nodes: 8589934592: a verified tree has 1 to"),
        (([0, 1], [5, 6], 65537), "num_nodes: 65537"),
        (([], [], 3), "accepted_nodes: a path starts at the root"),
    ):
        with pytest.raises(ValueError, match=arg):
            one(*(np.array(x, dtype=np.int64) if isinstance(x, list) else x for x in parts))
    with pytest.raises(TypeError, match="accepted_nodes: expected an integer array"):
        one(np.array([0.0]), np.array([5]), 1)

    batch = BatchVerifyResult._from_parts
    k, nodes, toks, offs = [1, 0], [[0, 2], [0, -1]], [[5, 6], [7, -1]], [0, 3, 4]
    good = batch(*(np.array(x) for x in (k, nodes, toks, offs)))
    assert good.tokens.tolist() == toks and good.offsets.tolist() == offs
    for change, arg in (
        ({"k": [2, 0]}, r"num_accepted: num_accepted\[0\] = 2, expected 0..2"),
        ({"k": [1, -1]}, r"num_accepted: num_accepted\[1\] = -1"),
        ({"nodes": [[0, 3], [0, -1]]}, "accepted_nodes: row 0: entry 1 is 3"),
        ({"nodes": [[0, 2], [0, 0]]}, r"accepted_nodes: row 1: entries past the path \(1\)"),
        ({"toks": [[5, 6], [7, 8]]}, r"tokens: row 1: entries past the path \(1\)"),
        ({"toks": [[5, 6]]}, r"tokens: expected shape \(2, 2\)"),
        ({"nodes": [[0, 2]]}, r"accepted_nodes: expected shape \(2, width >= 1\)"),
        ({"offs": [0, 3]}, "offsets: expected 3 entries starting at 0"),
        ({"offs": [1, 3, 4]}, "offsets: expected 3 entries starting at 0"),
        (
            {"offs": [0, 3, 3]},
            "offsets: offsets\\[1..=2\\] = 3, 3: each tree has at least its root",
        ),
        ({"offs": [0, 3, 2]}, "offsets: offsets\\[1..=2\\] = 3, 2"),
    ):
        parts = {"k": k, "nodes": nodes, "toks": toks, "offs": offs, **change}
        with pytest.raises(ValueError, match=arg):
            batch(*(np.array(parts[x]) for x in ("k", "nodes", "toks", "offs")))
    # Past a batch's node limit (global indices wrapped in to_sglang, which sized its
    # output from them): 300 trees of 65536 nodes.
    rows = 300
    with pytest.raises(ValueError, match=r"^offsets: 19660800 nodes in all, more than a batch"):
        batch(
            np.zeros(rows, np.int64),
            np.zeros((rows, 1), np.int64),
            np.zeros((rows, 1), np.int64),
            np.arange(rows + 1, dtype=np.int64) * 65536,
        )
    empty = batch(
        np.zeros(0, np.int64), np.zeros((0, 1), np.int64), np.zeros((0, 1), np.int64), [0]
    )
    assert len(empty) == 0


# ---------------------------------------------------------------------------- bad input


def test_front_door_keeps_the_documented_call():
    """`verify(tree, logits)` on host numpy logits goes straight to Rust and every other call
    to the full function: the same results either way, the documented keyword-only signature
    for `inspect` / help(), and Python's own errors for a bad call, naming `verify`."""
    sig = inspect.signature(ss.verify)
    assert list(sig.parameters)[:3] == ["tree", "logits", "target_tokens"]
    kinds = {name: p.kind for name, p in sig.parameters.items()}
    assert kinds["logits"] is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert {kinds[k] for k in list(kinds)[2:]} == {inspect.Parameter.KEYWORD_ONLY}
    assert ss.verify.__name__ == "verify" and "Verifies `tree`" in (ss.verify.__doc__ or "")
    b = ss.TreeBatch([ss.Tree(P5, T5), ss.Tree.chain([1, 2])])
    logits = np.random.default_rng(0).standard_normal((7, 16)).astype(np.float32)
    logits[[0, 1, 5], [T5[1], T5[3], 2]] = 9.0  # two draft tokens of the tree, the chain's one
    fast = ss.verify(b, logits)
    for spelled_out in (
        ss.verify(b, logits=logits),
        ss.verify(b, logits, reduce="host"),
        ss.verify(b, logits, seed=None, temperature=None),
    ):
        assert spelled_out.num_accepted.tolist() == fast.num_accepted.tolist()
        assert spelled_out.tokens.tolist() == fast.tokens.tolist()
    assert fast.num_accepted.tolist() == [2, 1]
    with pytest.raises(TypeError, match=r"verify\(\) got an unexpected keyword argument 'sed'"):
        ss.verify(b, logits, sed=1)
    with pytest.raises(TypeError, match=r"verify\(\) takes from 1 to 2 positional arguments"):
        ss.verify(b, logits, None)


def test_bad_input():
    t = ss.Tree(P5, T5)
    b = ss.TreeBatch([t, ss.Tree.chain([1, 2])])
    x = np.zeros((5, 10), dtype=np.float32)
    for both_or_neither in ({}, {"logits": x, "target_tokens": [0] * 5}):
        with pytest.raises(TypeError, match=r"^logits / target_tokens: pass exactly one"):
            ss.verify(t, **both_or_neither)
    with pytest.raises(ValueError, match="logits"):
        ss.verify(t, np.zeros((4, 10), dtype=np.float32))
    with pytest.raises(ValueError, match="logits"):
        ss.verify(t, np.zeros((6, 10), dtype=np.float32))
    with pytest.raises(ValueError, match="logits"):
        ss.verify(b, np.zeros((5, 10), dtype=np.float32))
    with pytest.raises(ValueError, match="logits"):
        ss.verify(t, np.zeros((5, 10, 1), dtype=np.float32))
    with pytest.raises(ValueError, match="logits"):
        ss.verify(t, np.zeros(5, dtype=np.float32))
    with pytest.raises(ValueError, match="logits"):
        ss.verify(t, np.zeros((5, 0), dtype=np.float32))
    for dtype in (np.int32, np.int64, np.uint16, np.bool_, np.complex64):
        with pytest.raises(TypeError, match="logits"):
            ss.verify(t, np.zeros((5, 10), dtype=dtype))
    with pytest.raises(TypeError, match="logits"):
        ss.verify(t, np.zeros((5, 10), dtype=">f4"))
    with pytest.raises(ValueError, match="target_tokens"):
        ss.verify(t, target_tokens=np.zeros(4, dtype=np.int64))
    with pytest.raises(ValueError, match="target_tokens"):
        ss.verify(b, target_tokens=np.zeros(5, dtype=np.int64))
    with pytest.raises(ValueError, match="target_tokens"):
        ss.verify(t, target_tokens=np.zeros((5, 1), dtype=np.int64))
    with pytest.raises(TypeError, match="target_tokens"):
        ss.verify(t, target_tokens=np.zeros(5, dtype=np.float64))
    with pytest.raises(TypeError, match="target_tokens"):
        ss.verify(t, target_tokens=np.zeros(5, dtype=np.int16))
    with pytest.raises(TypeError):
        ss.verify(t, x, target_tokens=np.zeros(5, dtype=np.int64))
    with pytest.raises(TypeError):
        ss.verify(t)
    for not_a_tree in ([-1, 0, 0, 1, 1], None, np.zeros(5)):
        with pytest.raises(TypeError, match="tree"):
            ss.verify(not_a_tree, x)
        with pytest.raises(TypeError, match="tree"):
            ss.verify(not_a_tree, target_tokens=np.zeros(5, dtype=np.int64))
    with pytest.raises(ValueError, match="reduce"):
        ss.verify(t, x, reduce="bogus")
    with pytest.raises(ValueError, match="reduce"):
        ss.verify(t, x, reduce="device")  # numpy logits cannot be reduced on a device
    # reduce="host" on host logits is the default path
    assert ss.verify(t, x, reduce="host").tokens.tolist() == [0]


# ------------------------------------------------------------------ zero copy, GIL release


@pytest.mark.parametrize("kind", ["C", "F", "cols"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_host_logits_are_read_in_place(kind, dtype):
    vocab = 128256
    n = 64 if dtype == np.float32 else 128  # 32 MB either way
    t, base = chain_logits(n, vocab, dtype)
    x = layout(base, kind)
    del base
    assert x.nbytes >= 32e6
    tracemalloc.start()
    try:
        r = ss.verify(t, x)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.num_accepted == n - 1  # every row was reduced
    assert r.tokens[-1] == n
    assert peak < x.nbytes / 64


NUMPY_LOGITS_IN_PLACE = """
import numpy as np
vocab = 128256
# Resident logits of 256 MB in layouts whose columns are strided (Fortran order, every other
# column), each base at least as large as the one before, so a copy of the view would pass the
# earlier peak: the chain is accepted to its end, so every row is read.
for dtype, n, kind in (("float16", 1024, "F"), ("float32", 512, "F"), ("float32", 512, "cols")):
    if kind == "F":
        base = np.zeros((vocab, n), dtype=dtype)
        x = base.T
    else:
        base = np.zeros((n, 2 * vocab), dtype=dtype)
        x = base[:, ::2]
    x[:, 7] = 1
    verify_peak(kind + dtype, x, x.nbytes)
    del base, x
"""


def test_strided_host_logits_allocate_nothing_of_their_size():
    """The peak resident size, which sees Rust's allocator as tracemalloc (above) does not:
    verifying Fortran-order and column-strided numpy logits raises it by far less than a copy
    of them would (a copy through a Rust `Vec` passed the tracemalloc test). Fresh
    interpreter, whose earlier peak is small."""
    assert_read_in_place(NUMPY_LOGITS_IN_PLACE, 3, 8)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_broadcast_logits_are_never_materialised(dtype):
    """A 0.5-1 GB zero-stride logits view (one real row): reading it in place costs nothing;
    any copy would raise the peak resident size by its size. Measured in a fresh interpreter,
    whose earlier peak is small."""
    code = textwrap.dedent(
        f"""
        import resource
        import numpy as np
        import specsched as ss
        vocab, n = 128256, 2048
        row = np.zeros(vocab, dtype=np.{dtype})
        row[7] = 1
        x = np.broadcast_to(row, (n, vocab))
        t = ss.Tree.chain([7] * n)
        ss.verify(ss.Tree.chain([7, 7]), x[:2])  # warm up
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        r = ss.verify(t, x)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(r.num_accepted, (after - before) * 1024, x.nbytes)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    accepted, grew, nbytes = map(int, proc.stdout.split())
    assert accepted == 2047
    assert grew < nbytes / 4, f"peak RSS grew by {grew} bytes for {nbytes} bytes of logits"


def big_batch() -> tuple[ss.TreeBatch, np.ndarray]:
    """64 chains of 32 nodes with [2048, 128256] f32 logits (a zero-stride view: 500 KB of
    memory) that accept every node, so every row is reduced: tens of ms of work."""
    vocab, b, n = 128256, 64, 32
    row = np.zeros(vocab, dtype=np.float32)
    row[7] = 1
    return ss.TreeBatch([ss.Tree.chain([7] * n)] * b), np.broadcast_to(row, (b * n, vocab))


def big_chain() -> tuple[ss.Tree, np.ndarray]:
    """One chain of 1024 nodes, every row reduced (the single-tree, single-thread path)."""
    vocab, n = 128256, 1024
    row = np.zeros(vocab, dtype=np.float32)
    row[7] = 1
    return ss.Tree.chain([7] * n), np.broadcast_to(row, (n, vocab))


def test_batch_verify_from_two_threads():
    """Two threads verifying the same large batch at once both get the right result.

    (Whether they overlap cannot be told from perf_counter intervals taken in Python: with the
    GIL held, the thread that returns first is switched out before it can read the clock, so
    the intervals of two serialised calls intersect too. The GIL tests below use a heartbeat.)
    """
    batch, x = big_batch()

    def worker(barrier, out, i):
        barrier.wait()
        out[i] = ss.verify(batch, x)

    barrier = threading.Barrier(2)
    out: list = [None, None]
    threads = [threading.Thread(target=worker, args=(barrier, out, i)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for res in out:
        assert res.num_accepted.tolist() == [31] * 64
        assert res.tokens.tolist() == [[7] * 32] * 64


@pytest.mark.parametrize("make", [big_batch, big_chain], ids=["batch", "tree"])
def test_verify_from_logits_releases_the_gil(make):
    """While a thread is in verify, Python keeps running in another thread."""
    tree, x = make()
    want = ss.verify(tree, x).num_accepted
    results = []
    ratios = []
    for _ in range(3):  # retries absorb a rare long preemption of the heartbeat thread
        ratios.append(heartbeat_gap(lambda: results.append(ss.verify(tree, x))))
        if ratios[-1] < 0.5:
            break
    assert min(ratios) < 0.5, f"Python was blocked during verify: gap/call ratios {ratios}"
    for res in results:
        assert np.array_equal(res.num_accepted, want)


def test_packed_record_fields_are_read_by_value() -> None:
    """A field of a packed record array has strides that are not whole elements; it must be
    read by value (here through a copy), never reinterpreted at the wrong offsets."""
    packed = np.dtype({"names": ["b"], "formats": ["<i4"], "offsets": [0], "itemsize": 6})
    tokens = np.zeros(4, packed)
    tokens["b"] = [5, 6, 7, 8]
    tree = ss.Tree([-1, 0, 0, 1], tokens["b"])
    assert tree.tokens.tolist() == [5, 6, 7, 8]
    choice = np.zeros(4, packed)
    choice["b"] = [6, 8, 0, 2]
    r = ss.verify(tree, target_tokens=choice["b"])
    assert r.tokens.tolist() == [6, 8, 2]
    logits = np.zeros((4, 10), [("a", "u1"), ("b", "<f4")])
    for row, best in enumerate([6, 8, 0, 2]):
        logits["b"][row, best] = 1.0
    assert ss.verify(tree, logits["b"]).tokens.tolist() == [6, 8, 2]
