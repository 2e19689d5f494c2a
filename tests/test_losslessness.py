"""Monte-Carlo proof that the sampled verification rules are lossless (`specsched.testing`).

Toy order-2 target and draft models over a vocabulary of 5 tokens; 200k seeded generations
per rule, each made of speculative steps over a 9-node draft tree until 3 tokens are emitted.
The empirical joint distribution of the first 3 tokens must match the exact autoregressive
distribution of the processed target: total-variation distance within 3x its expected sampling
noise (~0.007 here) and a chi-square p-value above 1e-3, at a fixed seed. Controls with teeth:
the rejection rule fed the wrong draft distribution (uniform instead of q, i.e. ignoring q)
and Medusa's typical acceptance (lossy by design) both fail the same test by a wide margin.
"""

from __future__ import annotations

import numpy as np
import pytest
from specsched import testing

STEPS = 200_000
MODELS = testing.toy_models(vocab=5, seed=0)

LOSSLESS = [
    ("match", {}),
    ("match", {"temperature": 0.7, "top_k": 3, "top_p": 0.9}),
    ("with_replacement", {}),
    ("without_replacement", {}),
    ("with_replacement", {"temperature": 1.3, "top_p": 0.8}),
]


@pytest.mark.parametrize(("rule", "params"), LOSSLESS, ids=lambda x: str(x))
def test_lossless_rules_reproduce_the_target_distribution(rule, params):
    verdict, sim = testing.check_rule(MODELS, rule, steps=STEPS, seed=1, **params)
    print(f"{rule} {params}: {verdict}")
    assert sim.counts.sum() == STEPS
    assert verdict.lossless, verdict
    assert verdict.tv < 0.02


def test_greedy_rows_emit_the_argmax_sequence():
    verdict, sim = testing.check_rule(MODELS, "match", steps=2000, seed=1, temperature=0.0)
    assert verdict.tv == 0.0
    # A deterministic target has no sampling noise: exact reproduction is lossless.
    assert verdict.noise == 0.0 and verdict.lossless, verdict
    assert np.count_nonzero(sim.counts) == 1


def ignore_q(batch, logits, draft_probs, seed):
    """A biased rule: accept a sampled child w.p. min(1, p(x) / (1/V)), i.e. SpecInfer with the
    draft's q replaced by the uniform distribution (ignoring how the child was drawn)."""
    uniform = np.full_like(draft_probs, 1.0 / draft_probs.shape[1])
    return testing.rule_verifier("with_replacement")(batch, logits, uniform, seed)


def test_biased_control_fails():
    verdict, _ = testing.check_rule(
        MODELS, "with_replacement", steps=STEPS, seed=1, verifier=ignore_q
    )
    print(f"biased control (q ignored): {verdict}")
    assert not verdict.lossless
    assert verdict.tv > 10 * verdict.noise


def test_typical_acceptance_is_lossy():
    verdict, _ = testing.check_rule(
        MODELS, "typical", steps=50_000, seed=1, posterior_threshold=0.3, posterior_alpha=0.55
    )
    print(f"typical (lossy): {verdict}")
    assert not verdict.lossless
    assert verdict.tv > 10 * verdict.noise


@pytest.mark.parametrize("params", [{}, {"temperature": 0.7, "top_k": 3}])
def test_sample_and_match_acceptance_equals_the_target_mass_on_the_children(params):
    _, sim = testing.check_rule(MODELS, "match", steps=STEPS, seed=2, **params)
    table = testing.processed_table(
        MODELS, params.get("temperature", 1.0), params.get("top_k", 0), 1.0
    )
    # Deterministic drafts from a fixed context: every run's first tree has the same root.
    children = sim.first_root_children[0]
    assert (sim.first_root_children == children).all()
    expected = table[MODELS.context][children].sum()
    measured = (sim.first_num_accepted >= 1).mean()
    sigma = np.sqrt(expected * (1 - expected) / STEPS)
    print(f"root acceptance {measured:.4f} vs sum p(children) {expected:.4f}")
    assert abs(measured - expected) < 4 * sigma + 1e-9


def test_harness_statistics():
    probs = np.array([0.5, 0.25, 0.25])
    assert testing.tv_distance(np.array([50, 25, 25]), probs) == 0.0
    assert testing.tv_distance(np.array([100, 0, 0]), probs) == pytest.approx(0.5)
    assert testing.chi_square_pvalue(np.array([5000, 2500, 2500]), probs) > 0.5
    assert testing.chi_square_pvalue(np.array([5400, 2300, 2300]), probs) < 1e-6
    assert testing.chi_square_pvalue(np.array([1, 0]), np.array([0.0, 1.0])) == 0.0
    joint = testing.exact_joint(testing.processed_table(MODELS, 1.0), MODELS.context)
    assert joint.shape == (125,) and joint.sum() == pytest.approx(1.0)
