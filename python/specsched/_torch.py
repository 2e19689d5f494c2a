"""Lazy torch adapter: CPU tensors become zero-copy numpy views, CUDA work stays on the device.

torch is an optional dependency; nothing here imports it until a tensor is actually passed.
CPU tensors are handed to Rust as numpy views of the same memory (bfloat16, which numpy lacks,
as its 16-bit patterns). For CUDA logits the reduction runs on the device and only `[T]`
choices (plus a `[T]` NaN flag) cross to the host, in one transfer.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from specsched import _core

if TYPE_CHECKING:
    import torch

_NOT_TENSORS = frozenset({np.ndarray, int, list, tuple, type(None)})

# numpy-less torch dtypes are moved as raw integers of the same width.
_INT_OF_SIZE = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}


def is_tensor(x: object) -> bool:
    """True for a torch.Tensor, without importing torch."""
    # numpy arrays and ints are the common case; isinstance against torch.Tensor goes through
    # a metaclass hook that costs ~0.5 µs per call once torch is imported.
    if type(x) in _NOT_TENSORS:
        return False
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def numpy_of(t: torch.Tensor) -> np.ndarray:
    """`t.numpy()` (same memory), based on `t`'s storage rather than on `t`: rust-numpy's
    borrow registry tells buffers apart by that base, so two specsched calls on one storage
    (a verify of logits that a compaction moves, two compactions of one cache) overlap there
    and the second is refused instead of racing. (`t.numpy()` is based on the tensor object,
    a new one for every `detach()` or slice.)"""
    return _core.key_by_storage(t.numpy(), t)


def cpu_view(t: torch.Tensor, arg: str = "logits") -> tuple[np.ndarray, str | None]:
    """A numpy view sharing `t`'s memory, and "bfloat16" when the view holds bf16 bit patterns.
    `arg` names the tensor in errors.

    Tensors that require grad are detached (same storage), never copied.
    """
    import torch

    check_dense(t, arg)
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return numpy_of(t.resolve_neg().view(torch.int16)), "bfloat16"
    if not t.is_floating_point():
        raise TypeError(f"{arg}: expected a floating-point tensor, got {t.dtype}")
    try:
        return numpy_of(t), None
    except TypeError:  # float8 and other formats numpy cannot hold
        raise TypeError(
            f"{arg}: dtype {t.dtype} has no host kernel (float16/32/64 and bfloat16 do): "
            f"pass {arg}.float()"
        ) from None
    except RuntimeError:
        # A lazy negation (`x.conj().imag`): its values are the negated storage, so they are
        # materialised (a copy; only then, the common case costs nothing).
        if not t.is_neg():
            raise
        return numpy_of(t.resolve_neg()), None


def host_view(t: torch.Tensor) -> Any:
    """A numpy view of a CPU tensor numpy can hold (same memory); the tensor itself on other
    devices and for bfloat16.

    For a target to hand its logits to specsched right after its forward (`raw_cpu_view` is
    the one for a cache): the conversion then runs while torch's code is still in the CPU
    caches (~2 µs), instead of at specsched's next call, after the forward has evicted them
    (15-35 µs on a 2-core VM).
    """
    import torch

    if t.device.type != "cpu" or t.dtype == torch.bfloat16:
        return t
    try:
        return numpy_of(t.detach())
    except (TypeError, RuntimeError):  # float8, sparse, a lazily negated view: verify's own
        return t


def synchronizer(device: torch.device) -> Callable[[], None] | None:
    """A target's `synchronize`: a call waiting for the work queued on `device` (CUDA runs
    kernels asynchronously), or None where there is nothing to wait for, so that `generate`
    makes no call at all on the CPU."""
    import torch

    if device.type != "cuda":
        return None
    return partial(torch.cuda.synchronize, device)


def raw_cpu_view(t: torch.Tensor, arg: str = "cache") -> np.ndarray:
    """A numpy view of any CPU tensor's bytes, for dtype-agnostic in-place moves. `arg`
    names the tensor in errors (a strided layout numpy cannot view: sparse, nested)."""
    import torch

    t = t.detach()
    if t.is_conj():
        # Moves permute stored values: the storage's own view (conj of a conj view) will do.
        t = t.conj()
    check_movable(t, arg)
    try:
        return numpy_of(t)
    except TypeError:  # bfloat16, float8, ...: reinterpret as integers of the same width
        return numpy_of(t.view(getattr(torch, _INT_OF_SIZE[t.element_size()])))


def check_movable(t: torch.Tensor, arg: str) -> None:
    """Refuses a cache tensor whose values have no strided storage to move in place (on any
    device): a lazily negated view, a sparse or a nested tensor, each named by `arg`."""
    check_dense(t, arg)
    if t.is_neg():
        raise TypeError(
            f"{arg}: a lazily negated view (negative bit set) has no storage of its values to "
            "compact in place; pass the tensor it views"
        )


def check_dense(t: torch.Tensor, arg: str) -> None:
    """Refuses a tensor without one strided array of values (sparse, mkldnn, nested), named
    by `arg`: torch's own errors on those name an operator, not the argument."""
    import torch

    if t.is_nested:  # its layout reads "strided", but its components have shapes of their own
        raise TypeError(f"{arg}: a nested tensor has no single shape; pass its parts")
    if t.layout != torch.strided:
        raise TypeError(f"{arg}: expected a dense (strided) tensor, got layout {t.layout}")


def check_logits(logits: torch.Tensor, num_nodes: int) -> None:
    """The checks Rust applies to host logits, for logits that never reach Rust."""
    check_dense(logits, "logits")
    if logits.ndim != 2:
        raise ValueError(
            f"logits: expected a 2-D array, got {logits.ndim}-D with shape {tuple(logits.shape)}"
        )
    if not logits.is_floating_point():
        raise TypeError(f"logits: expected a floating-point tensor, got {logits.dtype}")
    if logits.shape[0] != num_nodes:
        raise ValueError(
            f"logits: has {logits.shape[0]} rows, expected one per tree node ({num_nodes})"
        )
    if logits.shape[1] == 0:
        raise ValueError("logits: has an empty vocabulary axis (0 columns)")


def device_argmax(logits: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Greedy choice of every row on the logits' device: `(choice int64 [T], nan bool [T])`
    (a NaN row's choice is 0).

    torch's `max` picks the first maximum and propagates NaN, so a row holds a NaN iff its
    maximum is NaN; such a row's choice becomes -1. Three kernels and one `[T]` int64
    transfer: on the H200 here a greedy reduction of `[64, 32000]` logits takes 62 µs to the
    host, where a gather / isnan / where encoding and a pinned buffer per call took 89-104 µs
    (kernel launches and the host wait dominate at these sizes).
    """
    import torch

    if logits.element_size() == 1:
        # float8: torch has no max for it; float32 holds every value (NaN too), so the choice
        # is the same, and the sampled device path computes in float32 as well.
        logits = logits.float()
    with torch.no_grad():
        values, choice = torch.max(logits, dim=-1)
        out = torch.where(torch.isnan(values), -1, choice).cpu().numpy()
    nan_rows = out < 0
    return np.where(nan_rows, 0, out), nan_rows


_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _signed64(x: int) -> int:
    """A u64 constant as the int64 with the same bits (torch has no uint64 arithmetic)."""
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


def _srl(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's `>>` is arithmetic)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def _mix64(z: torch.Tensor) -> torch.Tensor:
    # int64 products wrap mod 2^64 on CPU and CUDA, as u64 products do.
    z = (z ^ _srl(z, 30)) * _signed64(0xBF58476D1CE4E5B9)
    z = (z ^ _srl(z, 27)) * _signed64(0x94D049BB133111EB)
    return z ^ _srl(z, 31)


def uniform(
    seed: int | torch.Tensor, request: torch.Tensor, node: torch.Tensor, draw: int
) -> torch.Tensor:
    """`reference.rng_uniform` for int64 tensors of request and node indices (float64);
    `seed`: one int, or an int64 tensor of seed bit patterns, one per entry."""
    import torch

    if isinstance(seed, torch.Tensor):
        h = _mix64(seed + _signed64(_GOLDEN))  # int64 sums wrap mod 2^64, as u64 sums do
    else:
        h = _mix64(torch.full_like(request, _signed64(seed + _GOLDEN)))
    for c in (request, node, torch.full_like(request, draw)):
        h = _mix64(h ^ (c + _signed64(_GOLDEN)))
    return (_srl(h, 11).to(torch.float64) + 0.5) / float(1 << 53)


def _node_keys(tree: Any) -> tuple[np.ndarray, np.ndarray]:
    """Request index and tree-local index of every node, `[T]` int64 each."""
    offsets = getattr(tree, "offsets", None)
    if offsets is None:
        n = tree.num_nodes
        return np.zeros(n, dtype=np.int64), np.arange(n, dtype=np.int64)
    sizes = np.diff(offsets)
    request = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    return request, np.arange(int(offsets[-1]), dtype=np.int64) - offsets[:-1][request]


def device_sample(
    logits: torch.Tensor,
    tree: Any,
    temperature: np.ndarray,
    top_k: np.ndarray,
    top_p: np.ndarray,
    seed: int | np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One target token per node on the logits' device: `(choice int64 [T], nan bool [T],
    no_finite bool [T])`.

    The same processing (temperature → top-k → top-p, ties as in docs/api.md) and the same
    counter-based uniform per (seed, request, node) as the host path (per-request seeds, a
    uint64 array of B: `(seed[b], 0, node)`), drawn by inverse CDF;
    greedy requests (temperature 0) take the argmax. Rows with a NaN, and sampled rows with no
    finite logit (a greedy one still has its argmax, as on the host), are flagged (an error
    if the walk reaches them). Every row is processed (the device cannot know the walk); only
    the `[T]` results cross to the host, in one transfer.
    """
    import torch

    request, local = _node_keys(tree)
    num_requests = int(request[-1]) + 1 if len(request) else 1
    for name, arr in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)):
        if len(arr) not in (1, num_requests):
            raise ValueError(
                f"{name}: has {len(arr)} entries; expected 1 or one per request ({num_requests})"
            )
    bad_t = ~np.isfinite(temperature) | (temperature < 0)
    if bad_t.any():
        i = int(np.argmax(bad_t))
        raise ValueError(
            f"temperature: entry {i} is {temperature[i]}; expected a finite value >= 0"
        )
    if (top_k < 0).any():
        i = int(np.argmax(top_k < 0))
        raise ValueError(f"top_k: entry {i} is {top_k[i]}; expected >= 0 (0 or None = no top-k)")
    bad_p = ~((top_p > 0) & (top_p <= 1))
    if bad_p.any():
        i = int(np.argmax(bad_p))
        raise ValueError(f"top_p: entry {i} is {top_p[i]}; expected a value in (0, 1]")

    def per_node(arr: np.ndarray) -> np.ndarray:
        return (
            arr[np.minimum(request, len(arr) - 1)] if len(arr) > 1 else np.repeat(arr, len(request))
        )

    device = logits.device
    cdt = torch.float64 if logits.dtype == torch.float64 else torch.float32
    vocab = logits.shape[1]
    with torch.no_grad():
        x = logits.detach().to(cdt)
        t = torch.as_tensor(per_node(temperature), device=device)
        k = torch.as_tensor(per_node(top_k), device=device)
        p = torch.as_tensor(per_node(top_p), device=device)
        nan = torch.isnan(x).any(dim=-1)
        greedy_choice = torch.argmax(x, dim=-1)
        m = x.max(dim=-1, keepdim=True).values
        sampled = t > 0
        no_finite = (m.squeeze(-1) == float("-inf")) & sampled & ~nan
        pos_inf = m == float("inf")
        x = torch.where(pos_inf, torch.where(x == float("inf"), 0.0, float("-inf")).to(cdt), x)
        m = torch.where(pos_inf, 0.0, m).to(cdt)
        # Temperatures in the compute type's range: cast, 1e-50 would become 0 (0/0 = NaN at
        # the maximum) and 1e39 inf (-inf/inf = NaN). Clamped, the smallest divides every
        # gap to -inf and the largest every finite one to ~0, as the host's float64 does.
        info = torch.finfo(cdt)
        scale = torch.where(sampled, t, 1.0).clamp(info.tiny, info.max).to(cdt)
        z = (x - m) / scale[:, None]
        use_k = (k > 0) & (k < vocab)
        if bool(use_k.any()):
            kmax = int(k[use_k].max())
            top = torch.topk(z, kmax, dim=-1).values
            kth = top.gather(-1, (k.clamp(1, kmax) - 1)[:, None])
            z = torch.where(use_k[:, None] & (z < kth), float("-inf"), z)
        w = torch.exp(z)
        total = w.sum(dim=-1)
        use_p = p < 1
        if bool(use_p.any()):
            # Descending, ties to the lower id: a stable sort keeps equal values in id order.
            zs, order = torch.sort(z, dim=-1, descending=True, stable=True)
            ws = torch.exp(zs)
            before = torch.cumsum(ws, dim=-1) - ws
            keep_sorted = before < (p.to(cdt) * total)[:, None]
            # The most likely token is always kept (the host keeps it for any p > 0): a p
            # below the compute type's smallest value rounds to 0 and would keep nothing
            # (then every draw fell past the end: token -1, the walk's stop marker).
            keep_sorted[:, 0] = True
            keep = torch.empty_like(keep_sorted).scatter_(-1, order, keep_sorted)
            w = torch.where(use_p[:, None] & ~keep, 0.0, w).to(cdt)
            total = w.sum(dim=-1)
        if isinstance(seed, np.ndarray):
            if len(seed) != num_requests:
                raise ValueError(
                    f"seed: has {len(seed)} per-request seeds, expected one per request "
                    f"({num_requests})"
                )
            # Each request's own seed, as int64 bit patterns; the request key is 0.
            keys = torch.as_tensor(seed.view(np.int64)[request], device=device)
            u = uniform(keys, torch.zeros_like(keys), torch.as_tensor(local, device=device), 0)
        else:
            u = uniform(
                seed,
                torch.as_tensor(request, device=device),
                torch.as_tensor(local, device=device),
                0,
            )
        target = (u * total.to(torch.float64)).to(cdt)
        cum = torch.cumsum(w, dim=-1)
        idx = torch.searchsorted(cum, target[:, None], right=True).squeeze(-1)
        last = torch.where(w > 0, torch.arange(vocab, device=device), -1).max(dim=-1).values
        idx = torch.where(idx >= vocab, last, idx)
        choice = torch.where(sampled, idx, greedy_choice)
        packed = torch.stack([choice, nan.to(torch.int64), no_finite.to(torch.int64)])
        if packed.device.type == "cuda":
            host = torch.empty(packed.shape, dtype=torch.int64, pin_memory=True)
            host.copy_(packed, non_blocking=True)
            torch.cuda.current_stream(packed.device).synchronize()
        else:
            # The CPU's own tensor, or another device's (MPS, XPU) copied over.
            host = packed.cpu()
    out = host.numpy()
    return out[0], out[1].astype(bool), out[2].astype(bool)


def compact_on_device(
    caches: Sequence[torch.Tensor], moves: tuple[Any, Any, Any, int, int]
) -> None:
    """Applies checked moves `(req, src, dst, seq_dim, batch_dim)` in place to each of `caches`
    (device tensors of one shape, on one device): the move indices cross to the device once.

    The gather on the right-hand side is materialised before the write, so moves that chain
    (a later source is an earlier destination) are safe in one indexed copy.
    """
    import torch

    req, src, dst, seq_dim, batch_dim = moves
    if len(src) == 0:
        return
    req_t, src_t, dst_t = torch.as_tensor(np.stack([req, src, dst]), device=caches[0].device)
    with torch.no_grad():
        for cache in caches:
            target = cache.detach()
            # Moving bytes needs no arithmetic: index ops on an integer view of the same width
            # work for every dtype, float8 included (whose index_copy_ torch does not implement).
            width = _INT_OF_SIZE.get(target.element_size())
            if width is not None and not target.is_complex():
                target = target.view(getattr(torch, width))
            if batch_dim < 0:
                target.index_copy_(seq_dim, dst_t, target.index_select(seq_dim, src_t))
            else:
                moved = target.movedim((batch_dim, seq_dim), (0, 1))
                moved[req_t, dst_t] = moved[req_t, src_t]


def buffer_description(t: torch.Tensor) -> tuple[int, list[int], list[int], int]:
    """`(address, shape, byte strides, itemsize)` of a tensor's memory, as
    `_core.check_cache_buffers` takes it."""
    item = t.element_size()
    return t.data_ptr(), list(t.shape), [s * item for s in t.stride()], item


def check_has_data(t: torch.Tensor, arg: str, index: int | None = None) -> None:
    """Refuses tensors on the meta device: they have a shape but no data to read or move.
    `index`: the tensor is entry `index` of the sequence `arg` (named `arg[index]`, formatted
    only when refused: a layered cache checks dozens of entries a step)."""
    if t.device.type == "meta":
        name = arg if index is None else f"{arg}[{index}]"
        raise ValueError(f"{name}: a tensor on the meta device holds no data")


def host_array(x: Any, arg: str, floats: bool = False) -> Any:
    """Small tensors (choices, slots, per-request parameters) as host numpy arrays; other
    inputs unchanged. For a float argument (`floats`), floats numpy cannot hold (bfloat16,
    float8) are widened to float32 (a handful of values); anywhere else they are named as
    they came (widened, an int argument's error named float32, a dtype never passed). A
    tensor numpy cannot view is a TypeError naming `arg`."""
    if is_tensor(x):
        import torch

        check_has_data(x, arg)
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        narrow = t.is_floating_point() and t.element_size() < 4 and t.dtype != torch.float16
        if narrow and floats:
            t = t.float()
        try:
            return numpy_of(t.resolve_conj().resolve_neg())
        except (TypeError, RuntimeError) as e:
            raise TypeError(f"{arg}: a {t.dtype} tensor numpy cannot hold ({e})") from None
    return x
