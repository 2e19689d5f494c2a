"""KV cache after verification (DESIGN §5): plans, in-place compaction, paged slot commits.

Host buffers (numpy arrays of any dtype, torch CPU tensors viewed without a copy) are moved in
place by Rust with the GIL released; CUDA tensors get the same checked plan applied on the
device with one indexed copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specsched import _core, _torch
from specsched._core import BatchVerifyResult, VerifyResult

Result = VerifyResult | BatchVerifyResult

# Length arguments that are never torch tensors: Rust reads them as they are.
_HOST_LENGTHS = frozenset({np.ndarray, int})
# Module names for compact_kv's decode-loop call: one dict lookup each instead of two.
_NDARRAY = np.ndarray
_compact_kv = _core.compact_kv


def kv_compaction_plan(
    result: Result, prefix_lens: Any, active: Any = None
) -> tuple[np.ndarray, ...]:
    """`(src, dst)` int64 sequence positions for a VerifyResult, `(req, src, dst)` for a batch.

    Only moves with `src != dst`, in an order that is safe to apply one after another. For a
    batch, `active` (bool `[B]`, None = all) marks the requests that commit: the others (a
    finished request, a padding row of a fixed-size batch) move nothing.
    """
    return _core.kv_compaction_plan(
        result,
        _torch.host_array(prefix_lens, "prefix_lens"),
        _torch.host_array(active, "active"),
    )


def compact_kv(
    cache: Any,
    result: Result,
    prefix_lens: Any,
    seq_dim: int,
    *,
    batch_dim: int | None = None,
    active: Any = None,
) -> Any:
    """Moves the accepted nodes' KV entries to `prefix + 0..k` along `seq_dim`, in place.

    `cache` is a numpy array or a torch tensor (CPU or CUDA) with a sequence axis; for a
    BatchVerifyResult it also has a batch axis (`batch_dim`, default 0) with one row per
    request, and `prefix_lens` is an int or one int per request. `cache` may also be a list or
    tuple of such buffers of one shape (a model's layers, keys and values: HF's per-layer
    tensors), all on the host or all on one device: the plan is made once and applied to each
    (on a device, its indices are copied there once). Buffers that may share memory are
    refused, naming the pair; a refused call writes nothing.

    Returns the committed lengths `prefix + k + 1` (the accepted path, root slot included): an
    int for a VerifyResult, int64 `[B]` (host) for a batch. A target's length bookkeeping
    then needs no array arithmetic of its own.

    For a batch, `active` (bool `[B]`, None = all) marks the requests that commit: one that
    does not (a finished request still verifying its root, a padding row of a fixed-size
    batch) moves nothing and keeps its length, `prefix_lens[b]`.
    """
    # The decode loop's call first: a host numpy cache and host lengths go straight to Rust.
    # Right after a model forward every Python function called here costs µs.
    if (
        type(cache) is _NDARRAY
        and type(prefix_lens) in _HOST_LENGTHS
        and (active is None or type(active) is _NDARRAY)
    ):
        return _compact_kv(cache, result, prefix_lens, seq_dim, batch_dim, active)
    prefix_lens = _torch.host_array(prefix_lens, "prefix_lens")
    active = _torch.host_array(active, "active")
    if isinstance(cache, list | tuple):
        return _compact_all(cache, result, prefix_lens, seq_dim, batch_dim, active)
    if _torch.is_tensor(cache):
        _torch.check_has_data(cache, "cache")
        if cache.device.type != "cpu":
            return _compact_all(
                [cache], result, prefix_lens, seq_dim, batch_dim, active, listed=False
            )
        cache = _torch.raw_cpu_view(cache)
    return _core.compact_kv(cache, result, prefix_lens, seq_dim, batch_dim, active)


def _compact_all(
    caches: list[Any] | tuple[Any, ...],
    result: Result,
    prefix_lens: Any,
    seq_dim: int,
    batch_dim: int | None,
    active: Any,
    listed: bool = True,
) -> Any:
    """`compact_kv` of a list or tuple of buffers: host ones (numpy, torch CPU) in one Rust
    call, device tensors with one plan and one copy of its indices to the device. One pass over
    the buffers (a layered cache has dozens), one torch call or two for each. `listed`: False
    for the one tensor `compact_kv` was given (messages then name `cache`)."""
    host: list[Any] = []
    devices = set()
    for i, c in enumerate(caches):
        if not _torch.is_tensor(c):
            host.append(c)
        elif c.device.type == "cpu":
            host.append(_torch.raw_cpu_view(c, f"cache[{i}]" if listed else "cache"))
        else:
            _torch.check_has_data(c, "cache", i)
            # What `raw_cpu_view` refuses of a host tensor, before any buffer is written.
            _torch.check_movable(c, f"cache[{i}]" if listed else "cache")
            devices.add(c.device)
    if not devices:
        return _core.compact_kv(host, result, prefix_lens, seq_dim, batch_dim, active)
    if len(devices) > 1:
        raise ValueError(f"cache: buffers on several devices ({sorted(map(str, devices))})")
    (device,) = devices
    if host:
        raise ValueError(f"cache: host buffers and {device} tensors in one call")
    # Every check before the first move: the buffers are written one after another.
    _core.check_cache_buffers([_torch.buffer_description(c) for c in caches], listed)
    req, src, dst, seq, batch, committed = _core.cache_moves(
        list(caches[0].shape), result, prefix_lens, seq_dim, batch_dim, active
    )
    _torch.compact_on_device(caches, (req, src, dst, seq, batch))
    return committed


def commit_slots(slots: Any, result: Result) -> tuple[Any, Any]:
    """Paged caches: `(kept, freed)` slot ids; kept in path order, freed in node order.

    For a batch, kept is `[B, D+1]` padded with -1 and freed is flat, request-major. torch
    slots give torch results on the slots' device.
    """
    kept, freed = _core.commit_slots(_torch.host_array(slots, "slots"), result)
    if _torch.is_tensor(slots):
        import torch

        return (
            torch.from_numpy(kept).to(slots.device),
            torch.from_numpy(freed).to(slots.device),
        )
    return kept, freed
