"""`verify`: the longest accepted path of a tree (or a batch) against the target's output.

Verification per DESIGN §4: decide per node, then walk from the root. Greedy (the default,
and temperature 0): the target's choice at node v is the argmax of row v (ties to the lowest
id). Sampled (temperature > 0): the target's processed distribution (temperature → top-k →
top-p) decides, under one of the lossless rules, or Medusa's lossy typical acceptance on
request. Host logits (numpy, torch CPU in any float format) are read in place by Rust, which
processes only the rows the walk visits; CUDA logits are reduced on the device (argmax or one
sample per node) and only `[T]` choices cross to the host.
"""

from __future__ import annotations

import functools
import math
import secrets
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from specsched import _core, _torch
from specsched._core import BatchVerifyResult, Tree, TreeBatch, VerifyResult

Reduce = Literal["auto", "host", "device"]
DraftSampling = Literal["with_replacement", "without_replacement"]

_U64 = 1 << 64
_INT64 = np.iinfo(np.int64)
# Medusa's typical-acceptance defaults; compared by identity (a caller's array must not reach
# an `!=` that has no single truth value).
_POSTERIOR_THRESHOLD = 0.09
_POSTERIOR_ALPHA = 0.3


def verify(
    tree: Tree | TreeBatch,
    logits: Any = None,
    *,
    target_tokens: Any = None,
    reduce: Reduce = "auto",
    temperature: Any = None,
    top_k: Any = None,
    top_p: Any = None,
    seed: Any = None,
    draft_probs: Any = None,
    draft_sampling: DraftSampling = "with_replacement",
    rule: Literal["typical"] | None = None,
    posterior_threshold: float = _POSTERIOR_THRESHOLD,
    posterior_alpha: float = _POSTERIOR_ALPHA,
) -> VerifyResult | BatchVerifyResult:
    """Verifies `tree` (a Tree or a TreeBatch) against the target.

    Pass exactly one of `logits` (`[N, V]` / `[T, V]`: numpy float16/32/64, or a torch tensor on
    any device, bfloat16 included) or `target_tokens` (the target's choice per node, `[N]` /
    `[T]`). `reduce` picks where logits are reduced: "host" (Rust, visited rows only), "device"
    (torch, every row on the tensor's device, then the walk), or "auto" (host for CPU memory,
    device for CUDA).

    Without sampling arguments this is the greedy walk. `temperature` (a float, or one per
    request of a batch; 0 = greedy for that request), `top_k` (int or per request; 0/None = off)
    and `top_p` (float or per request in (0, 1]; None = 1 = off) process the target row in that
    order, as HF transformers and vLLM do (see docs/api.md for the exact tie rules). `seed`
    keys the counter-based draws, so the same seed gives the same tokens whatever the thread
    count or call order: an int in [0, 2**64) for the batch (None draws one; request b's draws
    are keyed by its slot b), or one int per request (a sequence, a numpy array or a tensor
    of B: vLLM's and SGLang's per-request seeds), whose draws then depend on the request's
    own seed alone, not on its slot or the other requests; under seed s a request draws what
    a single tree verified with `seed=s` draws.

    Rules: deterministic drafts (the default): sample the target at each node and accept the
    child holding that token (lossless). `draft_probs` (`[N, V]` / `[T, V]`, float32/64, row v =
    the draft distribution v's children were drawn from, rows summing to 1 within
    `DRAFT_SUM_TOL`) selects multi-round rejection (SpecInfer) for children drawn
    `draft_sampling="with_replacement"` or `"without_replacement"` (lossless). `rule="typical"`
    is Medusa's typical acceptance with `posterior_threshold` / `posterior_alpha`: it CHANGES
    the output distribution (lossy) and is never the default.
    """
    if (logits is None) == (target_tokens is None):
        raise TypeError("logits / target_tokens: pass exactly one of them")
    if reduce not in ("auto", "host", "device"):
        raise ValueError(f"reduce: expected 'auto', 'host' or 'device', got {reduce!r}")
    sampling = not (
        temperature is None
        and top_k is None
        and top_p is None
        and draft_probs is None
        and rule is None
    )
    if not sampling and (
        seed is not None
        or draft_sampling != "with_replacement"
        or posterior_threshold is not _POSTERIOR_THRESHOLD
        or posterior_alpha is not _POSTERIOR_ALPHA
    ):
        # Not used by a greedy walk, but a wrong value is still the caller's mistake to hear.
        _check_options(seed, draft_sampling, posterior_threshold, posterior_alpha, _requests(tree))
    if target_tokens is not None:
        if sampling:
            raise TypeError(
                "target_tokens: sampling arguments need logits (target_tokens are the choices)"
            )
        return _core.verify_target_tokens(tree, _torch.host_array(target_tokens, "target_tokens"))
    if sampling:
        return _verify_sampled(
            tree,
            logits,
            reduce,
            temperature,
            top_k,
            top_p,
            seed,
            draft_probs,
            draft_sampling,
            rule,
            posterior_threshold,
            posterior_alpha,
        )
    if _reduce_on_device(logits, reduce):
        _check_device_inputs(tree, logits)
        choice, nan_rows = _torch.device_argmax(logits)
        return _core.verify_target_tokens(tree, choice, nan_rows)
    if _torch.is_tensor(logits):
        array, dtype = _torch.cpu_view(logits)
        return _core.verify_greedy(tree, array, dtype)
    return _core.verify_greedy(tree, logits)


_verify = verify
# Module names for the front door below: one dict lookup each instead of two.
_NDARRAY = np.ndarray
_verify_greedy = _core.verify_greedy

if not TYPE_CHECKING:

    @functools.wraps(_verify)
    def verify(tree, logits=None, **options):
        # The decode loop's call, `verify(tree, logits)` on host numpy logits, in as few
        # bytecodes and lookups as it takes: right after a model forward each costs. The
        # options are a `**` dict, not `_verify`'s keyword-only parameters, because CPython
        # fills each missing keyword-only default by a dict lookup on a call path it does not
        # specialize (`inspect.signature` and help() still show `_verify`'s). In the demo's
        # loop, alternating per step with the keyword-only function: 1.0-2.6 µs less a call,
        # and 0.4-1.9 µs less again for the module names.
        if not options and type(logits) is _NDARRAY:
            return _verify_greedy(tree, logits)
        return _verify(tree, logits, **options)


def _reduce_on_device(logits: Any, reduce: Reduce) -> bool:
    """Whether `logits` are reduced on their torch device (CUDA, or `reduce="device"`);
    `reduce` must fit where they live."""
    if not _torch.is_tensor(logits):
        if reduce == "device":
            raise ValueError("reduce: 'device' needs torch logits")
        return False
    _torch.check_has_data(logits, "logits")
    on_device = bool(logits.device.type != "cpu")
    if on_device and reduce == "host":
        raise ValueError(
            f"reduce: 'host' needs logits in CPU memory, got a tensor on {logits.device}"
        )
    return on_device or reduce == "device"


def _check_device_inputs(tree: Any, logits: Any) -> None:
    """What Rust would check of host logits, for logits reduced on the device."""
    _check_tree(tree)
    _torch.check_logits(logits, tree.num_nodes)


def _check_tree(tree: Any) -> None:
    if not isinstance(tree, (Tree, TreeBatch)):
        raise TypeError(f"tree: expected a Tree or a TreeBatch, got {type(tree).__name__}")


def _requests(tree: Any) -> int:
    """The requests `tree` verifies (checked to be a Tree or a TreeBatch first, so that a
    wrong tree is named as such, not as a per-request argument of the wrong length)."""
    _check_tree(tree)
    return tree.num_trees if isinstance(tree, TreeBatch) else 1


def _representable(x: Any, integer: bool) -> Any:
    """A Python int `x` clamped to what an int64 (`integer`) or a float64 holds."""
    if not isinstance(x, int) or isinstance(x, bool):
        return x
    if integer:
        return min(max(x, _INT64.min), _INT64.max)
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def _param(value: Any, name: str, default: float | int, integer: bool, requests: int) -> np.ndarray:
    """A per-request parameter as a 1-D array (a scalar becomes one entry) of 1 or `requests`
    entries, counted before anything is copied (a broadcast view may claim 2**40)."""
    if value is None:
        value = default
    if _torch.is_tensor(value):
        value = _torch.host_array(value, name, floats=not integer)
    # Python ints past int64 / float64 (numpy would make them an object array, a TypeError
    # for what is a value out of range): a k past int64 keeps every token, as a uint64 one
    # does below; one below it, or a float parameter past float64, becomes a value the range
    # checks name (int64's minimum, +-inf).
    if isinstance(value, (list, tuple)):
        value = [_representable(x, integer) for x in value]
    else:
        value = _representable(value, integer)
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name}: expected a number or a 1-D array of numbers: {e}") from None
    # By kind, not `np.issubdtype(..., np.integer)`: timedelta64 subclasses signedinteger.
    if arr.dtype.kind not in ("iu" if integer else "iuf"):
        kind = "integers" if integer else "numbers"
        raise TypeError(f"{name}: expected {kind}, got dtype {arr.dtype}")
    if arr.ndim > 1:
        raise ValueError(f"{name}: expected a scalar or a 1-D array, got shape {arr.shape}")
    if arr.ndim == 1 and len(arr) not in (1, requests):
        raise ValueError(
            f"{name}: has {len(arr)} entries; expected 1 or one per request ({requests})"
        )
    if integer and arr.dtype == np.uint64:
        # Past int64 it would wrap negative; any k that large keeps every token. (Narrower
        # unsigned types fit: numpy 2 refuses int64's maximum as their scalar.)
        arr = np.minimum(arr, np.uint64(_INT64.max))
    return np.ascontiguousarray(arr.reshape(-1), dtype=np.int64 if integer else np.float64)


def _check_options(
    seed: Any, draft_sampling: Any, posterior_threshold: Any, posterior_alpha: Any, requests: int
) -> int | np.ndarray:
    """The options every call validates, sampled or not (a `seed` passed without a
    temperature is still checked, not ignored): returns the seed to use."""
    if draft_sampling not in ("with_replacement", "without_replacement"):
        raise ValueError(
            "draft_sampling: expected 'with_replacement' or 'without_replacement', "
            f"got {draft_sampling!r}"
        )
    for name, x in (
        ("posterior_threshold", posterior_threshold),
        ("posterior_alpha", posterior_alpha),
    ):
        if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
            raise TypeError(f"{name}: expected a float, got {type(x).__name__}")
        if not (math.isfinite(x) and x >= 0):
            raise ValueError(f"{name}: expected a finite value >= 0, got {x}")
    return _seed(seed, requests)


def _seed(seed: Any, requests: int) -> int | np.ndarray:
    """An int in [0, 2**64) for the batch (None draws one), or one per request: a uint64
    array from any integer array-like (a list, numpy, a torch tensor) of `requests` such
    values, counted before they are read (a broadcast view may claim 2**40)."""
    if seed is None:
        return secrets.randbits(64)
    if isinstance(seed, bool):
        raise TypeError("seed: expected an int, got bool")
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, np.timedelta64):
        if not 0 <= int(seed) < _U64:
            raise ValueError(f"seed: expected an int in [0, 2**64), got {seed}")
        return int(seed)
    if isinstance(seed, (str, bytes, float, np.floating)):
        raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
    # A list is read item by item: numpy would turn [2**63, 7] into float64, losing bits.
    items = seed if isinstance(seed, (list, tuple)) else None
    if items is None:
        array = np.asarray(_torch.host_array(seed, "seed"))
        if array.ndim == 0:
            if array.dtype.kind in "iu":
                return _seed(int(array), requests)  # a 0-d integer array or tensor: one seed
            # numpy wraps any object (a torch.Generator, None-like values) as 0-d.
            raise TypeError(
                f"seed: expected an int or a 1-D integer sequence, got {type(seed).__name__}"
            )
        if array.ndim != 1:
            raise ValueError(f"seed: per-request seeds must be a 1-D sequence, got {array.ndim}-D")
        if array.dtype.kind not in "iu":
            raise TypeError(f"seed: expected integers (one per request), got {array.dtype}")
        _check_seed_count(len(array), requests)
        items = array.tolist()
    else:
        _check_seed_count(len(items), requests)
    values = []
    for b, x in enumerate(items):
        if isinstance(x, (bool, np.bool_, np.timedelta64)) or not isinstance(x, (int, np.integer)):
            raise TypeError(f"seed[{b}]: expected an int, got {type(x).__name__}")
        values.append(int(x))
    for b, x in enumerate(values):
        if not 0 <= x < _U64:
            raise ValueError(f"seed[{b}]: expected an int in [0, 2**64), got {x}")
    return np.array(values, dtype=np.uint64)


def _check_seed_count(count: int, requests: int) -> None:
    if count != requests:
        raise ValueError(
            f"seed: has {count} per-request seeds, expected one per request ({requests})"
        )


def _verify_sampled(
    tree: Any,
    logits: Any,
    reduce: Reduce,
    temperature: Any,
    top_k: Any,
    top_p: Any,
    seed: Any,
    draft_probs: Any,
    draft_sampling: Any,
    rule: Any,
    posterior_threshold: Any,
    posterior_alpha: Any,
) -> VerifyResult | BatchVerifyResult:
    requests = _requests(tree)
    temps = _param(temperature, "temperature", 0.0, integer=False, requests=requests)
    ks = _param(top_k, "top_k", 0, integer=True, requests=requests)
    ps = _param(top_p, "top_p", 1.0, integer=False, requests=requests)
    seed = _check_options(seed, draft_sampling, posterior_threshold, posterior_alpha, requests)
    if rule not in (None, "typical"):
        raise ValueError(f"rule: expected None or 'typical', got {rule!r}")
    if rule == "typical" and draft_probs is not None:
        raise ValueError("draft_probs: typical acceptance does not use draft probabilities")
    core_rule = (
        "typical" if rule == "typical" else ("match" if draft_probs is None else "rejection")
    )
    dtype = None
    if _reduce_on_device(logits, reduce):
        if core_rule != "match":
            raise ValueError(
                f"reduce: the device path samples deterministic drafts only; rule "
                f"{core_rule!r} needs logits (and draft_probs) in CPU memory"
            )
        _check_device_inputs(tree, logits)
        choice, nan_rows, no_finite_rows = _torch.device_sample(logits, tree, temps, ks, ps, seed)
        return _core.verify_target_tokens(tree, choice, nan_rows, no_finite_rows)
    if _torch.is_tensor(logits):
        logits, dtype = _torch.cpu_view(logits)
    if draft_probs is not None and _torch.is_tensor(draft_probs):
        if draft_probs.device.type != "cpu":
            raise ValueError(
                f"draft_probs: expected CPU memory for host verification, got {draft_probs.device}"
            )
        draft_probs, probs_dtype = _torch.cpu_view(draft_probs, "draft_probs")
        if probs_dtype is not None:
            raise TypeError("draft_probs: expected float32 or float64, got torch.bfloat16")
    return _core.verify_sampled(
        tree,
        logits,
        temps,
        ks,
        ps,
        seed,
        logits_dtype=dtype,
        rule=core_rule,
        draft_probs=draft_probs,
        without_replacement=draft_sampling == "without_replacement",
        posterior_threshold=float(posterior_threshold),
        posterior_alpha=float(posterior_alpha),
    )
