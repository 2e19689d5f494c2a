"""`ss.AcceptanceStats`: per-(depth, rank) acceptance counts from verify results, against the
plain-Python counts of `specsched.reference.acceptance_counts`, and its fitted vector."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import specsched as ss
from hypothesis import given, settings
from hypothesis import strategies as st
from specsched import reference as ref
from strategies import batches, trees


def padded(rows: list[list[int]], shape: tuple[int, int]) -> list[list[int]]:
    out = [[0] * shape[1] for _ in range(shape[0])]
    for d, row in enumerate(rows):
        out[d][: len(row)] = row
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(trees(1, 24, vocab=3), st.data()), min_size=1, max_size=6))
def test_counts_match_reference(items):
    stats = ss.AcceptanceStats()
    observed = []
    for (parents, tokens), data in items:
        target = data.draw(
            st.lists(st.integers(0, 2), min_size=len(parents), max_size=len(parents))
        )
        tree = ss.Tree(parents, tokens)
        r = ss.verify(tree, target_tokens=np.asarray(target))
        stats.update(tree, r)
        observed.append((parents, r.accepted_nodes.tolist()))
    trials, hits = ref.acceptance_counts(observed)
    shape = stats.trials.shape
    assert stats.trials.tolist() == padded(trials, shape)
    assert stats.hits.tolist() == padded(hits, shape)
    assert stats.steps == len(items)
    total_t = np.asarray(stats.trials).sum(axis=0)
    total_h = np.asarray(stats.hits).sum(axis=0)
    want = np.divide(total_h, total_t, out=np.zeros(len(total_t)), where=total_t > 0)
    np.testing.assert_allclose(stats.accept_probs(), want)
    lo, hi = stats.confidence_interval()
    assert np.all(lo <= want + 1e-12) and np.all(want <= hi + 1e-12)
    for z in (1.0, 1.96, 3.0):
        # Wilson's closed form, rank by rank ((0, 1) where a rank had no trial).
        lo, hi = stats.confidence_interval(z=z)
        for r, (h, n) in enumerate(zip(total_h, total_t, strict=True)):
            if n == 0:
                assert (lo[r], hi[r]) == (0.0, 1.0)
                continue
            p, z2 = h / n, z * z
            centre = (p + z2 / (2 * n)) / (1 + z2 / n)
            half = z * np.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
            assert lo[r] == pytest.approx(max(0.0, centre - half), abs=1e-12)
            assert hi[r] == pytest.approx(min(1.0, centre + half), abs=1e-12)
    assert stats.mean_accepted == pytest.approx(np.mean([len(path) - 1 for _, path in observed]))


@settings(max_examples=40, deadline=None)
@given(batches(max_trees=5, max_nodes=16, vocab=3), st.data())
def test_batch_update_equals_single_updates(batch, data):
    parents, tokens, offsets = batch
    tb = ss.TreeBatch.from_flat(parents, tokens, offsets)
    target = data.draw(st.lists(st.integers(0, 2), min_size=len(parents), max_size=len(parents)))
    rb = ss.verify(tb, target_tokens=np.asarray(target))
    together, apart = ss.AcceptanceStats(), ss.AcceptanceStats()
    together.update(tb, rb)
    for i in range(len(tb)):
        apart.update(tb[i], rb[i])
    assert together.trials.tolist() == apart.trials.tolist()
    assert together.hits.tolist() == apart.hits.tolist()
    merged = ss.AcceptanceStats()
    merged.merge(together)
    merged.merge(apart)
    assert merged.trials.tolist() == (2 * np.asarray(apart.trials)).tolist()
    assert merged.steps == 2 * len(tb)


def test_fitted_vector_converges_and_replans():
    # Star trees of 4 ranks; the target picks rank r with probability p[r] (else none).
    p = np.array([0.6, 0.2, 0.1, 0.0])
    rng = np.random.default_rng(0)
    tree = ss.Tree([-1, 0, 0, 0, 0], [0, 1, 2, 3, 4])
    stats = ss.AcceptanceStats()
    for _ in range(4000):
        r = rng.choice(5, p=[*p, 1 - p.sum()])
        target = np.zeros(5, np.int64)
        target[0] = r + 1 if r < 4 else 9
        stats.update(tree, ss.verify(tree, target_tokens=target))
    fitted = stats.accept_probs()
    lo, hi = stats.confidence_interval(z=4.0)
    assert np.all(lo <= p) and np.all(p <= hi)
    np.testing.assert_allclose(fitted, p, atol=0.04)
    choices, value = stats.optimal_tree(8, max_depth=3)
    want_choices, want_value = ss.optimal_tree(fitted, 8, 3)
    assert (choices, value) == (want_choices, want_value)
    assert "steps=4000" in repr(stats)


def test_interval_holds_the_estimate_at_none_and_all_accepted():
    # Rank 0 always accepted (3 of 3), rank 1 never (0 of 3): the bounds at p = 1 and p = 0
    # are exact, not an ulp inside (the textbook formula cancels to 1 - 2e-16 and 1e-16).
    stats = ss.AcceptanceStats()
    tree = ss.Tree([-1, 0, 0], [0, 1, 2])
    for _ in range(3):
        stats.update(tree, ss.verify(tree, target_tokens=np.array([1, 0, 0])))
    assert stats.accept_probs().tolist() == [1.0, 0.0]
    for z in (1.0, 1.96, 4.0):
        lo, hi = stats.confidence_interval(z=z)
        assert hi[0] == 1.0 and lo[1] == 0.0
        assert 0.0 < lo[0] < 1.0 and 0.0 < hi[1] < 1.0
    # As z grows the interval tends to (0, 1); past z**2's float range it is that, not NaN.
    for z in (1e150, 1e155, 1e300):
        lo, hi = stats.confidence_interval(z=z)
        assert lo.tolist() == [0.0, 0.0] and hi.tolist() == [1.0, 1.0], z


def test_empty_stats_and_bad_input():
    stats = ss.AcceptanceStats()
    assert stats.trials.shape == (0, 0) and stats.accept_probs().tolist() == []
    assert stats.mean_accepted == 0.0
    assert stats.optimal_tree(4) == ([], 1.0)
    tree = ss.Tree([-1, 0, 0], [0, 1, 2])
    other = ss.Tree([-1, 0, 1], [0, 1, 2])
    r = ss.verify(other, target_tokens=np.array([1, 2, 0]))
    with pytest.raises(ValueError, match=r"accepted node 2 \(step 2\) is not a child of node 1"):
        stats.update(tree, r)
    assert stats.steps == 0 and stats.trials.shape == (0, 0)
    with pytest.raises(ValueError, match="3 nodes"):
        stats.update(ss.Tree([-1, 0], [0, 1]), r)
    with pytest.raises(TypeError, match=r"^tree / result: expected \(Tree, VerifyResult\)"):
        stats.update(tree, "result")
    rb = ss.verify(ss.TreeBatch([tree, tree]), target_tokens=np.array([1, 0, 0, 2, 0, 0]))
    with pytest.raises(ValueError, match="different tree sizes"):
        stats.update(ss.TreeBatch([tree, other, tree]), rb)
    # A result of another tree whose accepted path also exists here (same shape, other tokens).
    chain_a, chain_b = ss.Tree([-1, 0, 0], [0, 5, 6]), ss.Tree([-1, 0, 0], [0, 7, 8])
    rb1 = ss.verify(chain_b, target_tokens=np.array([7, 3, 3]))
    with pytest.raises(ValueError, match=r"node 1 \(step 1\) holds token 5 in this tree"):
        stats.update(chain_a, rb1)
    both = ss.verify(ss.TreeBatch([chain_b, chain_b]), target_tokens=np.array([7, 3, 3, 0, 0, 0]))
    with pytest.raises(ValueError, match=r"request 0: accepted node 1 \(step 1\) holds token 5"):
        stats.update(ss.TreeBatch([chain_a, chain_a]), both)
    assert stats.steps == 0 and stats.trials.shape == (0, 0)
    with pytest.raises(ValueError, match="z"):
        stats.confidence_interval(z=0.0)


def test_merged_counts_stay_within_int64():
    # Self-merges double the counts: the 63rd wrapped the int64 getters negative, the 64th
    # to zero. A merge past int64 is refused and changes nothing.
    t = ss.Tree([-1, 0], [1, 2])
    stats = ss.AcceptanceStats()
    stats.update(t, ss.verify(t, np.zeros((2, 4))))
    for _ in range(62):
        stats.merge(stats)
    with pytest.raises(ValueError, match=r"other: the merged counts would pass 2\*\*63 - 1"):
        stats.merge(stats)
    assert stats.steps == 2**62 and stats.trials.tolist() == [[2**62]]


def test_a_foreign_result_is_named_once():
    chain = ss.Tree.chain([0, 1, 2, 3])
    other = ss.Tree.chain([0, 4, 2, 3])
    result = ss.verify(other, np.eye(8)[[4, 2, 3, 0]] * 5)
    with pytest.raises(ValueError, match=r"^result: accepted node 1 \(step 1\) holds token"):
        ss.AcceptanceStats().update(chain, result)


def test_updates_keep_counts_within_int64():
    # `update` added unchecked: at steps == 2**63 - 1 one more step wrapped the getters.
    t = ss.Tree([-1, 0], [1, 2])
    power = ss.AcceptanceStats()
    power.update(t, ss.verify(t, np.zeros((2, 4))))  # one step, one trial, no hit
    stats = ss.AcceptanceStats()
    for k in range(63):  # stats = sum of 2**k steps = 2**63 - 1
        stats.merge(power)
        if k < 62:
            power.merge(power)
    assert stats.steps == 2**63 - 1
    with pytest.raises(ValueError, match=r"^result: the counts would pass 2\*\*63 - 1"):
        stats.update(t, ss.verify(t, np.zeros((2, 4))))
    assert stats.steps == 2**63 - 1 and stats.trials.tolist() == [[2**63 - 1]]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(trees(1, 24, vocab=3), st.data()), max_size=6))
def test_pickle_keeps_the_counts(items):
    # A worker's statistics reach the process that merges them: the counts, the fitted vector
    # and the plan survive the trip, and the copy merges like the original.
    stats = ss.AcceptanceStats()
    for (parents, tokens), data in items:
        target = data.draw(
            st.lists(st.integers(0, 2), min_size=len(parents), max_size=len(parents))
        )
        tree = ss.Tree(parents, tokens)
        stats.update(tree, ss.verify(tree, target_tokens=np.asarray(target)))
    copy = pickle.loads(pickle.dumps(stats))
    assert copy is not stats
    assert copy.trials.tolist() == stats.trials.tolist()
    assert copy.hits.tolist() == stats.hits.tolist()
    assert (copy.steps, copy.mean_accepted) == (stats.steps, stats.mean_accepted)
    assert copy.accept_probs().tolist() == stats.accept_probs().tolist()
    assert copy.optimal_tree(8) == stats.optimal_tree(8)
    twice = pickle.loads(pickle.dumps(stats))
    twice.merge(copy)
    assert twice.hits.tolist() == (2 * stats.hits).tolist() and twice.steps == 2 * stats.steps


def test_restored_counts_are_checked():
    tree = ss.Tree([-1, 0, 0, 1], [5, 6, 7, 8])
    stats = ss.AcceptanceStats()
    for target in ([6, 8, 0, 0], [7, 0, 0, 0], [0, 0, 0, 0]):
        stats.update(tree, ss.verify(tree, target_tokens=np.array(target)))
    trials, hits, steps, accepted = stats.__reduce__()[2]
    assert (steps, accepted) == (3, 3)
    bad = [
        ((trials, hits[:1], steps, accepted), "hits: expected shape"),
        ((trials.ravel(), hits.ravel(), steps, accepted), "trials: expected a 2-D array"),
        ((trials, hits, -1, accepted), "steps"),
        (
            (trials + 3, hits, steps, accepted),
            r"trials\[0, 0\] = 6: expected a count in \[0, 3\], the trees that reached depth 0",
        ),
        (
            (trials, hits + np.eye(*hits.shape, dtype=np.int64) * 3, steps, accepted),
            r"hits\[0, 0\]",
        ),
        ((trials, hits, steps, accepted + 1), "accepted: 4, but the hits add up to 3"),
    ]
    # Four hits at the root's children over three trees (each rank within its trials).
    assert trials.tolist() == [[3, 3], [1, 0]] and hits.tolist() == [[1, 1], [1, 0]]
    bad.append(
        (
            (trials, np.array([[2, 2], [0, 0]]), steps, 4),
            "depth 0 has 4 hits, more than the 3 trees that reached it",
        )
    )
    wrong_type = [
        (None, "state: expected a tuple"),
        ((trials, hits), "got a tuple of 2"),
        ((trials.astype(float), hits, steps, accepted), "trials: expected an integer array"),
        ((trials, hits, True, accepted), "steps: expected an int, got bool"),
    ]
    # Children tried one level down, where only one tree arrived (one hit at depth 0 here).
    bad.append(
        (
            (np.array([[3, 3], [2, 0]]), np.array([[1, 0], [0, 0]]), steps, 1),
            r"trials\[1, 0\] = 2: expected a count in \[0, 1\], the trees that reached depth 1",
        )
    )
    # Trials at every depth with no hit to reach them: their rank totals would pass 2**64.
    top = 2**63 - 1
    bad.append(
        (
            (np.full((3, 1), top), np.full((3, 1), top // 3), top, 3 * (top // 3)),
            r"trials\[1, 0\]",
        )
    )
    # A depth's hits are added exactly, past 2**64.
    bad.append(
        (
            (np.full((1, 3), top), np.full((1, 3), top), top, top),
            f"depth 0 has {3 * top} hits, more than the {top} trees",
        )
    )
    cases = [(*case, ValueError) for case in bad] + [(*case, TypeError) for case in wrong_type]
    for state, message, kind in cases:
        fresh = ss.AcceptanceStats()
        with pytest.raises(kind, match=message):
            fresh.__setstate__(state)
        assert fresh.steps == 0 and fresh.trials.size == 0  # refused: left as it was
    # int32 counts (a state written by hand) are read as int64.
    fresh = ss.AcceptanceStats()
    fresh.__setstate__((trials.astype(np.int32), hits.astype(np.int32), steps, accepted))
    assert fresh.hits.tolist() == hits.tolist()
