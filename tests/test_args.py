"""The Python layer's scalar arguments are checked in one place (`specsched._args`): a count
reads the same, and is refused the same way, in every module that takes one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from specsched import generate, sglang, sim
from specsched._args import float_arg, int_arg
from specsched.drafting import SuffixTreeDrafter

# (name, low, a call taking the value)
COUNTS: list[tuple[str, int, Callable[[Any], object]]] = [
    ("gamma", 0, lambda v: sim.expected_tokens_chain(0.5, v)),
    ("budget", 1, lambda v: SuffixTreeDrafter(budget=v)),
    ("max_new_tokens", 1, lambda v: generate(None, None, [[1]], v)),
    ("topk", 1, lambda v: sglang.build_tree_kernel_efficient(*[None] * 5, 0, v, 1, 1)),
]


@pytest.mark.parametrize(("name", "low", "call"), COUNTS, ids=[c[0] for c in COUNTS])
def test_counts_are_refused_alike_everywhere(
    name: str, low: int, call: Callable[[Any], object]
) -> None:
    for flag in (True, np.bool_(True)):
        with pytest.raises(TypeError, match=f"^{name}: expected an int, got {type(flag).__name__}"):
            call(flag)
    for wrong in (2.0, "2", None):
        with pytest.raises(
            TypeError, match=f"^{name}: expected an int, got {type(wrong).__name__}"
        ):
            call(wrong)
    with pytest.raises(ValueError, match=f"^{name}: must be >= {low}, got {low - 1}$"):
        call(np.int64(low - 1))


def test_int_arg_takes_what_indexes() -> None:
    assert int_arg(np.uint64(2**63), "n", 0) == 2**63
    assert type(int_arg(np.int32(3), "n")) is int
    assert int_arg(np.array(5), "n", 5) == 5  # a 0-d int array indexes
    # One element is a per-request array, not a scalar; a bool tensor is a flag.
    with pytest.raises(TypeError, match=r"^n: expected an int, got a 1-D ndarray"):
        int_arg(np.array([5]), "n")
    torch = pytest.importorskip("torch")
    assert int_arg(torch.tensor(7), "n", 0) == 7
    with pytest.raises(TypeError, match=r"^n: expected an int, got a 1-D Tensor"):
        int_arg(torch.tensor([2]), "n")
    with pytest.raises(TypeError, match=r"^n: expected an int, got Tensor of torch\.bool"):
        int_arg(torch.tensor(True), "n")


def test_float_arg_maps_huge_ints_to_infinity() -> None:
    assert float_arg(10**400, "x") == float("inf")
    assert float_arg(-(10**400), "x") == float("-inf")
    assert type(float_arg(np.float16(0.5), "x")) is float
    with pytest.raises(TypeError, match=f"x: expected a number, got {type(np.bool_(0)).__name__}$"):
        float_arg(np.bool_(False), "x")
