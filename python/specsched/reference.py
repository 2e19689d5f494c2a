"""Pure-Python reference of every specsched Rust kernel.

This module is the *oracle* the test-suite compares the Rust extension against, and the
*baseline* the benchmarks time it against. It is written from the semantics in DESIGN.md and
docs/api.md only (never from the Rust code), as plain Python loops over lists, so that it is
obviously correct rather than fast.

Conventions (see DESIGN.md section 1):

- ``parents[0] == -1`` and ``0 <= parents[i] < i`` for ``i >= 1``; node 0 is the root.
- Siblings are ordered by node index (the lower index is the draft's preferred candidate).
- Batches are ragged and flat: nodes of all trees concatenated, ``offsets`` a CSR list of
  ``B + 1`` ints, and parents *tree-local* (each tree's first node has parent -1).
- Per-request outputs of varying length are padded with -1.

Inputs are plain Python sequences of ints (callers ``.tolist()`` their arrays); outputs are
(nested) lists. Only :func:`compact_kv` touches numpy, because it mutates an array in place.
Layout and verification functions assume an already validated tree (as the Rust kernels do for a
constructed ``Tree``); :func:`validate_tree`, :func:`validate_batch` and :func:`validate_offsets`
are the validation oracles.
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "argmax",
    "attention_bias",
    "attention_mask",
    "batch_commit_slots",
    "batch_depths",
    "batch_kv_compaction_plan",
    "batch_packed_mask",
    "batch_paths",
    "batch_positions",
    "batch_sglang_links",
    "batch_verify_sampled",
    "batch_verify_walk",
    "chain_parents",
    "commit_slots",
    "compact_kv",
    "depths",
    "from_choices",
    "kv_compaction_plan",
    "limit_depth",
    "num_leaves",
    "packed_mask",
    "packed_ragged_mask",
    "padded_mask",
    "paths",
    "positions",
    "processed_probs",
    "qlen_mask",
    "ragged_bias",
    "ragged_mask",
    "rng_uniform",
    "sample_index",
    "sglang_links",
    "sglang_outputs",
    "validate_batch",
    "validate_offsets",
    "validate_tree",
    "verify_logits",
    "verify_sampled",
    "verify_walk",
]

NEG_INF = float("-inf")


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _children(parents: Sequence[int]) -> list[list[int]]:
    """Children of every node, each list in increasing node index."""
    kids: list[list[int]] = [[] for _ in range(len(parents))]
    for i in range(1, len(parents)):
        kids[parents[i]].append(i)
    return kids


def _ancestors_or_self(parents: Sequence[int], i: int) -> list[int]:
    """Node ``i`` and all its ancestors, from ``i`` up to the root."""
    out = [i]
    p = parents[i]
    while p >= 0:
        out.append(p)
        p = parents[p]
    return out


def _check_prefix_len(prefix_len: int, name: str = "prefix_len") -> None:
    if prefix_len < 0:
        raise ValueError(f"{name} must be >= 0, got {prefix_len}")


def _trees(offsets: Sequence[int]) -> list[tuple[int, int]]:
    """``(start, end)`` of every tree of a CSR batch."""
    return [(offsets[b], offsets[b + 1]) for b in range(len(offsets) - 1)]


def _prefix_list(prefix_lens: int | Sequence[int], num_trees: int) -> list[int]:
    """Per-tree prefix lengths from an int (broadcast) or a sequence of ``B`` ints."""
    if isinstance(prefix_lens, bool):
        raise TypeError("prefix_lens must be an int or a sequence of ints, not a bool")
    if isinstance(prefix_lens, int):
        out = [prefix_lens] * num_trees
    else:
        out = [operator.index(p) for p in prefix_lens]
        if len(out) != num_trees:
            raise ValueError(
                f"prefix_lens has {len(out)} entries, expected one per tree ({num_trees})"
            )
    for b, p in enumerate(out):
        if p < 0:
            raise ValueError(f"prefix_lens[{b}] must be >= 0, got {p}")
    return out


def _max_depth(parents: Sequence[int]) -> int:
    return max(depths(parents))


# --------------------------------------------------------------------------------------------
# tree structure
# --------------------------------------------------------------------------------------------


def validate_tree(parents: Sequence[int], tokens: Sequence[int]) -> None:
    """Raise ValueError unless ``(parents, tokens)`` is a valid tree (DESIGN.md section 1)."""
    n = len(parents)
    if n == 0:
        raise ValueError("parents is empty: a tree has at least its root (N >= 1)")
    if len(tokens) != n:
        raise ValueError(f"tokens has {len(tokens)} entries, expected len(parents) = {n}")
    if parents[0] != -1:
        raise ValueError(f"parents[0] must be -1 (node 0 is the root), got {parents[0]}")
    for i in range(1, n):
        p = parents[i]
        if p < 0 or p >= i:
            raise ValueError(f"parents[{i}] = {p}: expected 0 <= parents[{i}] < {i}")


def depths(parents: Sequence[int]) -> list[int]:
    """``depth[0] = 0``, ``depth[i] = depth[parents[i]] + 1``."""
    out = [0] * len(parents)
    for i in range(1, len(parents)):
        out[i] = out[parents[i]] + 1
    return out


def num_leaves(parents: Sequence[int]) -> int:
    """Number of nodes without children (a lone root is a leaf)."""
    return sum(1 for kids in _children(parents) if not kids)


def limit_depth(
    parents: Sequence[int], tokens: Sequence[int], max_depth: int
) -> tuple[list[int], list[int]]:
    """The tree without the nodes deeper than ``max_depth``: the kept nodes in their order,
    each parent given by its position among the kept ones (``max_depth >= 0``: the root
    stays)."""
    if max_depth < 0:
        raise ValueError(f"max_depth must be >= 0, got {max_depth}")
    dep = depths(parents)
    kept = [i for i in range(len(parents)) if dep[i] <= max_depth]
    new_index = {old: new for new, old in enumerate(kept)}
    return [new_index[parents[i]] if parents[i] >= 0 else -1 for i in kept], [
        tokens[i] for i in kept
    ]


def chain_parents(n: int) -> list[int]:
    """Parents of a chain of ``n`` nodes: node i's parent is i - 1."""
    if n < 1:
        raise ValueError(f"n must be >= 1 (a tree has at least its root), got {n}")
    return [-1, *range(n - 1)]


def from_choices(
    choices: Sequence[Sequence[int]],
    tokens: Sequence[int] | None = None,
    order: str = "breadth_first",
) -> tuple[list[int], list[int]]:
    """Build ``(parents, tokens)`` from Medusa/EAGLE-1/vLLM/TRT-LLM choice paths.

    Nodes: root first, then ``sorted(choices, key=lambda c: (len(c), c))``, or with
    ``order="depth_first"`` ``sorted(choices)`` (depth-first preorder). ``tokens[0]`` is the
    root's and ``tokens[1 + j]`` belongs to ``choices[j]`` in the order given. Without tokens the
    root's is 0 and every other node's is its choice's last entry.
    """
    norm: list[tuple[int, ...]] = []
    seen: dict[tuple[int, ...], int] = {}
    for j, choice in enumerate(choices):
        c = tuple(operator.index(x) for x in choice)
        if len(c) == 0:
            raise ValueError(f"choices[{j}] is empty (the root is implicit)")
        for x in c:
            if x < 0:
                raise ValueError(f"choices[{j}] = {c} has a negative entry {x}")
        if c in seen:
            raise ValueError(f"choices[{j}] = {c} duplicates choices[{seen[c]}]")
        seen[c] = j
        norm.append(c)
    for j, c in enumerate(norm):
        if len(c) > 1 and c[:-1] not in seen:
            raise ValueError(f"choices[{j}] = {c}: its prefix {c[:-1]} is not a choice")
    if tokens is not None and len(tokens) != len(norm) + 1:
        raise ValueError(
            f"tokens has {len(tokens)} entries, expected len(choices) + 1 = {len(norm) + 1}"
        )

    if order not in ("breadth_first", "depth_first"):
        raise ValueError(f"order must be 'breadth_first' or 'depth_first', got {order!r}")
    if order == "depth_first":
        layout = sorted(range(len(norm)), key=lambda j: norm[j])
    else:
        layout = sorted(range(len(norm)), key=lambda j: (len(norm[j]), norm[j]))
    node_of: dict[tuple[int, ...], int] = {}
    parents = [-1]
    out_tokens = [0 if tokens is None else operator.index(tokens[0])]
    for node, j in enumerate(layout, start=1):
        c = norm[j]
        node_of[c] = node
        parents.append(0 if len(c) == 1 else node_of[c[:-1]])
        out_tokens.append(c[-1] if tokens is None else operator.index(tokens[1 + j]))
    return parents, out_tokens


# --------------------------------------------------------------------------------------------
# single-tree layouts
# --------------------------------------------------------------------------------------------


def attention_mask(parents: Sequence[int], prefix_len: int = 0) -> list[list[bool]]:
    """bool ``[N, prefix_len + N]``: prefix all True; ``[i][prefix_len + j]`` iff j is i or an
    ancestor of i."""
    _check_prefix_len(prefix_len)
    n = len(parents)
    out: list[list[bool]] = []
    for i in range(n):
        row = [True] * prefix_len + [False] * n
        for j in _ancestors_or_self(parents, i):
            row[prefix_len + j] = True
        out.append(row)
    return out


def attention_bias(parents: Sequence[int], prefix_len: int = 0) -> list[list[float]]:
    """Float ``[N, prefix_len + N]``: 0.0 where :func:`attention_mask` is True, -inf elsewhere."""
    return [[0.0 if m else NEG_INF for m in row] for row in attention_mask(parents, prefix_len)]


def packed_mask(parents: Sequence[int]) -> list[list[int]]:
    """uint32 words ``[N, ceil(N/32)]``: bit ``j % 32`` of word ``j // 32`` of row i is set iff j
    is i or an ancestor of i."""
    n = len(parents)
    words = (n + 31) // 32
    out: list[list[int]] = []
    for i in range(n):
        row = [0] * words
        for j in _ancestors_or_self(parents, i):
            row[j // 32] |= 1 << (j % 32)
        out.append(row)
    return out


def positions(parents: Sequence[int], prefix_len: int = 0) -> list[int]:
    """``prefix_len + depth`` per node."""
    _check_prefix_len(prefix_len)
    return [prefix_len + d for d in depths(parents)]


def paths(parents: Sequence[int]) -> list[list[int]]:
    """``[num_leaves, max_depth + 1]``: root-to-leaf node paths, leaves in increasing node index,
    rows padded with -1."""
    kids = _children(parents)
    width = _max_depth(parents) + 1
    out: list[list[int]] = []
    for i in range(len(parents)):
        if kids[i]:
            continue
        path = _ancestors_or_self(parents, i)[::-1]
        out.append(path + [-1] * (width - len(path)))
    return out


def sglang_links(parents: Sequence[int]) -> tuple[list[int], list[int]]:
    """``(next_token, next_sibling)``: each node's first (lowest-index) child and its next
    higher-index sibling; -1 = none."""
    n = len(parents)
    next_token = [-1] * n
    next_sibling = [-1] * n
    for kids in _children(parents):
        if kids:
            next_token[parents[kids[0]]] = kids[0]
        for a, b in itertools.pairwise(kids):
            next_sibling[a] = b
    return next_token, next_sibling


# --------------------------------------------------------------------------------------------
# batch (ragged, flat) layouts
# --------------------------------------------------------------------------------------------


def validate_offsets(offsets: Sequence[int], num_nodes: int) -> None:
    """Raise ValueError unless ``offsets`` is a CSR list ``[B + 1]`` with B >= 1, ``offsets[0]
    == 0``, strictly increasing (every tree has a node) and ``offsets[-1] == num_nodes``."""
    if len(offsets) < 2:
        raise ValueError(f"offsets has {len(offsets)} entries, expected B + 1 >= 2")
    if offsets[0] != 0:
        raise ValueError(f"offsets[0] must be 0, got {offsets[0]}")
    for b in range(1, len(offsets)):
        if offsets[b] <= offsets[b - 1]:
            raise ValueError(
                f"offsets[{b}] = {offsets[b]}: expected > offsets[{b - 1}] = {offsets[b - 1]} "
                "(offsets strictly increasing, every tree has >= 1 node)"
            )
    if offsets[-1] != num_nodes:
        raise ValueError(
            f"offsets[{len(offsets) - 1}] = {offsets[-1]}: expected the number of nodes "
            f"({num_nodes})"
        )


def validate_batch(parents: Sequence[int], tokens: Sequence[int], offsets: Sequence[int]) -> None:
    """Validate a flat batch (``TreeBatch.from_flat``): offsets, then every tree's local parents.

    Errors name the *global* (flat) index into ``parents``.
    """
    if len(tokens) != len(parents):
        raise ValueError(
            f"tokens has {len(tokens)} entries, expected len(parents) = {len(parents)}"
        )
    validate_offsets(offsets, len(parents))
    for start, end in _trees(offsets):
        if parents[start] != -1:
            raise ValueError(
                f"parents[{start}] must be -1 (first node of a tree), got {parents[start]}"
            )
        for g in range(start + 1, end):
            p = parents[g]
            i = g - start
            if p < 0 or p >= i:
                raise ValueError(
                    f"parents[{g}] = {p}: expected 0 <= parents[{g}] < {i} (tree-local index)"
                )


def batch_depths(parents: Sequence[int], offsets: Sequence[int]) -> list[int]:
    """Tree-local depth of every node of a flat batch, ``[T]``."""
    out: list[int] = []
    for start, end in _trees(offsets):
        out.extend(depths(parents[start:end]))
    return out


def batch_positions(
    parents: Sequence[int], offsets: Sequence[int], prefix_lens: int | Sequence[int]
) -> list[int]:
    """``prefix_lens[b] + depth`` of every node, ``[T]``."""
    trees = _trees(offsets)
    pls = _prefix_list(prefix_lens, len(trees))
    out: list[int] = []
    for (start, end), pl in zip(trees, pls, strict=True):
        out.extend(positions(parents[start:end], pl))
    return out


def ragged_mask(
    parents: Sequence[int], offsets: Sequence[int], prefix_lens: int | Sequence[int]
) -> tuple[list[bool], list[int]]:
    """FlashInfer ragged custom mask: ``(flat bool mask, mask_indptr [B + 1])``; each request's
    ``[N_b, prefix_b + N_b]`` :func:`attention_mask` flattened row-major, concatenated."""
    trees = _trees(offsets)
    pls = _prefix_list(prefix_lens, len(trees))
    flat: list[bool] = []
    indptr = [0]
    for (start, end), pl in zip(trees, pls, strict=True):
        for row in attention_mask(parents[start:end], pl):
            flat.extend(row)
        indptr.append(len(flat))
    return flat, indptr


def ragged_bias(
    parents: Sequence[int], offsets: Sequence[int], prefix_lens: int | Sequence[int]
) -> tuple[list[float], list[int]]:
    """:func:`ragged_mask` as 0.0 / -inf: ``(flat bias, mask_indptr)``."""
    flat, indptr = ragged_mask(parents, offsets, prefix_lens)
    return [0.0 if m else NEG_INF for m in flat], indptr


def packed_ragged_mask(
    parents: Sequence[int], offsets: Sequence[int], prefix_lens: int | Sequence[int]
) -> tuple[list[int], list[int]]:
    """``segment_packbits(mask, mask_indptr, bitorder="little")``: ``(bytes, byte indptr)``.

    Each request's segment is packed on its own into ``ceil(len / 8)`` bytes; bit k of byte m of
    a segment is its element ``8m + k``.
    """
    flat, indptr = ragged_mask(parents, offsets, prefix_lens)
    out: list[int] = []
    byte_indptr = [0]
    for b in range(len(indptr) - 1):
        seg = flat[indptr[b] : indptr[b + 1]]
        nbytes = (len(seg) + 7) // 8
        packed = [0] * nbytes
        for e, bit in enumerate(seg):
            if bit:
                packed[e // 8] |= 1 << (e % 8)
        out.extend(packed)
        byte_indptr.append(len(out))
    return out, byte_indptr


def qlen_mask(parents: Sequence[int], offsets: Sequence[int]) -> list[list[list[bool]]]:
    """SGLang QLEN_ONLY: bool ``[B, N, N]`` tree part of each mask; all trees must have N nodes."""
    trees = _trees(offsets)
    sizes = [end - start for start, end in trees]
    for b, s in enumerate(sizes):
        if s != sizes[0]:
            raise ValueError(
                f"qlen_mask needs equal tree sizes: tree 0 has {sizes[0]} nodes, tree {b} has {s}"
            )
    return [attention_mask(parents[start:end], 0) for start, end in trees]


def padded_mask(parents: Sequence[int], offsets: Sequence[int]) -> list[list[list[bool]]]:
    """bool ``[B, Nmax, Nmax]``: each tree's ``[N_b, N_b]`` mask, False outside the tree."""
    trees = _trees(offsets)
    nmax = max(end - start for start, end in trees)
    out: list[list[list[bool]]] = []
    for start, end in trees:
        m = attention_mask(parents[start:end], 0)
        n = end - start
        rows = [row + [False] * (nmax - n) for row in m]
        rows.extend([False] * nmax for _ in range(nmax - n))
        out.append(rows)
    return out


def padded_layout(
    parents: Sequence[int],
    tokens: Sequence[int],
    offsets: Sequence[int],
    prefix_lens: int | Sequence[int],
) -> tuple[list[list[int]], list[list[int]], list[list[list[bool]]], list[int], list[int]]:
    """The batch as the ``[B, Nmax]`` batch a model runs: ``(tokens, positions, tree_mask, rows,
    cols)``. Tree b fills slots ``0..N_b`` of row b with its tokens, positions ``prefix_b +
    depth`` and :func:`padded_mask`; a padding slot holds token 0 and position ``prefix_b``
    and attends to itself alone. ``rows[t]``, ``cols[t]``: the slot of flat node t."""
    trees = _trees(offsets)
    pls = _prefix_list(prefix_lens, len(trees))
    nmax = max(end - start for start, end in trees)
    mask = padded_mask(parents, offsets)
    out_tokens: list[list[int]] = []
    out_positions: list[list[int]] = []
    rows: list[int] = []
    cols: list[int] = []
    for b, ((start, end), pl) in enumerate(zip(trees, pls, strict=True)):
        n = end - start
        out_tokens.append(list(tokens[start:end]) + [0] * (nmax - n))
        out_positions.append(positions(parents[start:end], pl) + [pl] * (nmax - n))
        for j in range(n, nmax):
            mask[b][j][j] = True
        rows.extend([b] * n)
        cols.extend(range(n))
    return out_tokens, out_positions, mask, rows, cols


def batch_packed_mask(parents: Sequence[int], offsets: Sequence[int]) -> list[list[int]]:
    """uint32 words ``[T, ceil(Nmax / 32)]``: each node's :func:`packed_mask` row over its own
    tree, zero-extended to the batch width."""
    trees = _trees(offsets)
    nmax = max(end - start for start, end in trees)
    width = (nmax + 31) // 32
    out: list[list[int]] = []
    for start, end in trees:
        for row in packed_mask(parents[start:end]):
            out.append(row + [0] * (width - len(row)))
    return out


def batch_paths(parents: Sequence[int], offsets: Sequence[int]) -> list[list[list[int]]]:
    """``[B, Lmax, Dmax + 1]``: each tree's :func:`paths` (tree-local), -1 padded."""
    per_tree = [paths(parents[start:end]) for start, end in _trees(offsets)]
    lmax = max(len(p) for p in per_tree)
    width = max(len(p[0]) for p in per_tree)
    out: list[list[list[int]]] = []
    for p in per_tree:
        rows = [row + [-1] * (width - len(row)) for row in p]
        rows.extend([-1] * width for _ in range(lmax - len(p)))
        out.append(rows)
    return out


def batch_sglang_links(
    parents: Sequence[int], offsets: Sequence[int]
) -> tuple[list[int], list[int]]:
    """:func:`sglang_links` of every tree, tree-local indices, concatenated ``[T]``."""
    next_token: list[int] = []
    next_sibling: list[int] = []
    for start, end in _trees(offsets):
        nt, ns = sglang_links(parents[start:end])
        next_token.extend(nt)
        next_sibling.extend(ns)
    return next_token, next_sibling


# --------------------------------------------------------------------------------------------
# verification (greedy)
# --------------------------------------------------------------------------------------------


def argmax(row: Sequence[float]) -> int:
    """Index of the largest value, ties to the lowest index; ValueError on NaN or empty row."""
    if len(row) == 0:
        raise ValueError("argmax of an empty row")
    best = 0
    best_val = row[0]
    if math.isnan(best_val):
        raise ValueError("row contains NaN at index 0")
    for k in range(1, len(row)):
        x = row[k]
        if math.isnan(x):
            raise ValueError(f"row contains NaN at index {k}")
        if x > best_val:
            best = k
            best_val = x
    return best


def _walk(
    parents: Sequence[int], tokens: Sequence[int], choice: Callable[[int], int]
) -> tuple[list[int], list[int]]:
    """The match walk: v = 0; y = choice(v); accept the first child c (by index) with
    tokens[c] == y and repeat from c; else stop with bonus y. A negative y matches no child
    (the end marker of a known continuation). ``choice`` is called only on the nodes the walk
    visits."""
    kids = _children(parents)
    v = 0
    accepted = [0]
    emitted: list[int] = []
    while True:
        y = choice(v)
        emitted.append(y)
        nxt = -1
        for c in kids[v]:
            if y >= 0 and tokens[c] == y:
                nxt = c
                break
        if nxt < 0:
            return accepted, emitted
        accepted.append(nxt)
        v = nxt


def verify_walk(
    parents: Sequence[int], tokens: Sequence[int], target_tokens: Sequence[int]
) -> tuple[list[int], list[int]]:
    """Greedy walk given the target's choice per node: ``(accepted_nodes [k+1], tokens [k+1])``
    where tokens are the accepted draft tokens then the bonus."""
    return _walk(parents, tokens, lambda v: int(target_tokens[v]))


def verify_logits(
    parents: Sequence[int], tokens: Sequence[int], logits_rows: Any
) -> tuple[list[int], list[int]]:
    """:func:`verify_walk` with choice = :func:`argmax` of ``logits_rows[v]``, computed only for
    visited rows (a NaN in an unvisited row is not an error)."""

    def choice(v: int) -> int:
        try:
            return argmax(logits_rows[v])
        except ValueError as e:
            raise ValueError(f"logits row {v}: {e}") from None

    return _walk(parents, tokens, choice)


def batch_verify_walk(
    parents: Sequence[int],
    tokens: Sequence[int],
    offsets: Sequence[int],
    target_tokens: Sequence[int],
) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """Per-tree :func:`verify_walk` on a flat batch: ``(num_accepted [B], accepted_nodes
    [B, Dmax+1] tree-local, tokens [B, Dmax+1])``, -1 padded, Dmax = max depth over the batch."""
    trees = _trees(offsets)
    width = max(_max_depth(parents[start:end]) for start, end in trees) + 1
    num_acc: list[int] = []
    acc_out: list[list[int]] = []
    tok_out: list[list[int]] = []
    for start, end in trees:
        acc, emitted = verify_walk(parents[start:end], tokens[start:end], target_tokens[start:end])
        num_acc.append(len(acc) - 1)
        acc_out.append(acc + [-1] * (width - len(acc)))
        tok_out.append(emitted + [-1] * (width - len(emitted)))
    return num_acc, acc_out, tok_out


def truncate_batch_result(
    num_accepted: Sequence[int],
    accepted_nodes_padded: Sequence[Sequence[int]],
    tokens_padded: Sequence[Sequence[int]],
    keep: Sequence[int],
) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """A batch result as if row b's walk had stopped after its first ``keep[b]`` tokens (a
    path cut at EOS): the first ``keep[b]`` accepted nodes and tokens (the last kept token is
    the bonus), -1 past them, ``num_accepted = keep[b] - 1``."""
    if len(keep) != len(num_accepted):
        raise ValueError(f"keep: expected {len(num_accepted)} entries, got {len(keep)}")
    num: list[int] = []
    acc: list[list[int]] = []
    tok: list[list[int]] = []
    for b, n in enumerate(keep):
        if not 1 <= n <= num_accepted[b] + 1:
            raise ValueError(f"keep[{b}] = {n}, expected 1..={num_accepted[b] + 1}")
        width = len(accepted_nodes_padded[b])
        num.append(n - 1)
        acc.append(list(accepted_nodes_padded[b][:n]) + [-1] * (width - n))
        tok.append(list(tokens_padded[b][:n]) + [-1] * (width - n))
    return num, acc, tok


def sglang_outputs(
    offsets: Sequence[int],
    accepted_nodes_padded: Sequence[Sequence[int]],
    tokens_padded: Sequence[Sequence[int]],
    num_accepted: Sequence[int],
) -> tuple[list[int], list[list[int]], list[int]]:
    """SGLang ``verify_tree_greedy`` outputs from a batch result: ``(predicts [T], accept_index
    [B, Dmax+1], accept_length [B])``.

    ``accept_index`` holds global flat node indices (-1 padded); ``predicts`` at each accepted
    node is the target's choice there (the next emitted token: ``tokens[b][j]`` for accepted node
    j), 0 elsewhere; ``accept_length`` is the number of accepted draft tokens (bonus excluded).
    """
    predicts = [0] * offsets[-1]
    accept_index: list[list[int]] = []
    for b in range(len(offsets) - 1):
        k = num_accepted[b]
        row = [-1] * len(accepted_nodes_padded[b])
        for j in range(k + 1):
            g = offsets[b] + accepted_nodes_padded[b][j]
            row[j] = g
            predicts[g] = tokens_padded[b][j]
        accept_index.append(row)
    return predicts, accept_index, [int(k) for k in num_accepted]


# --------------------------------------------------------------------------------------------
# KV cache
# --------------------------------------------------------------------------------------------


def kv_compaction_plan(
    accepted_nodes: Sequence[int], prefix_len: int
) -> tuple[list[int], list[int]]:
    """``(src, dst)``: ``src = prefix + a_j``, ``dst = prefix + j`` for accepted node ``a_j`` at
    path position j, only where they differ, in order; -1 padding is ignored."""
    _check_prefix_len(prefix_len)
    src: list[int] = []
    dst: list[int] = []
    for j, a in enumerate(accepted_nodes):
        if a < 0:
            continue
        if a != j:
            src.append(prefix_len + a)
            dst.append(prefix_len + j)
    return src, dst


def batch_kv_compaction_plan(
    accepted_nodes_padded: Sequence[Sequence[int]],
    prefix_lens: int | Sequence[int],
    active: Sequence[bool] | None = None,
) -> tuple[list[int], list[int], list[int]]:
    """``(req, src, dst)``: :func:`kv_compaction_plan` of every request, request-major; a
    request with ``active[b]`` False moves nothing."""
    pls = _prefix_list(prefix_lens, len(accepted_nodes_padded))
    if active is not None and len(active) != len(pls):
        raise ValueError("active: one flag per request")
    req: list[int] = []
    src: list[int] = []
    dst: list[int] = []
    for b, (acc, pl) in enumerate(zip(accepted_nodes_padded, pls, strict=True)):
        s, d = kv_compaction_plan(acc, pl)
        if active is not None and not active[b]:
            continue
        req.extend([b] * len(s))
        src.extend(s)
        dst.extend(d)
    return req, src, dst


def compact_kv(
    cache: Any, moves: Sequence[Sequence[int]], seq_dim: int, batch_dim: int | None = None
) -> None:
    """Apply a plan to a numpy array in place, one basic-slicing copy per move, in order.

    ``moves`` is ``(src, dst)`` (from :func:`kv_compaction_plan`: every index of the other axes
    moves) or ``(req, src, dst)`` (from :func:`batch_kv_compaction_plan`: only index ``req``
    along ``batch_dim``, which defaults to 0 for such a plan).
    """
    import numpy as np

    arr = np.asarray(cache)
    ndim = arr.ndim
    if not -ndim <= seq_dim < ndim:
        raise ValueError(f"seq_dim {seq_dim} out of range for a {ndim}-d cache")
    seq_dim %= ndim
    if len(moves) == 3:
        req, src, dst = moves
        bd = 0 if batch_dim is None else batch_dim
        if not -ndim <= bd < ndim:
            raise ValueError(f"batch_dim {bd} out of range for a {ndim}-d cache")
        bd %= ndim
        if bd == seq_dim:
            raise ValueError(f"batch_dim and seq_dim are the same axis ({bd})")
    elif len(moves) == 2:
        src, dst = moves
        req = [-1] * len(src)
        bd = -1
    else:
        raise ValueError(f"moves must be (src, dst) or (req, src, dst), got {len(moves)} parts")
    for r, s, d in zip(req, src, dst, strict=True):
        idx_s: list[int | slice] = [slice(None)] * ndim
        idx_d: list[int | slice] = [slice(None)] * ndim
        idx_s[seq_dim] = int(s)
        idx_d[seq_dim] = int(d)
        if bd >= 0:
            idx_s[bd] = int(r)
            idx_d[bd] = int(r)
        cache[tuple(idx_d)] = cache[tuple(idx_s)]


def commit_slots(
    slots: Sequence[int], accepted_nodes: Sequence[int]
) -> tuple[list[int], list[int]]:
    """``(kept, freed)`` slot ids: kept = the accepted nodes' slots in path order, freed = every
    other node's slot in node order; -1 padding in ``accepted_nodes`` is ignored."""
    acc = [a for a in accepted_nodes if a >= 0]
    accepted = set(acc)
    kept = [slots[a] for a in acc]
    freed = [slots[i] for i in range(len(slots)) if i not in accepted]
    return kept, freed


def batch_commit_slots(
    slots: Sequence[int],
    offsets: Sequence[int],
    accepted_nodes_padded: Sequence[Sequence[int]],
) -> tuple[list[list[int]], list[int]]:
    """Per request :func:`commit_slots` on flat ``slots [T]``: ``(kept [B, D+1] -1 padded,
    freed flat request-major)``; D+1 is the width of ``accepted_nodes_padded``."""
    kept_out: list[list[int]] = []
    freed_out: list[int] = []
    for (start, end), acc in zip(_trees(offsets), accepted_nodes_padded, strict=True):
        kept, freed = commit_slots(slots[start:end], acc)
        kept_out.append(kept + [-1] * (len(acc) - len(kept)))
        freed_out.extend(freed)
    return kept_out, freed_out


# --------------------------------------------------------------------------------------------
# simulator (specsched.sim): acceptance models, expected tokens, Monte Carlo
# --------------------------------------------------------------------------------------------

__all__ += [
    "SimRng",
    "chain_expected_tokens",
    "sim_child_prob",
    "sim_expected_tokens",
    "sim_path_probs",
    "sim_simulate",
]

_M64 = (1 << 64) - 1
SIM_CHUNK = 1 << 14


def chain_expected_tokens(alpha: float, gamma: int) -> float:
    """Tokens per target call of a chain: the bonus plus draft i (i = 1..gamma) whenever the
    first i drafts are all accepted, so ``sum(alpha**i for i in 0..gamma)``."""
    return sum(alpha**i for i in range(gamma + 1))


def sim_child_prob(kind: str, values: Sequence[Any], depth: int, rank: int) -> float:
    """P(the target picks the rank-``rank`` child at depth ``depth`` | its parent accepted).
    iid / per_depth: every child matches independently with alpha, the first match wins;
    per_rank: ``values[rank]`` (0 past the end); table: ``values[depth - 1][rank]``."""
    if kind == "table":
        row = values[depth - 1]
        return row[rank] if rank < len(row) else 0.0
    if kind == "per_rank":
        return values[rank] if rank < len(values) else 0.0
    alpha = values[0] if kind == "iid" else values[depth - 1]
    p = alpha
    for _ in range(rank):
        p *= 1.0 - alpha
    return p


def _sim_conditional(parents: Sequence[int], kind: str, values: Sequence[Any]) -> list[float]:
    kids = _children(parents)
    dep = depths(parents)
    q = [0.0] * len(parents)
    q[0] = 1.0
    for v in range(len(parents)):
        for rank, c in enumerate(kids[v]):
            q[c] = sim_child_prob(kind, values, dep[c], rank)
    return q


def sim_path_probs(parents: Sequence[int], kind: str, values: Sequence[Any]) -> list[float]:
    """P(path from the root to v accepted) = product of the conditional probabilities."""
    q = _sim_conditional(parents, kind, values)
    out = []
    for v in range(len(parents)):
        p = 1.0
        for u in _ancestors_or_self(parents, v):
            p *= q[u]
        out.append(p)
    return out


def sim_expected_tokens(parents: Sequence[int], kind: str, values: Sequence[Any]) -> float:
    """Expected tokens per step: the root's 1 plus every draft node's path probability."""
    return sum(sim_path_probs(parents, kind, values))


def sim_best_value(
    kind: str, values: Sequence[Any], budget: int, max_depth: int, max_children: int
) -> float:
    """The largest expected tokens per step of any tree of at most ``budget`` nodes (root
    included), depth <= ``max_depth`` and at most ``max_children`` children per node: top-down
    over (nodes, depth of the subtree's root), the children's ranks splitting what is left."""
    import functools

    @functools.cache
    def subtree(m: int, depth: int) -> float:
        # A node at `depth` with at most `m` nodes under and including it.
        if m <= 1 or depth >= max_depth:
            return 1.0
        return 1.0 + ranks(m - 1, depth + 1, 0)

    @functools.cache
    def ranks(m: int, depth: int, rank: int) -> float:
        # Children of ranks `rank`, `rank + 1`, ... at `depth` sharing at most `m` nodes (a
        # rank exists only if the ranks before it do).
        if m == 0 or rank >= max_children:
            return 0.0
        p = sim_child_prob(kind, values, depth, rank)
        best = 0.0
        for y in range(1, m + 1):
            best = max(best, p * subtree(y, depth) + ranks(m - y, depth, rank + 1))
        return best

    return subtree(budget, 0)


def _splitmix64(state: int) -> tuple[int, int]:
    state = (state + 0x9E3779B97F4A7C15) & _M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return state, z ^ (z >> 31)


class SimRng:
    """xoshiro256++ seeded through splitmix64, one stream per chunk of ``SIM_CHUNK`` steps:
    ``base = splitmix64(seed)``, then four splitmix64 outputs from
    ``base ^ (stream * 0xD1B54A32D192ED03)``. ``random()`` takes the top 53 bits."""

    def __init__(self, seed: int, stream: int) -> None:
        _, base = _splitmix64(seed)
        st = base ^ ((stream * 0xD1B54A32D192ED03) & _M64)
        s = []
        for _ in range(4):
            st, z = _splitmix64(st)
            s.append(z)
        self.s = s

    def next_u64(self) -> int:
        s = self.s
        x = (s[0] + s[3]) & _M64
        out = (((x << 23) | (x >> 41)) & _M64) + s[0] & _M64
        t = (s[1] << 17) & _M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = ((s[3] << 45) | (s[3] >> 19)) & _M64
        return out

    def random(self) -> float:
        return (self.next_u64() >> 11) * (1.0 / (1 << 53))


def sim_simulate(
    parents: Sequence[int], kind: str, values: Sequence[Any], steps: int, seed: int
) -> list[int]:
    """Monte-Carlo verification: for every step, at each node the walk reaches draw
    ``u = rng.random()`` and pick the first child whose cumulative probability (children in
    index order) exceeds ``u``, or none; the walk runs over node-id tokens. Returns the
    histogram of accepted draft counts ``[max_depth + 1]``."""
    q = _sim_conditional(parents, kind, values)
    kids = _children(parents)
    ids = list(range(len(parents)))
    hist = [0] * (_max_depth(parents) + 1)
    for chunk in range((steps + SIM_CHUNK - 1) // SIM_CHUNK):
        rng = SimRng(seed, chunk)

        def choice(v: int, rng: SimRng = rng) -> int:
            u = rng.random()
            acc = 0.0
            for c in kids[v]:
                acc += q[c]
                if u < acc:
                    return c
            return -1

        for _ in range(min(SIM_CHUNK, steps - chunk * SIM_CHUNK)):
            accepted, _ = _walk(parents, ids, choice)
            hist[len(accepted) - 1] += 1
    return hist


# --------------------------------------------------------------------------------------------
# sampling verification (issue 4)
# --------------------------------------------------------------------------------------------

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def rng_uniform(seed: int, request: int, node: int, draw: int) -> float:
    """The counter-based uniform in (0, 1) of DESIGN §4's sampled rules: splitmix64's
    finaliser chained over ``seed, request, node, draw`` (each counter offset by the golden
    ratio constant, arithmetic mod 2^64); the top 53 bits, plus one half, over 2^53."""
    h = _mix64((seed + _GOLDEN) & _MASK64)
    for c in (request, node, draw):
        h = _mix64(h ^ ((c + _GOLDEN) & _MASK64))
    return ((h >> 11) + 0.5) / float(1 << 53)


def processed_probs(
    row: Sequence[float], temperature: float, top_k: int = 0, top_p: float = 1.0
) -> list[float]:
    """The target's processed distribution of one logits row (temperature > 0).

    Order and ties as HF transformers / vLLM: ``z = (l - max) / temperature``; top-k (0 = off)
    keeps every token whose ``z`` is at least the k-th largest (all ties at the k-th value are
    kept); top-p (1 = off) sorts the renormalized distribution descending with ties to the lower
    token id and keeps a token iff the mass before it is below ``top_p``. ``+inf`` logits share
    the mass evenly. ValueError on NaN or a row without a finite logit.
    """
    xs = [float(x) for x in row]
    if any(math.isnan(x) for x in xs):
        raise ValueError("row contains NaN")
    m = max(xs)
    if m == NEG_INF:
        raise ValueError("row has no finite logit")
    if m == math.inf:
        xs = [0.0 if x == math.inf else NEG_INF for x in xs]
        m = 0.0
    z = [(x - m) / temperature for x in xs]
    if 0 < top_k < len(z):
        kth = sorted(z, reverse=True)[top_k - 1]
        z = [x if x >= kth else NEG_INF for x in z]
    w = [math.exp(x) for x in z]
    total = sum(w)
    probs = [x / total for x in w]
    if top_p < 1.0:
        order = sorted(range(len(z)), key=lambda i: (-z[i], i))
        keep = [False] * len(z)
        before = 0.0
        for i in order:
            if probs[i] == 0.0:
                break
            if before < top_p:
                keep[i] = True
            before += probs[i]
        kept = sum(p for p, k in zip(probs, keep, strict=True) if k)
        probs = [p / kept if k else 0.0 for p, k in zip(probs, keep, strict=True)]
    return probs


def sample_index(probs: Sequence[float], u: float) -> int:
    """Inverse-CDF draw: the first token (in id order) whose cumulative probability exceeds
    ``u``; the last token of positive probability if rounding leaves the sum short."""
    cum = 0.0
    last = 0
    for i, p in enumerate(probs):
        if p > 0.0:
            cum += p
            last = i
            if cum > u:
                return i
    return last


def _sampled_walk(
    parents: Sequence[int],
    tokens: Sequence[int],
    logits_rows: Any,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int,
    request: int,
    rule: str,
    draft_rows: Any,
    without_replacement: bool,
    posterior_threshold: float,
    posterior_alpha: float,
) -> tuple[list[int], list[int]]:
    kids = _children(parents)

    def probs(v: int) -> list[float]:
        try:
            return processed_probs(logits_rows[v], temperature, top_k, top_p)
        except ValueError as e:
            raise ValueError(f"logits row {v}: {e}") from None

    def sample(v: int) -> int:
        return sample_index(probs(v), rng_uniform(seed, request, v, 0))

    if temperature == 0.0:
        return verify_logits(parents, tokens, logits_rows)
    if rule == "match":
        return _walk(parents, tokens, sample)
    if rule == "rejection":
        accepted = [0]
        emitted: list[int] = []
        v = 0
        while True:
            if not kids[v]:
                emitted.append(sample(v))
                return accepted, emitted
            p = probs(v)
            q_raw = [float(x) for x in draft_rows[v]]
            q = [x / sum(q_raw) for x in q_raw]
            nxt = -1
            for j, c in enumerate(kids[v]):
                x = tokens[c]
                if rng_uniform(seed, request, v, j + 1) < p[x] / q[x]:
                    nxt = c
                    break
                res = [max(a - b, 0.0) for a, b in zip(p, q, strict=True)]
                mass = sum(res)
                if mass > 0.0:
                    p = [r / mass for r in res]
                if without_replacement:
                    q[x] = 0.0
                    qm = sum(q)
                    if qm > 0.0:
                        q = [y / qm for y in q]
            if nxt < 0:
                emitted.append(sample_index(p, rng_uniform(seed, request, v, 0)))
                return accepted, emitted
            emitted.append(tokens[nxt])
            accepted.append(nxt)
            v = nxt
    if rule == "typical":
        # Deepest path over accepted edges; DFS in index order, first deepest wins.
        best = [0]
        bonus: dict[int, int] = {}

        def dfs(v: int, path: list[int]) -> None:
            nonlocal best
            p = probs(v)
            bonus[v] = sample_index(p, rng_uniform(seed, request, v, 0))
            if len(path) > len(best):
                best = list(path)
            entropy = -sum(x * math.log(x + 1e-5) for x in p if x > 0.0)
            cut = min(posterior_threshold, posterior_alpha * math.exp(-entropy))
            for c in kids[v]:
                if 0 <= tokens[c] < len(p) and p[tokens[c]] > cut:
                    dfs(c, [*path, c])

        dfs(0, [0])
        return best, [tokens[c] for c in best[1:]] + [bonus[best[-1]]]
    raise ValueError(f"unknown rule {rule!r}")


def verify_sampled(
    parents: Sequence[int],
    tokens: Sequence[int],
    logits_rows: Any,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    *,
    request: int = 0,
    rule: str = "match",
    draft_rows: Any = None,
    without_replacement: bool = False,
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
) -> tuple[list[int], list[int]]:
    """Sampled verification of one tree (DESIGN §4): ``(accepted_nodes, tokens)``.

    Node v of request ``request`` draws ``rng_uniform(seed, request, v, d)``: ``d = 0`` for the
    target's sample at v (the bonus), ``d = j`` for the coin of v's j-th child (1-based).
    Temperature 0 is the greedy walk under every rule.

    - ``"match"`` (deterministic drafts): y = a sample of the processed target at v; the first
      child with token y is accepted, else y is the bonus.
    - ``"rejection"`` (children drawn from ``q = draft_rows[v]``): for each child x in index
      order accept iff ``u < p(x) / q(x)``; on rejection ``p <- norm(max(p - q, 0))`` (kept if
      that is empty) and, ``without_replacement``, ``q <- norm(q with q(x) = 0)``; the bonus after
      rejecting every child is a sample of the final p. A leaf's bonus is a sample of p.
    - ``"typical"`` (lossy, Medusa): a child x is accepted iff
      ``p(x) > min(posterior_threshold, posterior_alpha * exp(-H))``,
      ``H = -sum p ln(p + 1e-5)``; the deepest accepted path wins, ties to the lowest node
      indices; the bonus is the stop node's sample.
    """
    return _sampled_walk(
        parents,
        tokens,
        logits_rows,
        temperature,
        top_k,
        top_p,
        seed,
        request,
        rule,
        draft_rows,
        without_replacement,
        posterior_threshold,
        posterior_alpha,
    )


def batch_verify_sampled(
    parents: Sequence[int],
    tokens: Sequence[int],
    offsets: Sequence[int],
    logits_rows: Any,
    temperature: Sequence[float],
    top_k: Sequence[int],
    top_p: Sequence[float],
    seed: int | Sequence[int] = 0,
    **rule: Any,
) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """:func:`verify_sampled` per tree of a flat batch, tree b as request b with its own
    ``temperature[b]``, ``top_k[b]``, ``top_p[b]``; outputs as :func:`batch_verify_walk`.
    ``seed``: one int for the batch (tree b draws as request b), or one per request (tree b
    draws as request 0 under ``seed[b]``: its draws depend on its own seed alone)."""
    trees = _trees(offsets)
    width = max(_max_depth(parents[start:end]) for start, end in trees) + 1
    draft_rows = rule.pop("draft_rows", None)
    num_acc: list[int] = []
    acc_out: list[list[int]] = []
    tok_out: list[list[int]] = []
    for b, (start, end) in enumerate(trees):
        acc, emitted = verify_sampled(
            parents[start:end],
            tokens[start:end],
            logits_rows[start:end],
            temperature[b],
            top_k[b],
            top_p[b],
            seed if isinstance(seed, int) else seed[b],
            request=b if isinstance(seed, int) else 0,
            draft_rows=None if draft_rows is None else draft_rows[start:end],
            **rule,
        )
        num_acc.append(len(acc) - 1)
        acc_out.append(acc + [-1] * (width - len(acc)))
        tok_out.append(emitted + [-1] * (width - len(emitted)))
    return num_acc, acc_out, tok_out


# ---------------------------------------------------------------------------------------------
# Tree construction (issue 5): top-N selection, SGLang's EAGLE tree ops, Sequoia, dynamic EAGLE-2
# drafting and acceptance statistics. Written from DESIGN.md / docs/api.md and SGLang's published
# contracts, as plain loops.
# ---------------------------------------------------------------------------------------------

__all__ += [
    "DynamicTreeBuilder",
    "acceptance_counts",
    "choose_tree",
    "expected_accept_length",
    "optimal_tree",
    "optimal_tree_heap",
    "sglang_build_tree",
    "sglang_organize",
    "sglang_verify_tree_greedy",
    "top_n_tree",
]


def top_n_tree(
    parents: Sequence[int],
    scores: Sequence[float],
    budget: int,
    tokens: Sequence[int] | None = None,
    root_token: int = 0,
    cumulative: bool = True,
) -> tuple[list[int], list[int], list[int]]:
    """`(tree parents, tree tokens, pool index of each draft node)` of the best budget-1 pool
    candidates: higher cumulative log score, then shallower, then lower pool index."""
    m = len(parents)
    if budget < 1 or budget - 1 > m:
        raise ValueError(f"budget: {budget} does not fit a pool of {m}")
    if tokens is None:
        tokens = list(range(m))
    total: list[float] = []
    depth: list[int] = []
    for i in range(m):
        p = parents[i]
        s = float(scores[i])
        if not -1 <= p < i:
            raise ValueError(f"parents: parents[{i}] = {p}")
        if math.isnan(s) or s > 0:
            raise ValueError(f"scores: scores[{i}] = {s} (candidate {i})")
        if p == -1:
            total.append(s)
            depth.append(1)
        else:
            if cumulative and s > total[p]:
                raise ValueError(f"scores: scores[{i}] (candidate {i}) exceeds its parent's")
            total.append(s if cumulative else total[p] + s)
            depth.append(depth[p] + 1)
    order = sorted(range(m), key=lambda i: (-total[i], depth[i], i))
    chosen = sorted(order[: budget - 1])
    node_of = {g: n + 1 for n, g in enumerate(chosen)}
    tree_parents = [-1] + [0 if parents[g] == -1 else node_of[parents[g]] for g in chosen]
    tree_tokens = [root_token] + [tokens[g] for g in chosen]
    return tree_parents, tree_tokens, chosen


def sglang_organize(
    scores: Sequence[Sequence[float]], tokens: Sequence[Sequence[int]], num_draft_token: int
) -> tuple[list[list[int]], list[list[int]]]:
    """SGLang `organize_draft_results` on the concatenated pool: per request, the indices of the
    num_draft_token-1 highest scores (ties to the lower index), sorted, and their tokens."""
    top: list[list[int]] = []
    drafts: list[list[int]] = []
    for row_s, row_t in zip(scores, tokens, strict=True):
        if any(math.isnan(s) for s in row_s):
            raise ValueError("score_list: NaN score")
        order = sorted(range(len(row_s)), key=lambda g: (-row_s[g], g))
        chosen = sorted(order[: num_draft_token - 1])
        top.append(chosen)
        drafts.append([row_t[g] for g in chosen])
    return top, drafts


def sglang_build_tree(
    parent_list: Sequence[Sequence[int]],
    selected_index: Sequence[Sequence[int]],
    seq_lens: Sequence[int],
    topk: int,
    num_verify_tokens: int,
    mode: int,
) -> tuple[list[Any], list[int], list[list[int]], list[list[int]], list[list[int]]]:
    """SGLang `build_tree_kernel_efficient` outputs `(tree_mask, positions, retrive_index,
    retrive_next_token, retrive_next_sibling)`: node 0 is the root, node i is candidate
    selected_index[b][i-1], whose parent is candidate parent_list[b][g // topk] (the root when
    g // topk == 0). mode 0 FULL, 1 QLEN_ONLY, 2 bit-packed ints (bit j = node j)."""
    n = num_verify_tokens
    mask: list[Any] = []
    positions: list[int] = []
    r_index: list[list[int]] = []
    r_next: list[list[int]] = []
    r_sib: list[list[int]] = []
    for b, seq in enumerate(seq_lens):
        sel = list(selected_index[b])
        par = [-1]
        for i in range(1, n):
            g = sel[i - 1]
            if g // topk == 0:
                par.append(0)
                continue
            pg = parent_list[b][g // topk]
            if pg not in sel[: i - 1]:
                raise ValueError(f"invalid eagle tree: request {b}, node {i}")
            par.append(sel.index(pg) + 1)
        dep = depths(par)
        positions += [seq + d for d in dep]
        r_index.append([b * n + i for i in range(n)])
        nxt, sib = sglang_links(par)
        r_next.append(nxt)
        r_sib.append(sib)
        for i in range(n):
            anc = set(_ancestors_or_self(par, i))
            if mode == 2:
                mask.append(sum(1 << j for j in anc))
            else:
                prefix = [True] * seq if mode == 0 else []
                mask += prefix + [j in anc for j in range(n)]
    return mask, positions, r_index, r_next, r_sib


def sglang_verify_tree_greedy(
    candidates: Sequence[Sequence[int]],
    retrive_index: Sequence[Sequence[int]],
    retrive_next_token: Sequence[Sequence[int]],
    retrive_next_sibling: Sequence[Sequence[int]],
    target_predict: Sequence[int],
    num_speculative_tokens: int,
    predicts: Sequence[int],
) -> tuple[list[int], list[list[int]], list[int]]:
    """sgl-kernel `verify_tree_greedy`: `(predicts, accept_index, accept_token_num)`; predicts
    starts as the given list and is written at accepted/stop nodes (global flat index)."""
    out = list(predicts)
    accept_index: list[list[int]] = []
    accept_num: list[int] = []
    for b in range(len(candidates)):
        last = retrive_index[b][0]
        row = [last]
        cur = 0
        path = [0]  # local nodes accepted so far
        for _ in range(1, num_speculative_tokens):
            cur = retrive_next_token[b][cur]
            while cur != -1:
                if candidates[b][cur] == target_predict[last]:
                    if cur in path:  # the lists lead back to the path: not a tree
                        raise ValueError(f"retrive_next_token: request {b}: node {cur} again")
                    path.append(cur)
                    out[last] = target_predict[last]
                    last = retrive_index[b][cur]
                    row.append(last)
                    break
                cur = retrive_next_sibling[b][cur]
            if cur == -1:
                break
        out[last] = target_predict[last]
        accept_num.append(len(row) - 1)
        accept_index.append(row + [-1] * (num_speculative_tokens - len(row)))
    return out, accept_index, accept_num


def expected_accept_length(parents: Sequence[int], accept_probs: Sequence[float]) -> float:
    """1 + sum over draft nodes of the product of accept_probs[rank] along the path (rank =
    position among siblings in node order; ranks past the vector have probability 0)."""
    kids = _children(parents)
    value = [0.0] * len(parents)
    value[0] = 1.0
    for v in range(len(parents)):
        for r, c in enumerate(kids[v]):
            value[c] = value[v] * (accept_probs[r] if r < len(accept_probs) else 0.0)
    return sum(value)


def optimal_tree(
    accept_probs: Sequence[float], budget: int, max_depth: int | None = None
) -> tuple[list[tuple[int, ...]], float]:
    """Exact best tree of at most `budget` nodes and depth <= max_depth, top-down with memo:
    best(m, l) = 1 + max over b children of the best split of m-1 nodes among ranks 0..b-1."""
    import functools

    if max_depth is not None and max_depth < 1:
        raise ValueError("max_depth: must be >= 1")
    depth = max(1, budget - 1 if max_depth is None else min(max_depth, budget - 1))
    p = list(accept_probs)

    @functools.cache
    def best(m: int, level: int) -> tuple[float, tuple[tuple[int, ...], ...]]:
        # value and shape (a tuple of child subtree sizes, recursively as choice suffixes)
        if m <= 1 or level == 0:
            return (1.0, ())
        top: tuple[float, tuple[tuple[int, ...], ...]] = (1.0, ())
        for b in range(1, min(len(p), m - 1) + 1):
            val, paths = split(m - 1, b, level)
            if val + 1.0 > top[0]:
                top = (1.0 + val, paths)
        return top

    @functools.cache
    def split(m: int, b: int, level: int) -> tuple[float, tuple[tuple[int, ...], ...]]:
        # ranks 0..b-1 each get >= 1 of at most m nodes
        if b == 0:
            return (0.0, ())
        top: tuple[float, tuple[tuple[int, ...], ...]] = (-1.0, ())
        for y in range(1, m - (b - 1) + 1):
            rest_v, rest_paths = split(m - y, b - 1, level)
            sub_v, sub_paths = best(y, level - 1)
            v = rest_v + p[b - 1] * sub_v
            if v > top[0]:
                mine = ((b - 1,), *((b - 1, *s) for s in sub_paths))
                top = (v, rest_paths + mine)
        return top

    value, paths = best(budget, depth)
    return sorted(paths, key=lambda c: (len(c), c)), value


def optimal_tree_heap(
    accept_probs: Sequence[float], budget: int, max_depth: int | None = None
) -> tuple[list[tuple[int, ...]], float]:
    """Greedy best-first growth for a non-increasing vector: repeatedly add the most valuable
    node whose parent and previous sibling are already in the tree."""
    if max_depth is not None and max_depth < 1:
        raise ValueError("max_depth: must be >= 1")
    depth = budget - 1 if max_depth is None else max_depth
    p = list(accept_probs)
    chosen: dict[tuple[int, ...], float] = {(): 1.0}
    while len(chosen) < budget:
        best: tuple[float, tuple[int, ...]] | None = None
        for path, val in chosen.items():
            options = []
            if len(path) < depth:
                options.append((val * p[0], (*path, 0)))
            if path and path[-1] + 1 < len(p):
                options.append((chosen[path[:-1]] * p[path[-1] + 1], (*path[:-1], path[-1] + 1)))
            for v, c in options:
                if c not in chosen and v > 0 and (best is None or v > best[0]):
                    best = (v, c)
        if best is None:
            break
        chosen[best[1]] = best[0]
    paths = [c for c in chosen if c]
    return sorted(paths, key=lambda c: (len(c), c)), sum(chosen.values())


def choose_tree(
    accept_probs: Sequence[float],
    t_draft: float,
    t_verify: dict[int, float],
    max_depth: int,
) -> tuple[int, int, float, float]:
    """`(budget, depth, expected_length, time_per_token)` minimizing
    (depth * t_draft + t_verify[budget]) / expected_length; budget 1 drafts nothing (depth 0);
    ties (within a relative 1e-12) to the smaller budget, then the shallower depth."""
    if max_depth < 1:
        raise ValueError("max_depth: must be >= 1")
    best: tuple[float, int, int, float] | None = None
    for n in sorted(t_verify):
        depths_ = [0] if n == 1 else range(1, min(max_depth, n - 1) + 1)
        for d in depths_:
            e = 1.0 if n == 1 else optimal_tree(accept_probs, n, d)[1]
            cost = (d * t_draft + t_verify[n]) / e
            # Costs within a relative 1e-12 tie (equal trees' sums can differ in the last bit).
            if best is None or cost < best[0] - 1e-12 * abs(best[0]):
                best = (cost, n, d, e)
    assert best is not None
    return best[1], best[2], best[3], best[0]


class DynamicTreeBuilder:
    """EAGLE-2 drafting for a batch, as nested lists: pool per request, frontier of K."""

    def __init__(self, batch: int, topk: int, depth: int, budget: int) -> None:
        if batch < 1 or topk < 1 or depth < 1:
            raise ValueError("batch, topk and depth must be >= 1")
        if budget < 1 or budget - 1 > topk + (depth - 1) * topk * topk:
            raise ValueError("budget: does not fit the pool")
        self.batch, self.topk, self.depth, self.budget = batch, topk, depth, budget
        self.level = 0

    def _step(self, parent_index: list[list[int]]) -> tuple[Any, Any, Any, Any]:
        k = self.topk
        tokens = [[self.tokens[b][g] for g in self.frontier[b]] for b in range(self.batch)]
        masks = []
        for b in range(self.batch):
            rows = []
            for g in self.frontier[b]:
                anc = set()
                while g != -1:
                    anc.add(g)
                    g = self.parents[b][g]
                rows.append([f in anc for f in self.fed[b]])
            masks.append(rows)
        pos = [[self.prefix[b] + self.level] * k for b in range(self.batch)]
        return tokens, parent_index, masks, pos

    def start(
        self,
        root_tokens: Sequence[int],
        topk_tokens: Sequence[Sequence[int]],
        topk_logprobs: Sequence[Sequence[float]],
        prefix_lens: Sequence[int] | None = None,
        active: Sequence[bool] | None = None,
    ) -> tuple[Any, Any, Any, Any]:
        """`active`: the requests still running (None = all); the others are drafted alike
        but build to their root alone and never keep the builder from settling."""
        k = self.topk
        for row in topk_logprobs:
            if any(math.isnan(x) or x > 0 for x in row):
                raise ValueError("topk_logprobs: must be <= 0 and not NaN")
        if active is not None and len(active) != self.batch:
            raise ValueError("active: one flag per request")
        self.root = list(root_tokens)
        self.prefix = list(prefix_lens) if prefix_lens is not None else [0] * self.batch
        self.active = [bool(a) for a in active] if active is not None else [True] * self.batch
        self.scores = [list(map(float, row)) for row in topk_logprobs]
        self.tokens = [list(row) for row in topk_tokens]
        self.parents = [[-1] * k for _ in range(self.batch)]
        self.frontier = [list(range(k)) for _ in range(self.batch)]
        self.fed = [list(range(k)) for _ in range(self.batch)]
        self.level = 1
        return self._step([[0] * k for _ in range(self.batch)])

    def expand(
        self, topk_tokens: Sequence[Any], topk_logprobs: Sequence[Any]
    ) -> tuple[Any, Any, Any, Any]:
        if self.level == 0 or self.level >= self.depth:
            raise ValueError("expand: not started or already at full depth")
        k = self.topk
        parent_index = []
        for b in range(self.batch):
            base = len(self.scores[b])
            for j, f in enumerate(self.frontier[b]):
                for c in range(k):
                    lp = float(topk_logprobs[b][j][c])
                    if math.isnan(lp) or lp > 0:
                        raise ValueError("topk_logprobs: must be <= 0 and not NaN")
                    self.scores[b].append(self.scores[b][f] + lp)
                    self.tokens[b].append(topk_tokens[b][j][c])
                    self.parents[b].append(f)
            new = sorted(range(base, base + k * k), key=lambda g: (-self.scores[b][g], g))[:k]
            parent_index.append([(g - base) // k for g in new])
            self.frontier[b] = new
            self.fed[b] += new
        self.level += 1
        return self._step(parent_index)

    @property
    def settled(self) -> bool:
        """No further level can change `build`: every running request has drafted
        `budget - 1` frontier nodes (all levels) and its best current frontier node scores at
        most the `(budget - 1)`-th best of them (later candidates descend from the frontier,
        score no more, and lose ties by pool index; frontier nodes are candidates)."""
        if self.level == 0:
            return False
        need = self.budget - 1
        for b in range(self.batch):
            if not self.active[b]:
                continue
            fed = sorted(self.scores[b][g] for g in self.fed[b])
            if len(fed) < need:
                return False
            if need and max(self.scores[b][g] for g in self.frontier[b]) > fed[-need]:
                return False
        return True

    def build(self, order: str = "pool") -> tuple[list[int], list[int], list[list[int]]]:
        """`(flat tree-local parents, flat tokens, pool_index [B][budget-1])`, each tree's
        nodes by pool index or (`order="depth_first"`) in depth-first preorder; a request not
        running is its root alone, its pool row all -1."""
        parents: list[int] = []
        tokens: list[int] = []
        pool: list[list[int]] = []
        for b in range(self.batch):
            if not self.active[b]:
                parents.append(-1)
                tokens.append(self.root[b])
                pool.append([-1] * (self.budget - 1))
                continue
            p, t, idx = top_n_tree(
                self.parents[b],
                self.scores[b],
                self.budget,
                self.tokens[b],
                self.root[b],
            )
            if order == "depth_first":
                p, t, idx = renumber_depth_first(p, t, idx)
            parents += p
            tokens += t
            pool.append(idx)
        return parents, tokens, pool


def depth_first_order(parents: Sequence[int]) -> list[int]:
    """The nodes in depth-first preorder, children in increasing index."""
    kids = _children(parents)
    order: list[int] = []
    stack = [0] if parents else []
    while stack:
        v = stack.pop()
        order.append(v)
        stack.extend(reversed(kids[v]))  # the lowest-index child is visited first
    return order


def renumber_depth_first(
    parents: Sequence[int], tokens: Sequence[int], pool_index: Sequence[int]
) -> tuple[list[int], list[int], list[int]]:
    """A tree (and its draft nodes' pool indices) renumbered in depth-first preorder."""
    order = depth_first_order(parents)
    new_of = {old: new for new, old in enumerate(order)}
    new_parents = [-1] + [new_of[parents[old]] for old in order[1:]]
    return new_parents, [tokens[old] for old in order], [pool_index[old - 1] for old in order[1:]]


def acceptance_counts(
    observations: Sequence[tuple[Sequence[int], Sequence[int]]],
) -> tuple[list[list[int]], list[list[int]]]:
    """`(trials, hits)` `[depth - 1][rank]` from (tree parents, accepted path) pairs: every child
    of a node on the accepted path is a trial for (child depth, sibling rank); the accepted child
    is a hit."""
    trials: dict[tuple[int, int], int] = {}
    hits: dict[tuple[int, int], int] = {}
    for parents, path in observations:
        dep = depths(parents)
        kids = _children(parents)
        for j, v in enumerate(path):
            nxt = path[j + 1] if j + 1 < len(path) else None
            for r, c in enumerate(kids[v]):
                key = (dep[v], r)
                trials[key] = trials.get(key, 0) + 1
                if c == nxt:
                    hits[key] = hits.get(key, 0) + 1
    if not trials:
        return [], []
    nd = max(d for d, _ in trials) + 1
    nr = max(r for _, r in trials) + 1
    t = [[trials.get((d, r), 0) for r in range(nr)] for d in range(nd)]
    h = [[hits.get((d, r), 0) for r in range(nr)] for d in range(nd)]
    return t, h


# --- Model-free drafters (issue 7): n-gram prompt lookup and the suffix drafter ------------------


def ngram_propose(
    context: Sequence[int], min_n: int, max_n: int, k: int, max_model_len: int = 1 << 40
) -> list[int]:
    """vLLM's n-gram proposal, by its definition: every earlier start ``s`` gets ``l(s)``, the
    largest ``l <= min(max_n, L-1-s)`` with ``context[s:s+l] == context[L-l:]``; the best start
    maximizes ``l(s)`` (ties to the earliest); if ``l >= min_n`` propose the (at most
    ``min(k, max_model_len - L)``) tokens that followed it."""
    total = len(context)
    if total < min_n or total >= max_model_len:
        return []
    best, best_s = 0, 0
    for s in range(total - 1):
        length = 0
        for cand in range(min(max_n, total - 1 - s), 0, -1):
            if list(context[s : s + cand]) == list(context[total - cand :]):
                length = cand
                break
        if length > best:
            best, best_s = length, s
    if best < min_n:
        return []
    start = best_s + best
    return list(context[start : min(start + min(k, max_model_len - total), total)])


def _next_token_counts(seqs: Sequence[Sequence[int]], w: Sequence[int]) -> dict[int, int]:
    """``{x: count(w + x)}`` over every occurrence of ``w`` in ``seqs``."""
    n = len(w)
    w = list(w)
    out: dict[int, int] = {}
    for s in seqs:
        for i in range(len(s) - n):
            if list(s[i : i + n]) == w:
                x = s[i + n]
                out[x] = out.get(x, 0) + 1
    return out


def suffix_propose(
    seqs: Sequence[Sequence[int]],
    context: Sequence[int],
    budget: int,
    min_prob: float,
    max_spec_factor: float,
    max_depth: int,
    chain: bool = False,
) -> tuple[list[int], list[int], list[float], float, int]:
    """One index's proposal for ``context``, from the semantics in docs/api.md: a proposal
    grown from every context suffix (length ``1..=max_depth - 1``) that occurs with a
    continuation, and the one with the highest score kept, ties to the longer match.
    Returns ``(parents, tokens, probs, score, match_len)``; the root alone, ``match_len`` 0,
    without a match."""
    best = [-1], [context[-1]], [1.0], 0.0, 0
    for length in range(1, min(len(context), max_depth - 1) + 1):
        if not _next_token_counts(seqs, context[len(context) - length :]):
            continue
        grown = _suffix_grow(
            seqs, context, length, budget, min_prob, max_spec_factor, max_depth, chain
        )
        if best[4] == 0 or grown[3] >= best[3]:
            best = grown
    return best


def _suffix_grow(
    seqs: Sequence[Sequence[int]],
    context: Sequence[int],
    match: int,
    budget: int,
    min_prob: float,
    max_spec_factor: float,
    max_depth: int,
    chain: bool,
) -> tuple[list[int], list[int], list[float], float, int]:
    """The proposal from the context's suffix of length ``match``: best-first growth by
    ``count(path) / C``, ``C`` the number of occurrences of the match followed by a token
    (ties to the earliest discovered; children discovered by count descending, token
    ascending), pruning below ``min_prob`` and at depth ``max_depth``, at most
    ``min(budget, floor(max_spec_factor * match))`` drafts."""
    parents, tokens, probs, score = [-1], [context[-1]], [1.0], 0.0
    limit = min(budget, math.floor(max_spec_factor * match))
    base = list(context[len(context) - match :])
    c0 = sum(_next_token_counts(seqs, base).values())
    heap: list[tuple[int, int, list[int], int, int]] = []
    order = 0

    def push(path: list[int], parent: int) -> None:
        nonlocal order
        if len(path) >= max_depth:
            return
        kids = sorted(_next_token_counts(seqs, path).items(), key=lambda kv: (-kv[1], kv[0]))
        for tok, cnt in kids:
            if cnt / c0 >= min_prob:
                heapq.heappush(heap, (-cnt, order, [*path, tok], parent, tok))
                order += 1
                if chain:
                    break

    if limit > 0:
        push(base, 0)
    while len(parents) <= limit and heap:
        neg, _, path, parent, tok = heapq.heappop(heap)
        idx = len(parents)
        prob = -neg / c0
        parents.append(parent)
        tokens.append(tok)
        probs.append(prob)
        score += prob
        if len(parents) <= limit:
            push(path, idx)
    return parents, tokens, probs, score, match


class ReferenceSuffixDrafter:
    """Plain-Python twin of ``ss.SuffixDrafter``: it stores the token lists and counts every
    occurrence by brute force on each proposal. Responses (tokens after the prompt) enter the
    global cache on ``finish_request``; the oldest are evicted while it holds more than
    ``max_global_tokens`` tokens, and a response longer than that alone is not cached."""

    def __init__(self, max_depth: int = 64, max_global_tokens: int = 1 << 22) -> None:
        self.max_depth = max_depth
        self.max_global_tokens = max_global_tokens
        self.requests: dict[int, tuple[list[int], int]] = {}
        self.responses: dict[int, list[int]] = {}  # insertion order = FIFO order

    def start_request(self, request_id: int, prompt: Sequence[int]) -> None:
        self.requests[request_id] = (list(prompt), len(prompt))

    def append(self, request_id: int, tokens: Sequence[int]) -> None:
        self.requests[request_id][0].extend(tokens)

    def finish_request(self, request_id: int, cache: bool = True) -> None:
        toks, plen = self.requests.pop(request_id)
        response = toks[plen:]
        if cache and response and self.max_global_tokens > 0:
            self.responses.pop(request_id, None)  # replaced, whether or not the new one fits
            if len(response) > self.max_global_tokens:
                return  # alone over the budget: never cached, the others stay
            self.responses[request_id] = response
            while sum(map(len, self.responses.values())) > self.max_global_tokens:
                del self.responses[next(iter(self.responses))]

    def remove_response(self, request_id: int) -> None:
        del self.responses[request_id]

    def propose(
        self,
        request_id: int,
        budget: int,
        min_prob: float = 0.1,
        max_spec_factor: float = 1.0,
        chain: bool = False,
        use_global: bool = True,
    ) -> tuple[list[int], list[int], list[float], float, int]:
        ctx = self.requests[request_id][0]
        args = (budget, min_prob, max_spec_factor, self.max_depth, chain)
        own = suffix_propose([ctx], ctx, *args)
        if not use_global or not self.responses:
            return own
        glob = suffix_propose(list(self.responses.values()), ctx, *args)
        return glob if glob[3] > own[3] else own
