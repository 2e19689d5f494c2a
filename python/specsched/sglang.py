"""Drop-in replacements for SGLang's EAGLE tree ops, on numpy arrays and torch CPU tensors.

Same names, arguments and outputs as SGLang's `organize_draft_results`,
`build_tree_kernel_efficient` (python/sglang/srt/speculative/eagle_utils.py, over sgl-kernel's
`build_tree_efficient`) and sgl-kernel's `verify_tree_greedy` (in place, returns None), so a
serving loop that swaps them in gets identical outputs. The work is one Rust call each; this
module only concatenates SGLang's per-step lists, allocates outputs like SGLang does and maps
torch CPU tensors to numpy views of the same memory (and back). Differences on bad input only:
where the CUDA kernels print "invalid eagle tree" and skip the node (or read out of bounds),
these raise ValueError / IndexError naming the request and node.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from enum import IntEnum
from typing import Any, NamedTuple

import numpy as np

from specsched import _core, _torch
from specsched._args import int_arg

__all__ = [
    "TreeMaskMode",
    "build_tree_kernel_efficient",
    "organize_draft_results",
    "verify_tree_greedy",
]


class TreeMaskMode(IntEnum):
    """SGLang's tree mask layouts."""

    FULL_MASK = 0
    QLEN_ONLY = 1
    QLEN_ONLY_BITPACKING = 2


_PACKED_DTYPES = (np.uint8, np.uint16, np.uint32)


def _is_torch(x: object) -> bool:
    if type(x) is np.ndarray:
        return False
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _host(x: Any, arg: str) -> np.ndarray:
    """`x` as a numpy array; a torch CPU tensor becomes a view of the same memory."""
    if type(x) is np.ndarray:
        return x
    if _is_torch(x):
        if x.device.type != "cpu":
            raise TypeError(
                f"{arg}: specsched.sglang runs on the host; got a tensor on {x.device} "
                "(pass CPU tensors or numpy arrays)"
            )
        if x.is_neg():
            raise TypeError(
                f"{arg}: a lazily negated view (negative bit set) has no memory of its "
                f"values; pass {arg}.resolve_neg()"
            )
        try:
            return _torch.numpy_of(x.detach())
        except TypeError:  # bfloat16 and other dtypes numpy has no type for
            raise TypeError(f"{arg}: dtype {x.dtype} has no numpy equivalent") from None
    return np.asarray(x)


def _token_ids(x: np.ndarray, arg: str) -> np.ndarray:
    """`x` checked to hold token ids: integers (a bool, a float or text would be cast into
    the returned tokens), none past int64 (where promotion with int64 would go to float)."""
    if x.size == 0:
        return x
    if x.dtype.kind not in "iu":
        raise TypeError(f"{arg}: expected integer token ids, got dtype {x.dtype}")
    if x.dtype == np.uint64 and int(x.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{arg}: token id {int(x.max())} does not fit in int64")
    return x


def _count(value: Any, arg: str) -> int:
    """A count argument (`topk`, `spec_steps`, `num_draft_token`, ...) as an int >= 1."""
    return int_arg(value, arg, 1)


def _flat_rows(a: np.ndarray, bs: int) -> np.ndarray:
    """`a` `[bs, ...]` as `[bs, rest]` (numpy cannot infer `rest` of an empty batch)."""
    return a.reshape(bs, math.prod(a.shape[1:]))


def _rows(arrays: list[np.ndarray], arg: str, bs: int) -> None:
    """Each draft step's array has the batch's `bs` rows (SGLang's torch.cat needs them)."""
    for i, a in enumerate(arrays):
        if a.ndim == 0 or a.shape[0] != bs:
            raise ValueError(
                f"{arg}[{i}]: expected {bs} rows (the batch of score_list[0]), got shape {a.shape}"
            )


def _back(x: np.ndarray, like_torch: bool) -> Any:
    if like_torch:
        import torch

        return torch.from_numpy(x)
    return x


def organize_draft_results(
    score_list: Sequence[Any],
    token_list: Sequence[Any],
    parents_list: Sequence[Any],
    num_draft_token: int,
) -> tuple[Any, Any, Any]:
    """`(parent_list, top_scores_index, draft_tokens)` as SGLang computes them.

    `score_list[i]` is `[bs, 1, K]` (step 0) or `[bs, K, K]`, `token_list[i]` `[bs, K]` or
    `[bs, K*K]`, `parents_list[i]` `[bs, K+1]` or `[bs, K]`. The best `num_draft_token - 1`
    candidates by score (ties to the lower pool index, i.e. the shallower), sorted by pool
    index; NaN scores are a ValueError naming the request and candidate.
    """
    if len(score_list) == 0 or not len(token_list) == len(parents_list) == len(score_list):
        raise ValueError(
            "score_list / token_list / parents_list: expected the same non-zero number of "
            f"draft steps, got {len(score_list)}, {len(token_list)} and {len(parents_list)}"
        )
    torch_in = _is_torch(score_list[0])
    n = _count(num_draft_token, "num_draft_token")
    scores = [_host(s, f"score_list[{i}]") for i, s in enumerate(score_list)]
    for i, s in enumerate(scores):
        if s.size and s.dtype.kind not in "iuf":
            raise TypeError(f"score_list[{i}]: expected scores (numbers), got dtype {s.dtype}")
    tokens = [
        _token_ids(_host(t, f"token_list[{i}]"), f"token_list[{i}]")
        for i, t in enumerate(token_list)
    ]
    if scores[0].ndim == 0:
        raise ValueError("score_list[0]: expected a [bs, ...] array, got a scalar")
    bs = scores[0].shape[0]
    _rows(scores, "score_list", bs)
    _rows(tokens, "token_list", bs)
    score = np.concatenate([_flat_rows(s, bs) for s in scores], axis=1)
    token = np.concatenate([_flat_rows(t, bs) for t in tokens], axis=1)
    top_index, draft = _core.sglang_organize(score, token, n)
    draft = draft.astype(token.dtype, copy=False)
    if len(parents_list) > 1:
        parents = [_host(p, f"parents_list[{i}]") for i, p in enumerate(parents_list[:-1])]
        _rows(parents, "parents_list", bs)
        for i, p in enumerate(parents):
            # Indices: a float one was truncated (NaN became int64's minimum). An empty one
            # of any dtype is nothing to read.
            if p.size and p.dtype.kind not in "iu":
                raise TypeError(f"parents_list[{i}]: expected an integer array, got {p.dtype}")
        parent_list = np.concatenate([_flat_rows(p, bs) for p in parents], axis=1).astype(
            np.int64, copy=False
        )
    else:
        parent_list = np.empty((bs, 0), dtype=np.int64)
    return (
        _back(parent_list, torch_in),
        _back(top_index, torch_in),
        _back(draft, torch_in),
    )


class _MaskOut(NamedTuple):
    kernel: np.ndarray  # the first `needed` entries: what the kernel writes
    whole: np.ndarray | None  # the caller's buffer, if one was given
    tail: np.ndarray | None  # the caller's entries past `needed`, filled after the kernel
    fill: Any  # what SGLang leaves in the tail (True, or 0 for bit-packed)


def _mask_out(mode: int, needed: int, n: int, buf: Any) -> _MaskOut:
    """The mask the kernel writes: a new array, or the first `needed` entries of the caller's
    `tree_mask_buf`, whose rest is filled as SGLang fills it once the kernel has run."""
    dtype: type[np.generic]
    if buf is None and mode != TreeMaskMode.QLEN_ONLY_BITPACKING:
        return _MaskOut(np.empty(needed, dtype=np.bool_), None, None, None)
    if mode == TreeMaskMode.QLEN_ONLY_BITPACKING:
        try:
            dtype = _PACKED_DTYPES[int(np.ceil(np.log2((n + 7) // 8)))]
        except IndexError:
            raise ValueError(
                f"num_verify_tokens: {n} draft tokens do not fit a bit-packed mask row (at most 32)"
            ) from None
        fill: Any = 0
    else:
        dtype, fill = np.bool_, True
    if buf is None:
        return _MaskOut(np.empty(needed, dtype=dtype), None, None, None)
    whole = _host(buf, "tree_mask_buf")
    if whole.dtype != dtype:
        raise TypeError(
            f"tree_mask_buf: expected dtype {np.dtype(dtype).name} for mode {mode} and "
            f"{n} draft tokens, got {whole.dtype}"
        )
    if not whole.flags.c_contiguous:
        raise ValueError("tree_mask_buf: must be contiguous (it is filled in place)")
    if whole.size == needed:
        # The kernel takes any contiguous shape: no flattened view to build.
        return _MaskOut(whole, whole, None, None)
    flat = whole.reshape(-1)
    if flat.size < needed:
        raise ValueError(f"tree_mask_buf: needs at least {needed} entries, has {flat.size}")
    return _MaskOut(flat[:needed], whole, flat[needed:], fill)


def _check_tail_disjoint(tail: np.ndarray, args: dict[str, np.ndarray]) -> None:
    """The binding refuses arguments that may share memory with the kernel's part of
    `tree_mask_buf`; the rest of the buffer, which the wrapper fills, must not hold any
    either (address ranges, as `numpy.may_share_memory` compares them)."""
    for name, x in args.items():
        if np.may_share_memory(tail, x):
            raise ValueError(
                f"tree_mask_buf and {name}: may share memory (tree_mask_buf is written in place)"
            )


def build_tree_kernel_efficient(
    verified_id: Any,
    parent_list: Any,
    top_scores_index: Any,
    draft_tokens: Any,
    seq_lens: Any,
    seq_lens_sum: int,
    topk: int,
    spec_steps: int,
    num_verify_tokens: int,
    tree_mask_mode: TreeMaskMode | int = TreeMaskMode.FULL_MASK,
    tree_mask_buf: Any = None,
    position_buf: Any = None,
) -> tuple[Any, Any, Any, Any, Any, Any]:
    """`(tree_mask, positions, retrive_index, retrive_next_token, retrive_next_sibling,
    draft_tokens)` exactly as SGLang's `build_tree_kernel_efficient` returns them.

    tree_mask: FULL_MASK bool `[sum(seq_lens)*N + bs*N*N]` (each request's `N x (seq_len+N)`
    rows), QLEN_ONLY bool `[bs*N*N]`, QLEN_ONLY_BITPACKING uint8/16/32 `[bs*N]` (bit j = node j
    is self or ancestor). positions int64 `[bs*N]` = seq_len + depth; retrive_* int64
    `[bs, N]`; draft_tokens `[bs*N]` = verified_id then the selected tokens, per request.
    """
    torch_in = _is_torch(seq_lens)
    mode = int_arg(tree_mask_mode, "tree_mask_mode", 0)
    if mode not in (0, 1, 2):
        raise ValueError(
            f"tree_mask_mode: expected 0 (FULL_MASK), 1 (QLEN_ONLY) or 2 "
            f"(QLEN_ONLY_BITPACKING), got {tree_mask_mode!r}"
        )
    n = _count(num_verify_tokens, "num_verify_tokens")
    topk, spec_steps = _count(topk, "topk"), _count(spec_steps, "spec_steps")
    seq = _host(seq_lens, "seq_lens")
    if seq.ndim != 1:
        raise ValueError(f"seq_lens: expected a 1-D array [bs], got shape {seq.shape}")
    vid = _token_ids(_host(verified_id, "verified_id"), "verified_id")
    drafts = _token_ids(_host(draft_tokens, "draft_tokens"), "draft_tokens")
    bs, total_seq = seq.shape[0], int_arg(seq_lens_sum, "seq_lens_sum", 0)
    if vid.shape != (bs,) or drafts.shape != (bs, n - 1):
        raise ValueError(
            f"verified_id / draft_tokens: expected shapes ({bs},) and ({bs}, {n - 1}), "
            f"got {vid.shape} and {drafts.shape}"
        )
    # SGLang sizes the FULL mask from seq_lens_sum; from the lengths themselves here, which
    # are the same when the call is valid, so a wrong seq_lens_sum is Rust's ValueError (it
    # checks one against the other) rather than a huge allocation first.
    if mode == TreeMaskMode.FULL_MASK:
        # Checked here, before the mask sized from them is allocated (Rust checks them too):
        # a float length would size it from a truncated or NaN value.
        if seq.dtype.kind not in "iu":
            raise TypeError(f"seq_lens: expected an integer array, got {seq.dtype}")
        if (seq < 0).any():
            b = int(np.argmax(seq < 0))
            raise ValueError(f"seq_lens: seq_lens[{b}] = {seq[b]}, expected >= 0")
        needed = sum(int(s) for s in seq.tolist()) * n + bs * n * n
        if needed > _core.MAX_OUTPUT_ELEMENTS:
            raise ValueError(
                f"seq_lens: the FULL mask of these lengths has {needed} entries, more than "
                f"the {_core.MAX_OUTPUT_ELEMENTS} a layout may have"
            )
    elif mode == TreeMaskMode.QLEN_ONLY:
        needed = bs * n * n
    else:
        needed = bs * n
    mask_out = _mask_out(mode, needed, n, tree_mask_buf)
    mask, mask_whole = mask_out.kernel, mask_out.whole
    if position_buf is None:
        positions_whole = None
        positions = np.empty(bs * n, dtype=np.int64)
    else:
        positions_whole = _host(position_buf, "position_buf")
        if positions_whole.dtype != np.int64:
            raise TypeError(f"position_buf: expected dtype int64, got {positions_whole.dtype}")
        if not positions_whole.flags.c_contiguous:
            raise ValueError("position_buf: must be contiguous (it is filled in place)")
        if positions_whole.size < bs * n:
            raise ValueError(
                f"position_buf: needs at least {bs * n} entries, has {positions_whole.size}"
            )
        positions = (
            positions_whole
            if positions_whole.size == bs * n
            else positions_whole.reshape(-1)[: bs * n]
        )
    # int64 tokens (SGLang's) are assembled by the binding; others keep torch.cat's promotion.
    tokens_in_rust = vid.dtype == np.int64 and drafts.dtype == np.int64
    count = 4 if tokens_in_rust else 3
    # One block for the `[bs, N]` outputs, but separate arrays for an empty batch: empty views
    # of one block share a data pointer, which the binding's borrow check refuses as aliased.
    outs = (
        np.empty((count, bs, n), dtype=np.int64)
        if bs
        else [np.empty((0, n), dtype=np.int64) for _ in range(count)]
    )
    r_index, r_next, r_sibling = outs[0], outs[1], outs[2]
    parents, selected = (
        _host(parent_list, "parent_list"),
        _host(top_scores_index, "top_scores_index"),
    )
    if mask_out.tail is not None:
        _check_tail_disjoint(
            mask_out.tail,
            {
                "parent_list": parents,
                "top_scores_index": selected,
                "seq_lens": seq,
                "verified_id": vid,
                "draft_tokens": drafts,
                "position_buf": positions,
            },
        )
    _core.sglang_build_tree(
        parents,
        selected,
        seq,
        total_seq,
        mask,
        positions,
        r_index,
        r_next,
        r_sibling,
        topk,
        spec_steps,
        n,
        int(mode),
        (vid, drafts, outs[3]) if tokens_in_rust else None,
    )
    if mask_out.tail is not None:
        mask_out.tail[...] = mask_out.fill
    tokens = outs[3] if tokens_in_rust else np.concatenate((vid[:, None], drafts), axis=1)
    if torch_in:
        return (
            tree_mask_buf if mask_whole is not None else _back(mask, True),
            position_buf if positions_whole is not None else _back(positions, True),
            _back(r_index, True),
            _back(r_next, True),
            _back(r_sibling, True),
            _back(tokens.reshape(-1), True),
        )
    return (
        mask_whole if mask_whole is not None else mask,
        positions_whole if positions_whole is not None else positions,
        r_index,
        r_next,
        r_sibling,
        tokens.reshape(-1),
    )


def verify_tree_greedy(
    predicts: Any,
    accept_index: Any,
    accept_token_num: Any,
    candidates: Any,
    retrive_index: Any,
    retrive_next_token: Any,
    retrive_next_sibling: Any,
    target_predict: Any,
) -> None:
    """sgl-kernel's `verify_tree_greedy`, in place.

    Writes `predicts` (int32 `[bs*N]`: the target's token at each accepted node and at the stop
    node, other entries untouched), `accept_index` (int32 `[bs, S+1]`: global flat indices of
    the root and the accepted nodes; entries after them untouched, as the kernel leaves them:
    SGLang allocates it filled with -1) and `accept_token_num` (int32 `[bs]`: draft
    tokens accepted). `candidates` and `retrive_*` are `[bs, N]`; `target_predict` holds the
    target's argmax per node, `[bs, N]` or `[bs*N]`.
    """
    _core.sglang_verify_tree_greedy(
        _host(predicts, "predicts"),
        _host(accept_index, "accept_index"),
        _host(accept_token_num, "accept_token_num"),
        _host(candidates, "candidates"),
        _host(retrive_index, "retrive_index"),
        _host(retrive_next_token, "retrive_next_token"),
        _host(retrive_next_sibling, "retrive_next_sibling"),
        _host(target_predict, "target_predict").reshape(-1),
    )
