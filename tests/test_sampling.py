"""Sampled verification (`ss.verify(..., temperature=...)`) against the pure-Python oracle.

The Rust kernels and `specsched.reference` share the counter-based uniform
(`reference.rng_uniform`), so seeded outputs must be *equal*, not just equally distributed:
processing (temperature → top-k → top-p and its tie rules), the inverse-CDF draw, the match walk,
multi-round rejection with and without replacement, and typical acceptance are compared token
for token on generated trees, batches with per-request parameters and greedy rows mixed in,
every logits dtype and layout. The torch device path is compared with the host path. Bad input
is rejected with an exception naming the argument. Distributional correctness (losslessness)
is proved separately by the Monte-Carlo harness in test_losslessness.py.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import specsched as ss
from gil import heartbeat_gap
from hypothesis import given, settings
from hypothesis import strategies as st
from specsched import reference as ref
from strategies import batches, trees

VOCAB = 8
SETTINGS = settings(deadline=None, max_examples=40)


def star_batch(num: int) -> ss.TreeBatch:
    """`num` single-node trees: request b's bonus is its sample from row b."""
    return ss.TreeBatch.from_flat(
        np.full(num, -1, dtype=np.int32), np.zeros(num, dtype=np.int64), np.arange(num + 1)
    )


def peaked_logits(rng: np.random.Generator, parents, tokens, vocab: int = VOCAB) -> np.ndarray:
    """Random logits that favour one child's token at each node, so sampled walks go deep."""
    logits = rng.standard_normal((len(parents), vocab)) * 1.5
    for c in range(1, len(parents)):
        if parents[c] >= 0 and rng.random() < 0.5:
            logits[parents[c], tokens[c]] += 2.5
    return logits


def draft_rows(rng: np.random.Generator, n: int, vocab: int = VOCAB) -> np.ndarray:
    return rng.dirichlet(np.full(vocab, 0.7), size=n) * 0.98 + 0.02 / vocab


def sampled_tokens(rng: np.random.Generator, parents, q: np.ndarray, replace: bool) -> list[int]:
    """Children drawn from their parent's draft row (without replacement: distinct siblings)."""
    tokens = [0] * len(parents)
    kids: dict[int, list[int]] = {}
    for c in range(1, len(parents)):
        kids.setdefault(parents[c], []).append(c)
    for v, cs in kids.items():
        pv = q[v].astype(np.float64)
        pv /= pv.sum()  # numpy's choice wants float64 sums within 1e-8 (float32 rows are not)
        if replace:
            draws = rng.choice(len(pv), size=len(cs), p=pv)
        else:
            draws = rng.choice(len(pv), size=len(cs), replace=False, p=pv)
        for c, x in zip(cs, draws, strict=True):
            tokens[c] = int(x)
    return tokens


# ----------------------------------------------------------------------- processing + draws


def test_reference_processing_hand_cases():
    pp = ref.processed_probs
    # temperature scales logits before the softmax
    assert pp([0.0, np.log(3.0)], 1.0) == pytest.approx([0.25, 0.75])
    assert pp([0.0, np.log(3.0)], 0.5) == pytest.approx([0.1, 0.9])
    # top-k keeps every tie at the k-th value (HF / vLLM compare with the k-th value)
    assert pp([1.0, 1.0, 1.0, 0.0], 1.0, top_k=2) == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0])
    assert pp([3.0, 1.0, 2.0, 0.0], 1.0, top_k=2)[1::2] == [0.0, 0.0]
    # top-p: keep a token iff the mass before it is < p; ties ranked by lower id
    assert pp([0.0] * 4, 1.0, top_p=0.5) == [0.5, 0.5, 0.0, 0.0]
    assert pp([0.0] * 4, 1.0, top_p=0.51) == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0])
    assert pp([5.0, 0.0, 0.0], 1.0, top_p=1e-9) == [1.0, 0.0, 0.0]  # always one token
    # top-p applies to the top-k-renormalized distribution
    assert pp([2.0, 1.0, 0.0, 0.0], 1.0, top_k=2, top_p=0.7)[2:] == [0.0, 0.0]
    assert pp([float("inf"), 0.0, float("inf")], 2.0) == [0.5, 0.0, 0.5]
    assert ref.sample_index([0.25, 0.0, 0.75], 0.24) == 0
    assert ref.sample_index([0.25, 0.0, 0.75], 0.25) == 2


def test_rng_is_splitmix64():
    # splitmix64's published first output for state 0 is mix(golden ratio constant).
    assert ref._mix64(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF
    us = [ref.rng_uniform(3, r, n, d) for r in range(4) for n in range(50) for d in range(5)]
    assert all(0.0 < u < 1.0 for u in us)
    assert len(set(us)) == len(us)
    assert abs(np.mean(us) - 0.5) < 0.03


ROW_CASES = [
    # (logits row, temperature, top_k, top_p)
    ([1.0, 1.0, 1.0, 0.0], 1.0, 2, 1.0),  # top-k ties: three tokens kept
    ([0.0, 0.0, 0.0, 0.0], 1.0, 0, 0.5),  # top-p ties: tokens 0 and 1
    ([2.0, -1.0, 0.5, 0.5, 3.0], 0.7, 3, 0.8),
    ([2.0, -1.0, 0.5, 0.5, 3.0], 2.5, 0, 0.95),
    ([float("-inf"), 1.0, float("-inf"), 0.0], 1.0, 0, 1.0),
    ([float("inf"), 1.0, float("inf"), 0.0], 1.0, 0, 1.0),
    # -0.0 and +0.0 are one value: the top-p tie goes to the lower ids, whatever the sign.
    ([float("-inf"), float("-inf"), 0.0, -0.0, -0.0, 0.0], 1.0, 0, 0.75),
    ([float("-inf"), 0.0, -0.0, float("-inf"), 0.0, 0.0], 1.0, 0, 0.7),
]


@pytest.mark.parametrize(("row", "temp", "k", "p"), ROW_CASES)
def test_seeded_samples_equal_the_reference_and_follow_its_distribution(row, temp, k, p):
    n = 4000
    logits = np.tile(np.asarray(row, dtype=np.float64), (n, 1))
    r = ss.verify(star_batch(n), logits, temperature=temp, top_k=k, top_p=p, seed=11)
    got = r.tokens[:, 0]
    probs = ref.processed_probs(row, temp, k, p)
    want = [ref.sample_index(probs, ref.rng_uniform(11, b, 0, 0)) for b in range(n)]
    assert got.tolist() == want
    freq = np.bincount(got, minlength=len(row)) / n
    assert np.all(freq[np.asarray(probs) == 0] == 0)
    assert np.abs(freq - probs).sum() / 2 < 0.03


@settings(deadline=None, max_examples=30)
@given(
    seed=st.integers(0, 2**64 - 1),
    vocab=st.sampled_from([3, 50, 3000]),
    temp=st.floats(0.05, 4.0),
    k=st.integers(0, 60),
    p=st.floats(0.01, 1.0),
    dtype=st.sampled_from([np.float16, np.float32, np.float64]),
)
def test_large_rows_match_the_reference(seed, vocab, temp, k, p, dtype):
    rng = np.random.default_rng(seed % 1000)
    rows = (rng.standard_normal((6, vocab)) * 3).astype(dtype)
    rows[:, rng.integers(vocab, size=3)] = rows[0, 0]  # ties across the row
    r = ss.verify(star_batch(6), rows, temperature=temp, top_k=k, top_p=p, seed=seed)
    for b in range(6):
        probs = ref.processed_probs(rows[b].astype(np.float64).tolist(), temp, k, p)
        assert r.tokens[b, 0] == ref.sample_index(probs, ref.rng_uniform(seed, b, 0, 0))


# ----------------------------------------------------------------------- rules on trees

RULES = [
    {"rule": "match"},
    {"rule": "rejection", "without_replacement": False},
    {"rule": "rejection", "without_replacement": True},
    {"rule": "typical", "posterior_threshold": 0.3, "posterior_alpha": 0.5},
]


def api_kwargs(rule: dict, q: np.ndarray | None) -> dict:
    if rule["rule"] == "typical":
        return {
            "rule": "typical",
            "posterior_threshold": rule["posterior_threshold"],
            "posterior_alpha": rule["posterior_alpha"],
        }
    if rule["rule"] == "rejection":
        sampling = "without_replacement" if rule["without_replacement"] else "with_replacement"
        return {"draft_probs": q, "draft_sampling": sampling}
    return {}


@pytest.mark.parametrize(
    "rule", RULES, ids=lambda r: r["rule"] + str(r.get("without_replacement", ""))
)
@SETTINGS
@given(
    tree=trees(max_nodes=24),
    seed=st.integers(0, 10**6),
    temp=st.sampled_from([0.0, 0.6, 1.0, 1.7]),
    dtype=st.sampled_from([np.float64, np.float32, np.float16]),
    probs_dtype=st.sampled_from([np.float64, np.float32]),
)
def test_tree_matches_reference(rule, tree, seed, temp, dtype, probs_dtype):
    parents, tokens = tree
    rng = np.random.default_rng(seed)
    vocab = 32 if rule.get("without_replacement") else VOCAB  # room for distinct siblings
    # Draft rows renormalized in their own precision (so they sum to 1 within its tolerance).
    q = draft_rows(rng, len(parents), vocab).astype(probs_dtype)
    q /= q.sum(axis=1, keepdims=True)
    if rule["rule"] == "rejection":
        tokens = sampled_tokens(rng, parents, q, replace=not rule["without_replacement"])
    # Logits in every host format: Rust widens them exactly, as the reference reads them.
    logits = peaked_logits(rng, parents, tokens, vocab).astype(dtype)
    k, p = int(rng.integers(0, 6)), float(rng.choice([1.0, 0.9, 0.6]))
    r = ss.verify(
        ss.Tree(parents, tokens),
        logits,
        temperature=temp,
        top_k=k,
        top_p=p,
        seed=seed,
        **api_kwargs(rule, q),
    )
    extra = dict(rule)
    acc, emitted = ref.verify_sampled(
        parents,
        tokens,
        logits.astype(np.float64).tolist(),
        temp,
        k,
        p,
        seed,
        draft_rows=q.astype(np.float64).tolist(),
        **extra,
    )
    assert r.accepted_nodes.tolist() == acc
    assert r.tokens.tolist() == emitted


@pytest.mark.parametrize(
    "rule", RULES, ids=lambda r: r["rule"] + str(r.get("without_replacement", ""))
)
@SETTINGS
@given(
    batch=batches(max_trees=6, max_nodes=16),
    seed=st.integers(0, 10**6),
    per_request_seeds=st.booleans(),
)
def test_batch_with_per_request_parameters_matches_reference(rule, batch, seed, per_request_seeds):
    parents, tokens, offsets = batch
    rng = np.random.default_rng(seed)
    nb = len(offsets) - 1
    # One seed for the batch, or one per request (up to 2**64 - 1, repeats allowed).
    seeds = (
        [[0, 7, 2**63, 2**64 - 1, seed][i] for i in rng.integers(0, 5, size=nb)]
        if per_request_seeds
        else seed
    )
    vocab = 32 if rule.get("without_replacement") else VOCAB
    q = draft_rows(rng, len(parents), vocab)
    if rule["rule"] == "rejection":
        tokens = []
        for b in range(nb):
            s, e = offsets[b], offsets[b + 1]
            tokens += sampled_tokens(rng, parents[s:e], q[s:e], not rule["without_replacement"])
    logits = np.concatenate(  # favour a child's token per node, tree-locally
        [
            peaked_logits(rng, parents[s:e], tokens[s:e], vocab)
            for s, e in itertools.pairwise(offsets)
        ]
    )
    temps = rng.choice([0.0, 0.5, 1.0, 2.0], size=nb)  # greedy rows mixed in
    ks = rng.integers(0, 5, size=nb)
    ps = rng.choice([1.0, 0.8, 0.5], size=nb)
    b_ = ss.TreeBatch.from_flat(np.asarray(parents), np.asarray(tokens), np.asarray(offsets))
    r = ss.verify(
        b_, logits, temperature=temps, top_k=ks, top_p=ps, seed=seeds, **api_kwargs(rule, q)
    )
    num, acc, tok = ref.batch_verify_sampled(
        parents,
        tokens,
        offsets,
        logits.tolist(),
        temps.tolist(),
        ks.tolist(),
        ps.tolist(),
        seeds,
        draft_rows=q.tolist(),
        **rule,
    )
    assert r.num_accepted.tolist() == num
    assert r.accepted_nodes.tolist() == acc
    assert r.tokens.tolist() == tok
    greedy = ss.verify(b_, logits)
    for b in np.flatnonzero(temps == 0):
        assert r.tokens[b].tolist() == greedy.tokens[b].tolist()


@pytest.mark.parametrize("reduce", ["host", "device"])
def test_per_request_seeds_make_draws_independent_of_the_batch(reduce):
    """A request's draws under its own seed do not depend on its slot or on the requests
    beside it (continuous batching reorders and drops requests every step), and equal what
    it draws alone; with one seed for the batch they are keyed by the slot."""
    if reduce == "device":
        torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    a = ss.Tree([-1, 0, 0, 1], [9, 1, 2, 3])
    other = ss.Tree([-1, 0], [4, 5])
    la = rng.normal(size=(4, 50))
    lo = rng.normal(size=(2, 50))

    def run(tree, logits, seed):
        x = torch.tensor(logits) if reduce == "device" else logits
        return ss.verify(tree, x, temperature=1.0, top_p=0.9, seed=seed, reduce=reduce)

    moved = 0
    for seed in range(60):
        alone = run(a, la, seed).tokens.tolist()
        first = ss.TreeBatch([a, other])
        second = ss.TreeBatch([other, a, other])
        got = run(first, np.concatenate([la, lo]), [seed, 11])[0].tokens.tolist()
        assert got == alone
        got = run(second, np.concatenate([lo, la, lo]), np.array([5, seed, 5], np.uint64))
        assert got[1].tokens.tolist() == alone
        slot = run(second, np.concatenate([lo, la, lo]), seed)[1].tokens.tolist()
        moved += slot != alone
    assert moved > 20  # the batch seed keys by slot: slot 1 draws otherwise than alone
    with pytest.raises(ValueError, match="seed: has 1 per-request seeds, expected one per"):
        run(ss.TreeBatch([a, other]), np.concatenate([la, lo]), [3])
    with pytest.raises(ValueError, match=r"seed\[1\]: expected an int in \[0, 2\*\*64\)"):
        run(ss.TreeBatch([a, other]), np.concatenate([la, lo]), [3, -1])
    with pytest.raises(TypeError, match="seed"):
        run(ss.TreeBatch([a, other]), np.concatenate([la, lo]), [3.0, 1.5])


def test_duplicate_sibling_tokens_with_replacement():
    # Both children hold token 1; once the first is rejected, p(1) is 0 in the residual, so the
    # duplicate is never accepted, and the bonus never emits 1 either.
    parents, tokens = [-1, 0, 0], [0, 1, 1]
    logits = np.log(np.array([[0.2, 0.3, 0.5]] * 3))
    q = np.array([[0.1, 0.8, 0.1]] * 3)
    n = 3000
    batch = ss.TreeBatch([ss.Tree(parents, tokens)] * n)
    r = ss.verify(
        batch, np.tile(logits, (n, 1)), temperature=1.0, seed=5, draft_probs=np.tile(q, (n, 1))
    )
    assert not (r.accepted_nodes[:, 1] == 2).any()
    accepted = r.num_accepted == 1
    # P(accept token 1) = min(1, p/q) = 0.375. Each rejection updates the residual:
    # p1 = norm(max(p - q, 0)) = [0.2, 0, 0.8], p2 = norm(max(p1 - q, 0)) = [0.125, 0, 0.875].
    assert abs(accepted.mean() - 0.375) < 0.03
    bonus = r.tokens[~accepted, 0]
    assert set(bonus.tolist()) <= {0, 2}
    assert abs((bonus == 0).mean() - 0.125) < 0.03


def test_greedy_is_unchanged():
    rng = np.random.default_rng(1)
    parents, tokens = [-1, 0, 0, 1, 2], [9, 1, 2, 3, 4]
    logits = peaked_logits(rng, parents, tokens)
    t = ss.Tree(parents, tokens)
    want = ss.verify(t, logits)
    for kw in ({"temperature": 0.0}, {"temperature": 0}, {"temperature": [0.0], "top_k": 3}):
        got = ss.verify(t, logits, seed=3, **kw)
        assert got.tokens.tolist() == want.tokens.tolist()
        assert got.accepted_nodes.tolist() == want.accepted_nodes.tolist()


def test_same_seed_same_tokens_and_batch_composition_does_not_matter():
    rng = np.random.default_rng(2)
    parents, tokens = [-1, 0, 0, 1, 1, 3], [0, 1, 2, 3, 4, 5]
    rows = [peaked_logits(rng, parents, tokens) for _ in range(3)]
    batch = ss.TreeBatch([ss.Tree(parents, tokens)] * 3)
    a = ss.verify(batch, np.concatenate(rows), temperature=1.0, seed=99)
    b = ss.verify(batch, np.concatenate(rows), temperature=1.0, seed=99)
    assert a.tokens.tolist() == b.tokens.tolist()
    # Replace the other requests' logits and parameters: request 1 is unchanged.
    other = [rows[0] * 3, rows[1], rng.standard_normal(rows[2].shape)]
    c = ss.verify(
        batch, np.concatenate(other), temperature=[0.3, 1.0, 2.0], top_k=[2, 0, 1], seed=99
    )
    assert c.tokens[1].tolist() == a.tokens[1].tolist()
    seeds = {
        tuple(ss.verify(batch, np.concatenate(rows), temperature=1.0, seed=s).tokens.ravel())
        for s in range(8)
    }
    assert len(seeds) > 1


def test_thread_count_does_not_matter():
    # A batch big enough for the parallel path, verified with 1 and with 2 rayon threads.
    script = textwrap.dedent(
        """
        import numpy as np, specsched as ss, sys
        rng = np.random.default_rng(0)
        n, vocab = 64, 20000
        batch = ss.TreeBatch([ss.Tree([-1, 0, 1, 2], [0, 1, 2, 3])] * n)
        logits = rng.standard_normal((4 * n, vocab)).astype(np.float32)
        logits[:, 1:4] += 6.0
        r = ss.verify(batch, logits, temperature=1.0, top_p=0.9, seed=7)
        sys.stdout.write(",".join(map(str, r.tokens.ravel().tolist())))
        """
    )
    outs = []
    for threads in ("1", "2"):
        env = {**os.environ, "RAYON_NUM_THREADS": threads}
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        )
        outs.append(done.stdout)
    assert outs[0] == outs[1] and outs[0]


def test_half_and_strided_logits_equal_their_float64_values():
    rng = np.random.default_rng(3)
    parents, tokens = [-1, 0, 0, 1, 2, 2], [0, 1, 2, 3, 4, 5]
    logits = peaked_logits(rng, parents, tokens).astype(np.float16)
    t = ss.Tree(parents, tokens)
    want = ss.verify(t, logits.astype(np.float64), temperature=0.8, top_k=4, seed=4)
    for arr in (logits, np.asfortranarray(logits), logits.astype(np.float32)[:, ::1]):
        got = ss.verify(t, arr, temperature=0.8, top_k=4, seed=4)
        assert got.tokens.tolist() == want.tokens.tolist()


def test_nan_only_matters_in_visited_rows():
    parents, tokens = [-1, 0, 0], [0, 1, 2]
    logits = np.zeros((3, 4))
    logits[0, 3] = 50.0  # the root's sample is 3: no child matches, rows 1 and 2 are unread
    logits[1, 0] = np.nan
    r = ss.verify(ss.Tree(parents, tokens), logits, temperature=1.0, seed=0)
    assert r.tokens.tolist() == [3]
    logits[0, 0] = np.nan
    with pytest.raises(ValueError, match="logits: row 0"):
        ss.verify(ss.Tree(parents, tokens), logits, temperature=1.0, seed=0)


# ----------------------------------------------------------------------- bad input


def test_bad_input_names_the_argument():
    t = ss.Tree([-1, 0, 0], [0, 1, 2])
    logits = np.zeros((3, 4))
    q = np.full((3, 4), 0.25)
    bad = [
        ({"temperature": -0.1}, ValueError, "temperature"),
        ({"temperature": float("nan")}, ValueError, "temperature"),
        ({"temperature": "hot"}, TypeError, "temperature"),
        ({"temperature": [1.0, 1.0]}, ValueError, "temperature"),
        ({"temperature": 1.0, "top_p": 0.0}, ValueError, "top_p"),
        ({"temperature": 1.0, "top_p": 1.5}, ValueError, "top_p"),
        ({"temperature": 1.0, "top_p": float("nan")}, ValueError, "top_p"),
        ({"temperature": 1.0, "top_k": -1}, ValueError, "top_k"),
        ({"temperature": 1.0, "top_k": 2.5}, TypeError, "top_k"),
        # Python ints past int64 / float64 are values out of range, not of the wrong type.
        ({"temperature": 1.0, "top_k": -(2**70)}, ValueError, "top_k: entry 0 is -9223372036"),
        ({"temperature": 1.0, "top_k": [-(2**70)]}, ValueError, "top_k: entry 0"),
        ({"temperature": -(10**400)}, ValueError, "temperature: entry 0 is -inf"),
        ({"temperature": 10**400}, ValueError, "temperature: entry 0 is inf"),
        ({"temperature": 1.0, "top_p": 10**400}, ValueError, "top_p: entry 0 is inf"),
        ({"temperature": 1.0, "seed": 1.5}, TypeError, "seed"),
        ({"temperature": 1.0, "seed": "1"}, TypeError, "seed"),
        ({"temperature": 1.0, "seed": -1}, ValueError, "seed"),
        ({"temperature": 1.0, "seed": 2**64}, ValueError, "seed"),
        ({"temperature": 1.0, "draft_probs": q[:2]}, ValueError, "draft_probs"),
        ({"temperature": 1.0, "draft_probs": q - 0.3}, ValueError, "draft_probs"),
        ({"temperature": 1.0, "draft_probs": q * np.nan}, ValueError, "draft_probs"),
        ({"temperature": 1.0, "draft_probs": q * 1.01}, ValueError, "draft_probs"),
        ({"temperature": 1.0, "draft_probs": q.astype(np.int64)}, TypeError, "draft_probs"),
        ({"temperature": 1.0, "draft_sampling": "sometimes"}, ValueError, "draft_sampling"),
        ({"temperature": 1.0, "rule": "nucleus"}, ValueError, "rule"),
        ({"temperature": 1.0, "rule": "typical", "draft_probs": q}, ValueError, "draft_probs"),
        (
            {"temperature": 1.0, "rule": "typical", "posterior_alpha": -1.0},
            ValueError,
            "posterior_alpha",
        ),
        (
            {"temperature": 1.0, "rule": "typical", "posterior_threshold": float("inf")},
            ValueError,
            "posterior_threshold",
        ),
    ]
    for kwargs, exc, name in bad:
        with pytest.raises(exc, match=name):
            ss.verify(t, logits, **kwargs)
    # a drafted token the draft could not have drawn
    q0 = q.copy()
    q0[0] = [0.5, 0.0, 0.5, 0.0]
    with pytest.raises(ValueError, match=r"draft_probs: row 0 gives token 1 of node 1"):
        ss.verify(t, logits, temperature=1.0, draft_probs=q0, seed=0)
    # a sampled draft token outside the vocabulary
    with pytest.raises(ValueError, match=r"^draft_probs: node 2 has token 7, outside the draft"):
        ss.verify(ss.Tree([-1, 0, 0], [0, 1, 7]), logits, temperature=1.0, draft_probs=q)
    # repeated sibling tokens cannot come from sampling without replacement
    with pytest.raises(ValueError, match="nodes 1 and 2 are siblings"):
        ss.verify(
            ss.Tree([-1, 0, 0], [0, 1, 1]),
            logits,
            temperature=1.0,
            draft_probs=q,
            draft_sampling="without_replacement",
        )
    with pytest.raises(TypeError, match="target_tokens"):
        ss.verify(t, target_tokens=[0, 0, 0], temperature=1.0)
    # every error is a ValueError / TypeError subclass, never a panic
    with pytest.raises(ValueError, match="logits"):
        ss.verify(t, np.full((3, 4), -np.inf), temperature=1.0)


# ----------------------------------------------------------------------- torch device path


def test_scalar_options_are_checked_and_shown_readably():
    t = ss.Tree([-1, 0, 0], [0, 1, 2])
    logits = np.zeros((3, 4))
    for kw, exc, match in [
        # Not an int at all: named as a type error (numpy made it a "0-D sequence").
        ({"temperature": 1.0, "seed": object()}, TypeError, "seed: expected an int or a 1-D"),
        # Negative posterior options are refused whatever the rule (NaN already was).
        ({"posterior_threshold": -1.0}, ValueError, "posterior_threshold: expected a finite"),
        ({"temperature": 1.0, "posterior_alpha": -5.0}, ValueError, "posterior_alpha"),
        # Far from 1, a float is shown with an exponent, not hundreds of digits.
        ({"temperature": -1e-300}, ValueError, r"^temperature: entry 0 is -1e-300; expected"),
        ({"temperature": 1.0, "top_p": 1e300}, ValueError, r"^top_p: entry 0 is 1e300; expected"),
    ]:
        with pytest.raises(exc, match=match):
            ss.verify(t, logits, **kw)
    # A 0-d integer array is one seed; a top_k past int64 keeps every token (as a uint64 does).
    one = ss.verify(t, logits, temperature=1.0, seed=np.array(3))
    assert one.tokens.tolist() == ss.verify(t, logits, temperature=1.0, seed=3).tokens.tolist()
    wide = ss.verify(t, logits, temperature=1.0, seed=3, top_k=2**64)
    assert wide.tokens.tolist() == one.tokens.tolist()


def test_device_uniform_equals_the_reference():
    torch = pytest.importorskip("torch")
    from specsched import _torch

    req = torch.tensor([0, 1, 7, 2**40], dtype=torch.int64)
    node = torch.tensor([0, 5, 123456, 3], dtype=torch.int64)
    for seed in (0, 1, 2**63 + 5, 2**64 - 1):
        got = _torch.uniform(seed, req, node, 0).tolist()
        want = [ref.rng_uniform(seed, int(r), int(n), 0) for r, n in zip(req, node, strict=True)]
        assert got == want


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_device_sampling_equals_host_sampling(dtype):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    nb, vocab = 40, 300
    trees_ = [ss.Tree([-1, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]) for _ in range(nb)]
    batch = ss.TreeBatch(trees_)
    logits = torch.from_numpy(rng.standard_normal((6 * nb, vocab)) * 2)
    logits[:, 1:6] += 3.0
    logits = logits.to(getattr(torch, dtype))
    temps = rng.choice([0.0, 0.7, 1.0, 1.5], size=nb)
    ks = rng.choice([0, 1, 3, 50], size=nb)
    ps = rng.choice([1.0, 0.9, 0.3], size=nb)
    kw = {"temperature": temps, "top_k": ks, "top_p": ps, "seed": 21}
    host = ss.verify(batch, logits, reduce="host", **kw)
    dev = ss.verify(batch, logits, reduce="device", **kw)
    same = (host.tokens == dev.tokens).all(axis=1)
    if dtype == "float64":
        assert same.all()
    else:  # float32 arithmetic on the device: a draw may land on the other side of a boundary
        assert same.mean() >= 0.95
    single = ss.verify(trees_[0], logits[:6], reduce="device", temperature=1.0, seed=21)
    assert (
        single.tokens.tolist()
        == ss.verify(trees_[0], logits[:6], temperature=1.0, seed=21).tokens.tolist()
        or dtype != "float64"
    )


def test_device_path_flags_nan_and_refuses_host_only_rules():
    torch = pytest.importorskip("torch")
    t = ss.Tree([-1, 0], [0, 1])
    logits = torch.zeros((2, 4), dtype=torch.float64)
    logits[0, 1] = 40.0
    logits[1, 2] = float("nan")
    with pytest.raises(ValueError, match="row 1"):
        ss.verify(t, logits, reduce="device", temperature=1.0, seed=0)
    with pytest.raises(ValueError, match="reduce"):
        ss.verify(t, logits, reduce="device", temperature=1.0, rule="typical")
    with pytest.raises(ValueError, match="top_p"):
        ss.verify(t, logits, reduce="device", temperature=1.0, top_p=2.0)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_device_path_matches_the_host_at_the_edges(dtype):
    torch = pytest.importorskip("torch")
    star = ss.Tree([-1, 0, 0, 0], [9, 0, 1, 2])
    row = torch.tensor([0.5, 2.0, 1.0, float("-inf")], dtype=getattr(torch, dtype))
    logits = row.expand(4, 4).contiguous()
    # Temperatures past float32's range: 1e-50 is the argmax (it cast to 0: 0/0 gave the
    # invalid token -1), 1e39 near-uniform over the finite logits (it cast to inf: NaN).
    for temp in (1e-50, 1e39):
        for seed in range(40):
            kw = {"temperature": temp, "seed": seed}
            host = ss.verify(star, logits, reduce="host", **kw)
            dev = ss.verify(star, logits, reduce="device", **kw)
            assert dev.tokens.tolist() == host.tokens.tolist(), (temp, seed)
    # A top_p below float32's smallest value keeps the most likely token, as the host does
    # (it rounded to 0 on the device, kept nothing and drew token -1, the walk's stop marker).
    for seed in range(10):
        kw = {"temperature": 1.0, "top_p": 1e-46, "seed": seed}
        host = ss.verify(star, logits, reduce="host", **kw)
        dev = ss.verify(star, logits, reduce="device", **kw)
        assert dev.tokens.tolist() == host.tokens.tolist() == [1, 1], seed
    # A row with no finite logit: a greedy request still has its argmax (token 0), as on the
    # host; a sampled one is refused naming why, not as a NaN.
    dead = torch.full((2, 3), float("-inf"), dtype=getattr(torch, dtype))
    pair = ss.Tree([-1, 0], [5, 0])
    for reduce in ("host", "device"):
        r = ss.verify(pair, dead, reduce=reduce, temperature=0.0, top_p=0.9, seed=1)
        assert r.tokens.tolist() == [0, 0]
        with pytest.raises(ValueError, match="row 0 has no finite logit"):
            ss.verify(pair, dead, reduce=reduce, temperature=1.0, seed=1)


def test_a_top_k_past_int64_keeps_every_token():
    t = ss.Tree([-1, 0, 0], [0, 1, 2])
    logits = np.array([[0.0, 1.0, 2.0, 0.5]] * 3)
    kw = {"temperature": 1.0, "seed": 3}
    for seed in range(20):
        kw["seed"] = seed
        want = ss.verify(t, logits, top_k=0, **kw).tokens.tolist()
        assert ss.verify(t, logits, top_k=np.uint64(2**63), **kw).tokens.tolist() == want


def test_sampled_verify_releases_the_gil():
    """While a thread samples a large batch in Rust, Python keeps running in another thread."""

    vocab, n = 128256, 48
    row = np.zeros(vocab, dtype=np.float32)
    row[7] = 60.0  # the sample is always 7: the walk visits (and processes) every row
    tree, logits = ss.Tree.chain([7] * n), np.broadcast_to(row, (n, vocab))
    kw = {"temperature": 1.0, "top_p": 0.9, "seed": 3}
    assert ss.verify(tree, logits, **kw).num_accepted == n - 1
    ratios = []
    for _ in range(3):  # retries absorb a rare long preemption of the heartbeat thread
        ratios.append(heartbeat_gap(lambda: ss.verify(tree, logits, **kw)))
        if ratios[-1] < 0.5:
            break
    assert min(ratios) < 0.5, f"Python was blocked during verify: gap/call ratios {ratios}"


def test_torch_cpu_inputs_take_the_host_path():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    parents = [-1, 0, 0, 1, 1, 2]
    q = draft_rows(rng, len(parents))
    tokens = sampled_tokens(rng, parents, q, replace=True)
    logits = peaked_logits(rng, parents, tokens)
    t = ss.Tree(parents, tokens)
    kw = {"temperature": 0.9, "top_k": 4, "seed": 12}
    want = ss.verify(t, logits.astype(np.float32), draft_probs=q, **kw)
    got = ss.verify(
        t,
        torch.from_numpy(logits.astype(np.float32)),
        draft_probs=torch.from_numpy(q),
        temperature=torch.tensor(0.9),
        top_k=4,
        seed=np.uint64(12),
    )
    assert got.tokens.tolist() == want.tokens.tolist()
    assert got.accepted_nodes.tolist() == want.accepted_nodes.tolist()


def test_seed_none_draws_a_fresh_seed():
    n = 64
    logits = np.zeros((n, 50))
    draws = {
        tuple(ss.verify(star_batch(n), logits, temperature=1.0).tokens[:, 0]) for _ in range(3)
    }
    assert len(draws) == 3
