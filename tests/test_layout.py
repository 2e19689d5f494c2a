"""Every attention layout of `ss.Tree` / `ss.TreeBatch` against the pure-Python oracle
(`specsched.reference`), plus the `out=` contract, argument checks, zero-copy outputs and GIL
release."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import specsched as ss
from fresh import fresh_lines
from hypothesis import given, settings
from hypothesis import strategies as st
from specsched import reference as ref
from specsched.generate import pad_trees
from strategies import INDEX_DTYPES, PUBLISHED_TREES, as_array, batches, parent_lists, trees

PUBLISHED = PUBLISHED_TREES
FLOAT_DTYPES = (np.float16, np.float32, np.float64)


def _published() -> list[tuple[str, list[list[int]]]]:
    data = json.loads(PUBLISHED.read_text())
    return [
        (f"{family}/{name}", choices)
        for family in ("eagle", "medusa")
        for name, choices in data[family].items()
    ]


PUBLISHED_TREES = _published()


def _bias_from_mask(mask: np.ndarray) -> np.ndarray:
    """0 / -inf float64 from a bool mask."""
    return np.where(mask, 0.0, -np.inf)


def _assert_bias(got: np.ndarray, want_mask: np.ndarray, dtype: Any) -> None:
    assert got.dtype == np.dtype(dtype)
    assert got.shape == want_mask.shape
    assert np.array_equal(got == 0, want_mask)
    assert np.array_equal(np.isneginf(got), ~want_mask)


def _packbits_segments(flat: np.ndarray, indptr: Sequence[int]) -> tuple[np.ndarray, list[int]]:
    """FlashInfer `segment_packbits(..., bitorder="little")` written with numpy."""
    parts = [
        np.packbits(flat[indptr[b] : indptr[b + 1]], bitorder="little")
        for b in range(len(indptr) - 1)
    ]
    byte_indptr = [0]
    for p in parts:
        byte_indptr.append(byte_indptr[-1] + len(p))
    return np.concatenate(parts).astype(np.uint8), byte_indptr


# ------------------------------------------------------------------------------ single tree


def _check_tree_layouts(t: ss.Tree, parents: list[int], prefix_len: int) -> None:
    n = len(parents)
    words = (n + 31) // 32

    mask = t.attention_mask(prefix_len)
    want_mask = np.array(ref.attention_mask(parents, prefix_len), dtype=bool)
    assert mask.dtype == np.bool_
    assert mask.shape == (n, prefix_len + n)
    assert np.array_equal(mask, want_mask)
    assert mask.flags.c_contiguous and mask.flags.writeable
    if prefix_len == 0:
        assert np.array_equal(t.attention_mask(), want_mask)

    for dtype in FLOAT_DTYPES:
        _assert_bias(t.attention_bias(prefix_len, dtype), want_mask, dtype)
    _assert_bias(t.attention_bias(prefix_len), want_mask, np.float32)  # default float32
    _assert_bias(t.attention_bias(prefix_len, dtype="float16"), want_mask, np.float16)
    want_bias = np.array(ref.attention_bias(parents, prefix_len), dtype=np.float64)
    assert np.array_equal(t.attention_bias(prefix_len, np.float64), want_bias)

    packed = t.packed_mask()
    assert packed.dtype == np.uint32
    assert packed.shape == (n, words)
    assert packed.tolist() == ref.packed_mask(parents)
    # Independent of the oracle: unpacking the words gives the tree part of the dense mask.
    bits = np.unpackbits(packed.view(np.uint8), axis=1, bitorder="little")[:, :n]
    assert np.array_equal(bits.astype(bool), want_mask[:, prefix_len:])

    pos = t.positions(prefix_len)
    assert pos.dtype == np.int64
    assert pos.tolist() == ref.positions(parents, prefix_len)
    assert t.positions().tolist() == ref.positions(parents, 0)

    paths = t.paths()
    assert paths.dtype == np.int32
    assert paths.shape == (ref.num_leaves(parents), max(ref.depths(parents)) + 1)
    assert paths.tolist() == ref.paths(parents)

    links = t.sglang_links()
    assert isinstance(links, tuple) and len(links) == 2
    next_token, next_sibling = links
    assert next_token.dtype == np.int64 and next_sibling.dtype == np.int64
    want_nt, want_ns = ref.sglang_links(parents)
    assert next_token.tolist() == want_nt
    assert next_sibling.tolist() == want_ns


@settings(max_examples=40, deadline=None)
@given(tree=trees(1, 160), prefix_len=st.integers(0, 48))
def test_tree_layouts_match_reference(tree: tuple[list[int], list[int]], prefix_len: int) -> None:
    parents, tokens = tree
    _check_tree_layouts(ss.Tree(parents, tokens), parents, prefix_len)


@pytest.mark.parametrize("n", [1, 2, 31, 32, 33, 63, 64, 65, 96, 97, 300])
@pytest.mark.parametrize("shape", ["chain", "star", "binary"])
def test_tree_layouts_word_boundaries(n: int, shape: str) -> None:
    if shape == "chain":
        parents = ref.chain_parents(n)
    elif shape == "star":
        parents = [-1] + [0] * (n - 1)
    else:
        parents = [-1] + [(i - 1) // 2 for i in range(1, n)]
    _check_tree_layouts(ss.Tree(parents, list(range(n))), parents, 3)


def test_tree_layouts_hand_checked() -> None:
    # 0 -> {1, 2}; 1 -> {3, 4}: checked by hand, not against the oracle.
    t = ss.Tree([-1, 0, 0, 1, 1], [10, 11, 12, 13, 14])
    rows = ["1110000", "1111000", "1110100", "1111010", "1111001"]
    assert ["".join("1" if x else "0" for x in r) for r in t.attention_mask(2)] == rows
    assert t.packed_mask().ravel().tolist() == [0b1, 0b11, 0b101, 0b1011, 0b10011]
    assert t.positions(7).tolist() == [7, 8, 8, 9, 9]
    assert t.paths().tolist() == [[0, 2, -1], [0, 1, 3], [0, 1, 4]]
    nt, ns = t.sglang_links()
    assert nt.tolist() == [1, 3, -1, -1, -1]
    assert ns.tolist() == [-1, 2, -1, 4, -1]
    assert t.attention_bias(0, np.float32)[2].tolist() == [0.0, -np.inf, 0.0, -np.inf, -np.inf]
    # A single node.
    one = ss.Tree([-1], [5])
    assert one.attention_mask(3).tolist() == [[True] * 4]
    assert one.paths().tolist() == [[0]]
    assert one.packed_mask().tolist() == [[1]]


@pytest.mark.parametrize(("name", "choices"), PUBLISHED_TREES, ids=[n for n, _ in PUBLISHED_TREES])
def test_published_tree_layouts(name: str, choices: list[list[int]]) -> None:
    t = ss.Tree.from_choices(choices)
    parents, _ = ref.from_choices(choices)
    for prefix_len in (0, 5):
        _check_tree_layouts(t, parents, prefix_len)


def test_published_trees_as_batch() -> None:
    built = [ref.from_choices(c) for _, c in PUBLISHED_TREES]
    parents = [p for ps, _ in built for p in ps]
    offsets = [0]
    for ps, _ in built:
        offsets.append(offsets[-1] + len(ps))
    b = ss.TreeBatch([ss.Tree.from_choices(c) for _, c in PUBLISHED_TREES])
    prefix = np.arange(len(built), dtype=np.int64) * 3
    _check_batch_layouts(b, parents, offsets, prefix, prefix.tolist())


# ------------------------------------------------------------------------------------ batch


def _check_batch_layouts(
    b: ss.TreeBatch,
    parents: list[int],
    offsets: list[int],
    prefix_arg: Any,
    prefix: int | list[int],
) -> None:
    num_trees = len(offsets) - 1
    sizes = [offsets[i + 1] - offsets[i] for i in range(num_trees)]
    nmax = max(sizes)

    pos = b.positions(prefix_arg)
    assert pos.dtype == np.int64
    assert pos.tolist() == ref.batch_positions(parents, offsets, prefix)

    flat, indptr = ref.ragged_mask(parents, offsets, prefix)
    want_flat = np.array(flat, dtype=bool)
    mask = b.attention_mask(prefix_arg)
    assert mask.dtype == np.bool_ and mask.ndim == 1
    assert np.array_equal(mask, want_flat)
    mi = b.mask_indptr(prefix_arg)
    assert mi.dtype == np.int64
    assert mi.tolist() == indptr

    for dtype in FLOAT_DTYPES:
        _assert_bias(b.attention_bias(prefix_arg, dtype), want_flat, dtype)
    _assert_bias(b.attention_bias(prefix_arg), want_flat, np.float32)
    want_bias, bias_indptr = ref.ragged_bias(parents, offsets, prefix)
    assert bias_indptr == indptr
    assert np.array_equal(b.attention_bias(prefix_arg, np.float64), np.array(want_bias))

    packed, packed_indptr = b.packed_attention_mask(prefix_arg)
    want_packed, want_pindptr = ref.packed_ragged_mask(parents, offsets, prefix)
    assert packed.dtype == np.uint8
    assert packed_indptr.dtype == np.int64
    assert packed.tolist() == want_packed
    assert packed_indptr.tolist() == want_pindptr
    np_packed, np_indptr = _packbits_segments(want_flat, indptr)
    assert np.array_equal(packed, np_packed)
    assert packed_indptr.tolist() == np_indptr

    padded = b.padded_mask()
    assert padded.dtype == np.bool_ and padded.shape == (num_trees, nmax, nmax)
    assert padded.tolist() == ref.padded_mask(parents, offsets)

    bpacked = b.packed_mask()
    assert bpacked.dtype == np.uint32
    assert bpacked.shape == (len(parents), (nmax + 31) // 32)
    assert bpacked.tolist() == ref.batch_packed_mask(parents, offsets)

    paths = b.paths()
    want_paths = ref.batch_paths(parents, offsets)
    assert paths.dtype == np.int32
    assert paths.shape == np.array(want_paths).shape
    assert paths.tolist() == want_paths

    nt, ns = b.sglang_links()
    assert nt.dtype == np.int64 and ns.dtype == np.int64
    want_nt, want_ns = ref.batch_sglang_links(parents, offsets)
    assert nt.tolist() == want_nt
    assert ns.tolist() == want_ns

    if all(s == sizes[0] for s in sizes):
        q = b.qlen_mask()
        assert q.dtype == np.bool_ and q.shape == (num_trees, sizes[0], sizes[0])
        assert q.tolist() == ref.qlen_mask(parents, offsets)
    else:
        with pytest.raises(ValueError):
            ref.qlen_mask(parents, offsets)
        with pytest.raises(ValueError, match="tree sizes"):
            b.qlen_mask()

    # Every batched layout agrees with the per-tree layouts of b[i].
    pl = [prefix] * num_trees if isinstance(prefix, int) else prefix
    for i in range(num_trees):
        t = b[i]
        seg = mask[indptr[i] : indptr[i + 1]].reshape(sizes[i], pl[i] + sizes[i])
        assert np.array_equal(seg, t.attention_mask(pl[i]))
        s, e = offsets[i], offsets[i + 1]
        assert np.array_equal(pos[s:e], t.positions(pl[i]))
        assert np.array_equal(bpacked[s:e, : (sizes[i] + 31) // 32], t.packed_mask())


PREFIX_KINDS = ("none", "int", "int32", "int64", "list")


def _prefix_args(kind: str, values: list[int]) -> tuple[Any, int | list[int]]:
    """(argument passed to the extension, the same for the reference)."""
    if kind == "none":
        return None, 0
    if kind == "int":
        return values[0], values[0]
    if kind == "list":
        return list(values), list(values)
    return np.asarray(values, dtype=np.int32 if kind == "int32" else np.int64), list(values)


@settings(max_examples=40, deadline=None)
@given(
    batch=st.one_of(batches(max_trees=6, max_nodes=40), batches(max_trees=64, max_nodes=12)),
    kind=st.sampled_from(PREFIX_KINDS),
    prefixes=st.lists(st.integers(0, 40), min_size=64, max_size=64),
    strided=st.booleans(),
)
def test_batch_layouts_match_reference(
    batch: tuple[list[int], list[int], list[int]],
    kind: str,
    prefixes: list[int],
    strided: bool,
) -> None:
    parents, tokens, offsets = batch
    b = ss.TreeBatch.from_flat(parents, tokens, offsets)
    num_trees = len(offsets) - 1
    arg, prefix = _prefix_args(kind, prefixes[:num_trees])
    if strided and isinstance(arg, np.ndarray):
        arg = as_array(arg.tolist(), arg.dtype.type, True)
    if arg is None:
        # The default (no argument) is prefix 0 everywhere.
        assert np.array_equal(b.attention_mask(), b.attention_mask(0))
        assert np.array_equal(b.positions(), b.positions(0))
        assert np.array_equal(b.mask_indptr(), b.mask_indptr(0))
    _check_batch_layouts(b, parents, offsets, arg, prefix)
    _check_padded_layout(b, parents, tokens, offsets, arg, prefix)


def _check_padded_layout(
    b: ss.TreeBatch,
    parents: list[int],
    tokens: list[int],
    offsets: list[int],
    arg: Any,
    prefix: int | list[int],
) -> None:
    got = b.padded_layout() if arg is None else b.padded_layout(arg)
    want = ref.padded_layout(parents, tokens, offsets, prefix)
    nb, nmax, total = b.num_trees, b.max_nodes, b.num_nodes
    shapes = [(nb, nmax), (nb, nmax), (nb, nmax, nmax), (total,), (total,)]
    dtypes = [np.int64, np.int64, np.bool_, np.int64, np.int64]
    for g, w, shape, dtype in zip(got, want, shapes, dtypes, strict=True):
        assert g.dtype == dtype and g.shape == shape and g.flags.c_contiguous
        assert g.tolist() == w
    # What a model's per-slot outputs are gathered back with: tree order.
    tok, pos, mask, rows, cols = got
    assert np.array_equal(tok[rows, cols], b.tokens)
    assert np.array_equal(pos[rows, cols], b.positions(0 if arg is None else arg))
    assert mask.any(axis=-1).all()  # no empty attention row
    # generate.pad_trees is this layout.
    padded = pad_trees(b, np.zeros(nb, np.int64) if arg is None else arg)
    assert all(np.array_equal(x, y) for x, y in zip(padded, got, strict=True))


@st.composite
def equal_size_batches(draw: st.DrawFn) -> tuple[list[int], list[int], list[int]]:
    n = draw(st.integers(1, 40))
    num_trees = draw(st.integers(1, 6))
    parents: list[int] = []
    offsets = [0]
    for _ in range(num_trees):
        parents += draw(parent_lists(n, n))
        offsets.append(len(parents))
    return parents, [0] * len(parents), offsets


@settings(max_examples=25, deadline=None)
@given(batch=equal_size_batches(), prefix=st.integers(0, 20))
def test_equal_size_batch_layouts(
    batch: tuple[list[int], list[int], list[int]], prefix: int
) -> None:
    parents, tokens, offsets = batch
    b = ss.TreeBatch.from_flat(parents, tokens, offsets)
    _check_batch_layouts(b, parents, offsets, prefix, prefix)
    q = b.qlen_mask()
    assert np.array_equal(q, b.padded_mask())


def _random_batch(sizes: list[int], seed: int) -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(seed)
    parents: list[int] = []
    offsets = [0]
    for n in sizes:
        parents += [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
        offsets.append(len(parents))
    return parents, offsets


def test_large_batch_uses_parallel_path_correctly() -> None:
    # Big enough (> 2**18 elements) for the multi-threaded fill; every tree differs.
    sizes = [64, 1, 100, 33, 64, 7, 128, 65, 90, 2]
    parents, offsets = _random_batch(sizes, 1)
    prefix = [500 + 97 * i for i in range(len(sizes))]
    b = ss.TreeBatch.from_flat(parents, [0] * len(parents), offsets)
    assert b.mask_indptr(prefix)[-1] > 1 << 18
    flat, indptr = ref.ragged_mask(parents, offsets, prefix)
    want = np.array(flat, dtype=bool)
    assert np.array_equal(b.attention_mask(np.array(prefix, np.int32)), want)
    _assert_bias(b.attention_bias(prefix, np.float16), want, np.float16)
    packed, pindptr = b.packed_attention_mask(prefix)
    np_packed, np_indptr = _packbits_segments(want, indptr)
    assert np.array_equal(packed, np_packed)
    assert pindptr.tolist() == np_indptr
    assert b.positions(prefix).tolist() == ref.batch_positions(parents, offsets, prefix)
    assert b.padded_mask().tolist() == ref.padded_mask(parents, offsets)
    assert b.packed_mask().tolist() == ref.batch_packed_mask(parents, offsets)


def test_very_large_batch_packed_mask() -> None:
    # Packed output > 2**18 bytes (the packed fill goes parallel too): checked against
    # np.packbits of per-tree masks (each tree's own mask is checked against the oracle above).
    sizes = [128, 3, 77, 128, 64, 1, 100, 128] * 2
    parents, offsets = _random_batch(sizes, 2)
    prefix = np.array([1500 + 131 * i for i in range(len(sizes))], dtype=np.int64)
    b = ss.TreeBatch.from_flat(parents, [0] * len(parents), offsets)
    per_tree = [b[i].attention_mask(int(prefix[i])).ravel() for i in range(len(sizes))]
    want = np.concatenate(per_tree)
    indptr = np.cumsum([0] + [len(m) for m in per_tree]).tolist()
    assert b.mask_indptr(prefix).tolist() == indptr
    assert np.array_equal(b.attention_mask(prefix), want)
    packed, pindptr = b.packed_attention_mask(prefix)
    assert len(packed) > 1 << 18
    np_packed, np_indptr = _packbits_segments(want, indptr)
    assert pindptr.tolist() == np_indptr
    assert np.array_equal(packed, np_packed)


def test_batch_layouts_hand_checked() -> None:
    # Tree A: 0 -> 1 (2 nodes), tree B: chain of 3; prefixes 1 and 3.
    b = ss.TreeBatch.from_flat([-1, 0, -1, 0, 1], [0] * 5, [0, 2, 5])
    assert b.mask_indptr([1, 3]).tolist() == [0, 6, 24]
    mask = b.attention_mask([1, 3])
    assert mask[:6].tolist() == [True, True, False, True, True, True]
    assert mask[6:].reshape(3, 6).tolist() == [
        [True, True, True, True, False, False],
        [True, True, True, True, True, False],
        [True, True, True, True, True, True],
    ]
    packed, indptr = b.packed_attention_mask([1, 3])
    assert indptr.tolist() == [0, 1, 4]
    assert packed.tolist() == [0b111011, 0b11001111, 0b11110111, 0b11]
    assert b.positions([1, 3]).tolist() == [1, 2, 3, 4, 5]
    assert b.paths().tolist() == [[[0, 1, -1]], [[0, 1, 2]]]
    nt, ns = b.sglang_links()
    assert nt.tolist() == [1, -1, 1, 2, -1]
    assert ns.tolist() == [-1] * 5
    assert b.padded_mask()[0].tolist() == [
        [True, False, False],
        [True, True, False],
        [False, False, False],
    ]


# ----------------------------------------------------------------------------------- out=

TREE = ss.Tree([-1, 0, 0, 1, 1, 2, 5] + [6] * 30, list(range(37)))  # 37 nodes: 2 packed words
BATCH = ss.TreeBatch([TREE, ss.Tree.chain([1, 2, 3]), ss.Tree([-1, 0, 0, 0, 1], [0] * 5)])
EQUAL_BATCH = ss.TreeBatch([TREE, ss.Tree.chain(list(range(37)))])

# name -> f(out) computing the layout into `out` (or allocating when out is None)
OUT_LAYOUTS: dict[str, Callable[[Any], np.ndarray]] = {
    "tree.attention_mask": lambda out: TREE.attention_mask(5, out=out),
    "tree.attention_mask_default": lambda out: TREE.attention_mask(out=out),
    "tree.attention_bias_f16": lambda out: TREE.attention_bias(5, np.float16, out=out),
    "tree.attention_bias_f32": lambda out: TREE.attention_bias(5, out=out),
    "tree.attention_bias_f64": lambda out: TREE.attention_bias(5, np.float64, out=out),
    "tree.packed_mask": lambda out: TREE.packed_mask(out=out),
    "tree.positions": lambda out: TREE.positions(9, out=out),
    "batch.positions": lambda out: BATCH.positions([1, 0, 4], out=out),
    "batch.attention_mask": lambda out: BATCH.attention_mask(np.array([1, 0, 4]), out=out),
    "batch.attention_bias_f16": lambda out: BATCH.attention_bias(3, np.float16, out=out),
    "batch.attention_bias_f32": lambda out: BATCH.attention_bias(3, out=out),
    "batch.attention_bias_f64": lambda out: BATCH.attention_bias(3, np.float64, out=out),
    "batch.qlen_mask": lambda out: EQUAL_BATCH.qlen_mask(out=out),
    "batch.padded_mask": lambda out: BATCH.padded_mask(out=out),
    "batch.packed_mask": lambda out: BATCH.packed_mask(out=out),
}


def _garbage(expected: np.ndarray) -> np.ndarray:
    """An array of the same dtype and shape that differs from `expected` everywhere."""
    if expected.dtype == np.bool_ or expected.dtype.kind == "u":
        return ~expected
    if expected.dtype.kind == "i":
        return expected + 1
    return np.where(expected == 0, 1.0, 0.0).astype(expected.dtype)


@pytest.mark.parametrize("name", list(OUT_LAYOUTS))
def test_out_buffer_is_filled_and_returned(name: str) -> None:
    f = OUT_LAYOUTS[name]
    expected = f(None)
    out = _garbage(expected)
    assert out.flags.c_contiguous and out.flags.writeable
    got = f(out)
    assert got is out
    assert np.array_equal(out, expected)
    # Again on the filled buffer: still exactly the layout.
    assert f(out) is out
    assert np.array_equal(out, expected)


_OTHER_DTYPE = {"b": np.uint8, "u": np.int32, "i": np.int32, "f": np.float64}


def _other_dtype(dt: np.dtype) -> np.dtype:
    """A dtype of the same item kind family that the layout must still refuse."""
    return np.dtype(np.float32 if dt == np.float64 else _OTHER_DTYPE[dt.kind])


@pytest.mark.parametrize("name", list(OUT_LAYOUTS))
def test_out_buffer_checks(name: str) -> None:
    f = OUT_LAYOUTS[name]
    expected = f(None)
    shape, dt = expected.shape, expected.dtype

    wrong_dtype = np.zeros(shape, dtype=_other_dtype(dt))
    with pytest.raises(TypeError, match="out"):
        f(wrong_dtype)
    with pytest.raises(TypeError, match="out"):
        f(expected.tolist())  # not an array

    for bad_shape in ((expected.size + 1,), (*shape[:-1], shape[-1] + 1), (1, *shape)):
        with pytest.raises(ValueError, match="out"):
            f(np.zeros(bad_shape, dtype=dt))
    if expected.ndim > 1:
        with pytest.raises(ValueError, match="out"):
            f(np.zeros(expected.size, dtype=dt))  # right size, flat

    backing = np.zeros((*shape[:-1], 2 * shape[-1]), dtype=dt)
    strided = backing[..., ::2]
    assert strided.shape == shape and not strided.flags.c_contiguous
    with pytest.raises(ValueError, match="out"):
        f(strided)
    assert not backing.any()
    if expected.ndim > 1:
        fortran = np.zeros(shape, dtype=dt, order="F")
        with pytest.raises(ValueError, match="out"):
            f(fortran)

    readonly = np.zeros(shape, dtype=dt)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="out"):
        f(readonly)
    assert not readonly.any()


def test_out_rejects_the_trees_own_arrays() -> None:
    t = ss.Tree.chain(np.arange(4, dtype=np.int64))
    with pytest.raises(ValueError, match="out"):
        t.positions(out=t.tokens)
    assert t.tokens.tolist() == [0, 1, 2, 3]


# -------------------------------------------------------------------- argument validation


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.attention_mask(-1),
        lambda t: t.attention_mask(prefix_len=-5),
        lambda t: t.attention_bias(-1),
        lambda t: t.attention_bias(-1, np.float16),
        lambda t: t.positions(-1),
        lambda t: t.positions(-1, out=np.zeros(3, np.int64)),
    ],
)
def test_negative_prefix_len(call: Callable[[ss.Tree], object]) -> None:
    t = ss.Tree.chain([1, 2, 3])
    with pytest.raises(ValueError, match="prefix_len"):
        call(t)


BATCH_PREFIX_METHODS: dict[str, Callable[[ss.TreeBatch, Any], object]] = {
    "positions": lambda b, p: b.positions(p),
    "attention_mask": lambda b, p: b.attention_mask(p),
    "mask_indptr": lambda b, p: b.mask_indptr(p),
    "attention_bias": lambda b, p: b.attention_bias(p),
    "attention_bias_f16": lambda b, p: b.attention_bias(p, np.float16),
    "packed_attention_mask": lambda b, p: b.packed_attention_mask(p),
}


@pytest.mark.parametrize("method", list(BATCH_PREFIX_METHODS))
def test_bad_prefix_lens(method: str) -> None:
    f = BATCH_PREFIX_METHODS[method]
    b = ss.TreeBatch([ss.Tree.chain([1, 2]), ss.Tree.chain([3]), ss.Tree([-1, 0, 0], [4, 5, 6])])
    with pytest.raises(ValueError, match="prefix_lens"):
        f(b, -1)
    for dtype in INDEX_DTYPES:
        with pytest.raises(ValueError, match=r"prefix_lens\[1\]"):
            f(b, np.array([0, -1, 2], dtype=dtype))
        with pytest.raises(ValueError, match="prefix_lens"):
            f(b, np.array([0, 1], dtype=dtype))  # too short
        with pytest.raises(ValueError, match="prefix_lens"):
            f(b, np.array([0, 1, 2, 3], dtype=dtype))  # too long
    with pytest.raises(ValueError, match=r"prefix_lens\[2\]"):
        f(b, [0, 1, -7])
    with pytest.raises(ValueError, match="prefix_lens"):
        f(b, np.zeros((3, 1), np.int64))
    with pytest.raises(TypeError, match="prefix_lens"):
        f(b, np.array([0.0, 1.0, 2.0]))


def test_bad_bias_dtype() -> None:
    t = ss.Tree.chain([1, 2])
    b = ss.TreeBatch([t])
    for dtype in (np.int32, np.bool_, np.complex64, "uint8"):
        with pytest.raises(TypeError, match="dtype"):
            t.attention_bias(0, dtype)
        with pytest.raises(TypeError, match="dtype"):
            b.attention_bias(0, dtype)


# ------------------------------------------------------------- zero copy and GIL release


def _big_tree(n: int = 512) -> ss.Tree:
    rng = np.random.default_rng(7)
    parents = np.array([-1] + [int(rng.integers(max(0, i - 8), i)) for i in range(1, n)])
    return ss.Tree(parents, np.zeros(n, np.int64))


def test_layouts_into_out_allocate_nothing() -> None:
    t = _big_tree(512)
    b = ss.TreeBatch([t, t])
    prefix = 4096
    buf = np.empty((512, prefix + 512), dtype=bool)  # ~2.3 MB
    bbuf = np.empty(int(b.mask_indptr(prefix)[-1]), dtype=bool)  # ~4.7 MB
    fbuf = np.empty((512, prefix + 512), dtype=np.float32)  # ~9.4 MB
    t.attention_mask(prefix, out=buf)  # warm up (first-call caches)
    b.attention_mask(prefix, out=bbuf)
    t.attention_bias(prefix, out=fbuf)
    tracemalloc.start()
    try:
        # The measurement works: a fresh mask is a traced allocation of the mask's size.
        tracemalloc.reset_peak()
        fresh = t.attention_mask(prefix)
        assert tracemalloc.get_traced_memory()[1] >= fresh.nbytes
        del fresh

        tracemalloc.reset_peak()
        assert t.attention_mask(prefix, out=buf) is buf
        assert tracemalloc.get_traced_memory()[1] < buf.nbytes // 20

        tracemalloc.reset_peak()
        assert b.attention_mask(prefix, out=bbuf) is bbuf
        assert tracemalloc.get_traced_memory()[1] < bbuf.nbytes // 20

        tracemalloc.reset_peak()
        assert t.attention_bias(prefix, out=fbuf) is fbuf
        assert tracemalloc.get_traced_memory()[1] < fbuf.nbytes // 20
    finally:
        tracemalloc.stop()
    assert np.array_equal(buf, t.attention_mask(prefix))
    assert np.array_equal(bbuf, b.attention_mask(prefix))


def test_layouts_into_out_raise_no_resident_peak() -> None:
    """What tracemalloc (above) cannot see: a temporary in Rust's allocator (or malloc's) of
    the output's size. The peak resident size sees it; the outputs are touched first, so only
    a temporary of their size can raise it. Fresh interpreter, whose earlier peak is small."""
    script = textwrap.dedent(
        """
        import resource
        import numpy as np
        import specsched as ss

        def peak():
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

        rng = np.random.default_rng(7)
        n, prefix = 512, 65536
        parents = [-1] + [int(rng.integers(max(0, i - 8), i)) for i in range(1, n)]
        t = ss.Tree(parents, np.zeros(n, np.int64))
        b = ss.TreeBatch([t, t])
        small = ss.Tree([-1, 0], [0, 0])
        small.attention_mask(4)  # warm up (code, thread pool)
        small.attention_bias(4)
        ss.TreeBatch([small]).attention_mask(4)
        buf = np.zeros((n, prefix + n), dtype=bool)
        bbuf = np.zeros(int(b.mask_indptr(prefix)[-1]), dtype=bool)
        fbuf = np.zeros((n, prefix + n), dtype=np.float32)
        for out in (buf, bbuf, fbuf):
            out.fill(1)  # resident before the calls
        for name, call, out in (
            ("tree mask", lambda: t.attention_mask(prefix, out=buf), buf),
            ("batch mask", lambda: b.attention_mask(prefix, out=bbuf), bbuf),
            ("tree bias", lambda: t.attention_bias(prefix, out=fbuf), fbuf),
        ):
            before = peak()
            assert call() is out
            print(name.replace(" ", "_"), peak() - before, out.nbytes)
        """
    )
    for name, grew, nbytes in fresh_lines(script, 3):
        assert int(grew) < int(nbytes) // 4, f"{name}: peak RSS grew by {grew} for {nbytes} B"


def _other_thread_runs_during(call: Callable[[], object], attempts: int = 5) -> bool:
    """Whether a pure-Python thread makes progress while `call` runs.

    The switch interval is set so high that the interpreter never takes the GIL away from the
    main thread; the counter thread can then only run while `call` has released the GIL
    itself (the counter thread gives it back at once with `time.sleep(0)`). So the counter
    advances across `call` iff the call releases the GIL -- no timing thresholds involved.
    """
    state = {"count": 0, "stop": False}
    started = threading.Event()

    def spin() -> None:
        started.set()
        while not state["stop"]:
            state["count"] += 1
            time.sleep(0)

    old = sys.getswitchinterval()
    thread = threading.Thread(target=spin, daemon=True)
    sys.setswitchinterval(1000.0)
    try:
        thread.start()
        started.wait()
        for _ in range(attempts):
            time.sleep(0.005)  # let the counter thread reach its GIL wait
            before = state["count"]
            call()
            if state["count"] != before:
                return True
        return False
    finally:
        state["stop"] = True
        sys.setswitchinterval(old)
        thread.join()


def _big_batch() -> ss.TreeBatch:
    rng = np.random.default_rng(3)
    parents: list[int] = []
    offsets = [0]
    for _ in range(256):
        parents += [-1] + [int(rng.integers(0, i)) for i in range(1, 128)]
        offsets.append(len(parents))
    return ss.TreeBatch.from_flat(parents, [0] * len(parents), offsets)


def test_batched_mask_releases_the_gil() -> None:
    b = _big_batch()  # B=256, N=128, prefix 2048: a ~71 MB mask per call
    assert _other_thread_runs_during(lambda: b.attention_mask(2048))
    assert _other_thread_runs_during(lambda: b.attention_bias(1024, np.float16))


def test_tree_mask_releases_the_gil() -> None:
    t = _big_tree(512)
    buf = np.empty((512, 65536 + 512), dtype=bool)  # ~34 MB
    assert _other_thread_runs_during(lambda: t.attention_mask(65536, out=buf))


@pytest.mark.parametrize(
    "build",
    [
        lambda trees: ss.TreeBatch(trees),
        lambda trees: ss.TreeBatch(trees)[3],
        lambda trees: trees[0].limit_depth(60_000),
        lambda trees: ss.Tree.chain(np.arange(1 << 16)),
    ],
    ids=["TreeBatch", "getitem", "limit_depth", "chain"],
)
def test_tree_construction_releases_the_gil(build: Callable[[list[ss.Tree]], object]) -> None:
    # DESIGN §2: the GIL is released around all Rust work, construction included (a batch of
    # 64 chains of 65,536 nodes is ~0.1 s of copying and checking).
    trees = [ss.Tree.chain(np.arange(1 << 16))] * 64
    batch = ss.TreeBatch(trees)
    assert batch.num_nodes == 64 << 16
    assert _other_thread_runs_during(lambda: build(trees))


def test_gil_probe_detects_a_call_that_holds_the_gil() -> None:
    # The probe has teeth: C code that keeps the GIL (sorting a big list) shows no progress.
    data = list(range(2_000_000, 0, -1))
    assert not _other_thread_runs_during(lambda: sorted(data), attempts=2)


def test_concurrent_layout_calls_overlap_and_agree() -> None:
    # Thread safety of concurrent calls (the GIL proof is the counter probe above).
    b = _big_batch()
    want = b.attention_mask(512)
    spans: list[tuple[float, float]] = []
    results: list[bool] = []
    barrier = threading.Barrier(2)

    def work() -> None:
        barrier.wait()
        for _ in range(3):
            t0 = time.perf_counter()
            r = b.attention_mask(512)
            spans.append((t0, time.perf_counter()))
            results.append(bool(np.array_equal(r, want)))

    threads = [threading.Thread(target=work) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert results == [True] * 6
    # Concurrent calls from two threads both complete, correctly, with overlapping spans.
    spans.sort()
    assert any(spans[i + 1][0] < spans[i][1] for i in range(len(spans) - 1))


# ------------------------------------------------- once Rust-side bugs: sizes that cannot exist

ABSURD_PREFIX_CALLS: dict[str, Callable[[], object]] = {
    # numpy refused the [2, 2**62 + 2] allocation; the binding unwrapped the null array.
    "tree.attention_mask": lambda: ss.Tree.chain([1, 2]).attention_mask(2**62),
    "tree.attention_bias": lambda: ss.Tree.chain([1, 2]).attention_bias(2**62),
    # N * (prefix + N) wrapped around usize to 0: a 0-length output, then a slice panic.
    "batch.attention_mask_wrap": lambda: ss.TreeBatch([ss.Tree.chain([1, 2])]).attention_mask(
        np.array([2**63 - 2], np.int64)
    ),
    "batch.packed_attention_mask_wrap": lambda: ss.TreeBatch(
        [ss.Tree.chain([1, 2])]
    ).packed_attention_mask(np.array([2**63 - 2], np.int64)),
}


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("name", list(ABSURD_PREFIX_CALLS))
def test_absurd_prefix_len_is_a_python_error(name: str) -> None:
    # Refused by size before any allocation, naming the argument (numpy's own "array is too
    # big" names none).
    with pytest.raises(ValueError, match=r"^prefix_lens?: the output would have 2 x \d+"):
        ABSURD_PREFIX_CALLS[name]()


def test_positions_do_not_wrap() -> None:
    t = ss.Tree.chain([1, 2, 3])
    with pytest.raises(ValueError, match=r"^prefix_len: 9223372036854775807 \+ tree depth 2"):
        t.positions(2**63 - 1)
    assert t.positions(2**63 - 3).tolist() == [2**63 - 3, 2**63 - 2, 2**63 - 1]


def test_batch_positions_past_int64_name_the_row_and_write_nothing():
    t = ss.Tree([-1, 0, 1], [0, 1, 2])
    batch = ss.TreeBatch([t, t])
    out = np.full(6, -7, np.int64)
    with pytest.raises(ValueError, match=r"prefix_lens\[1\] = 9223372036854775806 \+ tree depth 2"):
        batch.positions(np.array([3, 2**63 - 2]), out=out)
    assert (out == -7).all()  # every row is checked before any is written
    assert batch.positions(np.array([3, 2**63 - 3])).tolist()[3:] == [
        2**63 - 3 + d for d in range(3)
    ]
