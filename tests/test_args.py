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


def test_durations_are_not_numbers() -> None:
    """np.timedelta64 subclasses np.signedinteger: checks by `isinstance(x, np.integer)` or
    `np.issubdtype(dtype, np.integer)` took a duration as a count, a seed or a sampling
    parameter (`temperature=np.timedelta64(1, 's')` sampled)."""
    import specsched as ss

    second = np.timedelta64(1, "s")
    with pytest.raises(TypeError, match=r"^x: expected a number, got timedelta64$"):
        float_arg(second, "x")
    with pytest.raises(TypeError, match=r"^n: expected an int, got timedelta64$"):
        int_arg(second, "n")
    tree, logits = ss.Tree.chain([1, 2]), np.zeros((2, 8), np.float32)
    for kw, arg in [
        ({"temperature": second}, "temperature"),
        ({"temperature": np.array([1], "m8[s]")}, "temperature"),
        ({"top_k": np.array([2], "m8[D]")}, "top_k"),
        ({"top_p": np.timedelta64(1, "ns")}, "top_p"),
        ({"seed": second}, "seed"),
        ({"seed": [second]}, r"seed\[0\]"),
    ]:
        with pytest.raises(TypeError, match=f"^{arg}: expected"):
            ss.verify(tree, logits, **{"temperature": 1.0, **kw})
    with pytest.raises(TypeError, match=r"^input_ids\[0\]: expected a sequence of int token"):
        generate(_NoTarget(), None, [np.array([1, 2], "m8[s]")], 1)


class _NoTarget:
    """The target protocol's methods, never reached: the arguments are refused first."""

    def prefill(self, input_ids: Any) -> Any:
        raise AssertionError("prefill ran")

    forward_tree = accept = prefill


def test_unsigned_top_k_of_any_width_is_a_count() -> None:
    """numpy 2 refuses int64's maximum as a uint32 scalar: clamping a narrow unsigned top_k
    to it raised an unnamed OverflowError; only uint64 can pass int64."""
    import specsched as ss

    tree, logits = ss.Tree([-1, 0, 0], [0, 1, 2]), np.array([[0.0, 1.0, 2.0, 0.5]] * 3)
    for seed in range(8):
        kw = {"temperature": 1.0, "seed": seed}
        want = ss.verify(tree, logits, top_k=2, **kw).tokens.tolist()
        for top_k in (np.uint8(2), np.uint16(2), np.uint32(2), np.array([2], np.uint32)):
            assert ss.verify(tree, logits, top_k=top_k, **kw).tokens.tolist() == want


def test_toy_models_name_their_arguments() -> None:
    """`specsched.testing.toy_models` is public: numpy's "negative dimensions are not allowed"
    for vocab=-1, a bare IndexError later for vocab=1 (the context is tokens (0, 1)), and a
    NaN mismatch surfacing as a draft_probs error were what a caller got."""
    from specsched.testing import toy_models

    assert toy_models(vocab=2).target_logits.shape == (2, 2, 2)
    for kw, exc, match in [
        ({"vocab": 1}, ValueError, "^vocab: must be >= 2, got 1"),
        ({"vocab": -1}, ValueError, "^vocab: must be >= 2"),
        ({"vocab": 1.5}, TypeError, "^vocab: expected an int, got float"),
        ({"vocab": 257}, ValueError, r"^vocab: at most 256 \(each model is a \[V, V, V\] table"),
        ({"seed": -1}, ValueError, "^seed: must be >= 0"),
        ({"mismatch": float("nan")}, ValueError, "^mismatch: expected a finite number >= 0"),
        ({"mismatch": -0.5}, ValueError, "^mismatch: expected a finite number >= 0"),
        ({"mismatch": "1"}, TypeError, "^mismatch: expected a number, got str"),
    ]:
        with pytest.raises(exc, match=match):
            toy_models(**kw)
