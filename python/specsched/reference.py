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
    "batch_verify_walk",
    "chain_parents",
    "commit_slots",
    "compact_kv",
    "depths",
    "from_choices",
    "kv_compaction_plan",
    "num_leaves",
    "packed_mask",
    "packed_ragged_mask",
    "padded_mask",
    "paths",
    "positions",
    "qlen_mask",
    "ragged_bias",
    "ragged_mask",
    "sglang_links",
    "sglang_outputs",
    "validate_batch",
    "validate_offsets",
    "validate_tree",
    "verify_logits",
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


def chain_parents(n: int) -> list[int]:
    """Parents of a chain of ``n`` nodes: node i's parent is i - 1."""
    if n < 1:
        raise ValueError(f"n must be >= 1 (a tree has at least its root), got {n}")
    return [-1, *range(n - 1)]


def from_choices(
    choices: Sequence[Sequence[int]], tokens: Sequence[int] | None = None
) -> tuple[list[int], list[int]]:
    """Build ``(parents, tokens)`` from Medusa/EAGLE-1/vLLM/TRT-LLM choice paths.

    Nodes: root first, then ``sorted(choices, key=lambda c: (len(c), c))``. ``tokens[0]`` is the
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

    order = sorted(range(len(norm)), key=lambda j: (len(norm[j]), norm[j]))
    node_of: dict[tuple[int, ...], int] = {}
    parents = [-1]
    out_tokens = [0 if tokens is None else operator.index(tokens[0])]
    for node, j in enumerate(order, start=1):
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
    tokens[c] == y and repeat from c; else stop with bonus y. ``choice`` is called only on the
    nodes the walk visits."""
    kids = _children(parents)
    v = 0
    accepted = [0]
    emitted: list[int] = []
    while True:
        y = choice(v)
        emitted.append(y)
        nxt = -1
        for c in kids[v]:
            if tokens[c] == y:
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
    accepted_nodes_padded: Sequence[Sequence[int]], prefix_lens: int | Sequence[int]
) -> tuple[list[int], list[int], list[int]]:
    """``(req, src, dst)``: :func:`kv_compaction_plan` of every request, request-major."""
    pls = _prefix_list(prefix_lens, len(accepted_nodes_padded))
    req: list[int] = []
    src: list[int] = []
    dst: list[int] = []
    for b, (acc, pl) in enumerate(zip(accepted_nodes_padded, pls, strict=True)):
        s, d = kv_compaction_plan(acc, pl)
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
    """One index's proposal for ``context``, from the semantics in docs/api.md: the longest
    context suffix (length <= min(max_depth - 1, max(1, max_depth - budget))) occurring with a
    continuation, then best-first growth by ``count(path) / C``, ``C`` the number of
    occurrences of the match followed by a token (ties to the earliest discovered; children
    discovered by count descending, token ascending), pruning below ``min_prob`` and at depth
    ``max_depth``, at most ``min(budget, floor(max_spec_factor * match_len))`` drafts.
    Returns ``(parents, tokens, probs, score, match_len)``."""
    n = len(context)
    root = context[-1]
    match = 0
    max_match = min(max_depth - 1, max(1, max_depth - budget))
    for m in range(min(n, max_match), 0, -1):
        if _next_token_counts(seqs, context[n - m :]):
            match = m
            break
    parents, tokens, probs, score = [-1], [root], [1.0], 0.0
    if match == 0:
        return parents, tokens, probs, score, 0
    limit = min(budget, math.floor(max_spec_factor * match))
    base = list(context[n - match :])
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
    ``max_global_tokens`` tokens."""

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
            self.responses.pop(request_id, None)
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
