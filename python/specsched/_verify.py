"""`verify`: the longest accepted path of a tree (or a batch) against the target's output.

Greedy verification per DESIGN §4: the target's choice at node v is the argmax of row v
(ties to the lowest id); the walk accepts, from the root, the first child whose token equals
the choice, and stops with the choice as the bonus token. Host logits (numpy, torch CPU in any
float format) are read in place by Rust, which reduces only the rows the walk visits; CUDA
logits are reduced on the device and only `[T]` choices cross to the host.
"""

from __future__ import annotations

from typing import Any, Literal

from specsched import _core, _torch
from specsched._core import BatchVerifyResult, Tree, TreeBatch, VerifyResult

Reduce = Literal["auto", "host", "device"]


def verify(
    tree: Tree | TreeBatch,
    logits: Any = None,
    *,
    target_tokens: Any = None,
    reduce: Reduce = "auto",
) -> VerifyResult | BatchVerifyResult:
    """Greedy verification of `tree` (a Tree or a TreeBatch).

    Pass exactly one of `logits` (`[N, V]` / `[T, V]`: numpy float16/32/64, or a torch tensor on
    any device, bfloat16 included) or `target_tokens` (the target's choice per node, `[N]` /
    `[T]`). `reduce` picks where logits are reduced: "host" (Rust, visited rows only), "device"
    (torch argmax over every row on the tensor's device, then the walk), or "auto" (host for
    CPU memory, device for CUDA).
    """
    if (logits is None) == (target_tokens is None):
        raise TypeError("verify: pass exactly one of logits or target_tokens")
    if reduce not in ("auto", "host", "device"):
        raise ValueError(f"reduce: expected 'auto', 'host' or 'device', got {reduce!r}")
    if target_tokens is not None:
        return _core.verify_target_tokens(tree, _torch.host_array(target_tokens))
    if _torch.is_tensor(logits):
        on_device = logits.device.type != "cpu"
        if on_device and reduce == "host":
            raise ValueError(
                f"reduce: 'host' needs logits in CPU memory, got a tensor on {logits.device}"
            )
        if on_device or reduce == "device":
            if not isinstance(tree, (Tree, TreeBatch)):
                raise TypeError(f"tree: expected a Tree or a TreeBatch, got {type(tree).__name__}")
            _torch.check_logits(logits, tree.num_nodes)
            choice, nan_rows = _torch.device_argmax(logits)
            return _core.verify_target_tokens(tree, choice, nan_rows)
        array, dtype = _torch.cpu_view(logits)
        return _core.verify_greedy(tree, array, dtype)
    if reduce == "device":
        raise ValueError("reduce: 'device' needs torch logits")
    return _core.verify_greedy(tree, logits)
