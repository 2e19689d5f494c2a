"""Lazy torch adapter: CPU tensors become zero-copy numpy views, CUDA work stays on the device.

torch is an optional dependency; nothing here imports it until a tensor is actually passed.
CPU tensors are handed to Rust as numpy views of the same memory (bfloat16, which numpy lacks,
as its 16-bit patterns). For CUDA logits the reduction runs on the device and only `[T]`
choices (plus a `[T]` NaN flag) cross to the host, in one transfer.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import numpy as np

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


def cpu_view(t: torch.Tensor) -> tuple[np.ndarray, str | None]:
    """A numpy view sharing `t`'s memory, and "bfloat16" when the view holds bf16 bit patterns.

    Tensors that require grad are detached (same storage), never copied.
    """
    import torch

    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy(), "bfloat16"
    if not t.is_floating_point():
        raise TypeError(f"logits: expected a floating-point tensor, got {t.dtype}")
    try:
        return t.numpy(), None
    except TypeError as e:  # float8 and other formats numpy cannot hold
        raise TypeError(f"logits: unsupported dtype {t.dtype} ({e})") from None


def raw_cpu_view(t: torch.Tensor) -> np.ndarray:
    """A numpy view of any CPU tensor's bytes, for dtype-agnostic in-place moves."""
    import torch

    t = t.detach()
    try:
        return t.numpy()
    except TypeError:  # bfloat16, float8, ...: reinterpret as integers of the same width
        return t.view(getattr(torch, _INT_OF_SIZE[t.element_size()])).numpy()


def check_logits(logits: torch.Tensor, num_nodes: int) -> None:
    """The checks Rust applies to host logits, for logits that never reach Rust."""
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
    """Greedy choice of every row on the logits' device: `(choice int64 [T], nan bool [T])`.

    torch's argmax picks the first maximum and treats NaN as the maximum, so gathering the
    picked value tells, per row, whether the row holds a NaN. The flag rides in the choice's
    sign (`-1 - choice` for a NaN row), so exactly `T` int64 cross to the host, in one transfer.
    """
    import torch

    with torch.no_grad():
        choice = torch.argmax(logits, dim=-1)
        nan = torch.isnan(logits.gather(-1, choice.unsqueeze(-1)).squeeze(-1))
        encoded = torch.where(nan, -1 - choice, choice)
        if encoded.device.type == "cuda":
            host = torch.empty(encoded.shape, dtype=torch.int64, pin_memory=True)
            host.copy_(encoded, non_blocking=True)
            torch.cuda.current_stream(encoded.device).synchronize()
        else:
            host = encoded.cpu()
    out = host.numpy()
    nan_rows = out < 0
    return np.where(nan_rows, -1 - out, out), nan_rows


def compact_on_device(cache: torch.Tensor, moves: tuple[Any, Any, Any, int, int]) -> None:
    """Applies checked moves `(req, src, dst, seq_dim, batch_dim)` to a device tensor in place.

    The gather on the right-hand side is materialised before the write, so moves that chain
    (a later source is an earlier destination) are safe in one indexed copy.
    """
    import torch

    req, src, dst, seq_dim, batch_dim = moves
    if len(src) == 0:
        return
    device = cache.device
    target = cache.detach()
    # Moving bytes needs no arithmetic: index ops on an integer view of the same width work
    # for every dtype, float8 included (whose index_copy_ torch does not implement).
    width = _INT_OF_SIZE.get(target.element_size())
    if width is not None and not target.is_complex():
        target = target.view(getattr(torch, width))
    src_t = torch.as_tensor(src, device=device)
    dst_t = torch.as_tensor(dst, device=device)
    with torch.no_grad():
        if batch_dim < 0:
            target.index_copy_(seq_dim, dst_t, target.index_select(seq_dim, src_t))
        else:
            req_t = torch.as_tensor(req, device=device)
            moved = target.movedim((batch_dim, seq_dim), (0, 1))
            moved[req_t, dst_t] = moved[req_t, src_t]


def host_array(x: Any) -> Any:
    """Small index tensors (choices, slots) as host numpy arrays; other inputs unchanged."""
    if is_tensor(x):
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        return t.numpy()
    return x
