"""The hostile-input matrix: every public function x every class of bad input.

Run as a script (tests/test_hostile.py does it in a subprocess, so a segfault or an abort fails
that test instead of killing pytest). Each case calls one function with one bad input and
checks that it raises the documented exception type, that the message names the argument, and
that no input was modified (compared with copies taken before the call). A second table holds
the inputs that look hostile but are valid (strided, F-ordered, read-only inputs, arrays that
require grad): they must give the same result as the plain input and stay unmodified.

Before each case the script prints `START <id>` to stderr (flushed), so a crash names the case;
at the end it prints one JSON object on stdout: `{"cases": [...], "accepted": [...]}`.
"""

from __future__ import annotations

import copy
import json
import sys
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import specsched as ss
from specsched import sglang, sim

try:
    import torch
except ImportError:  # pragma: no cover - torch is a test extra
    torch = None

Call = Callable[[], Any]
CASES: list[tuple[str, str, tuple[type[BaseException], ...], str, Call, tuple[Any, ...]]] = []
ACCEPTED: list[tuple[str, str, Call, Call, tuple[Any, ...]]] = []


def bad(
    fn: str,
    kind: str,
    exc: type[BaseException] | tuple[type[BaseException], ...],
    arg: str,
    call: Call,
    *inputs: Any,
) -> None:
    """`call()` must raise `exc` with `arg` in its message and leave `inputs` unmodified."""
    # An empty name is in every message: the case would pass any error of the type.
    assert arg, f"{fn} {kind}: name the argument the error must name"
    CASES.append((fn, kind, exc if isinstance(exc, tuple) else (exc,), arg, call, inputs))


def same(fn: str, kind: str, call: Call, plain: Call, *inputs: Any) -> None:
    """`call()` (a valid but unusual input) must equal `plain()` and leave `inputs` unmodified."""
    ACCEPTED.append((fn, kind, call, plain, inputs))


def snapshot(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return x.copy()
    if torch is not None and isinstance(x, torch.Tensor):
        return None if x.device.type == "meta" else x.detach().clone()
    return copy.deepcopy(x)


def unchanged(before: Any, after: Any) -> bool:
    if before is None:
        return True
    if isinstance(after, np.ndarray):
        return bool(np.array_equal(before, after, equal_nan=True)) and before.dtype == after.dtype
    if torch is not None and isinstance(after, torch.Tensor):
        return bool(torch.equal(before.nan_to_num(), after.detach().nan_to_num()))
    return bool(before == after)


def flat(x: Any) -> Any:
    """A result as nested plain values, for equality."""
    if isinstance(x, tuple | list):
        return [flat(v) for v in x]
    if isinstance(x, np.ndarray):
        return [str(x.dtype), list(x.shape), x.tolist()]
    if torch is not None and isinstance(x, torch.Tensor):
        return flat(x.detach().cpu().numpy())
    for attr in ("accepted_nodes", "parents"):
        if hasattr(x, attr):
            return [
                flat(getattr(x, a))
                for a in ("accepted_nodes", "tokens", "parents")
                if hasattr(x, a)
            ]
    return x


# ---------------------------------------------------------------------------------------------
# Fixtures: small valid inputs every case perturbs in one way.
# ---------------------------------------------------------------------------------------------

P = np.array([-1, 0, 0, 1], dtype=np.int32)
TOK = np.array([5, 6, 7, 8], dtype=np.int64)
TREE = ss.Tree(P, TOK)
TREE2 = ss.Tree.chain([1, 2])
BATCH = ss.TreeBatch([TREE, TREE2])
FP = np.concatenate([P, TREE2.parents])
FT = np.concatenate([TOK, TREE2.tokens])
OFFS = np.array([0, 4, 6], dtype=np.int64)
V = 10
LOGITS = np.linspace(-1, 1, 4 * V, dtype=np.float32).reshape(4, V)
BLOGITS = np.linspace(-1, 1, 6 * V, dtype=np.float32).reshape(6, V)
TARGET = np.array([6, 8, 0, 3], dtype=np.int64)
RESULT = ss.verify(TREE, target_tokens=TARGET)
BRESULT = ss.verify(BATCH, target_tokens=np.array([6, 8, 0, 3, 2, 0]))
NAN_LOGITS = LOGITS.copy()
NAN_LOGITS[0, 3] = np.nan
Q = np.full((4, V), 1.0 / V)
HUGE = 1 << 40  # a size that must be refused before anything is allocated


def tree_cases() -> None:
    fn = "Tree"
    bad(fn, "float parents", TypeError, "parents", lambda: ss.Tree(P.astype(np.float64), TOK))
    bad(fn, "bool parents", TypeError, "parents", lambda: ss.Tree(P > 0, TOK))
    bad(fn, "float tokens", TypeError, "tokens", lambda: ss.Tree(P, TOK.astype(np.float32)))
    bad(fn, "str parents", TypeError, "parents", lambda: ss.Tree(["a", "b"], [1, 2]))
    bad(fn, "2-D parents", ValueError, "parents", lambda: ss.Tree(P[None], TOK))
    bad(fn, "0-D parents", ValueError, "parents", lambda: ss.Tree(np.int32(-1), TOK[:1]))
    bad(fn, "2-D tokens", ValueError, "tokens", lambda: ss.Tree(P, TOK[None]))
    bad(fn, "short tokens", ValueError, "tokens", lambda: ss.Tree(P, TOK[:3]))
    bad(fn, "empty", ValueError, "parents", lambda: ss.Tree([], []))
    bad(fn, "root not -1", ValueError, "parents", lambda: ss.Tree([0, 0], [1, 2]))
    bad(fn, "negative parent", ValueError, "parents", lambda: ss.Tree([-1, -1], [1, 2]))
    bad(fn, "very negative", ValueError, "parents", lambda: ss.Tree([-1, -7], [1, 2]))
    bad(fn, "out of range", ValueError, "parents", lambda: ss.Tree([-1, 9], [1, 2]))
    bad(fn, "self loop", ValueError, "parents", lambda: ss.Tree([-1, 1], [1, 2]))
    bad(fn, "cycle", ValueError, "parents", lambda: ss.Tree([-1, 2, 1], [1, 2, 3]))
    bad(fn, "forward ref", ValueError, "parents", lambda: ss.Tree([-1, 2, 0], [1, 2, 3]))
    big = np.array([-1, 1 << 40], dtype=np.int64)
    bad(fn, "int64 overflow", ValueError, "parents", lambda: ss.Tree(big, [1, 2]), big)
    too_many = np.arange(-1, ss.MAX_NODES, dtype=np.int32)
    bad(fn, "> MAX_NODES", ValueError, "parents", lambda: ss.Tree(too_many, too_many), too_many)
    p, t = P.copy(), TOK.copy()
    same(fn, "same array twice", lambda: ss.Tree(p, p), lambda: ss.Tree(P.copy(), P.copy()), p)
    wide = np.stack([P, P], axis=1)[:, 0]
    same(fn, "strided parents", lambda: ss.Tree(wide, t), lambda: ss.Tree(P, TOK), wide, t)
    ro = P.copy()
    ro.flags.writeable = False
    same(fn, "read-only parents", lambda: ss.Tree(ro, t), lambda: ss.Tree(P, TOK), ro)

    fn = "Tree.chain"
    bad(fn, "float tokens", TypeError, "tokens", lambda: ss.Tree.chain([1.5, 2.5]))
    bad(fn, "2-D tokens", ValueError, "tokens", lambda: ss.Tree.chain([[1, 2]]))
    bad(fn, "empty", ValueError, "tokens", lambda: ss.Tree.chain([]))
    fn = "Tree.from_choices"
    bad(fn, "negative entry", ValueError, "choices", lambda: ss.Tree.from_choices([(0,), (-1,)]))
    bad(fn, "missing prefix", ValueError, "choices", lambda: ss.Tree.from_choices([(0, 0)]))
    bad(fn, "duplicate", ValueError, "choices", lambda: ss.Tree.from_choices([(0,), (0,)]))
    bad(fn, "empty tuple", ValueError, "choices", lambda: ss.Tree.from_choices([()]))
    bad(fn, "non-int entry", TypeError, "choices", lambda: ss.Tree.from_choices([(0.5,)]))
    bad(fn, "wrong tokens length", ValueError, "tokens", lambda: ss.Tree.from_choices([(0,)], [1]))
    bad(fn, "float tokens", TypeError, "tokens", lambda: ss.Tree.from_choices([(0,)], [1.0, 2.0]))
    bad(fn, "unknown order", ValueError, "order", lambda: ss.Tree.from_choices([(0,)], order="bfs"))

    fn = "TreeBatch.limit_depth"
    cut_batch = ss.TreeBatch([ss.Tree.chain([1, 2, 3]), ss.Tree.chain([4, 5])])
    cut_depths = np.array([1, 0], dtype=np.int64)
    bad(fn, "wrong length", ValueError, "max_depth", lambda: cut_batch.limit_depth([1, 1, 1]))
    bad(fn, "negative entry", ValueError, "max_depth", lambda: cut_batch.limit_depth([1, -1]))
    bad(fn, "negative int", ValueError, "max_depth", lambda: cut_batch.limit_depth(-3))
    bad(fn, "float array", TypeError, "max_depth", lambda: cut_batch.limit_depth(cut_depths * 0.5))
    bad(fn, "bool", TypeError, "max_depth", lambda: cut_batch.limit_depth(True))
    bad(
        fn,
        "2-D array",
        ValueError,
        "max_depth",
        lambda: cut_batch.limit_depth(cut_depths[None]),
        cut_depths,
    )
    bad(fn, "int past int64", ValueError, "max_depth", lambda: cut_batch.limit_depth(1 << 70))
    cut_strided = np.stack([cut_depths, cut_depths], axis=1).astype(np.int32)[:, 0]
    same(
        fn,
        "strided int32",
        lambda: cut_batch.limit_depth(cut_strided),
        lambda: cut_batch.limit_depth([1, 0]),
        cut_strided,
    )
    same(fn, "past every depth", lambda: cut_batch.limit_depth(1 << 40), lambda: cut_batch)
    fn = "Tree.limit_depth"
    bad(fn, "negative", ValueError, "max_depth", lambda: cut_batch[0].limit_depth(-1))
    bad(fn, "float", TypeError, "max_depth", lambda: cut_batch[0].limit_depth(1.5))
    bad(fn, "array", TypeError, "max_depth", lambda: cut_batch[0].limit_depth(cut_depths))


def layout_cases() -> None:
    n = TREE.num_nodes
    for name, call in (
        ("attention_mask", lambda **k: TREE.attention_mask(**k)),
        ("attention_bias", lambda **k: TREE.attention_bias(**k)),
        ("positions", lambda **k: TREE.positions(**k)),
    ):
        fn = f"Tree.{name}"
        bad(fn, "negative prefix_len", ValueError, "prefix_len", lambda c=call: c(prefix_len=-1))
        bad(fn, "float prefix_len", TypeError, "prefix_len", lambda c=call: c(prefix_len=1.5))
        bad(fn, "array prefix_len", TypeError, "prefix_len", lambda c=call: c(prefix_len=[1]))
    for name in ("attention_mask", "attention_bias"):
        fn = f"Tree.{name}"
        bad(
            fn,
            "absurd prefix_len",
            ValueError,
            "prefix_len",
            lambda nm=name: getattr(TREE, nm)(prefix_len=HUGE),
        )
    bad(
        "Tree.positions",
        "int64 overflow prefix_len",
        ValueError,
        "prefix_len",
        lambda: TREE.positions(prefix_len=(1 << 63) - 2),
    )
    bad(
        "Tree.attention_bias",
        "int dtype",
        TypeError,
        "dtype",
        lambda: TREE.attention_bias(dtype=np.int32),
    )
    outs: dict[str, tuple[Callable[..., Any], Any, tuple[int, ...]]] = {
        "Tree.attention_mask": (TREE.attention_mask, np.bool_, (n, n)),
        "Tree.attention_bias": (TREE.attention_bias, np.float32, (n, n)),
        "Tree.packed_mask": (TREE.packed_mask, np.uint32, (n, 1)),
        "Tree.positions": (TREE.positions, np.int64, (n,)),
        "TreeBatch.attention_mask": (BATCH.attention_mask, np.bool_, (4 * 4 + 2 * 2,)),
        "TreeBatch.positions": (BATCH.positions, np.int64, (6,)),
        "TreeBatch.qlen_mask": (ss.TreeBatch([TREE, TREE]).qlen_mask, np.bool_, (2, n, n)),
        "TreeBatch.padded_mask": (BATCH.padded_mask, np.bool_, (2, n, n)),
        "TreeBatch.packed_mask": (BATCH.packed_mask, np.uint32, (6, 1)),
    }
    for fn, (method, dtype, shape) in outs.items():
        wrong = np.float64 if dtype != np.float64 else np.int64
        o1 = np.zeros(shape, dtype=wrong)
        bad(fn, "out wrong dtype", TypeError, "out", lambda m=method, o=o1: m(out=o), o1)
        o2 = np.zeros((*shape, 1), dtype=dtype)
        bad(fn, "out wrong ndim", ValueError, "out", lambda m=method, o=o2: m(out=o), o2)
        o3 = np.zeros((shape[0] + 1, *shape[1:]), dtype=dtype)
        bad(fn, "out wrong length", ValueError, "out", lambda m=method, o=o3: m(out=o), o3)
        o4 = np.zeros(shape, dtype=dtype)
        o4.flags.writeable = False
        bad(fn, "out read-only", ValueError, "out", lambda m=method, o=o4: m(out=o), o4)
        base = np.zeros((*shape[:-1], shape[-1] * 2), dtype=dtype)
        o5 = base[..., ::2]
        bad(fn, "out strided", ValueError, "out", lambda m=method, o=o5: m(out=o), base)
        if len(shape) == 2 and shape[0] > 1 and shape[1] > 1:
            o6 = np.zeros(shape, dtype=dtype, order="F")
            bad(fn, "out F-ordered", ValueError, "out", lambda m=method, o=o6: m(out=o), o6)
        bad(fn, "out not an array", TypeError, "out", lambda m=method, k=shape[0]: m(out=[0] * k))

    fn = "TreeBatch"
    bad(fn, "empty", ValueError, "trees", lambda: ss.TreeBatch([]))
    bad(fn, "not trees", TypeError, "trees", lambda: ss.TreeBatch([1, 2]))
    fn = "TreeBatch.from_flat"
    bad(
        fn,
        "float parents",
        TypeError,
        "parents",
        lambda: ss.TreeBatch.from_flat(FP * 1.0, FT, OFFS),
    )
    bad(
        fn,
        "float offsets",
        TypeError,
        "offsets",
        lambda: ss.TreeBatch.from_flat(FP, FT, OFFS * 1.0),
    )
    bad(
        fn, "2-D offsets", ValueError, "offsets", lambda: ss.TreeBatch.from_flat(FP, FT, OFFS[None])
    )
    bad(fn, "short tokens", ValueError, "tokens", lambda: ss.TreeBatch.from_flat(FP, FT[:5], OFFS))
    for kind, offs in (
        ("offsets[0] != 0", [1, 4, 6]),
        ("empty tree", [0, 4, 4, 6]),
        ("decreasing", [0, 5, 4, 6]),
        ("last != T", [0, 4, 5]),
        ("negative", [0, -1, 6]),
        ("too long", [0, 4, 6, 9]),
        ("empty offsets", []),
        ("one entry", [0]),
    ):
        arr = np.array(offs, dtype=np.int64)
        bad(fn, kind, ValueError, "offsets", lambda a=arr: ss.TreeBatch.from_flat(FP, FT, a), arr)
    cyc = FP.copy()
    cyc[5] = 2
    bad(
        fn,
        "parent crosses trees",
        ValueError,
        "parents",
        lambda: ss.TreeBatch.from_flat(cyc, FT, OFFS),
        cyc,
    )
    fn = "TreeBatch methods"
    bad(
        fn,
        "prefix_lens wrong length",
        ValueError,
        "prefix_lens",
        lambda: BATCH.positions([1, 2, 3]),
    )
    bad(
        fn, "prefix_lens negative", ValueError, "prefix_lens", lambda: BATCH.attention_mask([0, -1])
    )
    bad(fn, "prefix_lens float", TypeError, "prefix_lens", lambda: BATCH.mask_indptr([0.5, 1.0]))
    bad(fn, "prefix_lens 2-D", ValueError, "prefix_lens", lambda: BATCH.positions([[0, 1]]))
    bad(fn, "prefix_lens absurd", ValueError, "prefix_lens", lambda: BATCH.attention_mask(HUGE))
    bad(fn, "bias absurd", ValueError, "prefix_lens", lambda: BATCH.attention_bias([HUGE, 0]))
    bad(fn, "packed absurd", ValueError, "prefix_lens", lambda: BATCH.packed_attention_mask(HUGE))
    bad(fn, "padded prefix length", ValueError, "prefix_lens", lambda: BATCH.padded_layout([1]))
    bad(fn, "padded prefix negative", ValueError, "prefix_lens", lambda: BATCH.padded_layout(-1))
    bad(
        fn,
        "padded position overflow",
        ValueError,
        "prefix_lens",
        lambda: BATCH.padded_layout([0, (1 << 63) - 1]),
    )
    bad(fn, "qlen unequal sizes", ValueError, "batch", lambda: BATCH.qlen_mask())
    bad(fn, "index out of range", IndexError, "index", lambda: BATCH[2])
    bad(fn, "negative index out of range", IndexError, "index", lambda: BATCH[-3])


def verify_cases() -> None:
    fn = "verify"
    lg = LOGITS.copy()
    bad(fn, "int logits", TypeError, "logits", lambda: ss.verify(TREE, lg.astype(np.int32)))
    bad(fn, "1-D logits", ValueError, "logits", lambda: ss.verify(TREE, lg[0]), lg)
    bad(fn, "3-D logits", ValueError, "logits", lambda: ss.verify(TREE, lg[None]), lg)
    bad(fn, "short logits", ValueError, "logits", lambda: ss.verify(TREE, lg[:3]), lg)
    bad(fn, "empty vocab", ValueError, "logits", lambda: ss.verify(TREE, lg[:, :0]), lg)
    nl = NAN_LOGITS.copy()
    bad(fn, "NaN logits", ValueError, "logits", lambda: ss.verify(TREE, nl), nl)
    ninf = np.full((4, V), -np.inf, dtype=np.float32)
    bad(
        fn,
        "all -inf sampled",
        ValueError,
        "logits",
        lambda: ss.verify(TREE, ninf, temperature=1.0, seed=0),
        ninf,
    )
    bad(
        fn,
        "NaN logits sampled",
        ValueError,
        "logits",
        lambda: ss.verify(TREE, nl, temperature=1.0, seed=0),
        nl,
    )
    bad(
        fn,
        "both logits and tokens",
        TypeError,
        "logits / target_tokens",
        lambda: ss.verify(TREE, lg, target_tokens=TARGET),
    )
    bad(fn, "neither", TypeError, "logits / target_tokens", lambda: ss.verify(TREE))
    bad(fn, "not a tree", TypeError, "tree", lambda: ss.verify([0, 1], lg))
    tt = TARGET.copy()
    bad(
        fn,
        "float target_tokens",
        TypeError,
        "target_tokens",
        lambda: ss.verify(TREE, target_tokens=tt * 1.0),
        tt,
    )
    bad(
        fn,
        "short target_tokens",
        ValueError,
        "target_tokens",
        lambda: ss.verify(TREE, target_tokens=tt[:2]),
        tt,
    )
    bad(
        fn,
        "2-D target_tokens",
        ValueError,
        "target_tokens",
        lambda: ss.verify(TREE, target_tokens=tt[None]),
        tt,
    )
    bad(fn, "bad reduce", ValueError, "reduce", lambda: ss.verify(TREE, lg, reduce="gpu"))
    bad(
        fn,
        "device reduce on numpy",
        ValueError,
        "reduce",
        lambda: ss.verify(TREE, lg, reduce="device"),
    )
    for kind, kw, exc, arg in (
        ("negative temperature", {"temperature": -1.0}, ValueError, "temperature"),
        ("NaN temperature", {"temperature": float("nan")}, ValueError, "temperature"),
        ("inf temperature", {"temperature": float("inf")}, ValueError, "temperature"),
        ("str temperature", {"temperature": "hot"}, TypeError, "temperature"),
        ("2-D temperature", {"temperature": [[1.0]]}, ValueError, "temperature"),
        (
            "temperature per request, wrong length",
            {"temperature": [1.0, 1.0, 1.0]},
            ValueError,
            "temperature",
        ),
        ("negative top_k", {"temperature": 1.0, "top_k": -1}, ValueError, "top_k"),
        ("float top_k", {"temperature": 1.0, "top_k": 1.5}, TypeError, "top_k"),
        ("top_p 0", {"temperature": 1.0, "top_p": 0.0}, ValueError, "top_p"),
        ("top_p > 1", {"temperature": 1.0, "top_p": 1.5}, ValueError, "top_p"),
        ("NaN top_p", {"temperature": 1.0, "top_p": float("nan")}, ValueError, "top_p"),
        ("negative seed", {"temperature": 1.0, "seed": -1}, ValueError, "seed"),
        ("seed >= 2**64", {"temperature": 1.0, "seed": 1 << 64}, ValueError, "seed"),
        ("float seed", {"temperature": 1.0, "seed": 1.5}, TypeError, "seed"),
        ("unknown rule", {"temperature": 1.0, "rule": "medusa"}, ValueError, "rule"),
        (
            "unknown draft_sampling",
            {"temperature": 1.0, "draft_probs": Q, "draft_sampling": "x"},
            ValueError,
            "draft_sampling",
        ),
        (
            "draft_probs wrong shape",
            {"temperature": 1.0, "draft_probs": Q[:3]},
            ValueError,
            "draft_probs",
        ),
        (
            "draft_probs NaN",
            {"temperature": 1.0, "draft_probs": np.where(Q > 0, np.nan, Q)},
            ValueError,
            "draft_probs",
        ),
        (
            "draft_probs negative",
            {"temperature": 1.0, "draft_probs": Q - 0.5},
            ValueError,
            "draft_probs",
        ),
        (
            "draft_probs sum off",
            {"temperature": 1.0, "draft_probs": Q * 2},
            ValueError,
            "draft_probs",
        ),
        (
            "draft_probs int",
            {"temperature": 1.0, "draft_probs": np.ones((4, V), np.int64)},
            TypeError,
            "draft_probs",
        ),
        (
            "draft_probs with typical",
            {"temperature": 1.0, "draft_probs": Q, "rule": "typical"},
            ValueError,
            "draft_probs",
        ),
        (
            "posterior_threshold NaN",
            {"temperature": 1.0, "rule": "typical", "posterior_threshold": float("nan")},
            ValueError,
            "posterior_threshold",
        ),
        (
            "posterior_alpha negative",
            {"temperature": 1.0, "rule": "typical", "posterior_alpha": -1.0},
            ValueError,
            "posterior_alpha",
        ),
    ):
        bad(fn, kind, exc, arg, lambda k=kw: ss.verify(TREE, lg, **k), lg)
    bl = BLOGITS.copy()
    bad("verify(batch)", "short logits", ValueError, "logits", lambda: ss.verify(BATCH, bl[:5]), bl)
    bad(
        "verify(batch)",
        "temperature wrong length",
        ValueError,
        "temperature",
        lambda: ss.verify(BATCH, bl, temperature=[1.0, 1.0, 1.0]),
        bl,
    )
    tb = np.array([6, 8, 0, 3, 2], dtype=np.int64)
    bad(
        "verify(batch)",
        "short target_tokens",
        ValueError,
        "target_tokens",
        lambda: ss.verify(BATCH, target_tokens=tb),
        tb,
    )
    bad("BatchVerifyResult[]", "index out of range", IndexError, "index", lambda: BRESULT[5])

    lg2 = LOGITS.copy()
    same(
        fn,
        "F-ordered logits",
        lambda: ss.verify(TREE, np.asfortranarray(lg2)),
        lambda: ss.verify(TREE, LOGITS),
        lg2,
    )
    wide = np.repeat(LOGITS, 2, axis=1)
    same(
        fn,
        "strided logits",
        lambda: ss.verify(TREE, wide[:, ::2]),
        lambda: ss.verify(TREE, LOGITS),
        wide,
    )
    ro = LOGITS.copy()
    ro.flags.writeable = False
    same(
        fn,
        "read-only logits",
        lambda: ss.verify(TREE, ro, temperature=0.7, seed=3),
        lambda: ss.verify(TREE, LOGITS, temperature=0.7, seed=3),
        ro,
    )
    nan_unvisited = LOGITS.copy()
    nan_unvisited[3] = np.nan  # node 3's row: read only if the walk reaches node 3
    plain = LOGITS.copy()
    plain[3] = 0.0
    if ss.verify(TREE, plain).num_accepted < 3:
        same(
            fn,
            "NaN in an unvisited row",
            lambda: ss.verify(TREE, nan_unvisited),
            lambda: ss.verify(TREE, plain),
            nan_unvisited,
        )


def kv_cases() -> None:
    fn = "kv_compaction_plan"
    bad(fn, "negative prefix", ValueError, "prefix_lens", lambda: ss.kv_compaction_plan(RESULT, -1))
    bad(
        fn,
        "overflowing prefix",
        ValueError,
        "prefix_lens",
        lambda: ss.kv_compaction_plan(RESULT, (1 << 63) - 1),
    )
    bad(fn, "float prefix", TypeError, "prefix_lens", lambda: ss.kv_compaction_plan(RESULT, 1.5))
    bad(
        fn,
        "batch prefix wrong length",
        ValueError,
        "prefix_lens",
        lambda: ss.kv_compaction_plan(BRESULT, [1, 2, 3]),
    )
    bad(
        fn,
        "batch prefix negative",
        ValueError,
        "prefix_lens",
        lambda: ss.kv_compaction_plan(BRESULT, [1, -2]),
    )
    bad(fn, "not a result", TypeError, "result", lambda: ss.kv_compaction_plan(TREE, 0))

    fn = "compact_kv"
    cache = np.arange(2 * 8 * 3, dtype=np.float32).reshape(2, 8, 3)
    bad(
        fn,
        "seq_dim out of range",
        ValueError,
        "seq_dim",
        lambda: ss.compact_kv(cache, RESULT, 0, seq_dim=3),
        cache,
    )
    bad(
        fn,
        "seq_dim below -ndim",
        ValueError,
        "seq_dim",
        lambda: ss.compact_kv(cache, RESULT, 0, seq_dim=-4),
        cache,
    )
    bad(
        fn,
        "float seq_dim",
        TypeError,
        "seq_dim",
        lambda: ss.compact_kv(cache, RESULT, 0, seq_dim=1.0),
        cache,
    )
    bad(
        fn,
        "seq axis too short",
        ValueError,
        "cache",
        lambda: ss.compact_kv(cache, RESULT, 5, seq_dim=1),
        cache,
    )
    bad(
        fn,
        "negative prefix",
        ValueError,
        "prefix_lens",
        lambda: ss.compact_kv(cache, RESULT, -1, seq_dim=1),
        cache,
    )
    ro = cache.copy()
    ro.flags.writeable = False
    bad(
        fn,
        "read-only cache",
        ValueError,
        "cache",
        lambda: ss.compact_kv(ro, RESULT, 0, seq_dim=1),
        ro,
    )
    bcast = np.broadcast_to(np.arange(8.0)[None, :, None], (2, 8, 3))
    bad(
        fn,
        "broadcast cache",
        ValueError,
        "cache",
        lambda: ss.compact_kv(bcast, RESULT, 0, seq_dim=1),
        bcast,
    )
    bad(
        fn,
        "not an array",
        TypeError,
        "cache",
        lambda: ss.compact_kv([[1, 2]], RESULT, 0, seq_dim=1),
    )
    bad(
        fn,
        "empty list of caches",
        ValueError,
        "cache",
        lambda: ss.compact_kv([], RESULT, 0, seq_dim=1),
    )
    bad(
        fn,
        "list of caches of two shapes",
        ValueError,
        "cache[1]",
        lambda: ss.compact_kv([cache, cache[:, :, :2].copy()], RESULT, 0, seq_dim=1),
        cache,
    )
    bad(
        fn,
        "one cache twice in a list",
        ValueError,
        "may share memory",
        lambda: ss.compact_kv([cache, cache], RESULT, 0, seq_dim=1),
        cache,
    )
    bcache = np.arange(2 * 8 * 3, dtype=np.float32).reshape(2, 8, 3)
    bad(
        fn,
        "batch_dim == seq_dim",
        ValueError,
        "batch_dim",
        lambda: ss.compact_kv(bcache, BRESULT, 0, seq_dim=1, batch_dim=1),
        bcache,
    )
    bad(
        fn,
        "batch axis wrong length",
        ValueError,
        "cache",
        lambda: ss.compact_kv(bcache[:1], BRESULT, 0, seq_dim=1),
        bcache,
    )
    bad(
        fn,
        "batch prefix wrong length",
        ValueError,
        "prefix_lens",
        lambda: ss.compact_kv(bcache, BRESULT, [0, 0, 0], seq_dim=1),
        bcache,
    )
    f_cache = np.asfortranarray(cache)
    c_copy = cache.copy()
    ss.compact_kv(c_copy, RESULT, 1, seq_dim=1)

    def f_compact() -> Any:
        x = f_cache.copy(order="F")
        ss.compact_kv(x, RESULT, 1, seq_dim=1)
        return x

    same(fn, "F-ordered cache", f_compact, lambda: c_copy)

    fn = "commit_slots"
    slots = np.arange(4, dtype=np.int64)
    bad(fn, "wrong length", ValueError, "slots", lambda: ss.commit_slots(slots[:3], RESULT), slots)
    bad(fn, "float slots", TypeError, "slots", lambda: ss.commit_slots(slots * 1.0, RESULT), slots)
    bad(fn, "2-D slots", ValueError, "slots", lambda: ss.commit_slots(slots[None], RESULT), slots)
    bad(
        fn,
        "batch wrong length",
        ValueError,
        "slots",
        lambda: ss.commit_slots(np.arange(5), BRESULT),
    )


def builder_cases() -> None:
    fn = "top_n_tree"
    par = np.array([-1, -1, 0, 2], dtype=np.int64)
    sc = np.array([-0.1, -0.2, -0.3, -0.4])
    bad(fn, "float parents", TypeError, "parents", lambda: ss.top_n_tree(par * 1.0, sc, 3), par, sc)
    bad(
        fn,
        "forward parent",
        ValueError,
        "parents",
        lambda: ss.top_n_tree(np.array([-1, 2, 0, 2]), sc, 3),
        sc,
    )
    bad(
        fn,
        "parent < -1",
        ValueError,
        "parents",
        lambda: ss.top_n_tree(np.array([-1, -2, 0, 2]), sc, 3),
        sc,
    )
    bad(
        fn,
        "self parent",
        ValueError,
        "parents",
        lambda: ss.top_n_tree(np.array([-1, 1, 0, 2]), sc, 3),
        sc,
    )
    bad(fn, "short scores", ValueError, "scores", lambda: ss.top_n_tree(par, sc[:3], 3), par, sc)
    bad(fn, "int scores", TypeError, "scores", lambda: ss.top_n_tree(par, np.arange(4), 3), par)
    for kind, s in (
        ("NaN score", [-0.1, np.nan, -0.3, -0.4]),
        ("+inf score", [-0.1, np.inf, -0.3, -0.4]),
        ("positive score", [0.5, -0.2, -0.3, -0.4]),
        ("child above parent", [-0.5, -0.2, -0.3, -0.4]),
    ):
        arr = np.array(s)
        bad(fn, kind, ValueError, "scores", lambda a=arr: ss.top_n_tree(par, a, 3), arr, par)
    bad(fn, "budget 0", ValueError, "budget", lambda: ss.top_n_tree(par, sc, 0))
    bad(fn, "budget > pool + 1", ValueError, "budget", lambda: ss.top_n_tree(par, sc, 6))
    bad(fn, "absurd budget", ValueError, "budget", lambda: ss.top_n_tree(par, sc, HUGE))
    bad(fn, "negative budget", ValueError, "budget", lambda: ss.top_n_tree(par, sc, -1))
    bad(fn, "float budget", TypeError, "budget", lambda: ss.top_n_tree(par, sc, 2.0))
    bad(fn, "short tokens", ValueError, "tokens", lambda: ss.top_n_tree(par, sc, 3, tokens=[1, 2]))

    fn = "optimal_tree"
    for kind, p, exc in (
        ("NaN", [0.5, np.nan], ValueError),
        ("> 1", [1.5], ValueError),
        ("negative", [-0.1], ValueError),
        ("2-D", [[0.5]], ValueError),
        ("str", ["a"], TypeError),
    ):
        bad(fn, kind, exc, "accept_probs", lambda q=p: ss.optimal_tree(q, 4))
    bad(fn, "budget 0", ValueError, "budget", lambda: ss.optimal_tree([0.5], 0))
    bad(fn, "unknown method", ValueError, "method", lambda: ss.optimal_tree([0.5], 4, method="x"))
    bad(
        fn,
        "heap on non-monotone",
        ValueError,
        "accept_probs",
        lambda: ss.optimal_tree([0.1, 0.5], 4, method="heap"),
    )
    fn = "expected_accept_length"
    bad(fn, "NaN", ValueError, "accept_probs", lambda: ss.expected_accept_length(TREE, [np.nan]))
    bad(fn, "not a tree", TypeError, "tree", lambda: ss.expected_accept_length([0], [0.5]))

    fn = "DynamicTreeBuilder"
    bad(fn, "topk 0", ValueError, "topk", lambda: ss.DynamicTreeBuilder(1, 0, 2, 3))
    bad(fn, "depth 0", ValueError, "depth", lambda: ss.DynamicTreeBuilder(1, 2, 0, 3))
    bad(fn, "batch 0", ValueError, "batch", lambda: ss.DynamicTreeBuilder(0, 2, 2, 3))
    bad(fn, "budget 0", ValueError, "budget", lambda: ss.DynamicTreeBuilder(1, 2, 2, 0))
    bad(
        fn,
        "absurd sizes",
        ValueError,
        "batch",
        lambda: ss.DynamicTreeBuilder(1 << 20, 1 << 10, 1 << 10, 3),
    )
    bad(
        fn,
        "negative batch",
        (ValueError, OverflowError),
        "batch",
        lambda: ss.DynamicTreeBuilder(-1, 2, 2, 3),
    )
    root = np.array([1])
    tk = np.array([[3, 4]])
    lp = np.array([[-0.1, -0.5]], dtype=np.float32)

    def fresh() -> Any:
        return ss.DynamicTreeBuilder(1, 2, 3, 4)

    fn = "DynamicTreeBuilder.start"
    bad(
        fn,
        "wrong batch",
        ValueError,
        "root_tokens",
        lambda: fresh().start(np.array([1, 2]), tk, lp),
    )
    bad(
        fn,
        "wrong topk",
        ValueError,
        "topk_tokens",
        lambda: fresh().start(root, tk[:, :1], lp),
        tk,
        lp,
    )
    bad(
        fn,
        "NaN logprob",
        ValueError,
        "topk_logprobs",
        lambda: fresh().start(root, tk, np.array([[np.nan, -1.0]])),
    )
    bad(
        fn,
        "positive logprob",
        ValueError,
        "topk_logprobs",
        lambda: fresh().start(root, tk, np.array([[0.5, -1.0]])),
    )
    bad(fn, "float tokens", TypeError, "topk_tokens", lambda: fresh().start(root, tk * 1.0, lp))
    fn = "DynamicTreeBuilder.expand"
    bad(
        fn,
        "before start",
        ValueError,
        "start",
        lambda: fresh().expand(np.zeros((1, 2, 2), np.int64), np.zeros((1, 2, 2))),
    )

    def started() -> Any:
        b = fresh()
        b.start(root, tk, lp)
        return b

    bad(
        fn,
        "wrong shape",
        ValueError,
        "topk_tokens",
        lambda: started().expand(np.zeros((1, 2), np.int64), np.zeros((1, 2))),
    )
    bad(
        fn,
        "NaN logprob",
        ValueError,
        "topk_logprobs",
        lambda: started().expand(np.zeros((1, 2, 2), np.int64), np.full((1, 2, 2), np.nan)),
    )

    def staged(logprobs: np.ndarray, prefix: int = 0) -> Any:
        """A builder whose buffers hold `logprobs` (`[1, 2, 2]`), prefix length `prefix` and
        zero tokens."""
        b = fresh()
        b.buffers.topk_logprobs[:] = logprobs
        b.buffers.prefix_lens[:] = prefix
        return b

    fn = "DynamicTreeBuilder.start_in_place"
    bad(fn, "buffers never read", ValueError, "buffers", lambda: fresh().start_in_place())
    bad(
        fn,
        "negative prefix in buffers",
        ValueError,
        "prefix_lens",
        lambda: staged(np.full((1, 2, 2), -1.0), prefix=-3).start_in_place(),
    )
    bad(
        fn,
        "NaN logprob in buffers",
        ValueError,
        "topk_logprobs",
        lambda: staged(np.full((1, 2, 2), np.nan)).start_in_place(),
    )
    fn = "DynamicTreeBuilder.expand_in_place"
    bad(
        fn,
        "before start",
        ValueError,
        "start",
        lambda: staged(np.full((1, 2, 2), -1.0)).expand_in_place(),
    )

    def started_in_place(logprobs: float) -> Any:
        b = staged(np.full((1, 2, 2), -1.0))
        b.start_in_place()
        b.buffers.topk_logprobs[:] = logprobs
        return b

    bad(
        fn,
        "positive logprob in buffers",
        ValueError,
        "topk_logprobs",
        lambda: started_in_place(0.5).expand_in_place(),
    )
    fn = "DynamicTreeBuilder.build_in_place"
    bad(fn, "buffers never read", ValueError, "buffers", lambda: fresh().build_in_place())
    bad(
        fn,
        "before start",
        ValueError,
        "start",
        lambda: staged(np.full((1, 2, 2), -1.0)).build_in_place(),
    )
    bad(
        fn,
        "unknown order",
        ValueError,
        "order",
        lambda: started_in_place(-1.0).build_in_place("bfs"),
    )

    fn = "AcceptanceStats.update"
    bad(
        fn,
        "mismatched pair",
        ValueError,
        "result",
        lambda: ss.AcceptanceStats().update(TREE2, RESULT),
    )
    bad(
        fn,
        "tree with batch result",
        TypeError,
        "tree / result",
        lambda: ss.AcceptanceStats().update(TREE, BRESULT),
    )


def sglang_cases() -> None:
    topk, steps, n = 2, 2, 4
    scores = [
        np.array([[-0.1, -0.2]], dtype=np.float32),
        np.array([[-0.3, -0.4, -0.5, -0.6]], dtype=np.float32),
    ]
    tokens = [np.array([[3, 4]]), np.array([[5, 6, 7, 8]])]
    parents = [np.array([[-1, 0]]), np.array([[0, 1]])]
    fn = "sglang.organize_draft_results"
    bad(
        fn,
        "num_draft_token 0",
        ValueError,
        "num_draft_token",
        lambda: sglang.organize_draft_results(scores, tokens, parents, 0),
    )
    bad(
        fn,
        "too many tokens",
        ValueError,
        "num_draft_token",
        lambda: sglang.organize_draft_results(scores, tokens, parents, 9),
    )
    nan_scores = [scores[0], np.array([[np.nan, -0.4, -0.5, -0.6]], dtype=np.float32)]
    bad(
        fn,
        "NaN score",
        ValueError,
        "score_list",
        lambda: sglang.organize_draft_results(nan_scores, tokens, parents, n),
    )
    bad(
        fn,
        "token shape",
        ValueError,
        "token_list",
        lambda: sglang.organize_draft_results(scores, tokens[:1], parents, n),
    )
    parent_list, sel, dtoks = sglang.organize_draft_results(scores, tokens, parents, n)
    seq = np.array([3])
    vid = np.array([1])

    def build(**over: Any) -> Any:
        kw = dict(
            verified_id=vid,
            parent_list=parent_list,
            top_scores_index=sel,
            draft_tokens=dtoks,
            seq_lens=seq,
            seq_lens_sum=3,
            topk=topk,
            spec_steps=steps,
            num_verify_tokens=n,
        )
        kw.update(over)
        return sglang.build_tree_kernel_efficient(**kw)

    fn = "sglang.build_tree_kernel_efficient"
    bad(fn, "topk 0", ValueError, "topk", lambda: build(topk=0))
    bad(
        fn,
        "num_verify_tokens too big",
        ValueError,
        "num_verify_tokens",
        lambda: build(
            num_verify_tokens=9,
            top_scores_index=np.arange(8)[None],
            draft_tokens=np.zeros((1, 8), np.int64),
        ),
    )
    bad(
        fn,
        "selection out of pool",
        IndexError,
        "top_scores_index",
        lambda: build(top_scores_index=np.array([[0, 1, 99]])),
    )
    bad(
        fn,
        "negative selection",
        IndexError,
        "top_scores_index",
        lambda: build(top_scores_index=np.array([[-1, 0, 1]])),
    )
    bad(
        fn,
        "unsorted selection",
        ValueError,
        "top_scores_index",
        lambda: build(top_scores_index=np.array([[1, 0, 2]])),
    )
    bad(
        fn,
        "not a tree",
        ValueError,
        "top_scores_index",
        lambda: build(top_scores_index=np.array([[1, 2, 3]])),
    )
    bad(
        fn,
        "parent_list too narrow",
        IndexError,
        "parent_list",
        lambda: build(top_scores_index=np.array([[0, 4, 5]])),
    )
    bad(fn, "negative seq_lens", ValueError, "seq_lens", lambda: build(seq_lens=np.array([-1])))
    bad(fn, "seq_lens_sum mismatch", ValueError, "seq_lens_sum", lambda: build(seq_lens_sum=7))
    bad(
        fn,
        "selection wrong shape",
        ValueError,
        "top_scores_index",
        lambda: build(top_scores_index=sel[:, :2]),
    )
    mbuf = np.zeros(3, dtype=bool)
    bad(
        fn,
        "tree_mask_buf too small",
        ValueError,
        "tree_mask_buf",
        lambda: build(tree_mask_buf=mbuf),
        mbuf,
    )
    out = build()
    ri, nt, ns = (np.asarray(x).reshape(1, n) for x in out[2:5])
    cands = np.asarray(out[5]).reshape(1, n)
    tp = np.array([3, 5, 0, 0])

    def vt(**over: Any) -> Any:
        kw = dict(
            predicts=np.zeros(n, np.int32),
            accept_index=np.zeros((1, 3), np.int32),
            accept_token_num=np.zeros(1, np.int32),
            candidates=cands,
            retrive_index=ri,
            retrive_next_token=nt,
            retrive_next_sibling=ns,
            target_predict=tp,
        )
        kw.update(over)
        return sglang.verify_tree_greedy(**kw)

    fn = "sglang.verify_tree_greedy"
    bad(fn, "predicts int64", TypeError, "predicts", lambda: vt(predicts=np.zeros(n, np.int64)))
    bad(
        fn, "predicts short", ValueError, "predicts", lambda: vt(predicts=np.zeros(n - 1, np.int32))
    )
    ro = np.zeros(n, np.int32)
    ro.flags.writeable = False
    bad(fn, "predicts read-only", ValueError, "predicts", lambda: vt(predicts=ro), ro)
    cyc = ns.copy()
    cyc[0, 1] = 1
    cyc_nt = nt.copy()
    cyc_nt[0, 0] = 1
    bad(
        fn,
        "sibling cycle",
        ValueError,
        "retrive_next_sibling",
        lambda: vt(
            retrive_next_sibling=cyc,
            retrive_next_token=cyc_nt,
            target_predict=np.array([99, 0, 0, 0]),
        ),
        cyc,
    )
    far = nt.copy()
    far[0, 0] = 17
    bad(
        fn,
        "next_token out of range",
        IndexError,
        "retrive_next_token",
        lambda: vt(retrive_next_token=far),
        far,
    )
    neg = ri.copy()
    neg[0, 0] = -5
    bad(
        fn,
        "retrive_index negative",
        IndexError,
        "retrive_index",
        lambda: vt(retrive_index=neg),
        neg,
    )
    bad(fn, "candidates wrong shape", ValueError, "candidates", lambda: vt(candidates=cands[:, :2]))
    both = np.zeros((1, n), np.int32)
    bad(
        fn,
        "same array twice",
        ValueError,
        "accept_index",
        lambda: vt(predicts=both.reshape(-1), accept_index=both),
        both,
    )
    bad(
        fn,
        "token beyond int32",
        ValueError,
        "target_predict",
        lambda: vt(target_predict=np.array([1 << 40, 0, 0, 0])),
    )


def torch_cases() -> None:
    if torch is None:
        return
    lg = torch.tensor(LOGITS)
    meta = torch.empty((4, V), device="meta")
    bad("verify", "meta logits", ValueError, "logits", lambda: ss.verify(TREE, meta))
    bad(
        "verify",
        "meta logits sampled",
        ValueError,
        "logits",
        lambda: ss.verify(TREE, meta, temperature=1.0, seed=0),
    )
    bad(
        "verify",
        "int tensor logits",
        TypeError,
        "logits",
        lambda: ss.verify(TREE, lg.to(torch.int32)),
    )
    bad("verify", "3-D tensor logits", ValueError, "logits", lambda: ss.verify(TREE, lg[None]), lg)
    bad(
        "verify",
        "host reduce on meta",
        ValueError,
        "logits",
        lambda: ss.verify(TREE, meta, reduce="host"),
    )
    bad(
        "verify",
        "meta target_tokens",
        ValueError,
        "target_tokens",
        lambda: ss.verify(TREE, target_tokens=torch.empty(4, dtype=torch.int64, device="meta")),
    )
    cache = torch.arange(48, dtype=torch.float32).reshape(2, 8, 3)
    bad(
        "compact_kv",
        "meta cache",
        ValueError,
        "cache",
        lambda: ss.compact_kv(torch.empty((2, 8, 3), device="meta"), RESULT, 0, seq_dim=1),
    )
    bad(
        "compact_kv",
        "short cache tensor",
        ValueError,
        "cache",
        lambda: ss.compact_kv(cache[:, :3], RESULT, 1, seq_dim=1),
        cache,
    )
    bad(
        "verify",
        "meta draft_probs",
        ValueError,
        "draft_probs",
        lambda: ss.verify(
            TREE,
            lg,
            temperature=1.0,
            draft_probs=torch.empty((4, V), dtype=torch.float64, device="meta"),
        ),
    )
    bad(
        "kv_compaction_plan",
        "meta prefix_lens",
        ValueError,
        "prefix_lens",
        lambda: ss.kv_compaction_plan(BRESULT, torch.empty(2, dtype=torch.int64, device="meta")),
    )
    bad(
        "verify",
        "meta temperature",
        ValueError,
        "temperature",
        lambda: ss.verify(TREE, lg, temperature=torch.empty(1, device="meta")),
    )
    bad(
        "commit_slots",
        "meta slots",
        ValueError,
        "slots",
        lambda: ss.commit_slots(torch.empty(4, dtype=torch.int64, device="meta"), RESULT),
    )
    bad(
        "sglang.verify_tree_greedy",
        "meta predicts",
        TypeError,
        "predicts",
        lambda: sglang.verify_tree_greedy(
            torch.empty(4, dtype=torch.int32, device="meta"),
            np.zeros((1, 3), np.int32),
            np.zeros(1, np.int32),
            np.zeros((1, 4)),
            np.zeros((1, 4)),
            np.zeros((1, 4)),
            np.zeros((1, 4)),
            np.zeros(4),
        ),
    )
    grad = torch.tensor(LOGITS, requires_grad=True)
    same(
        "verify",
        "logits that require grad",
        lambda: ss.verify(TREE, grad),
        lambda: ss.verify(TREE, LOGITS),
        grad,
    )
    same(
        "verify",
        "sampled, logits that require grad",
        lambda: ss.verify(TREE, grad, temperature=0.8, seed=1),
        lambda: ss.verify(TREE, LOGITS, temperature=0.8, seed=1),
        grad,
    )
    tt = torch.tensor(TARGET)
    same(
        "verify",
        "torch target_tokens",
        lambda: ss.verify(TREE, target_tokens=tt),
        lambda: ss.verify(TREE, target_tokens=TARGET),
        tt,
    )
    lt = torch.tensor(LOGITS).t().contiguous().t()
    same(
        "verify",
        "transposed tensor logits",
        lambda: ss.verify(TREE, lt),
        lambda: ss.verify(TREE, LOGITS),
        lt,
    )


def _merged_self(st: Any) -> Any:
    st.merge(st)
    return [st.steps, st.trials, st.hits]


def _doubled() -> Any:
    st = ss.AcceptanceStats()
    st.update(TREE, RESULT)
    st.update(TREE, RESULT)
    return [st.steps, st.trials, st.hits]


def more_cases() -> None:

    fn = "choose_tree"
    tv = {1: 1e-3, 4: 1.2e-3, 8: 1.5e-3}
    bad(
        fn,
        "t_verify not a mapping",
        TypeError,
        "t_verify",
        lambda: ss.choose_tree([0.5], 1e-4, [1e-3], 3),
    )
    bad(
        fn,
        "NaN accept_probs",
        ValueError,
        "accept_probs",
        lambda: ss.choose_tree([np.nan], 1e-4, tv, 3),
    )
    bad(fn, "negative t_draft", ValueError, "t_draft", lambda: ss.choose_tree([0.5], -1.0, tv, 3))
    bad(
        fn,
        "NaN t_verify",
        ValueError,
        "t_verify",
        lambda: ss.choose_tree([0.5], 1e-4, {4: np.nan}, 3),
    )
    bad(
        fn,
        "budget 0 in t_verify",
        ValueError,
        "t_verify",
        lambda: ss.choose_tree([0.5], 1e-4, {0: 1e-3}, 3),
    )
    fn = "AcceptanceStats"
    st = ss.AcceptanceStats()
    st.update(TREE, RESULT)
    bad(
        fn + ".confidence_interval",
        "NaN z",
        ValueError,
        "z",
        lambda: st.confidence_interval(z=float("nan")),
    )
    bad(
        fn + ".confidence_interval",
        "negative z",
        ValueError,
        "z",
        lambda: st.confidence_interval(z=-1.0),
    )
    bad(fn + ".optimal_tree", "budget 0", ValueError, "budget", lambda: st.optimal_tree(0))
    bad(fn + ".merge", "not stats", TypeError, "other", lambda: st.merge(TREE))
    bad(fn + ".update", "not a tree", TypeError, "tree / result", lambda: st.update([0], RESULT))
    twice = ss.AcceptanceStats()
    twice.update(TREE, RESULT)
    same(
        fn + ".merge",
        "the same object twice (doubles the counts)",
        lambda: _merged_self(twice),
        lambda: _doubled(),
    )
    fn = "BatchVerifyResult[]"
    bad(fn, "non-int index", TypeError, "index", lambda: BRESULT["a"])
    bad("TreeBatch[]", "non-int index", TypeError, "index", lambda: BATCH[1.5])
    fn = "sim"
    bad(
        fn + ".expected_tokens_chain",
        "alpha > 1",
        ValueError,
        "alpha",
        lambda: sim.expected_tokens_chain(1.5, 3),
    )
    bad(
        fn + ".expected_tokens_chain",
        "NaN alpha",
        ValueError,
        "alpha",
        lambda: sim.expected_tokens_chain(np.nan, 3),
    )
    bad(
        fn + ".expected_tokens_chain",
        "negative gamma",
        ValueError,
        "gamma",
        lambda: sim.expected_tokens_chain(0.5, -1),
    )
    bad(
        fn + ".expected_tokens_chain",
        "float gamma",
        TypeError,
        "gamma",
        lambda: sim.expected_tokens_chain(0.5, 1.5),
    )
    bad(
        fn + ".simulate",
        "steps 0",
        ValueError,
        "steps",
        lambda: sim.simulate(TREE, sim.Acceptance.iid(0.5), steps=0),
    )
    bad(
        fn + ".simulate",
        "negative seed",
        ValueError,
        "seed",
        lambda: sim.simulate(TREE, sim.Acceptance.iid(0.5), seed=-1),
    )
    bad(
        fn + ".simulate",
        "seed >= 2**64",
        ValueError,
        "seed",
        lambda: sim.simulate(TREE, sim.Acceptance.iid(0.5), seed=1 << 64),
    )
    bad(
        fn + ".simulate",
        "threads 0",
        ValueError,
        "threads",
        lambda: sim.simulate(TREE, sim.Acceptance.iid(0.5), threads=0),
    )
    bad(
        fn + ".Acceptance.per_rank",
        "sum > 1",
        ValueError,
        "per_rank",
        lambda: sim.Acceptance.per_rank([0.7, 0.6]),
    )
    bad(
        fn + ".Acceptance.iid", "NaN", ValueError, "alpha", lambda: sim.Acceptance.iid(float("nan"))
    )


def run_bad(case: tuple[Any, ...]) -> dict[str, Any]:
    fn, kind, exc, arg, call, inputs = case
    before = [snapshot(x) for x in inputs]
    problem = None
    try:
        call()
        problem = "no exception"
    except exc as e:
        if arg not in str(e):
            problem = f"message does not name {arg!r}: {type(e).__name__}: {e}"
    except BaseException as e:
        problem = f"expected {[x.__name__ for x in exc]}, got {type(e).__name__}: {e}"
    if problem is None and not all(unchanged(b, x) for b, x in zip(before, inputs, strict=True)):
        problem = "an input was modified"
    return {"fn": fn, "kind": kind, "ok": problem is None, "problem": problem}


def run_same(case: tuple[Any, ...]) -> dict[str, Any]:
    fn, kind, call, plain, inputs = case
    before = [snapshot(x) for x in inputs]
    problem = None
    try:
        if flat(call()) != flat(plain()):
            problem = "result differs from the plain input's"
    except BaseException as e:
        problem = f"raised {type(e).__name__}: {e}\n{traceback.format_exc()}"
    if problem is None and not all(unchanged(b, x) for b, x in zip(before, inputs, strict=True)):
        problem = "an input was modified"
    return {"fn": fn, "kind": kind, "ok": problem is None, "problem": problem}


def scalar_cases() -> None:
    """Scalars PyO3 would extract itself (its messages name no argument): each is converted
    by name. One-element tensors are not one int (they have `__index__`)."""
    suffix = ss.SuffixDrafter()
    for fn, kind, exc, arg, call in [
        (
            "DynamicTreeBuilder",
            "float batch",
            TypeError,
            "batch",
            lambda: ss.DynamicTreeBuilder(2.0, 2, 2, 4),
        ),
        (
            "DynamicTreeBuilder",
            "bool topk",
            TypeError,
            "topk",
            lambda: ss.DynamicTreeBuilder(2, True, 2, 4),
        ),
        ("SuffixDrafter", "float max_depth", TypeError, "max_depth", lambda: ss.SuffixDrafter(8.0)),
        (
            "SuffixDrafter.propose",
            "budget past int64",
            ValueError,
            "budget",
            lambda: suffix.propose(1, 2**63),
        ),
        (
            "SuffixDrafter.start_request",
            "id past int64",
            ValueError,
            "request_id",
            lambda: suffix.start_request(2**63, [1]),
        ),
        (
            "SuffixDrafter.propose_batch",
            "float budgets",
            TypeError,
            "budgets",
            lambda: suffix.propose_batch([1], 4.0),
        ),
        (
            "SuffixDrafter.propose_batch",
            "min_prob 0",
            ValueError,
            "min_prob",
            lambda: suffix.propose_batch([1], 4, min_prob=0.0),
        ),
        (
            "SuffixDrafter.propose_batch",
            "max_spec_factor -1",
            ValueError,
            "max_spec_factor",
            lambda: suffix.propose_batch([1], 4, max_spec_factor=-1.0),
        ),
        ("NgramDrafter", "bool k", TypeError, "k", lambda: ss.NgramDrafter(k=True)),
        (
            "NgramDrafter",
            "max_model_len past int64",
            ValueError,
            "max_model_len",
            lambda: ss.NgramDrafter(max_model_len=2**63),
        ),
        (
            "top_n_tree",
            "float root_token",
            TypeError,
            "root_token",
            lambda: ss.top_n_tree([-1, 0], [0.0, -1.0], 2, root_token=1.0),
        ),
        (
            "choose_tree",
            "str t_draft",
            TypeError,
            "t_draft",
            lambda: ss.choose_tree([0.5], "1", {4: 1.0}, 2),
        ),
        (
            "sim.simulate",
            "steps 2**64",
            ValueError,
            "steps",
            lambda: sim.simulate(TREE, 0.5, 2**64),
        ),
        ("sim.best_tree", "budget 2**64", ValueError, "budget", lambda: sim.best_tree(0.5, 2**64)),
        (
            "AcceptanceStats.confidence_interval",
            "str z",
            TypeError,
            "z",
            lambda: ss.AcceptanceStats().confidence_interval("x"),
        ),
    ]:
        bad(fn, kind, exc, arg, call)
    # A contiguous, writeable output whose data sits at an odd byte offset.
    odd = np.zeros(4 * 4 * 4 + 1, np.uint8)[1:].view(np.float32).reshape(4, 4)
    bad(
        "Tree.attention_bias",
        "misaligned out",
        ValueError,
        "out: its data is not aligned",
        lambda: TREE.attention_bias(out=odd),
    )
    odd_i32 = np.zeros(13, np.uint8)[1:].view(np.int32)
    bad(
        "sglang.verify_tree_greedy",
        "misaligned predicts",
        ValueError,
        "predicts: its data is not aligned",
        lambda: sglang.verify_tree_greedy(
            odd_i32,
            np.full((1, 3), -1, np.int32),
            np.zeros(1, np.int32),
            np.array([[10, 11, 12]]),
            np.array([[0, 1, 2]]),
            np.array([[1, 2, -1]]),
            np.array([[-1, -1, -1]]),
            np.array([11, 12, 13]),
        ),
    )
    # A list holding an int past int64 (numpy would make it float64 or object): named.
    bad(
        "NgramDrafter.propose_tokens",
        "int past int64 in a list",
        ValueError,
        "context[1]: 9223372036854775808 does not fit in int64",
        lambda: ss.NgramDrafter().propose_tokens([1, 2**63]),
    )
    bad(
        "Tree",
        "token past int64 in a list",
        ValueError,
        "tokens[1]",
        lambda: ss.Tree([-1, 0], [1, 2**64]),
    )
    # Options a greedy call does not use are still checked, not ignored.
    for kind, exc, arg, kw in [
        ("greedy, negative seed", ValueError, "seed", {"seed": -1}),
        ("greedy, str seed", TypeError, "seed", {"seed": "abc"}),
        ("greedy, unknown draft_sampling", ValueError, "draft_sampling", {"draft_sampling": "x"}),
        ("greedy, NaN posterior_alpha", ValueError, "posterior_alpha", {"posterior_alpha": np.nan}),
        (
            "greedy, 2 seeds for 1 tree",
            ValueError,
            "seed: has 2 per-request seeds",
            {"seed": [1, 2]},
        ),
        (
            "greedy, array posterior_threshold",
            TypeError,
            "posterior_threshold",
            {"posterior_threshold": np.array([0.1, 0.2])},
        ),
    ]:
        bad("verify", kind, exc, arg, lambda kw=kw: ss.verify(TREE, LOGITS, **kw), LOGITS)
    if torch is None:
        return
    one = torch.tensor([7])
    bad(
        "TreeBatch.positions",
        "one-element tensor",
        ValueError,
        "prefix_lens",
        lambda: BATCH.positions(one),
        one,
    )
    bad(
        "TreeBatch.limit_depth",
        "[1, 1] tensor",
        ValueError,
        "max_depth",
        lambda: BATCH.limit_depth(torch.tensor([[0]])),
    )
    builder = ss.DynamicTreeBuilder(2, 2, 2, 4)
    roots = np.array([1, 2])
    tokens = np.zeros((2, 2), np.int64)
    logprobs = np.full((2, 2), -1.0, np.float32)
    bad(
        "DynamicTreeBuilder.start",
        "one-element prefix_lens tensor",
        ValueError,
        "prefix_lens",
        lambda: builder.start(roots, tokens, logprobs, prefix_lens=one),
    )
    same(
        "TreeBatch.positions",
        "0-d tensor",
        lambda: BATCH.positions(torch.tensor(3)),
        lambda: BATCH.positions(3),
    )
    # A draft head's top-k as it comes: half precision, or still attached to the graph.
    lp32 = torch.tensor([[-0.5, -1.0], [-0.25, -2.0]])
    for kind, lp in [
        ("float16 topk_logprobs tensor", lp32.half()),
        ("bfloat16 topk_logprobs tensor", lp32.bfloat16()),
        ("topk_logprobs that require grad", lp32.clone().requires_grad_()),
        ("float16 topk_logprobs array", lp32.half().numpy()),
    ]:
        same(
            "DynamicTreeBuilder.start",
            kind,
            lambda lp=lp: ss.DynamicTreeBuilder(2, 2, 2, 3).start([1, 2], tokens, lp),
            lambda: ss.DynamicTreeBuilder(2, 2, 2, 3).start([1, 2], tokens, lp32.numpy()),
        )
    same(
        "top_n_tree",
        "scores that require grad",
        lambda: ss.top_n_tree([-1, 0, 1], torch.tensor([0.0, -1.0, -2.0], requires_grad=True), 3),
        lambda: ss.top_n_tree([-1, 0, 1], np.array([0.0, -1.0, -2.0]), 3),
    )
    lg = torch.tensor(LOGITS)
    bad(
        "verify",
        "integer draft_probs tensor",
        TypeError,
        "draft_probs",
        lambda: ss.verify(
            TREE, lg, temperature=1.0, draft_probs=torch.ones(4, V, dtype=torch.int32)
        ),
    )
    # Per-request parameters in bfloat16 (numpy has no such dtype) are widened, not refused.
    same(
        "verify",
        "bfloat16 temperature tensor",
        lambda: ss.verify(TREE, lg, temperature=torch.tensor([0.5], dtype=torch.bfloat16), seed=4),
        lambda: ss.verify(TREE, lg, temperature=0.5, seed=4),
    )


def main() -> None:
    for build in (
        tree_cases,
        layout_cases,
        verify_cases,
        kv_cases,
        builder_cases,
        sglang_cases,
        torch_cases,
        more_cases,
        scalar_cases,
    ):
        build()
    results = []
    for i, case in enumerate(CASES):
        print(f"START bad {i} {case[0]}: {case[1]}", file=sys.stderr, flush=True)
        results.append(run_bad(case))
    accepted = []
    for i, case in enumerate(ACCEPTED):
        print(f"START same {i} {case[0]}: {case[1]}", file=sys.stderr, flush=True)
        accepted.append(run_same(case))
    print(json.dumps({"cases": results, "accepted": accepted}))


if __name__ == "__main__":
    main()
