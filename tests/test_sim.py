"""specsched.sim: formulas against hand-computed values and the reference, the simulator
against the analytic model (within its confidence interval), reproducibility by seed and
independence of the thread count, the cost model, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import specsched as ss
from gil import heartbeat_gap
from hypothesis import given, settings
from hypothesis import strategies as st
from specsched import reference as ref
from specsched import sim
from specsched.sim import Acceptance, CostModel
from strategies import parent_lists


def test_chain_formula_hand_values() -> None:
    # (1 - 0.85^5) / 0.15 = (1 - 0.4437053125) / 0.15
    assert sim.expected_tokens_chain(0.85, 4) == pytest.approx(3.708631250, abs=1e-9)
    assert sim.expected_tokens_chain(0.5, 1) == pytest.approx(1.5)
    assert sim.expected_tokens_chain(0.5, 3) == pytest.approx(1.875)
    assert sim.expected_tokens_chain(1.0, 4) == 5.0
    assert sim.expected_tokens_chain(0.0, 7) == 1.0
    assert sim.expected_tokens_chain(0.9, 0) == 1.0


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.85, 0.99, 1.0])
@pytest.mark.parametrize("gamma", [0, 1, 4, 12])
def test_chain_formula_equals_tree_sum_and_reference(alpha: float, gamma: int) -> None:
    closed = sim.expected_tokens_chain(alpha, gamma)
    assert closed == pytest.approx(ref.chain_expected_tokens(alpha, gamma), rel=1e-12)
    assert sim.expected_accept_length(gamma, alpha) == pytest.approx(closed, rel=1e-12)
    assert sim.expected_accept_length(sim.chain_tree(gamma), alpha) == pytest.approx(closed)


def test_tree_expectation_hand_values() -> None:
    # root -> {1, 2}; 1 -> {3}
    t = ss.Tree([-1, 0, 0, 1], [0, 0, 1, 0])
    # per rank [0.6, 0.3]: 1 + 0.6 + 0.3 + 0.6 * 0.6
    assert sim.expected_accept_length(t, Acceptance.per_rank([0.6, 0.3])) == pytest.approx(2.26)
    # iid 0.5: rank 0 -> 0.5, rank 1 -> 0.25: 1 + 0.5 + 0.25 + 0.25
    assert sim.expected_accept_length(t, 0.5) == pytest.approx(2.0)
    # per depth [0.5, 0.9]: 1 + 0.5 + 0.25 + 0.45
    assert sim.expected_accept_length(t, Acceptance.per_depth([0.5, 0.9])) == pytest.approx(2.2)
    # table [[0.6, 0.3], [0.5]]: 1 + 0.6 + 0.3 + 0.3
    assert sim.expected_accept_length(t, Acceptance.table([[0.6, 0.3], [0.5]])) == pytest.approx(
        2.2
    )
    np.testing.assert_allclose(
        sim.path_probabilities(t, Acceptance.per_rank([0.6, 0.3])), [1.0, 0.6, 0.3, 0.36]
    )


MODELS = [
    Acceptance.iid(0.7),
    Acceptance.per_depth([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2] * 4),
    Acceptance.per_rank([0.5, 0.2, 0.1]),
    Acceptance.table([[0.6, 0.2], [0.5, 0.3, 0.1]] * 16),
]


@settings(max_examples=40, deadline=None)
@given(parents=parent_lists(max_nodes=24), which=st.integers(0, len(MODELS) - 1))
def test_expected_tokens_match_reference(parents: list[int], which: int) -> None:
    m = MODELS[which]
    t = ss.Tree(parents, [0] * len(parents))
    values = m.core_values() if m.kind == "table" else list(m.values)
    want = ref.sim_expected_tokens(parents, m.kind, values)
    assert sim.expected_accept_length(t, m) == pytest.approx(want, rel=1e-12)
    np.testing.assert_allclose(
        sim.path_probabilities(t, m), ref.sim_path_probs(parents, m.kind, values), rtol=1e-12
    )


@settings(max_examples=15, deadline=None)
@given(parents=parent_lists(max_nodes=16), which=st.integers(0, len(MODELS) - 1))
def test_simulation_is_bit_identical_to_the_reference_twin(parents: list[int], which: int) -> None:
    m = MODELS[which]
    t = ss.Tree(parents, [0] * len(parents))
    values = m.core_values() if m.kind == "table" else list(m.values)
    # Two chunks, the second partial: the per-chunk streams must line up too.
    steps = 16384 + 300
    r = sim.simulate(t, m, steps, seed=11)
    assert r.histogram.tolist() == ref.sim_simulate(parents, m.kind, values, steps, 11)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.kind)
def test_simulation_agrees_with_the_analytic_model(model: Acceptance) -> None:
    tree = sim.best_tree(model, 32, 8, 3)
    r = sim.simulate(tree, model, 200_000, seed=3)
    exact = sim.expected_accept_length(tree, model)
    lo, hi = r.ci95
    # A 99.9% interval so the test is not flaky across models (the seed is fixed anyway).
    half = (hi - lo) / 2 * 3.29 / 1.96
    assert abs(r.mean_tokens - exact) < half, (r.mean_tokens, exact, half)
    assert r.histogram.sum() == r.steps == 200_000
    assert r.accepted_distribution.sum() == pytest.approx(1.0)
    assert sum(r.tokens_distribution.values()) == pytest.approx(1.0)
    assert min(r.tokens_distribution) == 1


def test_chain_distribution_is_geometric() -> None:
    r = sim.simulate(3, 0.5, 400_000, seed=1)
    np.testing.assert_allclose(r.accepted_distribution, [0.5, 0.25, 0.125, 0.125], atol=0.004)
    assert r.std == pytest.approx(
        math.sqrt(sum(p * (k - 0.875) ** 2 for k, p in enumerate([0.5, 0.25, 0.125, 0.125]))),
        rel=0.01,
    )


def test_reproducible_by_seed_and_independent_of_threads() -> None:
    tree = sim.best_tree(Acceptance.iid(0.75), 64, 10, 4)
    runs = [sim.simulate(tree, 0.75, 300_000, seed=5, threads=n) for n in (1, 2, 3)]
    runs.append(sim.simulate(tree, 0.75, 300_000, seed=5))
    for r in runs[1:]:
        np.testing.assert_array_equal(r.histogram, runs[0].histogram)
    other = sim.simulate(tree, 0.75, 300_000, seed=6)
    assert not np.array_equal(other.histogram, runs[0].histogram)


def test_tokens_are_ignored_only_shape_matters() -> None:
    a = ss.Tree([-1, 0, 0, 1], [5, 7, 7, 7])  # duplicate sibling tokens
    b = ss.Tree([-1, 0, 0, 1], [0, 1, 2, 3])
    m = Acceptance.per_rank([0.5, 0.4])
    np.testing.assert_array_equal(
        sim.simulate(a, m, 50_000, 2).histogram, sim.simulate(b, m, 50_000, 2).histogram
    )


def test_best_tree_beats_the_chain_at_equal_budget() -> None:
    m = Acceptance.per_rank([0.6, 0.2, 0.1])
    # At N = 4 the chain is best (0.6^3 = 0.216 > 0.2); from N = 8 the tree wins.
    assert sim.best_tree(m, 4).parents.tolist() == [-1, 0, 1, 2]
    for budget in (8, 16, 32):
        tree = sim.best_tree(m, budget)
        assert tree.num_nodes == budget
        chain = sim.expected_accept_length(budget - 1, m)
        assert sim.expected_accept_length(tree, m) > chain + 0.1
    # A model that only ever accepts rank 0 gives the chain back.
    tree = sim.best_tree(Acceptance.per_rank([0.8]), 6)
    assert tree.parents.tolist() == [-1, 0, 1, 2, 3, 4]
    limited = sim.best_tree(m, 64, max_depth=3, topk=2)
    assert limited.max_depth <= 3 and limited.num_nodes <= 1 + 2 + 4 + 8


probability = st.floats(0.0, 1.0)


@st.composite
def any_models(draw: st.DrawFn) -> Acceptance:
    """Every kind, and rank vectors in any order (a lower rank may be worth less)."""
    kind = draw(st.sampled_from(["iid", "per_depth", "per_rank", "table"]))
    if kind == "iid":
        return Acceptance.iid(draw(probability))
    if kind == "per_depth":
        return Acceptance.per_depth(draw(st.lists(probability, min_size=5, max_size=5)))

    def ranks() -> list[float]:
        raw = draw(st.lists(probability, min_size=1, max_size=4))
        return [x / max(1.0, sum(raw)) for x in raw]  # at most one child is picked

    if kind == "per_rank":
        return Acceptance.per_rank(ranks())
    return Acceptance.table([ranks() for _ in range(5)])


@given(
    model=any_models(),
    budget=st.integers(1, 10),
    depth=st.integers(1, 5),
    topk=st.integers(1, 4),
)
@settings(max_examples=300, deadline=None)
def test_best_tree_is_optimal_for_every_model(
    model: Acceptance, budget: int, depth: int, topk: int
) -> None:
    tree = sim.best_tree(model, budget, depth, topk)
    assert tree.num_nodes <= budget and tree.max_depth <= depth
    assert max(np.bincount(tree.parents[1:], minlength=1), default=0) <= topk
    values = model.core_values() if model.kind == "table" else list(model.values)
    best = ref.sim_best_value(model.kind, values, budget, depth, topk)
    assert sim.expected_accept_length(tree, model) == pytest.approx(best, rel=1e-12, abs=1e-12)


def test_best_tree_takes_a_better_later_rank_with_its_sibling() -> None:
    # Rank 1 is worth more than rank 0: best-first took chains of rank 0 (value 2.274 at
    # budget 10); the optimum spends a node on rank 0 to reach rank 2 under every node.
    m = Acceptance.per_rank([0.561, 0.009, 0.43])
    tree = sim.best_tree(m, 10)
    assert sim.expected_accept_length(tree, m) == pytest.approx(
        ss.optimal_tree([0.561, 0.009, 0.43], 10, method="dp")[1]
    )
    assert sim.expected_accept_length(tree, m) > 3.1


def test_cost_model_and_speedup() -> None:
    cost = CostModel(t_target_ms=30.0, knee_tokens=300.0, t_draft_ms=1.5, t_host_ms=0.1)
    # Memory-bound: verifying 5 tokens costs what 1 does.
    assert cost.t_target(5) == 30.0
    e = sim.expected_tokens_chain(0.85, 4)
    assert sim.speedup(e, 5, 4, cost) == pytest.approx(e * 30 / (30 + 4 * 1.5 + 0.1))
    busy = CostModel(t_target_ms=30.0, knee_tokens=300.0, concurrency=100)
    assert busy.t_target(1) == 30.0 and busy.t_target(6) == pytest.approx(60.0)
    # At 100 concurrent requests, verifying 6 tokens doubles the step: a 1.9-token chain loses.
    assert sim.speedup(1.9, 6, 0, busy) < 1.0


def test_measure_host_overhead_is_positive_and_grows_with_batch() -> None:
    tree = sim.best_tree(0.8, 16, 6, 4)
    one = sim.measure_host_overhead(tree, 1, min_time=0.05)
    many = sim.measure_host_overhead(tree, 64, min_time=0.05)
    assert 0 < one < 50
    assert many > one


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: sim.expected_tokens_chain(1.2, 3), "alpha"),
        (lambda: sim.expected_tokens_chain(float("nan"), 3), "alpha"),
        (lambda: sim.expected_tokens_chain(0.5, -1), "gamma"),
        (lambda: Acceptance.per_rank([0.7, 0.5]), "per_rank"),
        (lambda: Acceptance.per_depth([0.5, -0.1]), r"per_depth\[1\]"),
        (lambda: Acceptance.table([[0.5, 0.6]]), r"table\[0\]"),
        (lambda: Acceptance("bogus", (0.5,)), "kind"),  # type: ignore[arg-type]
        (
            lambda: sim.expected_accept_length(
                ss.Tree.chain([0, 1, 2]), Acceptance.per_depth([0.5])
            ),
            "2 deep",
        ),
        (lambda: sim.best_tree(0.5, 0), "budget"),
        (lambda: sim.simulate(3, 0.5, 0), "steps"),
        (lambda: sim.simulate(3, 0.5, 10, seed=-1), "seed"),
        (lambda: sim.simulate(3, 0.5, 10, threads=0), "threads"),
        (lambda: sim.simulate(3, 0.5, 10, threads=5000), "threads: 5000: at most 1024"),
        (lambda: CostModel(t_target_ms=0), "t_target_ms"),
        # An infinite forward made every speed-up nan.
        (
            lambda: CostModel(t_target_ms=math.inf),
            r"t_target_ms: inf, expected a positive number up to 1e\+12",
        ),
        (lambda: CostModel(t_target_ms=10, t_host_ms=-1), "t_host_ms"),
        (lambda: sim.speedup(0.5, 4, 3, CostModel(10)), "expected_tokens"),
        # gamma + 1 wrapped past usize (0 expected tokens); past int64 it was an OverflowError.
        (lambda: sim.expected_tokens_chain(0.5, 2**64 - 1), "^gamma: .* does not fit in int64"),
        # Checked before the chain's tokens are allocated (2**40 asked numpy for 8 TiB).
        (lambda: sim.chain_tree(2**40), "^gamma: 1099511627776 drafts, a tree holds at most"),
        (lambda: sim.expected_accept_length(70_000, 0.5), "^gamma: 70000 drafts"),
        (lambda: sim.measure_host_overhead(4, seed=-1), "^seed: must be >= 0, got -1"),
        (lambda: CostModel(1, concurrency=10**400), "^concurrency: .* expected at most 1,000,000"),
    ],
)
def test_bad_input_names_the_argument(call, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=match):
        call()


def test_long_chains_have_their_limits() -> None:
    # Past powi's i32 exponent: gamma + 1 at alpha 1 (refused for a while), the geometric
    # limit 1 / (1 - alpha) below it.
    assert sim.expected_tokens_chain(1.0, 2**40) == 2**40 + 1
    assert sim.expected_tokens_chain(0.5, 2**31) == pytest.approx(2.0)


def test_bad_types() -> None:
    # A wrong type is a TypeError, a bool included (it was a ValueError, and True was 1.0).
    for call, match in [
        (lambda: Acceptance.iid("a"), "alpha: expected a probability in .* got str"),  # type: ignore[arg-type]
        (lambda: Acceptance.iid(True), "alpha: expected a probability in .* got bool"),
        (lambda: CostModel(t_target_ms="a"), "t_target_ms: expected a number, got str"),  # type: ignore[arg-type]
        (lambda: CostModel(t_target_ms=True), "t_target_ms: expected a number, got bool"),
        (lambda: sim.replay([([1, 2], [3])], budget=True), "budget: expected an int, got bool"),
        (lambda: sim.replay([([1, 2], [3])], budget=2.5), "budget: expected an int, got float"),  # type: ignore[arg-type]
        (lambda: sim.speedup(2.0, 4, 1, None), "^cost: expected a CostModel, got NoneType"),  # type: ignore[arg-type]
        (lambda: sim.speedup("2", 4, 1, CostModel(10)), "^expected_tokens: expected a number"),  # type: ignore[arg-type]
        (lambda: sim.measure_host_overhead(4, seed=1.5), "^seed: expected an int, got float"),  # type: ignore[arg-type]
        (lambda: Acceptance.from_stats(5), "^stats: expected an AcceptanceStats, got int"),  # type: ignore[arg-type]
    ]:
        with pytest.raises(TypeError, match=match):
            call()
    with pytest.raises(ValueError, match="prefix_len: must be >= 0, got -1"):
        sim.measure_host_overhead(4, 1, prefix_len=-1)
    with pytest.raises(ValueError, match="t_target_ms: an int of 1329 bits, past float64"):
        CostModel(t_target_ms=10**400)
    assert CostModel(t_target_ms=np.float32(2.0)).t_target(1) == 2.0
    # What float() reads is a probability's type: numpy and torch scalars, Fractions.
    import fractions

    assert Acceptance.iid(np.array(0.5)).values == (0.5,)
    assert Acceptance.iid(fractions.Fraction(1, 2)).values == (0.5,)
    torch = pytest.importorskip("torch")
    assert Acceptance.per_rank(torch.tensor([0.5, 0.25])).values == (0.5, 0.25)
    with pytest.raises(TypeError, match="model"):
        sim.expected_accept_length(3, "0.5")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tree"):
        sim.simulate([0, 1], 0.5)  # type: ignore[arg-type]


def test_simulate_releases_the_gil() -> None:
    """While a thread simulates, Python keeps running in another thread: the largest gap
    between this thread's heartbeats stays a small fraction of the call."""
    tree = sim.best_tree(0.8, 64, 8, 4)

    def gap() -> float:
        return heartbeat_gap(lambda: sim.simulate(tree, 0.8, 1_000_000, seed=1, threads=1))

    ratios = []
    for _ in range(3):  # retries absorb a rare long preemption of the heartbeat thread
        ratios.append(gap())
        if ratios[-1] < 0.5:
            break
    assert min(ratios) < 0.5, f"Python was blocked during simulate: {ratios}"


def test_empirical_model_from_acceptance_stats() -> None:
    """Statistics gathered from verify results give back the per-rank acceptance that produced
    them, and the model they make predicts the measured tokens per step."""
    rng = np.random.default_rng(7)
    tree = ss.Tree.from_choices([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    children: dict[int, list[int]] = {}
    for c in range(1, tree.num_nodes):
        children.setdefault(int(tree.parents[c]), []).append(c)
    stats = ss.AcceptanceStats()
    emitted = []
    for _ in range(4000):
        target = np.full(tree.num_nodes, -1, dtype=np.int64)
        for v, kids in children.items():
            u = rng.random()
            pick = 0 if u < 0.6 else (1 if u < 0.8 else None)
            if pick is not None and pick < len(kids):
                target[v] = tree.tokens[kids[pick]]
        r = ss.verify(tree, target_tokens=target)
        stats.update(tree, r)
        emitted.append(r.num_accepted + 1)
    model = sim.Acceptance.from_stats(stats)
    rows = model.core_values()
    assert abs(rows[0][0] - 0.6) < 0.03 and abs(rows[0][1] - 0.2) < 0.03
    predicted = sim.expected_accept_length(tree, model)
    assert abs(predicted - float(np.mean(emitted))) < 0.05
    with pytest.raises(ValueError, match="stats"):
        sim.Acceptance.from_stats(ss.AcceptanceStats())
