"""Tree layouts: build a batch, then its padded mask, positions and root-to-leaf paths.

One group per (B, N). Contenders compute the same three outputs from the same inputs:
- `rust`: `TreeBatch.from_flat` (validates) + `padded_mask()` + `positions(prefix_lens)` +
  `paths()`;
- `reference`: `reference.padded_mask` + `batch_positions` + `batch_paths` over lists;
- `numpy_peer`: the vectorized formulation a peer would write on a padded `[B, Nmax]` parent
  array: every node climbs one level per step at once (a loop over depth, never over nodes).
Each contender's output is checked against Rust's after timing (the timed call returns it).
The group "tree N=8" times a single small tree: `Tree(...)` + `attention_mask()`. The groups
"padded layout B, N" time `TreeBatch.padded_layout(prefix_lens)` (the padded `[B, Nmax]` batch
a model runs, `generate.pad_trees`) on a built batch, against `reference.padded_layout` and
the same climb in numpy with the tokens scattered into their slots.
"""

from __future__ import annotations

import numpy as np
import pytest
import specsched as ss
from bench_inputs import make_batch, run, uniform_batch
from specsched import reference as ref

SIZES = [(b, n) for b in (1, 32, 256) for n in (8, 64, 128)]
CONTENDERS = ["rust", "reference", "numpy_peer"]


def climb(
    padded_parents: np.ndarray, sizes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`(mask [B, Nmax, Nmax], depth [B * Nmax], valid [B, Nmax], up [B * Nmax])` in numpy.

    Works on global node ids g = b * Nmax + i. `up[g]` is g's parent, and a root or padding
    slot points at itself, so climbing is idempotent there (a padding row marks its own
    diagonal alone). Step k marks, for every node at once, its k-th ancestor in the mask and
    counts a level if it moved; after max_depth + 1 steps every node sits on its root.
    """
    nb, nmax = padded_parents.shape
    local = np.arange(nmax)
    valid = local < sizes[:, None]  # [B, Nmax]
    base = (np.arange(nb) * nmax)[:, None]
    up = (np.where(valid & (local > 0), padded_parents, local) + base).ravel()
    g = np.arange(nb * nmax)
    row_start = g * nmax - np.repeat(base.ravel(), nmax)  # mask[g, local j] at row_start + g_j

    mask = np.zeros(nb * nmax * nmax, dtype=bool)
    depth = np.zeros(nb * nmax, dtype=np.int64)
    cur = g
    while True:
        mask[row_start + cur] = True
        nxt = up[cur]
        moved = nxt != cur
        if not moved.any():
            break
        depth += moved
        cur = nxt
    return mask.reshape(nb, nmax, nmax), depth, valid, up


def numpy_layout(
    padded_parents: np.ndarray, sizes: np.ndarray, prefix_lens: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(padded_mask [B, Nmax, Nmax], positions [T], paths [B, Lmax, Dmax+1])` in numpy, from
    the `climb`. Paths climb from the leaves only, writing column depth - k; columns that fall
    off the left edge go to a scratch column that is sliced away.
    """
    nb, nmax = padded_parents.shape
    mask, depth, valid, up = climb(padded_parents, sizes)
    g = np.arange(nb * nmax)
    all_valid = bool(valid.all())
    if not all_valid:
        mask[~valid] = False  # padding rows marked their own diagonal

    positions = (depth.reshape(nb, nmax) + prefix_lens[:, None]).ravel()
    if not all_valid:
        positions = positions[valid.ravel()]

    has_child = np.zeros(nb * nmax, dtype=bool)
    has_child[up[up != g]] = True
    leaves = np.flatnonzero(valid.ravel() & ~has_child)  # grouped by tree, increasing index
    tree_of = leaves // nmax
    per_tree = np.bincount(tree_of, minlength=nb)
    lmax = int(per_tree.max())
    slot = np.arange(len(leaves)) - np.repeat(np.cumsum(per_tree) - per_tree, per_tree)
    width = int(depth.max()) + 1
    paths = np.full((nb * lmax, width + 1), -1, dtype=np.int32)
    flat_paths = paths.reshape(-1)
    row = (tree_of * lmax + slot) * (width + 1)
    col = depth[leaves]
    cur = leaves
    local_base = tree_of * nmax
    for _ in range(width):
        flat_paths[row + np.where(col >= 0, col, width)] = cur - local_base
        cur = up[cur]
        col = col - 1
    return mask, positions, paths[:, :width].reshape(nb, lmax, width)


def numpy_tree_mask(parents: np.ndarray) -> np.ndarray:
    """Single-tree `attention_mask()` by the same climb: one scatter and one gather per level."""
    n = len(parents)
    up = parents.copy()
    up[0] = 0
    mask = np.zeros((n, n), dtype=bool)
    rows = np.arange(n)
    cur = rows
    while True:
        mask[rows, cur] = True
        if not cur.any():
            return mask
        cur = up[cur]


def layout_contender(name: str, batch) -> tuple[object, int | None]:
    """`(fn, rounds)` for one contender; `rounds` pins slow reference runs."""
    if name == "rust":
        parents, tokens, offsets, prefix = (
            batch.parents,
            batch.tokens,
            batch.offsets,
            batch.prefix_lens,
        )

        def rust():
            b = ss.TreeBatch.from_flat(parents, tokens, offsets)
            return b.padded_mask(), b.positions(prefix), b.paths()

        return rust, None
    if name == "reference":
        lists = batch.lists()
        parents, offsets, prefix = lists["parents"], lists["offsets"], lists["prefix_lens"]

        def reference():
            return (
                ref.padded_mask(parents, offsets),
                ref.batch_positions(parents, offsets, prefix),
                ref.batch_paths(parents, offsets),
            )

        # 20 ms to 0.4 s per call from B*N = 32*128 up: three single-call rounds suffice.
        return reference, (3 if len(parents) >= 32 * 128 else None)
    padded, sizes, prefix = batch.padded_parents, batch.sizes, batch.prefix_lens
    return (lambda: numpy_layout(padded, sizes, prefix)), None


@pytest.mark.parametrize("contender", CONTENDERS)
@pytest.mark.parametrize(("num_trees", "num_nodes"), SIZES, ids=[f"B{b}-N{n}" for b, n in SIZES])
def test_layout(benchmark, num_trees, num_nodes, contender):
    benchmark.group = f"layout B={num_trees} N={num_nodes}"
    batch = uniform_batch(num_trees, num_nodes)
    fn, rounds = layout_contender(contender, batch)
    mask, positions, paths = run(benchmark, fn, rounds=rounds)

    # Checked against an implementation other than the one timed: Rust against the numpy
    # peer, the others against Rust.
    if contender == "rust":
        want = numpy_layout(batch.padded_parents, batch.sizes, batch.prefix_lens)
    else:
        b = batch.tree_batch()
        want = (b.padded_mask(), b.positions(batch.prefix_lens), b.paths())
    for got, expected in zip((mask, positions, paths), want, strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def numpy_padded_layout(
    padded_parents: np.ndarray, sizes: np.ndarray, tokens: np.ndarray, prefix_lens: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`TreeBatch.padded_layout` in numpy: the `climb`'s mask (padding rows already see only
    themselves) and depths, tokens scattered into their slots."""
    nb, nmax = padded_parents.shape
    mask, depth, valid, _ = climb(padded_parents, sizes)
    rows, cols = np.nonzero(valid)  # row-major: tree order
    padded_tokens = np.zeros((nb, nmax), dtype=np.int64)
    padded_tokens[rows, cols] = tokens
    positions = depth.reshape(nb, nmax) + prefix_lens[:, None]
    return padded_tokens, positions, mask, rows, cols


# The demo's decode loop (4 requests, 16-node trees) and a serving batch.
PADDED_SIZES = [(4, 16), (64, 64)]


@pytest.mark.parametrize("contender", CONTENDERS)
@pytest.mark.parametrize(
    ("num_trees", "num_nodes"), PADDED_SIZES, ids=[f"B{b}-N{n}" for b, n in PADDED_SIZES]
)
def test_padded_layout(benchmark, num_trees, num_nodes, contender):
    """The padded batch a model runs (`generate.pad_trees`), from a built TreeBatch."""
    benchmark.group = f"padded layout B={num_trees} N={num_nodes}"
    batch = uniform_batch(num_trees, num_nodes)
    tb, prefix = batch.tree_batch(), batch.prefix_lens
    if contender == "rust":
        got = run(benchmark, lambda: tb.padded_layout(prefix))
    elif contender == "reference":
        lists = batch.lists()
        args = lists["parents"], lists["tokens"], lists["offsets"], lists["prefix_lens"]
        got = run(benchmark, lambda: ref.padded_layout(*args))
    else:
        padded, sizes, tokens = batch.padded_parents, batch.sizes, batch.tokens
        got = run(benchmark, lambda: numpy_padded_layout(padded, sizes, tokens, prefix))
    for g, w in zip(got, tb.padded_layout(prefix), strict=True):
        np.testing.assert_array_equal(np.asarray(g), w)


TREE_N = 8


@pytest.mark.parametrize("contender", CONTENDERS)
def test_tree_mask(benchmark, contender):
    benchmark.group = f"tree N={TREE_N}"
    batch = uniform_batch(1, TREE_N)
    parents, tokens = batch.parents, batch.tokens
    if contender == "rust":
        mask = run(benchmark, lambda: ss.Tree(parents, tokens).attention_mask())
    elif contender == "reference":
        plist = parents.tolist()
        mask = run(benchmark, lambda: ref.attention_mask(plist))
    else:
        mask = run(benchmark, lambda: numpy_tree_mask(parents))
    # Against the plain-Python reference (Rust against itself could not fail).
    np.testing.assert_array_equal(
        np.asarray(mask, dtype=bool), np.asarray(ref.attention_mask(parents.tolist()), dtype=bool)
    )


def test_numpy_peer_on_ragged_batch():
    """The peer's padding path (trees of different sizes), not exercised by the timed groups."""
    batch = make_batch([1, 9, 64, 5, 33], seed=7)
    mask, positions, paths = numpy_layout(batch.padded_parents, batch.sizes, batch.prefix_lens)
    expected = batch.tree_batch()
    np.testing.assert_array_equal(mask, expected.padded_mask())
    np.testing.assert_array_equal(positions, expected.positions(batch.prefix_lens))
    np.testing.assert_array_equal(paths, expected.paths())
    padded = numpy_padded_layout(batch.padded_parents, batch.sizes, batch.tokens, batch.prefix_lens)
    for g, w in zip(padded, expected.padded_layout(batch.prefix_lens), strict=True):
        np.testing.assert_array_equal(g, w)
