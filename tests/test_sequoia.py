"""Sequoia-optimal trees: `ss.optimal_tree` (exact DP and greedy heap), `ss.expected_accept_length`
and `ss.choose_tree`, against exhaustive search and `specsched.reference`."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import specsched as ss
from hypothesis import given, settings
from hypothesis import strategies as st
from specsched import reference as ref
from specsched import sim
from specsched.sim import Acceptance
from strategies import parent_lists

probs = st.lists(
    st.one_of(st.sampled_from([0.0, 0.25, 0.5, 1.0]), st.floats(0, 1)), min_size=1, max_size=5
)


def all_parent_lists(n: int):
    """Every tree of n nodes as a parent list (parents precede children)."""
    return itertools.product(*[range(i) for i in range(1, n)])


def brute_force(p, budget, max_depth):
    best = 1.0
    for n in range(2, budget + 1):
        for ps in all_parent_lists(n):
            parents = [-1, *ps]
            if max(ref.depths(parents)) <= max_depth:
                best = max(best, ref.expected_accept_length(parents, p))
    return best


def value_of(choices, p):
    return ss.expected_accept_length(ss.Tree.from_choices(choices), p)


@settings(max_examples=40, deadline=None)
@given(probs, st.integers(1, 6), st.integers(1, 5))
def test_dp_is_optimal_against_exhaustive_search(p, budget, depth):
    choices, value = ss.optimal_tree(p, budget, depth, method="dp")
    assert value == pytest.approx(brute_force(p, budget, depth), abs=1e-12)
    assert value == pytest.approx(value_of(choices, p), abs=1e-12)
    assert len(choices) < budget
    assert all(len(c) <= depth for c in choices)


@settings(max_examples=60, deadline=None)
@given(probs, st.integers(1, 40), st.one_of(st.none(), st.integers(1, 8)))
def test_dp_matches_reference_for_arbitrary_vectors(p, budget, depth):
    choices, value = ss.optimal_tree(p, budget, depth)
    _, want = ref.optimal_tree(p, budget, depth)
    assert value == pytest.approx(want, abs=1e-9)
    assert value == pytest.approx(value_of(choices, p), abs=1e-9)


@settings(max_examples=80, deadline=None)
@given(probs, st.integers(1, 128), st.one_of(st.none(), st.integers(1, 16)))
def test_heap_and_dp_agree_on_non_increasing_vectors(p, budget, depth):
    p = sorted(p, reverse=True)
    heap_choices, heap_value = ss.optimal_tree(p, budget, depth, method="heap")
    dp_choices, dp_value = ss.optimal_tree(p, budget, depth, method="dp")
    auto = ss.optimal_tree(p, budget, depth)
    assert heap_value == pytest.approx(dp_value, rel=1e-12, abs=1e-12)
    assert auto == (heap_choices, heap_value)  # auto takes the heap for a monotone vector
    for choices in (heap_choices, dp_choices):
        assert value_of(choices, p) == pytest.approx(heap_value, rel=1e-12)
        assert len(choices) < budget
        assert depth is None or all(len(c) <= depth for c in choices)
    if budget <= 20:
        assert heap_value == pytest.approx(ref.optimal_tree_heap(p, budget, depth)[1])


def test_auto_uses_the_dp_for_non_monotone_vectors():
    p = [0.1, 0.8]
    choices, value = ss.optimal_tree(p, 3, max_depth=1)
    assert choices == [(0,), (1,)] and value == pytest.approx(1.9)
    with pytest.raises(ValueError, match="non-increasing"):
        ss.optimal_tree(p, 3, method="heap")


def test_chain_and_star_limits():
    # One rank: the best tree is a chain; depth 1: a star of the best ranks.
    choices, value = ss.optimal_tree([0.5], 5)
    assert choices == [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]
    assert value == pytest.approx(1 + 0.5 + 0.25 + 0.125 + 0.0625)
    choices, value = ss.optimal_tree([0.5, 0.3, 0.1], 10, max_depth=1)
    assert choices == [(0,), (1,), (2,)] and value == pytest.approx(1.9)


@settings(max_examples=60, deadline=None)
@given(parent_lists(1, 30), probs)
def test_expected_accept_length_matches_reference(parents, p):
    tree = ss.Tree(parents, np.zeros(len(parents), np.int64))
    got = ss.expected_accept_length(tree, np.asarray(p))
    assert got == pytest.approx(ref.expected_accept_length(parents, p), rel=1e-12)


@settings(max_examples=30, deadline=None)
@given(
    probs,
    st.floats(0, 2),
    st.dictionaries(st.integers(1, 12), st.floats(0.5, 5), min_size=1, max_size=4),
    st.integers(1, 4),
)
def test_choose_tree_matches_reference(p, t_draft, t_verify, max_depth):
    c = ss.choose_tree(p, t_draft, t_verify, max_depth)
    budget, depth, expected, cost = ref.choose_tree(p, t_draft, t_verify, max_depth)
    assert c.time_per_token == pytest.approx(cost, rel=1e-9)
    assert c.expected_length == pytest.approx(expected, rel=1e-9)
    assert value_of(c.choices, p) == pytest.approx(c.expected_length, rel=1e-9)
    assert (c.depth * t_draft + t_verify[c.budget]) / c.expected_length == pytest.approx(cost)
    assert isinstance(c, ss.TreeChoice)
    if not math.isclose(c.time_per_token, cost, rel_tol=0, abs_tol=0):
        return  # equal-cost ties may pick another (budget, depth)
    assert (c.budget, c.depth) == (budget, depth)


def test_choose_tree_trades_draft_time_for_length():
    p = [0.8, 0.1]
    cheap = ss.choose_tree(p, 0.0, {8: 1.0, 16: 1.0}, 8)
    assert cheap.budget == 16 and cheap.depth > 1
    dear = ss.choose_tree(p, 50.0, {1: 1.0, 8: 1.0}, 8)
    assert dear.budget == 1 and dear.depth == 0 and dear.choices == []


def test_choose_tree_ties_equal_trees_summed_along_different_paths():
    # Depth 2 and depth 3 give trees worth exactly 6.45 (0.15 + 1 + 1 ... by hand), but the DP
    # sums them along different paths: 6.449999999999999 and 6.45. Free drafting: a tie, which
    # goes to the shallower depth (it was depth 3).
    c = ss.choose_tree([0.15, 1.0, 1.0], 0.0, {9: 1.0}, 5)
    assert c.depth == 2 and c.expected_length == pytest.approx(6.45, rel=1e-15)
    assert ref.choose_tree([0.15, 1.0, 1.0], 0.0, {9: 1.0}, 5)[:2] == (9, 2)


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: ss.optimal_tree([1.5], 4), ValueError, r"accept_probs\[0\] = 1.5"),
        (lambda: ss.optimal_tree([0.5, -0.1], 4), ValueError, r"accept_probs\[1\]"),
        (lambda: ss.optimal_tree([math.nan], 4), ValueError, r"accept_probs\[0\]"),
        (lambda: ss.optimal_tree([], 4), ValueError, "accept_probs"),
        (lambda: ss.optimal_tree([0.5], 0), ValueError, "budget"),
        (lambda: ss.optimal_tree([0.5], 4, 0), ValueError, "max_depth"),
        (lambda: ss.optimal_tree([0.5], 4, method="bfs"), ValueError, "method"),
        (lambda: ss.optimal_tree(["a"], 4), TypeError, "accept_probs"),
        (lambda: ss.expected_accept_length([0, 1], [0.5]), TypeError, "tree"),
        (lambda: ss.choose_tree([0.5], -1.0, {4: 1.0}, 3), ValueError, "t_draft"),
        (lambda: ss.choose_tree([0.5], 1.0, {}, 3), ValueError, "t_verify"),
        (lambda: ss.choose_tree([0.5], 1.0, {4: 0.0}, 3), ValueError, r"t_verify\[4\]"),
        (lambda: ss.choose_tree([0.5], 1.0, {0: 1.0}, 3), ValueError, "t_verify"),
        (lambda: ss.choose_tree([0.5], 1.0, [(4, 1.0)], 3), TypeError, "t_verify"),
        (lambda: ss.choose_tree([0.5], 1.0, {True: 1.0, 4: 1.2}, 3), TypeError, "key True"),
        (lambda: ss.choose_tree([0.5], 1.0, {4: 1.0}, 0), ValueError, "max_depth"),
        # Negative counts are the argument's ValueError, not PyO3's unnamed OverflowError.
        (lambda: ss.optimal_tree([0.5], -1), ValueError, "budget: must be >= 1, got -1"),
        (lambda: ss.optimal_tree([0.5], 4, -1), ValueError, "max_depth: must be >= 1, got -1"),
        (lambda: ss.optimal_tree([0.5], 4, 1.5), TypeError, "max_depth: expected an int"),
        (lambda: ss.choose_tree([0.5], 1.0, {4: 1.0}, -2), ValueError, "max_depth"),
        (lambda: ss.AcceptanceStats().optimal_tree(-1), ValueError, "budget"),
        (lambda: ss.AcceptanceStats().optimal_tree(4, -3), ValueError, "max_depth"),
        # The exact DP refuses tables it could not hold, before allocating them (an
        # increasing vector takes the DP: the heap would not be exact).
        (lambda: ss.optimal_tree([0.1, 0.2], 65536), ValueError, "budget: the exact DP"),
        # ... and runs it could not finish: these tables fit (44% of the limit), but the run
        # takes depth * ranks * n^2 steps (~25 minutes).
        (
            lambda: ss.optimal_tree([0.3, 0.5], 65536, max_depth=300),
            ValueError,
            "budget: the exact DP",
        ),
        (
            lambda: sim.best_tree(Acceptance.per_rank([0.3, 0.5]), 65536, 300),
            ValueError,
            "budget: the exact DP",
        ),
        (
            lambda: ss.choose_tree([0.1, 0.2], 1.0, {4: 1.0, 65536: 2.0}, 65535),
            ValueError,
            "t_verify: largest budget 65536",
        ),
    ],
)
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_method_and_budget_keys_are_named():
    with pytest.raises(TypeError, match="method: expected 'auto' or 'dp' or 'heap', got int"):
        ss.optimal_tree([0.5], 3, method=5)
    with pytest.raises(ValueError, match=r"method: expected .* got \"x\""):
        ss.optimal_tree([0.5], 3, method="x")
    assert ss.optimal_tree([0.5], 3, method="dp") == ss.optimal_tree([0.5], 3, method="heap")
    with pytest.raises(ValueError, match="t_verify: key 9223372036854775808 does not fit"):
        ss.choose_tree([0.5], 0.1, {2**63: 0.1}, 2)
    with pytest.raises(TypeError, match="t_verify: key True is not an int budget"):
        ss.choose_tree([0.5], 0.1, {True: 0.1}, 2)


def test_plans_too_long_to_spell_are_refused_and_halves_widen():
    # The heap's plan spells every node's path: a 65,536-node chain's is 2.1e9 entries
    # (~35 GB; a PanicException under a memory limit). Refused as the DP's sizes are.
    with pytest.raises(ValueError, match="budget: the plan of 65536 nodes spells 2147450880"):
        ss.optimal_tree([0.999], 65536)
    assert len(ss.optimal_tree([0.999], 4096)[0]) == 4095
    # float16 (and torch bfloat16) probabilities are widened, as the builders' scores are.
    want = ss.optimal_tree([0.5, 0.25], 3)
    assert ss.optimal_tree(np.array([0.5, 0.25], np.float16), 3) == want
    torch = pytest.importorskip("torch")
    assert ss.optimal_tree(torch.tensor([0.5, 0.25], dtype=torch.bfloat16), 3) == want


def test_max_depth_zero_is_refused_by_rust_and_the_reference_alike():
    # The reference read 0 as 1 and returned a tree deeper than max_depth; Rust refused it.
    for call in (
        lambda m: m.optimal_tree([0.5, 0.2], 4, 0),
        lambda m: m.choose_tree([0.5], 0.1, {1: 1.0, 4: 1.2}, 0),
    ):
        for module in (ss, ref):
            with pytest.raises(ValueError, match="max_depth: must be >= 1"):
                call(module)
    with pytest.raises(ValueError, match="max_depth: must be >= 1"):
        ref.optimal_tree_heap([0.5, 0.2], 4, 0)
