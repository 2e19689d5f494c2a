"""`ss.Tree` / `ss.TreeBatch` construction, properties and input validation, against the
pure-Python oracle (`specsched.reference`) and the contract in docs/api.md."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import specsched as ss
from hypothesis import given, settings
from hypothesis import strategies as st
from specsched import reference as ref
from strategies import (
    INDEX_DTYPES,
    PUBLISHED_TREES,
    SHARED_PUBLISHED_TREES,
    TOKEN_DTYPES,
    as_array,
    batches,
    parent_lists,
    trees,
)

PUBLISHED = PUBLISHED_TREES


def _published() -> list[tuple[str, list[list[int]]]]:
    data = json.loads(PUBLISHED.read_text())
    return [
        (f"{family}/{name}", choices)
        for family in ("eagle", "medusa")
        for name, choices in data[family].items()
    ]


PUBLISHED_TREES = _published()


def _data_ptr(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _choice_paths(parents: Sequence[int]) -> list[tuple[int, ...]]:
    """Every node's path of sibling ranks from the root (the root's is `()`)."""
    paths: list[tuple[int, ...]] = [()]
    num_children = [0] * len(parents)
    for i in range(1, len(parents)):
        p = parents[i]
        paths.append((*paths[p], num_children[p]))
        num_children[p] += 1
    return paths


# ------------------------------------------------------------------------------- Tree basics


def _check_tree(t: ss.Tree, parents: Sequence[int], tokens: Sequence[int]) -> None:
    n = len(parents)
    assert t.num_nodes == n
    assert len(t) == n
    assert t.parents.dtype == np.int32
    assert t.tokens.dtype == np.int64
    assert t.depths.dtype == np.int32
    assert t.parents.shape == t.tokens.shape == t.depths.shape == (n,)
    assert t.parents.tolist() == list(parents)
    assert t.tokens.tolist() == [int(x) for x in tokens]
    depths = ref.depths(parents)
    assert t.depths.tolist() == depths
    assert t.max_depth == max(depths)
    assert t.num_leaves == ref.num_leaves(parents)


@settings(max_examples=40, deadline=None)
@given(
    tree=trees(1, 512, vocab=1 << 20),
    pdtype=st.sampled_from(INDEX_DTYPES),
    tdtype=st.sampled_from(TOKEN_DTYPES),
    pstrided=st.booleans(),
    tstrided=st.booleans(),
)
def test_tree_properties_match_reference(
    tree: tuple[list[int], list[int]],
    pdtype: type,
    tdtype: type,
    pstrided: bool,
    tstrided: bool,
) -> None:
    parents, tokens = tree
    ref.validate_tree(parents, tokens)
    p = as_array(parents, pdtype, pstrided)
    t = as_array(tokens, tdtype, tstrided)
    # A strided view's whole backing array, the gaps between its entries included.
    p_whole, t_whole = (x if x.base is None else x.base for x in (p, t))
    p_before, t_before = p_whole.copy(), t_whole.copy()
    tr = ss.Tree(p, t)
    _check_tree(tr, parents, tokens)
    # Inputs are never modified (nor their strided backing memory).
    np.testing.assert_array_equal(p_whole, p_before)
    np.testing.assert_array_equal(t_whole, t_before)
    # The tree owns its data: mutating the inputs afterwards changes nothing.
    if len(parents) > 1:
        p[1] = 0 if parents[1] else -1
    t[0] = 12345
    _check_tree(tr, parents, tokens)


@settings(max_examples=25, deadline=None)
@given(tree=trees(1, 128, vocab=1 << 40))
def test_tree_from_python_lists(tree: tuple[list[int], list[int]]) -> None:
    parents, tokens = tree
    _check_tree(ss.Tree(parents, tokens), parents, tokens)
    _check_tree(ss.Tree(tuple(parents), tuple(tokens)), parents, tokens)


def test_tree_reversed_and_large_token_values() -> None:
    # Negative strides; uint32 tokens above 2**31 stay positive; int64 tokens keep all bits.
    p = np.array([1, 0, -1], dtype=np.int64)[::-1]
    t = np.array([2**32 - 1, 2**31, 7], dtype=np.uint32)[::-1]
    tr = ss.Tree(p, t)
    assert tr.parents.tolist() == [-1, 0, 1]
    assert tr.tokens.tolist() == [7, 2**31, 2**32 - 1]
    big = np.array([-(2**62), 2**62 + 3], dtype=np.int64)
    assert ss.Tree([-1, 0], big).tokens.tolist() == big.tolist()


def test_single_node_tree() -> None:
    t = ss.Tree(np.array([-1], np.int32), np.array([42], np.int64))
    assert (t.num_nodes, t.max_depth, t.num_leaves, len(t)) == (1, 0, 1, 1)
    assert t.depths.tolist() == [0]


@pytest.mark.parametrize("name", ["parents", "tokens", "depths"])
def test_property_arrays_are_readonly_views(name: str) -> None:
    t = ss.Tree([-1, 0, 0, 1], [5, 6, 7, 8])
    a = getattr(t, name)
    b = getattr(t, name)
    assert not a.flags.writeable
    with pytest.raises(ValueError):
        a[0] = 1
    with pytest.raises(ValueError):
        a.setflags(write=True)
    # Both accesses view the tree's own memory: no copy per access.
    assert _data_ptr(a) == _data_ptr(b)
    # The view keeps the tree alive.
    expected = a.tolist()
    del t, b
    assert a.tolist() == expected


@pytest.mark.parametrize("name", ["parents", "tokens", "depths"])
def test_batch_property_arrays_are_readonly_views(name: str) -> None:
    b = ss.TreeBatch.from_flat([-1, 0, -1, 0, 1], [1, 2, 3, 4, 5], [0, 2, 5])
    a = getattr(b, name)
    assert not a.flags.writeable
    with pytest.raises(ValueError):
        a[0] = 1
    assert _data_ptr(a) == _data_ptr(getattr(b, name))
    assert b.offsets.dtype == np.int64


def test_tree_equality() -> None:
    a = ss.Tree([-1, 0, 0, 1], [5, 6, 7, 8])
    assert a == ss.Tree(np.array([-1, 0, 0, 1], np.int64), np.array([5, 6, 7, 8], np.uint32))
    assert a != ss.Tree([-1, 0, 0, 1], [5, 6, 7, 9])  # tokens differ
    assert a != ss.Tree([-1, 0, 0, 2], [5, 6, 7, 8])  # parents differ
    assert a != ss.Tree([-1, 0, 0], [5, 6, 7])
    assert a != "tree"
    assert not (a == ss.Tree.chain([5, 6, 7, 8]))


# ------------------------------------------------------------------------------------ chain


@settings(max_examples=20, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=300),
    dtype=st.sampled_from(TOKEN_DTYPES),
    strided=st.booleans(),
)
def test_chain(tokens: list[int], dtype: type, strided: bool) -> None:
    t = ss.Tree.chain(as_array(tokens, dtype, strided))
    _check_tree(t, ref.chain_parents(len(tokens)), tokens)
    assert t.max_depth == len(tokens) - 1
    assert t.num_leaves == 1
    assert t == ss.Tree(ref.chain_parents(len(tokens)), tokens)


def test_chain_from_list() -> None:
    t = ss.Tree.chain([9, 8, 7])
    assert t.parents.tolist() == [-1, 0, 1]
    assert t.tokens.tolist() == [9, 8, 7]


# ----------------------------------------------------------------------------- from_choices


def _check_from_choices(
    choices: Sequence[Sequence[int]],
    tokens: Sequence[int] | None = None,
    order: str = "breadth_first",
) -> ss.Tree:
    t = ss.Tree.from_choices(choices, tokens, order=order)
    want_p, want_t = ref.from_choices(choices, tokens, order)
    assert t.parents.tolist() == want_p
    assert t.tokens.tolist() == want_t
    assert t.depths.tolist() == ref.depths(want_p)
    assert t.num_leaves == ref.num_leaves(want_p)
    return t


@settings(max_examples=40, deadline=None)
@given(
    parents=parent_lists(1, 200),
    seed=st.integers(0, 2**32 - 1),
    with_tokens=st.booleans(),
    tdtype=st.sampled_from(TOKEN_DTYPES),
    as_lists=st.booleans(),
    order=st.sampled_from(["breadth_first", "depth_first"]),
)
def test_from_choices_matches_reference(
    parents: list[int], seed: int, with_tokens: bool, tdtype: type, as_lists: bool, order: str
) -> None:
    rnd = random.Random(seed)
    paths = _choice_paths(parents)
    given = list(range(1, len(parents)))
    rnd.shuffle(given)
    choices: list[Any] = [list(paths[i]) if as_lists else paths[i] for i in given]
    node_tokens = [rnd.randrange(1 << 30) for _ in parents]
    tokens = [node_tokens[0]] + [node_tokens[i] for i in given] if with_tokens else None
    t = _check_from_choices(
        choices, None if tokens is None else np.asarray(tokens, dtype=tdtype).tolist(), order
    )
    if with_tokens:
        # Same via an array of the chosen dtype.
        as_array = np.asarray(tokens, dtype=tdtype)
        assert t == ss.Tree.from_choices(choices, tokens=as_array, order=order)
    # Independently of the oracle: the built tree is the original one, renumbered; every
    # node's token is the one given for its choice path (or its rank without tokens).
    new_paths = _choice_paths(t.parents.tolist())
    old_node = {p: i for i, p in enumerate(paths)}
    assert sorted(new_paths) == sorted(paths)
    if order == "depth_first":
        assert new_paths == sorted(new_paths)
    else:
        assert new_paths == sorted(new_paths, key=lambda c: (len(c), c))
    for node, path in enumerate(new_paths):
        want = node_tokens[old_node[path]] if with_tokens else (path[-1] if path else 0)
        assert t.tokens[node] == want


@pytest.mark.skipif(not SHARED_PUBLISHED_TREES.exists(), reason="no shared/ beside the checkout")
def test_the_published_trees_copy_is_the_projects() -> None:
    assert json.loads(PUBLISHED.read_text()) == json.loads(SHARED_PUBLISHED_TREES.read_text())


@pytest.mark.parametrize(("name", "choices"), PUBLISHED_TREES, ids=[n for n, _ in PUBLISHED_TREES])
def test_from_choices_published_trees(name: str, choices: list[list[int]]) -> None:
    t = _check_from_choices(choices)
    assert t.num_nodes == len(choices) + 1
    tokens = list(range(1000, 1001 + len(choices)))
    random.Random(name).shuffle(tokens)
    _check_from_choices(choices, tokens)
    _check_from_choices([tuple(c) for c in reversed(choices)], tokens)
    _check_from_choices(choices, tokens, "depth_first")
    with pytest.raises(ValueError, match="order"):
        ss.Tree.from_choices(choices, order="bfs")


def test_from_choices_permutes_tokens_into_node_order() -> None:
    # Node order: root, (0,), (1,), (0, 0); tokens[1 + j] belongs to choices[j].
    t = ss.Tree.from_choices([(0, 0), (1,), (0,)], tokens=[100, 200, 300, 400])
    assert t.parents.tolist() == [-1, 0, 0, 1]
    assert t.tokens.tolist() == [100, 400, 300, 200]
    # Without tokens: the root's is 0, every other node's is its choice's last entry.
    t = ss.Tree.from_choices([(0, 0), (1,), (0,), (0, 1)])
    assert t.parents.tolist() == [-1, 0, 0, 1, 1]
    assert t.tokens.tolist() == [0, 0, 1, 0, 1]
    # No choices: the root alone.
    assert ss.Tree.from_choices([]).parents.tolist() == [-1]
    assert ss.Tree.from_choices([], tokens=[7]).tokens.tolist() == [7]


def test_from_choices_sorts_by_length_then_lexicographically() -> None:
    # (10,) sorts after (2,) (ints, not strings); deeper paths after all shallower ones.
    t = ss.Tree.from_choices([(10,), (2, 0), (2,), (10, 0), (0,)])
    assert t.tokens.tolist() == [0, 0, 2, 10, 0, 0]
    assert t.parents.tolist() == [-1, 0, 0, 0, 2, 3]


# -------------------------------------------------------------------------------- TreeBatch


def _local(parents: list[int], offsets: list[int], b: int) -> list[int]:
    return parents[offsets[b] : offsets[b + 1]]


@settings(max_examples=40, deadline=None)
@given(
    batch=st.one_of(
        batches(max_trees=8, max_nodes=48, vocab=1 << 16),
        batches(max_trees=64, max_nodes=8, vocab=1 << 16),
    ),
    pdtype=st.sampled_from(INDEX_DTYPES),
    tdtype=st.sampled_from(TOKEN_DTYPES),
    odtype=st.sampled_from(INDEX_DTYPES),
    strided=st.booleans(),
)
def test_batch_matches_reference(
    batch: tuple[list[int], list[int], list[int]],
    pdtype: type,
    tdtype: type,
    odtype: type,
    strided: bool,
) -> None:
    parents, tokens, offsets = batch
    ref.validate_batch(parents, tokens, offsets)
    p = as_array(parents, pdtype, strided)
    t = as_array(tokens, tdtype, strided)
    o = as_array(offsets, odtype, strided)
    before = (p.copy(), t.copy(), o.copy())
    b = ss.TreeBatch.from_flat(p, t, o)
    for x, y in zip((p, t, o), before, strict=True):
        np.testing.assert_array_equal(x, y)

    num_trees = len(offsets) - 1
    sizes = [offsets[i + 1] - offsets[i] for i in range(num_trees)]
    depths = ref.batch_depths(parents, offsets)
    assert b.num_trees == len(b) == num_trees
    assert b.num_nodes == len(parents)
    assert b.offsets.dtype == np.int64
    assert b.offsets.tolist() == offsets
    assert b.parents.dtype == np.int32
    assert b.parents.tolist() == parents
    assert b.tokens.dtype == np.int64
    assert b.tokens.tolist() == tokens
    assert b.depths.dtype == np.int32
    assert b.depths.tolist() == depths
    assert b.max_depth == max(depths)
    assert b.max_nodes == max(sizes)

    singles = [
        ss.Tree(_local(parents, offsets, i), tokens[offsets[i] : offsets[i + 1]])
        for i in range(num_trees)
    ]
    for i, tree in enumerate(singles):
        got = b[i]
        assert isinstance(got, ss.Tree)
        assert got == tree
        _check_tree(got, _local(parents, offsets, i), tokens[offsets[i] : offsets[i + 1]])
        assert b[i - num_trees] == tree
    with pytest.raises(IndexError, match="index"):
        b[num_trees]
    with pytest.raises(IndexError, match="index"):
        b[-num_trees - 1]

    # TreeBatch(trees) builds the same batch as from_flat; lists and tuples both work.
    assert ss.TreeBatch(singles) == b
    assert ss.TreeBatch(tuple(singles)) == b
    assert ss.TreeBatch.from_flat(parents, tokens, offsets) == b
    # Round trip through the batch's own arrays.
    assert ss.TreeBatch.from_flat(b.parents, b.tokens, b.offsets) == b
    assert ss.TreeBatch([b[i] for i in range(num_trees)]) == b


@settings(max_examples=60, deadline=None)
@given(
    batch=batches(max_trees=8, max_nodes=40, vocab=1 << 16),
    data=st.data(),
    ddtype=st.sampled_from(INDEX_DTYPES),
    strided=st.booleans(),
)
def test_limit_depth_matches_reference(
    batch: tuple[list[int], list[int], list[int]],
    data: st.DataObject,
    ddtype: type,
    strided: bool,
) -> None:
    parents, tokens, offsets = batch
    b = ss.TreeBatch.from_flat(parents, tokens, offsets)
    n = b.num_trees
    limits = data.draw(st.lists(st.integers(0, 12), min_size=n, max_size=n))
    d = as_array(limits, ddtype, strided)
    before = d.copy()
    cut = b.limit_depth(d)
    np.testing.assert_array_equal(d, before)
    for i in range(n):
        local, toks = _local(parents, offsets, i), tokens[offsets[i] : offsets[i + 1]]
        want = ref.limit_depth(local, toks, limits[i])
        assert (cut[i].parents.tolist(), cut[i].tokens.tolist()) == want
        assert b[i].limit_depth(limits[i]) == cut[i]
    # One int for every tree; a limit past every tree's depth keeps the batch as it is.
    assert b.limit_depth(limits[0]) == b.limit_depth([limits[0]] * n)
    assert b.limit_depth(b.max_depth) == b
    assert b.parents.tolist() == parents  # the input batch is unchanged


def test_bad_limit_depth() -> None:
    b = ss.TreeBatch([ss.Tree.chain([1, 2, 3]), ss.Tree.chain([4])])
    with pytest.raises(ValueError, match="max_depth: has 3 entries, expected one per tree"):
        b.limit_depth([1, 1, 1])
    with pytest.raises(ValueError, match=r"max_depth\[1\] = -1"):
        b.limit_depth(np.array([0, -1]))
    with pytest.raises(ValueError, match="max_depth"):
        b.limit_depth(-2)
    with pytest.raises(TypeError, match="max_depth"):
        b.limit_depth(np.array([0.5, 1.0]))
    with pytest.raises(TypeError, match="max_depth"):
        b.limit_depth(True)
    with pytest.raises(ValueError, match="max_depth: must be >= 0"):
        b[0].limit_depth(-1)
    with pytest.raises(TypeError, match="max_depth"):
        b[0].limit_depth(1.5)  # type: ignore[arg-type]
    assert b[0].limit_depth(0) == ss.Tree.chain([1])


def test_batch_equality_and_getitem() -> None:
    t1 = ss.Tree([-1, 0, 0], [1, 2, 3])
    t2 = ss.Tree.chain([4, 5])
    b = ss.TreeBatch([t1, t2])
    assert b.offsets.tolist() == [0, 3, 5]
    assert b.parents.tolist() == [-1, 0, 0, -1, 0]
    assert b.depths.tolist() == [0, 1, 1, 0, 1]
    assert b[0] == t1
    assert b[1] == t2
    assert b[-1] == t2
    assert b[-2] == t1
    assert b != ss.TreeBatch([t2, t1])
    assert b != ss.TreeBatch([t1])
    assert b == ss.TreeBatch.from_flat(
        np.array([-1, 0, 0, -1, 0], np.int64), [1, 2, 3, 4, 5], np.array([0, 3, 5], np.int32)
    )
    for bad in (2, 3, -3, 100):
        with pytest.raises(IndexError, match="index"):
            b[bad]


# ------------------------------------------------------------------------------ bad inputs

I32 = np.int32
I64 = np.int64


def _i32(*v: int) -> np.ndarray:
    return np.array(v, dtype=I32)


def _i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=I64)


# (id, constructor, exception, match)
BAD_TREES: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    ("tokens_shorter", lambda: ss.Tree([-1, 0, 0], [1, 2]), ValueError, "tokens"),
    ("tokens_longer", lambda: ss.Tree(_i32(-1, 0), _i64(1, 2, 3)), ValueError, "tokens"),
    ("root_not_minus1", lambda: ss.Tree([0, 0], [1, 2]), ValueError, r"parents\[0\]"),
    ("root_minus2", lambda: ss.Tree([-2, 0], [1, 2]), ValueError, r"parents\[0\]"),
    ("parent_is_self", lambda: ss.Tree([-1, 0, 2, 1], [1, 2, 3, 4]), ValueError, r"parents\[2\]"),
    (
        "parent_after_child",
        lambda: ss.Tree([-1, 0, 1, 4, 0], [1, 2, 3, 4, 5]),
        ValueError,
        r"parents\[3\]",
    ),
    ("parent_below_minus1", lambda: ss.Tree([-1, 0, -2], [1, 2, 3]), ValueError, r"parents\[2\]"),
    ("second_root", lambda: ss.Tree([-1, 0, 1, -1], [1, 2, 3, 4]), ValueError, r"parents\[3\]"),
    (
        "parent_huge_int64",
        lambda: ss.Tree(_i64(-1, 0, 2**40), [1, 2, 3]),
        ValueError,
        r"parents\[2\]",
    ),
    ("empty_arrays", lambda: ss.Tree(_i32(), _i64()), ValueError, "parents"),
    (
        "float_parents",
        lambda: ss.Tree(np.array([-1.0, 0.0]), _i64(1, 2)),
        TypeError,
        "parents",
    ),
    ("float_parent_list", lambda: ss.Tree([-1.0, 0.0], [1, 2]), TypeError, "parents"),
    ("float_tokens", lambda: ss.Tree(_i32(-1, 0), np.array([1.0, 2.0])), TypeError, "tokens"),
    ("bool_parents", lambda: ss.Tree(np.array([True, False]), _i64(1, 2)), TypeError, "parents"),
    ("bool_tokens", lambda: ss.Tree(_i32(-1, 0), np.array([True, False])), TypeError, "tokens"),
    (
        "uint32_parents",
        lambda: ss.Tree(np.array([0, 0], np.uint32), _i64(1, 2)),
        TypeError,
        "parents",
    ),
    (
        "int16_tokens",
        lambda: ss.Tree(_i32(-1, 0), np.array([1, 2], np.int16)),
        TypeError,
        "tokens",
    ),
    ("2d_parents", lambda: ss.Tree(_i32(-1, 0).reshape(1, 2), _i64(1, 2)), ValueError, "parents"),
    ("2d_tokens", lambda: ss.Tree(_i32(-1, 0), _i64(1, 2).reshape(2, 1)), ValueError, "tokens"),
    ("0d_parents", lambda: ss.Tree(np.int32(-1), _i64(1)), ValueError, "parents"),
    ("chain_empty", lambda: ss.Tree.chain(_i64()), ValueError, "tokens"),
    ("chain_float", lambda: ss.Tree.chain([1.5, 2.5]), TypeError, "tokens"),
    ("chain_2d", lambda: ss.Tree.chain(_i64(1, 2).reshape(1, 2)), ValueError, "tokens"),
]


@pytest.mark.parametrize(
    ("ctor", "exc", "match"), [c[1:] for c in BAD_TREES], ids=[c[0] for c in BAD_TREES]
)
def test_bad_tree_inputs(ctor: Callable[[], object], exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        ctor()


@pytest.mark.parametrize(
    ("parents", "tokens"),
    [
        ([-1, 0, 0], [1, 2]),
        ([0, 0], [1, 2]),
        ([-1, 0, 2, 1], [1, 2, 3, 4]),
        ([-1, 0, -2], [1, 2, 3]),
        ([-1, 0, 1, -1], [1, 2, 3, 4]),
    ],
)
def test_bad_trees_rejected_by_reference_too(parents: list[int], tokens: list[int]) -> None:
    # The oracle and the extension agree on what is invalid (and on the index named).
    with pytest.raises(ValueError) as ref_err:
        ref.validate_tree(parents, tokens)
    with pytest.raises(ValueError) as rust_err:
        ss.Tree(parents, tokens)
    bad = [s for s in str(ref_err.value).split() if s.startswith("parents[")]
    if bad:
        assert bad[0].rstrip(":") in str(rust_err.value)


def test_empty_python_lists_are_an_empty_tree_error() -> None:
    with pytest.raises(ValueError, match="parents"):
        ss.Tree([], [])


P2 = [-1, 0, -1, 0, 1]  # trees of 2 and 3 nodes
T2 = [1, 2, 3, 4, 5]

BAD_FLAT: list[tuple[str, list[int] | np.ndarray, Any, Any, type[Exception], str]] = [
    ("offsets_not_from_0", P2, T2, [1, 2, 5], ValueError, r"offsets\[0\]"),
    ("offsets_equal", P2, T2, [0, 2, 2, 5], ValueError, r"offsets\[2\]"),
    ("offsets_decreasing", P2, T2, [0, 3, 2, 5], ValueError, r"offsets\[2\]"),
    ("offsets_negative", P2, T2, [0, -1, 5], ValueError, r"offsets\[1\]"),
    ("offsets_end_short", P2, T2, [0, 2, 4], ValueError, "offsets"),
    ("offsets_end_past", P2, T2, [0, 2, 6], ValueError, "offsets"),
    ("offsets_too_short", P2, T2, [0], ValueError, "offsets"),
    ("offsets_empty", P2, T2, _i64(), ValueError, "offsets"),
    ("offsets_float", P2, T2, np.array([0.0, 2.0, 5.0]), TypeError, "offsets"),
    ("offsets_2d", P2, T2, _i64(0, 2, 5).reshape(1, 3), ValueError, "offsets"),
    ("offsets_uint32", P2, T2, np.array([0, 2, 5], np.uint32), TypeError, "offsets"),
    ("tokens_short", P2, T2[:4], [0, 2, 5], ValueError, "tokens"),
    ("second_root_not_minus1", [-1, 0, 0, 0, 1], T2, [0, 2, 5], ValueError, r"parents\[2\]"),
    ("local_parent_out_of_range", [-1, 0, -1, 0, 2], T2, [0, 2, 5], ValueError, r"parents\[4\]"),
    ("local_parent_global_index", [-1, 0, -1, 2, 3], T2, [0, 2, 5], ValueError, r"parents\[3\]"),
    ("first_root", [0, 0, -1, 0, 1], T2, [0, 2, 5], ValueError, r"parents\[0\]"),
    ("float_parents", np.array(P2, float), T2, [0, 2, 5], TypeError, "parents"),
    ("bool_tokens", P2, np.ones(5, bool), [0, 2, 5], TypeError, "tokens"),
]


@pytest.mark.parametrize(
    ("parents", "tokens", "offsets", "exc", "match"),
    [c[1:] for c in BAD_FLAT],
    ids=[c[0] for c in BAD_FLAT],
)
def test_bad_from_flat(
    parents: Any, tokens: Any, offsets: Any, exc: type[Exception], match: str
) -> None:
    with pytest.raises(exc, match=match):
        ss.TreeBatch.from_flat(parents, tokens, offsets)
    if exc is ValueError:
        with pytest.raises(ValueError):
            ref.validate_batch(list(parents), list(tokens), list(offsets))


BAD_CHOICES: list[tuple[str, Any, Any, type[Exception], str]] = [
    ("missing_prefix", [(0,), (1, 0)], None, ValueError, r"choices\[1\]"),
    ("missing_deep_prefix", [(0,), (0, 0), (0, 1, 0)], None, ValueError, r"choices\[2\]"),
    ("duplicate", [(0,), (1,), (0,)], None, ValueError, r"choices\[2\]"),
    ("duplicate_list_tuple", [[0], (0, 0), [0, 0]], None, ValueError, r"choices\[2\]"),
    ("empty_tuple", [(0,), ()], None, ValueError, r"choices\[1\]"),
    ("negative_entry", [(0,), (0, -1)], None, ValueError, r"choices\[1\]"),
    ("negative_first", [(-1,)], None, ValueError, r"choices\[0\]"),
    ("tokens_short", [(0,), (1,)], [1, 2], ValueError, "tokens"),
    ("tokens_long", [(0,), (1,)], [1, 2, 3, 4], ValueError, "tokens"),
    ("tokens_float", [(0,)], np.array([1.0, 2.0]), TypeError, "tokens"),
    ("choice_not_a_tuple", [0, 1], None, TypeError, r"choices\[0\]"),
    ("choice_of_strings", [(0,), ("a",)], None, TypeError, r"choices\[1\]"),
    ("choices_not_iterable", 5, None, TypeError, "choices"),
    # PyO3 and numpy read a bool as 0 / 1; a rank is an int.
    ("bool_rank", [(0,), (0, True)], None, TypeError, r"choices\[1\]\[1\]"),
    # Errors name the first offender in the order given, as the reference does (the nodes
    # are placed in sorted order, where (2, 1) would come first).
    ("missing_prefix_first_given", [(3, 3, 3), (2, 1)], None, ValueError, r"choices\[0\]"),
    ("duplicate_first_given", [(1,), (0,), (1,), (0,)], None, ValueError, r"choices\[2\]"),
]


@pytest.mark.parametrize(
    ("choices", "tokens", "exc", "match"),
    [c[1:] for c in BAD_CHOICES],
    ids=[c[0] for c in BAD_CHOICES],
)
def test_bad_from_choices(choices: Any, tokens: Any, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        ss.Tree.from_choices(choices, tokens)
    if exc is ValueError:
        with pytest.raises(ValueError):
            ref.from_choices(choices, tokens)


@pytest.mark.parametrize(
    ("make", "arg"),
    [
        (lambda bad: ss.Tree([-1, 0], bad), "tokens"),
        (lambda bad: ss.Tree(bad, [1, 2]), "parents"),
        (lambda bad: ss.Tree.chain(bad), "tokens"),
        (lambda bad: ss.TreeBatch.from_flat([-1], [1], bad), "offsets"),
    ],
)
@pytest.mark.parametrize(
    "bad", [None, (x for x in [1, 2]), b"\x01\x02", "12"], ids=["none", "gen", "bytes", "str"]
)
def test_non_numbers_are_a_type_error(make: Callable[[Any], Any], arg: str, bad: Any) -> None:
    # numpy wraps these as 0-d object / text arrays; the error is their type, not a shape.
    with pytest.raises(TypeError, match=f"^{arg}: expected an array of numbers"):
        make(bad)


def test_bools_among_ints_are_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"^parents\[1\]: a bool among ints"):
        ss.Tree([-1, False, True], [1, 2, 3])
    b = ss.TreeBatch([ss.Tree.chain([1, 2]), ss.Tree.chain([3])])
    with pytest.raises(TypeError, match=r"^prefix_lens\[0\]"):
        b.positions([True, 5])
    with pytest.raises(TypeError, match=r"^parents\[1\]\[0\]"):
        ss.TreeBatch.from_flat([[-1], [False]], [1, 2], [0, 2])
    # An all-bool list stays a bool array: refused for its dtype, named.
    with pytest.raises(TypeError, match=r"^parents: expected an integer array"):
        ss.Tree([True, False], [1, 2])


def test_bad_treebatch_constructor() -> None:
    t = ss.Tree.chain([1, 2])
    with pytest.raises(ValueError, match="trees"):
        ss.TreeBatch([])
    with pytest.raises(TypeError, match=r"trees\[0\]"):
        ss.TreeBatch([1])
    with pytest.raises(TypeError, match=r"trees\[1\]"):
        ss.TreeBatch([t, "tree"])
    with pytest.raises(TypeError, match=r"trees\[1\]"):
        ss.TreeBatch([t, ss.TreeBatch([t])])
    with pytest.raises(TypeError, match="trees"):
        ss.TreeBatch(5)


def test_trees_are_immutable() -> None:
    t = ss.Tree.chain([1, 2])
    with pytest.raises(AttributeError):
        t.parents = np.array([-1, 0], np.int32)  # type: ignore[misc]
    b = ss.TreeBatch([t])
    with pytest.raises(AttributeError):
        b.offsets = np.array([0, 2])  # type: ignore[misc]


def test_trees_pickle_copy_and_refuse_hashing() -> None:
    # Serving engines ship trees between scheduler and worker processes: a tree and a batch
    # pickle by value; they are immutable, so a copy is the object itself. Equality is by
    # value with no hash (a list's contract; the stubs say so).
    import copy
    import pickle

    t = ss.Tree.from_choices([(0,), (1,), (0, 0)], tokens=[9, 4, 5, 6])
    b = ss.TreeBatch([t, ss.Tree.chain([1, 2])])
    for x in (t, b):
        back = pickle.loads(pickle.dumps(x))
        assert back == x and type(back) is type(x)
        assert copy.copy(x) is x and copy.deepcopy(x) is x
        with pytest.raises(TypeError, match="unhashable"):
            hash(x)
    assert pickle.loads(pickle.dumps(b)).offsets.tolist() == [0, 4, 6]


@pytest.mark.parametrize("order", [None, 0, b"depth_first"])
def test_a_non_string_order_names_the_argument(order: Any) -> None:
    with pytest.raises(TypeError, match="order: expected 'breadth_first' or 'depth_first'"):
        ss.Tree.from_choices([(0,)], order=order)
    with pytest.raises(TypeError, match="order: expected 'pool' or 'depth_first'"):
        ss.DynamicTreeBuilder(1, 1, 1, 2).build(order)


def test_per_request_arrays_are_measured_before_they_are_copied():
    # A broadcast view claims any length at no cost; its entries were copied into a vector
    # before the count was checked, and a failed allocation aborted the process.
    huge = np.broadcast_to(np.int64(0), (2**33,))
    t = ss.Tree([-1, 0], [1, 2])
    batch = ss.TreeBatch([t, t])
    with pytest.raises(ValueError, match="prefix_lens: has 8589934592 entries, expected one"):
        batch.positions(huge)
    with pytest.raises(ValueError, match="max_depth: has 8589934592 entries, expected one"):
        batch.limit_depth(huge)
    assert batch.positions(np.broadcast_to(np.int64(3), (2,))).tolist() == [3, 4, 3, 4]


def test_qlen_mask_checks_the_tree_sizes_before_sizing_its_output():
    # Sized from tree 0 first: a 65,536-node tree ahead of 300 roots asked for 1.2 TiB.
    big, root = ss.Tree.chain(np.zeros(65536, np.int64)), ss.Tree([-1], [0])
    with pytest.raises(ValueError, match="equal tree sizes, but tree 0 has 65536 nodes"):
        ss.TreeBatch([big] + [root] * 300).qlen_mask()


def test_an_index_past_int64_is_out_of_range():
    t = ss.Tree([-1, 0], [1, 2])
    batch = ss.TreeBatch([t, t])
    result = ss.verify(batch, np.zeros((4, 3)))
    for i in (2**63, -(2**70)):
        with pytest.raises(IndexError, match=r"index: .* is out of range"):
            batch[i]
        with pytest.raises(IndexError, match=r"index: .* is out of range"):
            result[i]


def test_batch_offsets_are_read_only_like_every_other_array():
    t = ss.Tree([-1, 0], [1, 2])
    batch = ss.TreeBatch([t, t])
    for offsets in (batch.offsets, ss.verify(batch, np.zeros((4, 3))).offsets):
        assert offsets.tolist() == [0, 2, 4]
        with pytest.raises(ValueError, match="read-only"):
            offsets[0] = 1


def test_from_choices_names_the_entry_that_is_not_an_int64():
    with pytest.raises(ValueError, match=r"choices\[0\]\[0\]: 9223372036854775808 does not fit"):
        ss.Tree.from_choices([(2**63,)])
    with pytest.raises(TypeError, match=r"choices\[1\]\[1\]: expected an int, got bool"):
        ss.Tree.from_choices([(0,), (0, True)])
    with pytest.raises(TypeError, match=r"choices\[0\]\[0\]: expected an int, got str"):
        ss.Tree.from_choices(["ab"])
