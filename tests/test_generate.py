"""The speculative decode loop (`specsched.generate`): lossless end to end.

- Greedy: every drafter's output equals autoregressive greedy decoding token for token, on the
  shipped tiny model (batch 1 and 4, prompts of different lengths) and on a random model driven
  by an oracle drafter that hides the true continuation at random places in random trees.
- The target's KV cache after speculative decoding equals the cache autoregressive decoding
  builds (compaction kept exactly the accepted path).
- Sampling: on an order-2 toy target (no torch), the first three tokens of `generate` with a
  fixed seed follow the exact processed target distribution (the loss-less-ness harness of
  `specsched.testing`), and the same seed reproduces the same tokens.
- EOS and the length limit cut inside an accepted path; bad arguments raise.
"""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import specsched as ss
from specsched import reference as ref
from specsched.drafting import NgramChainDrafter, SuffixTreeDrafter
from specsched.generate import Generation, TargetStep, generate, root_only
from specsched.testing import (
    OracleDrafter,
    Verdict,
    chi_square_pvalue,
    exact_joint,
    processed_table,
    toy_models,
    tv_distance,
    tv_noise,
)

# --- an order-2 toy target and drafter (numpy only) ------------------------------------------


class ToyTarget:
    """`logits = table[previous token, token]` per position; no cache needed."""

    def __init__(self, logits: np.ndarray) -> None:
        self.table = logits
        self.prev = np.zeros(0, dtype=np.int64)  # token before each row's root
        self.trees: ss.TreeBatch | None = None

    def prefill(self, input_ids: Sequence[Sequence[int]]) -> TargetStep:
        ctx = np.array([[p[-2], p[-1]] for p in input_ids], dtype=np.int64)
        self.prev = ctx[:, 1].copy()
        return TargetStep(self.table[ctx[:, 0], ctx[:, 1]])

    def forward_tree(self, trees: ss.TreeBatch) -> TargetStep:
        offsets, parents, tokens = trees.offsets, trees.parents, trees.tokens
        row = np.repeat(np.arange(trees.num_trees), np.diff(offsets))
        parent_token = np.where(
            parents >= 0, tokens[offsets[row] + np.maximum(parents, 0)], self.prev[row]
        )
        self.trees = trees
        return TargetStep(self.table[parent_token, tokens])

    def accept(self, result: Any) -> None:
        assert self.trees is not None
        last = (
            self.trees.offsets[:-1]
            + result.accepted_nodes[np.arange(self.trees.num_trees), result.num_accepted]
        )
        self.prev = self.trees.tokens[last].astype(np.int64)


class ToyDrafter:
    """Root, the draft's top-2 children and each child's top-1 child (5 nodes)."""

    def __init__(self, draft_logits: np.ndarray) -> None:
        self.table = draft_logits
        self.prev = np.zeros(0, dtype=np.int64)

    def start(self, input_ids: Any, first_tokens: np.ndarray, prefill: TargetStep) -> None:
        self.prev = np.array([p[-1] for p in input_ids], dtype=np.int64)

    def propose(self, roots: np.ndarray, active: np.ndarray) -> ss.TreeBatch:
        b = roots.shape[0]
        top2 = np.argsort(-self.table[self.prev, roots], axis=-1, kind="stable")[:, :2]
        grand = np.argmax(self.table[roots[:, None], top2], axis=-1)
        tokens = np.stack([roots, top2[:, 0], top2[:, 1], grand[:, 0], grand[:, 1]], axis=1)
        parents = np.tile(np.array([-1, 0, 0, 1, 2], dtype=np.int32), b)
        return ss.TreeBatch.from_flat(parents, tokens.reshape(-1), np.arange(b + 1) * 5)

    def commit(self, trees: ss.TreeBatch, result: Any, step: TargetStep, kept: Any) -> None:
        k = result.num_accepted
        rows = np.arange(trees.num_trees)
        # The token before the next root: the last accepted node's token.
        self.prev = trees.tokens[trees.offsets[:-1] + result.accepted_nodes[rows, k]].copy()


def test_sampling_follows_the_target_distribution() -> None:
    models = toy_models(vocab=4, seed=3, mismatch=0.8)
    rows, temperature = 20_000, 0.9
    prompts = [list(models.context)] * rows
    gen = generate(
        ToyTarget(models.target_logits),
        ToyDrafter(models.draft_logits),
        prompts,
        3,
        temperature=temperature,
        seed=7,
    )
    assert gen.mean_accepted > 0.3  # the drafts are used, not just the bonus
    v = models.vocab
    codes = np.array([t[0] * v * v + t[1] * v + t[2] for t in gen.tokens])
    counts = np.bincount(codes, minlength=v**3)
    joint = exact_joint(processed_table(models, temperature), models.context, 3)
    verdict = Verdict(
        tv_distance(counts, joint), tv_noise(joint, rows), chi_square_pvalue(counts, joint)
    )
    assert verdict.lossless, verdict
    again = generate(
        ToyTarget(models.target_logits),
        ToyDrafter(models.draft_logits),
        prompts[:50],
        3,
        temperature=temperature,
        seed=7,
    )
    assert again.tokens == gen.tokens[:50]


def test_toy_greedy_matches_autoregressive() -> None:
    models = toy_models(vocab=6, seed=1, mismatch=0.5)
    prompts = [[0, 1], [2, 3, 4], [5, 5]]
    ar = generate(ToyTarget(models.target_logits), None, prompts, 25)
    spec = generate(ToyTarget(models.target_logits), ToyDrafter(models.draft_logits), prompts, 25)
    assert spec.tokens == ar.tokens
    assert ar.tokens_per_forward == pytest.approx(25 / 25)
    assert spec.mean_accepted > 0
    assert spec.tokens_per_forward > 1.0
    assert sum(spec.forwards) < sum(ar.forwards)


def test_eos_and_length_cut_inside_an_accepted_path() -> None:
    models = toy_models(vocab=6, seed=1, mismatch=0.0)  # the draft is the target: long accepts
    prompts = [[0, 1], [2, 3]]
    ar = generate(ToyTarget(models.target_logits), None, prompts, 40)
    eos = ar.tokens[0][5]
    cut = [row[: row.index(eos) + 1] if eos in row else row for row in ar.tokens]
    spec = generate(
        ToyTarget(models.target_logits),
        ToyDrafter(models.draft_logits),
        prompts,
        40,
        eos_token_id=eos,
    )
    assert spec.tokens == cut
    short = generate(ToyTarget(models.target_logits), ToyDrafter(models.draft_logits), prompts, 4)
    assert short.tokens == [row[:4] for row in ar.tokens]


class RecordingDrafter(ToyDrafter):
    """ToyDrafter that records what `commit` tells it each row kept."""

    def start(self, input_ids: Any, first_tokens: np.ndarray, prefill: TargetStep) -> None:
        super().start(input_ids, first_tokens, prefill)
        self.committed: list[list[int]] = [[] for _ in input_ids]
        self.cut_steps = 0

    def commit(self, trees: ss.TreeBatch, result: Any, step: TargetStep, kept: Any) -> None:
        super().commit(trees, result, step, kept)
        for b, k in enumerate(kept.tolist()):
            self.committed[b] += result.tokens[b, :k].tolist()
        self.cut_steps += int(np.any((kept > 0) & (kept < result.num_accepted + 1)))


def test_drafters_learn_only_emitted_tokens() -> None:
    # Tokens the target accepted past EOS are never emitted: `commit` must not hand them to
    # the drafter, whose suffix index would otherwise cache them as part of the response.
    models = toy_models(vocab=6, seed=1, mismatch=0.0)
    prompts = [[0, 1], [2, 3]]
    eos = generate(ToyTarget(models.target_logits), None, prompts, 40).tokens[0][5]
    recorder = RecordingDrafter(models.draft_logits)
    spec = generate(ToyTarget(models.target_logits), recorder, prompts, 40, eos_token_id=eos)
    assert recorder.committed == [row[1:] for row in spec.tokens]  # the first comes at start
    assert recorder.cut_steps > 0  # EOS fell inside an accepted path
    suffix = SuffixTreeDrafter(8)
    spec = generate(ToyTarget(models.target_logits), suffix, prompts, 40, eos_token_id=eos)
    assert suffix.index.num_global_tokens == sum(map(len, spec.tokens))


def test_suffix_drafters_sharing_an_index_keep_each_others_responses() -> None:
    # Two drafters (two batches) on one global index: their request ids never meet, so
    # neither's finished responses replace the other's in the cache, and both can be live.
    models = toy_models(vocab=6, seed=1, mismatch=0.2)
    prompts = [[0, 1], [2, 3]]
    index = ss.SuffixDrafter()
    index.start_request(1, np.array([5, 5]))  # an id the caller gave the index directly
    first, second = SuffixTreeDrafter(8, index=index), SuffixTreeDrafter(8, index=index)
    runs = [generate(ToyTarget(models.target_logits), d, prompts, 12) for d in (first, second)]
    assert len(index.cached_responses) == 4
    assert index.num_global_tokens == sum(len(t) for run in runs for t in run.tokens)
    pre = TargetStep(None)
    first.start(prompts, np.array([1, 2]), pre)
    second.start(prompts, np.array([1, 2]), pre)  # both live at once
    assert len(set(first.request_ids) | set(second.request_ids) | {1}) == 5


def test_a_failed_run_leaves_no_request_in_a_shared_index() -> None:
    # A target that fails on its third forward (a transient CUDA OOM, say): the drafter's
    # requests leave the shared index with the failure, and a bad prompt part-way through
    # `start` takes the rows started before it along.
    models = toy_models(vocab=6, seed=1, mismatch=0.2)

    class Flaky(ToyTarget):
        forwards = 0

        def forward_tree(self, trees: ss.TreeBatch) -> TargetStep:
            self.forwards += 1
            if self.forwards == 3:
                raise RuntimeError("transient target failure")
            return super().forward_tree(trees)

    index = ss.SuffixDrafter()
    drafter = SuffixTreeDrafter(8, index=index)
    prompts = [[0, 1, 2, 3] * 5, [2, 3, 4] * 5]
    for _ in range(3):
        with pytest.raises(RuntimeError, match="transient"):
            generate(Flaky(models.target_logits), drafter, prompts, 20)
        assert index.num_requests == 0
    generate(ToyTarget(models.target_logits), drafter, prompts, 20)
    assert index.num_requests == 0
    with pytest.raises(ValueError, match="prompt"):
        drafter.start([[1, 2], [1, 2**31]], np.array([3, 3]), TargetStep(None))
    assert index.num_requests == 0
    # A run left unfinished by a caller of the protocol is dropped by the next start.
    drafter.start(prompts, np.array([1, 2]), TargetStep(None))
    drafter.start(prompts, np.array([1, 2]), TargetStep(None))
    assert index.num_requests == 2


def test_trees_are_cut_to_the_tokens_a_request_has_left() -> None:
    models = toy_models(vocab=4, seed=5, mismatch=0.3)
    # Near the end, a request is verified only as deep as it can still emit: the ToyDrafter's
    # depth-2 trees are cut to the root and one level when one or two tokens are left.
    target = ToyTarget(models.target_logits)
    seen: list[int] = []
    forward = target.forward_tree

    def record(trees: ss.TreeBatch) -> TargetStep:
        seen.append(int(trees.max_depth))
        return forward(trees)

    target.forward_tree = record  # type: ignore[method-assign]
    out = generate(target, ToyDrafter(models.draft_logits), [[0, 1]], 6)
    ar = generate(ToyTarget(models.target_logits), None, [[0, 1]], 6)
    assert out.tokens == ar.tokens
    left = 6 - 1  # the first token comes from the prefill
    for depth, k in zip(seen, out.accepted[0], strict=True):
        assert depth <= left - 1
        left -= k + 1


def test_target_synchronize_is_called_around_its_work() -> None:
    # A target with device work queued asynchronously gets `synchronize()` after prefill,
    # each forward and each accept, so that the time split counts its device time as its own.
    models = toy_models(vocab=4, seed=5, mismatch=0.3)
    calls: list[str] = []

    class Synced(ToyTarget):
        def forward_tree(self, trees: ss.TreeBatch) -> TargetStep:
            calls.append("forward")
            return super().forward_tree(trees)

        def accept(self, result: Any) -> None:
            calls.append("accept")
            super().accept(result)

        def synchronize(self) -> None:
            calls.append("sync")

    out = generate(Synced(models.target_logits), ToyDrafter(models.draft_logits), [[0, 1]], 5)
    assert calls[0] == "sync"  # after the prefill
    assert calls[1:] == ["forward", "sync", "accept", "sync"] * out.steps


def test_bad_arguments() -> None:
    target = ToyTarget(toy_models(vocab=4).target_logits)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(target, None, [[0, 1]], 0)
    with pytest.raises(ValueError, match=r"input_ids\[1\]: empty"):
        generate(target, None, [[0, 1], []], 3)
    with pytest.raises(ValueError, match="at least one"):
        generate(target, None, [], 3)
    with pytest.raises(TypeError, match="input_ids"):
        generate(target, None, "ab", 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="max_new_tokens: expected an int, got float"):
        generate(target, None, [[0, 1]], 2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="max_new_tokens: expected an int, got NoneType"):
        generate(target, None, [[0, 1]], None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"input_ids\[1\]: expected a sequence of int token ids"):
        generate(target, None, [[0, 1], [1, 2.5]], 3)
    with pytest.raises(ValueError, match=r"input_ids\[0\]: negative token id -1"):
        generate(target, None, [[0, -1]], 3)
    with pytest.raises(TypeError, match=r"input_ids\[0\]: expected a sequence of int token"):
        generate(target, None, [[0, [1, 2]]], 3)  # ragged: numpy's "inhomogeneous shape"
    with pytest.raises(TypeError, match=r"input_ids\[0\]: a bool among the token ids"):
        generate(target, None, [[0, True]], 3)
    # The loop's scalars, each named (numpy's own messages named none of them).
    for kw, exc, match in [
        ({"seed": -1}, ValueError, r"seed: expected an int in \[0, 2\*\*64\)"),
        ({"seed": 2**64}, ValueError, "seed: expected an int in"),
        ({"seed": "x"}, TypeError, "seed: expected an int, got str"),
        ({"seed": [1, 2]}, TypeError, "seed: expected an int, got list"),
        ({"seed": True}, TypeError, "seed: expected an int, got bool"),
        ({"temperature": np.array([0.5, 1.0])}, TypeError, "temperature: expected a float"),
        ({"temperature": None}, TypeError, "temperature: expected a float"),
        ({"eos_token_id": "a"}, TypeError, "eos_token_id: expected an int, got str"),
        ({"eos_token_id": [1, 2.5]}, TypeError, r"eos_token_id\[1\]: expected an int"),
        ({"eos_token_id": -5}, ValueError, "eos_token_id: -5 is outside"),
        # Checked greedy or not (ignored unchecked before), and before the prefill.
        ({"top_k": "x"}, TypeError, "top_k: expected integers"),
        ({"top_k": -1}, ValueError, "top_k: entry 0 is -1"),
        ({"top_p": 5.0}, ValueError, r"top_p: entry 0 is 5; expected a value in \(0, 1\]"),
        ({"temperature": -1.0}, ValueError, "temperature: entry 0 is -1"),
        ({"temperature": 1.0, "top_k": [1, 2]}, ValueError, "top_k: has 2 entries"),
    ]:
        with pytest.raises(exc, match=match):
            generate(target, None, [[0, 1]], 3, **kw)

    class NoPrefill(ToyTarget):
        def prefill(self, input_ids: Sequence[Sequence[int]]) -> TargetStep:
            raise AssertionError("the arguments are checked before the prefill")

    with pytest.raises(ValueError, match="top_p"):
        generate(NoPrefill(target.table), None, [[0, 1]], 3, temperature=1.0, top_p=2.0)
    # An unsigned count: uint64 - int64 made the lengths left float64 (a TypeError naming
    # max_depth, an argument nobody passed).
    models = toy_models(vocab=4)
    want = generate(ToyTarget(models.target_logits), ToyDrafter(models.draft_logits),
                    [[0, 1], [2, 3]], 6).tokens  # fmt: skip
    assert generate(ToyTarget(models.target_logits), ToyDrafter(models.draft_logits),
                    [[0, 1], [2, 3]], np.uint64(6)).tokens == want  # fmt: skip

    class WrongRoot(ToyDrafter):
        def propose(self, roots: np.ndarray, active: np.ndarray) -> ss.TreeBatch:
            return root_only(roots + 1)

    with pytest.raises(ValueError, match="root"):
        generate(target, WrongRoot(toy_models(vocab=4).draft_logits), [[0, 1]], 3)


def test_any_of_several_eos_ids_stops_a_request() -> None:
    # HF generation configs give a list of end tokens (Llama 3: [128001, 128009]).
    models = toy_models(vocab=6, seed=2, mismatch=0.3)
    free = generate(ToyTarget(models.target_logits), None, [[0, 1], [2, 3]], 12).tokens
    eos = [free[0][4], free[1][6]]
    for drafter in (None, ToyDrafter(models.draft_logits)):
        got = generate(ToyTarget(models.target_logits), drafter, [[0, 1], [2, 3]], 12,
                       eos_token_id=eos).tokens  # fmt: skip
        for row, want in zip(got, free, strict=True):
            stop = next(j for j, t in enumerate(want) if t in eos)
            assert row == want[: stop + 1]
        assert generate(ToyTarget(models.target_logits), drafter, [[0, 1], [2, 3]], 12,
                        eos_token_id=tuple(eos)).tokens == got  # fmt: skip


def test_generation_statistics() -> None:
    models = toy_models(vocab=6, seed=2, mismatch=0.3)
    gen = generate(
        ToyTarget(models.target_logits), ToyDrafter(models.draft_logits), [[0, 1], [1, 2]], 12
    )
    assert isinstance(gen, Generation)
    assert gen.steps == max(len(a) for a in gen.accepted)
    assert gen.num_tokens == 24
    for b in range(2):
        assert len(gen.accepted[b]) == gen.forwards[b] - 1
        # first token from the prefill, then k + 1 per step (trees are cut to the tokens left)
        assert sum(gen.accepted[b]) + len(gen.accepted[b]) + 1 == 12
    assert gen.wall_s >= gen.target_s + gen.verify_s + gen.kv_s
    assert 0 <= gen.specsched_share
    # Without a drafter nothing is drafted: the root-only trees are specsched's tree work,
    # and the loop's bookkeeping is in no timer (it was counted as draft time).
    plain = generate(ToyTarget(models.target_logits), None, [[0, 1], [1, 2]] * 4, 40)
    assert plain.draft_s == 0.0 and plain.build_s > 0.0
    assert plain.wall_s >= plain.target_s + plain.build_s + plain.verify_s + plain.kv_s


def test_model_free_drafter_arguments_are_checked_by_name() -> None:
    # Refused when the drafter is made, naming its own arguments (they failed at the first
    # propose after the target's prefill, naming the index's `budgets`).
    for kw, exc, match in [
        ({"budget": 2.5}, TypeError, "budget: expected an int, got float"),
        ({"budget": True}, TypeError, "budget: expected an int, got bool"),
        ({"budget": 0}, ValueError, "budget: must be >= 1, got 0"),
        ({"min_prob": 0}, ValueError, r"min_prob: expected a value in \(0, 1\]"),
        ({"min_prob": "x"}, TypeError, "min_prob: expected a number, got str"),
        ({"max_spec_factor": -1}, ValueError, "max_spec_factor: expected a finite value >= 0"),
        ({"chain": 1}, TypeError, "chain: expected a bool, got int"),
        ({"budget": 2**63}, ValueError, "budget: 9223372036854775808 does not fit in int64"),
        ({"index": "x"}, TypeError, "index: expected a specsched.SuffixDrafter or None, got str"),
    ]:
        with pytest.raises(exc, match=match):
            SuffixTreeDrafter(**kw)


def test_drafters_off_the_protocol_are_named_before_the_prefill() -> None:
    models = toy_models(vocab=6, seed=2, mismatch=0.3)

    class CountingTarget(ToyTarget):
        prefills = 0

        def prefill(self, prompts: Any) -> Any:
            CountingTarget.prefills += 1
            return super().prefill(prompts)

    target = CountingTarget(models.target_logits)
    for drafter in ("suffix-tree", object()):
        with pytest.raises(TypeError, match=r"^drafter: expected a Drafter"):
            generate(target, drafter, [[0, 1]], 4)
    assert CountingTarget.prefills == 0

    class NoTreeTarget(CountingTarget):
        forward_tree = None  # type: ignore[assignment]

    # A target off the protocol likewise (an AttributeError, after the prefill for this one).
    for bad in (None, "gpt2", NoTreeTarget(models.target_logits)):
        with pytest.raises(TypeError, match=r"^target: expected a TargetModel \(prefill, "):
            generate(bad, None, [[0, 1]], 4)
    assert CountingTarget.prefills == 0

    class OneTreeDrafter(ToyDrafter):
        def propose(self, roots: np.ndarray, active: np.ndarray) -> Any:
            return super().propose(roots, active)[0]  # a Tree, not a TreeBatch

    with pytest.raises(
        ValueError, match=r"^drafter.propose: returned a Tree, expected a TreeBatch"
    ):
        generate(target, OneTreeDrafter(models.draft_logits), [[0, 1]], 4)


class PositionedToyTarget(ToyTarget):
    """A ToyTarget that encodes `max_positions` positions and refuses a node past them, as
    a model's position embeddings do."""

    def __init__(self, logits: np.ndarray, max_positions: int) -> None:
        super().__init__(logits)
        self.max_positions = max_positions
        self.lengths = np.zeros(0, dtype=np.int64)
        self.deepest_position = -1

    def prefill(self, input_ids: Sequence[Sequence[int]]) -> TargetStep:
        self.lengths = np.array([len(p) for p in input_ids], dtype=np.int64)
        return super().prefill(input_ids)

    def forward_tree(self, trees: ss.TreeBatch) -> TargetStep:
        row = np.repeat(np.arange(trees.num_trees), np.diff(trees.offsets))
        last = int((self.lengths[row] + trees.depths).max())
        if last >= self.max_positions:
            raise ValueError(f"positions: {last} is beyond max_positions {self.max_positions}")
        self.deepest_position = max(self.deepest_position, last)
        return super().forward_tree(trees)

    def accept(self, result: Any) -> None:
        super().accept(result)
        self.lengths += result.num_accepted + 1


def test_trees_are_cut_below_the_targets_last_position() -> None:
    # The request ends on EOS after 5 tokens, its autoregressive decoding at position 6; the
    # drafter's depth-2 trees reached position 7, past the model's 7 positions, and the run
    # was refused for drafts it would never emit.
    models = toy_models(vocab=6, seed=2, mismatch=0.3)
    prompt = [[1, 2, 3]]
    plain = PositionedToyTarget(models.target_logits, 7)
    want = generate(plain, None, prompt, 100, eos_token_id=1)
    assert [len(t) for t in want.tokens] == [5] and plain.deepest_position == 6
    target = PositionedToyTarget(models.target_logits, 7)
    got = generate(target, ToyDrafter(models.draft_logits), prompt, 100, eos_token_id=1)
    assert got.tokens == want.tokens and target.deepest_position == 6
    # One position fewer: the autoregressive run is refused by the target, and so is this one.
    for drafter in (None, ToyDrafter(models.draft_logits)):
        with pytest.raises(ValueError, match=r"^positions: 6 is beyond"):
            generate(
                PositionedToyTarget(models.target_logits, 6), drafter, prompt, 100, eos_token_id=1
            )


def test_a_limit_past_int64_is_no_limit() -> None:
    # Clamped: the lengths left stay int64 when a tree is cut for a finished row (row 0
    # ends on EOS 1 at 14 tokens, row 1 at 5, while ToyDrafter keeps proposing its 5 nodes).
    models = toy_models(vocab=6, seed=2, mismatch=0.3)
    prompts = [[0, 1], [1, 2, 3]]
    want = generate(ToyTarget(models.target_logits), None, prompts, 100, eos_token_id=1)
    assert [len(t) for t in want.tokens] == [14, 5]
    for limit in (2**63, 2**70):
        target, drafter = ToyTarget(models.target_logits), ToyDrafter(models.draft_logits)
        got = generate(target, drafter, prompts, limit, eos_token_id=1)
        assert got.tokens == want.tokens


def test_target_layout_time_is_specsched_time() -> None:
    """A target's `layout_seconds` (its time in specsched's tree layouts) moves from the
    target's time to specsched's `layout_s`."""

    class LayingOutTarget(ToyTarget):
        def forward_tree(self, trees: ss.TreeBatch) -> Any:
            t0 = time.perf_counter()
            time.sleep(0.002)  # stands in for `pad_trees`
            self.layout_seconds = getattr(self, "layout_seconds", 0.0) + time.perf_counter() - t0
            return super().forward_tree(trees)

    models = toy_models(vocab=6, seed=2, mismatch=0.3)
    target = LayingOutTarget(models.target_logits)
    target.layout_seconds = 0.5  # time from before this call is not this call's
    gen = generate(target, ToyDrafter(models.draft_logits), [[0, 1], [1, 2]], 12)
    assert gen.layout_s == pytest.approx(target.layout_seconds - 0.5)
    assert gen.layout_s >= 0.002 * gen.steps
    # The toy's forwards are numpy on a 6-token vocabulary: far under 2 ms a step.
    assert 0 < gen.target_s < gen.layout_s
    assert gen.specsched_s == pytest.approx(gen.build_s + gen.layout_s + gen.verify_s + gen.kv_s)
    assert gen.wall_s >= gen.target_s + gen.specsched_s


# --- torch: the shipped tiny model, a random model with an oracle drafter -----------------------

torch = pytest.importorskip("torch")

from specsched.models.eagle import (  # noqa: E402
    EagleChainDrafter,
    EagleDrafter,
    EagleStaticDrafter,
)
from specsched.models.tiny import (  # noqa: E402
    WEIGHTS_DIR,
    EagleHead,
    TinyConfig,
    TinyLM,
    TinyTarget,
    load_tiny,
)

PROMPTS = [
    list(b"    def __init__(self, name, value=None):\n        self."),
    list(b"import os\n"),
    list(b"for i in range(len(items)):\n    if items[i] "),
    list(b'class Error(Exception):\n    """'),
]


@pytest.fixture(scope="module")
def shipped() -> tuple[Any, Any]:
    if not (WEIGHTS_DIR / "target.npz").exists():
        pytest.fail(f"shipped weights missing under {WEIGHTS_DIR}")
    # float64: the tree forward and the one-token forward then agree to ~1e-15, so a greedy
    # tie cannot flip between them and equality is exact.
    return load_tiny(dtype=torch.float64)


def drafters(target: TinyLM, head: EagleHead) -> dict[str, Any]:
    return {
        "eagle-tree": EagleDrafter(target, head, topk=4, depth=5, budget=24),
        "eagle-chain": EagleChainDrafter(target, head, depth=5),
        "eagle-static": EagleStaticDrafter(
            target, head, ss.optimal_tree([0.7, 0.2, 0.1], 16, max_depth=5)[0]
        ),
        "suffix": SuffixTreeDrafter(16),
        "ngram": NgramChainDrafter(5),
    }


@pytest.mark.parametrize("batch", [1, 4])
def test_shipped_model_greedy_is_autoregressive(shipped: tuple[Any, Any], batch: int) -> None:
    target, head = shipped
    prompts = PROMPTS[:batch]
    ar = generate(TinyTarget(target), None, prompts, 48)
    for name, drafter in drafters(target, head).items():
        spec = generate(TinyTarget(target), drafter, prompts, 48)
        assert spec.tokens == ar.tokens, name
        assert spec.layout_s > 0, name  # the target's tree layout, counted as specsched's
        if name.startswith("eagle"):
            assert spec.mean_accepted > 0.5, name  # the trained head really drafts


def test_eos_inside_a_path_while_another_request_runs(shipped: tuple[Any, Any]) -> None:
    # One request stops on an EOS inside an accepted path and the other runs on: the finished
    # row's next root is the EOS it emitted (what every drafter has as its last token), not
    # the bonus after it, and `accepted` counts the drafts it emitted.
    target, head = shipped
    prompts = [PROMPTS[0], PROMPTS[1]]
    free = generate(TinyTarget(target), None, prompts, 40).tokens
    eos = next(t for t in free[1][3:] if t not in free[0])
    want = [row[: row.index(eos) + 1] if eos in row else row for row in free]
    assert len(want[1]) < 40 == len(want[0])
    for name, drafter in drafters(target, head).items():
        spec = generate(TinyTarget(target), drafter, prompts, 40, eos_token_id=eos)
        assert spec.tokens == want, name
        for b, row in enumerate(spec.tokens):
            # The prefill's token, then k + 1 a step; k alone where EOS cut the drafts.
            per_step = sum(a + 1 for a in spec.accepted[b])
            assert len(row) - 1 in (per_step, per_step - 1), (name, b)


def test_tiny_target_hands_specsched_zero_copy_host_views(shipped: tuple[Any, Any]) -> None:
    """On the CPU the target's logits and the cache it compacts are numpy views of its own
    tensors (made right after the forward), not copies."""
    target, _ = shipped
    tt = TinyTarget(target)
    pre = tt.prefill(PROMPTS)
    assert isinstance(pre.logits, np.ndarray) and pre.logits.shape == (4, tt.vocab_size)
    step = tt.forward_tree(root_only(np.array([p[-1] for p in PROMPTS], dtype=np.int64)))
    assert isinstance(step.logits, np.ndarray) and step.logits.shape == (4, tt.vocab_size)
    # Views over torch's memory own no data (a copy would own its own).
    assert not pre.logits.flags.owndata and not step.logits.flags.owndata
    assert isinstance(tt.cache_host, np.ndarray)
    assert tt.cache_host.ctypes.data == tt.cache.data_ptr()
    assert tt.cache_host.shape == tuple(tt.cache.shape)


def test_static_drafter_takes_each_choice_rank(shipped: tuple[Any, Any]) -> None:
    """A choice path's last entry is the head's candidate rank, also in a sparse choice list:
    [(1,), (1, 0)] drafts the second candidate and its best child, as the complete list
    [(0,), (1,), (1, 0)] does at the same paths."""
    target, head = shipped
    drafted = []
    for choices in ([(1,), (1, 0)], [(0,), (1,), (1, 0)]):
        pre = TinyTarget(target).prefill(PROMPTS)
        first = np.asarray(pre.logits).argmax(-1).astype(np.int64)  # the first greedy tokens
        drafter = EagleStaticDrafter(target, head, choices)
        drafter.start(PROMPTS, first, pre)
        trees = drafter.propose(first, np.ones(len(PROMPTS), dtype=bool))
        drafted.append([trees[b].tokens.tolist() for b in range(len(PROMPTS))])
    for sparse, full in zip(*drafted, strict=True):
        assert sparse == [full[0], full[2], full[3]]  # paths (), (1,), (1, 0)
        assert sparse[1] != full[1]  # not the head's first candidate


def test_drafters_give_finished_rows_the_root_alone(shipped: tuple[Any, Any]) -> None:
    # What the loop would cut a finished row's tree to; a drafter that gives it so spares the
    # loop that call. The rows still running keep their whole trees.
    target, head = shipped
    pre = TinyTarget(target).prefill(PROMPTS)
    first = np.asarray(pre.logits).argmax(-1).astype(np.int64)
    active = np.arange(len(PROMPTS)) % 2 == 0
    for drafter, size in (
        (EagleChainDrafter(target, head, depth=3), 4),
        (EagleStaticDrafter(target, head, [(0,), (1,), (0, 0)]), 4),
        (EagleDrafter(target, head, topk=2, depth=3, budget=5), 5),
        (NgramChainDrafter(3), None),
    ):
        drafter.start(PROMPTS, first, pre)
        for rows in (active, ~active, np.ones_like(active)):
            trees = drafter.propose(first, rows)
            sizes = np.diff(trees.offsets)
            assert (sizes[~rows] == 1).all()
            if size is not None:
                assert (sizes[rows] == size).all()
            assert trees.tokens[trees.offsets[:-1]].tolist() == first.tolist()


def test_head_drafter_arguments_are_checked_by_name(shipped: tuple[Any, Any]) -> None:
    # Refused where they are given, not inside generate after the target's prefill (torch's
    # "selected index k out of range", an IndexError from a negative headroom).
    target, head = shipped
    for make, exc, match in [
        (lambda: EagleDrafter(target, head, topk=300), ValueError, "topk: 300 candidates"),
        (lambda: EagleDrafter(target, head, topk=0), ValueError, "topk: must be >= 1"),
        (lambda: EagleDrafter(target, head, depth=0), ValueError, "depth: must be >= 1"),
        (lambda: EagleDrafter(target, head, budget=0), ValueError, "budget: must be >= 1"),
        (lambda: EagleDrafter(target, head, headroom=-5), ValueError, "headroom: must be >= 0"),
        (lambda: EagleDrafter(target, head, temperature=float("inf")), ValueError, "temperature"),
        (lambda: EagleDrafter(target, head, temperature="1"), TypeError, "temperature: expected"),
        (lambda: EagleDrafter(target, head, temperature=True), TypeError, "got bool"),
        (
            lambda: EagleDrafter(target, head, topk=2, depth=2, budget=1000),
            ValueError,
            "budget: 1000 nodes need 999 candidates but topk=2, depth=2 draft only 6",
        ),
        (lambda: TinyTarget(target, headroom=-5), ValueError, "headroom: must be >= 0"),
        (lambda: TinyTarget(target, headroom=2.5), TypeError, "headroom: expected an int"),
        (lambda: EagleChainDrafter(target, head, depth=2.5), TypeError, "depth: expected an int"),
        (lambda: EagleStaticDrafter(target, head, [(300,)]), ValueError, "choices: rank 300"),
        # The choices' own errors (they were iterated first: "'NoneType' object is not
        # iterable").
        (lambda: EagleStaticDrafter(target, head, None), TypeError, "^choices: expected"),
        (lambda: EagleStaticDrafter(target, head, [0, 1]), TypeError, r"^choices\[0\]"),
        # A TinyTarget where its TinyLM goes, a swapped pair, a head of another width: named
        # here, not as an AttributeError or a torch size mismatch after the prefill.
        (lambda: EagleDrafter(TinyTarget(target), head), TypeError, "^target: expected the TinyLM"),
        (lambda: EagleChainDrafter(head, target), TypeError, "^target: expected the TinyLM"),
        (
            lambda: EagleStaticDrafter(target, target, [(0,)]),
            TypeError,
            "^head: expected an EagleHead",
        ),
        (lambda: TinyTarget(head), TypeError, "^model: expected a TinyLM, got EagleHead"),
        (
            lambda: EagleChainDrafter(
                target, EagleHead(dataclasses.replace(target.cfg, d_model=64))
            ),
            ValueError,
            "^head: d_model 64 does not match the target's",
        ),
        (
            lambda: EagleChainDrafter(target, copy.deepcopy(head).float()),
            ValueError,
            "^head: torch.float32 on cpu, but the target is torch.float64",
        ),
        (
            lambda: EagleChainDrafter(target, head, depth=2**70),
            ValueError,
            "^depth: .* a tree holds",
        ),
    ]:
        with pytest.raises(exc, match=match):
            make()


def test_headroom_past_the_models_positions_is_never_grown(shipped: tuple[Any, Any]) -> None:
    # 2**70 columns failed in torch after the prefill: no cache needs more than max_positions.
    target, head = shipped
    assert TinyTarget(target, headroom=2**70).headroom == target.cfg.max_positions
    assert EagleChainDrafter(target, head, headroom=10**6).state.headroom == 8192


def test_a_tiny_draft_temperature_ranks_without_overflow(shipped: tuple[Any, Any]) -> None:
    # Logits over 1e-38 overflowed float32 to inf, and log_softmax made NaN of them: the run
    # failed after the prefill, naming an internal buffer. Below the row's maximum they go
    # to -inf: the head's greedy choice ranks first, and the output stays the target's.
    target, head = shipped
    want = generate(TinyTarget(target), None, PROMPTS[:2], 12).tokens
    for t in (1e-38, 5e-324):
        drafter = EagleDrafter(target, head, topk=2, depth=3, budget=6, temperature=t)
        assert generate(TinyTarget(target), drafter, PROMPTS[:2], 12).tokens == want


def test_head_drafters_need_the_targets_features(shipped: tuple[Any, Any]) -> None:
    target, head = shipped
    pre = TinyTarget(target).prefill(PROMPTS)
    first = np.asarray(pre.logits).argmax(-1).astype(np.int64)
    with pytest.raises(ValueError, match="features"):
        EagleChainDrafter(target, head).start(PROMPTS, first, TargetStep(pre.logits, None))


def test_chain_drafter_drafts_the_topk1_dynamic_chain(shipped: tuple[Any, Any]) -> None:
    """The chain drafter skips the builder's per-level calls, not its drafts: each step's
    trees are the ones `EagleDrafter(topk=1)` builds, and so is the whole generation."""
    target, head = shipped
    chain, dynamic = (
        EagleChainDrafter(target, head, depth=4),
        EagleDrafter(target, head, topk=1, depth=4, budget=5),
    )
    proposed: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {"chain": [], "dynamic": []}

    def recording(name: str, drafter: Any) -> Any:
        propose = drafter.propose

        def record(roots: np.ndarray, active: np.ndarray) -> ss.TreeBatch:
            trees = propose(roots, active)
            proposed[name].append((np.asarray(trees.parents), np.asarray(trees.tokens)))
            return trees

        drafter.propose = record
        return drafter

    runs = [
        generate(TinyTarget(target), recording(name, d), PROMPTS, 24)
        for name, d in (("chain", chain), ("dynamic", dynamic))
    ]
    assert runs[0].tokens == runs[1].tokens
    assert len(proposed["chain"]) == len(proposed["dynamic"]) > 3
    for (p1, t1), (p2, t2) in zip(proposed["chain"], proposed["dynamic"], strict=True):
        np.testing.assert_array_equal(p1, p2)
        np.testing.assert_array_equal(t1, t2)
    assert chain.build_seconds > 0


class _LevelCounter:
    """A `DynamicTreeBuilder` stand-in counting the draft levels; with `never_settle`, it
    hides `settled` from the drafter, which then drafts every level."""

    def __init__(self, builder: ss.DynamicTreeBuilder, never_settle: bool) -> None:
        self.builder, self.never_settle, self.levels = builder, never_settle, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.builder, name)

    def start_in_place(self) -> bool:
        self.levels += 1
        return self.builder.start_in_place() and not self.never_settle

    def expand_in_place(self) -> bool:
        self.levels += 1
        return self.builder.expand_in_place() and not self.never_settle


def test_dynamic_drafter_stops_drafting_once_settled(shipped: tuple[Any, Any]) -> None:
    """The dynamic drafter stops at the level where no deeper candidate can enter any tree
    (`DynamicTreeBuilder.settled`): every step's trees are the ones drafting every level
    gives, in fewer draft levels."""
    target, head = shipped
    proposed: dict[bool, list[tuple[list[int], list[int]]]] = {True: [], False: []}
    counters: dict[bool, _LevelCounter] = {}

    def drafter(never_settle: bool) -> EagleDrafter:
        d = EagleDrafter(target, head, topk=2, depth=10, budget=8)
        start, propose = d.start, d.propose

        def counted_start(*args: Any) -> None:
            start(*args)
            assert d.builder is not None
            counters[never_settle] = _LevelCounter(d.builder, never_settle)
            d.builder = counters[never_settle]  # type: ignore[assignment]

        def recorded(roots: np.ndarray, active: np.ndarray) -> ss.TreeBatch:
            trees = propose(roots, active)
            proposed[never_settle].append((trees.parents.tolist(), trees.tokens.tolist()))
            return trees

        d.start, d.propose = counted_start, recorded  # type: ignore[method-assign,assignment]
        return d

    runs = [generate(TinyTarget(target), drafter(n), PROMPTS, 32) for n in (True, False)]
    assert runs[0].tokens == runs[1].tokens
    assert proposed[True] == proposed[False] and len(proposed[True]) > 3
    steps = len(proposed[True])
    assert counters[True].levels == 10 * steps
    assert counters[False].levels < counters[True].levels


def test_shipped_model_ships_its_metrics() -> None:
    import json

    meta = json.loads((WEIGHTS_DIR / "config.json").read_text())
    assert meta["training"]["command"].startswith("python scripts/train_tiny.py")
    size = sum(p.stat().st_size for p in WEIGHTS_DIR.iterdir())
    assert size <= 20 * 2**20
    assert meta["metrics"]["target_held_out_loss_nats_per_byte"] < 2.0


def random_model(seed: int) -> TinyLM:
    torch.manual_seed(seed)
    model = TinyLM(TinyConfig(d_model=64, n_layers=2, n_heads=2, d_ff=128)).double().eval()
    with torch.no_grad():
        model.embed.weight.normal_(0, 1.0)  # a sharper, less repetitive random model
    return model


def test_prompt_tokens_outside_the_targets_vocabulary_are_refused() -> None:
    model = TinyLM(TinyConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64)).eval()
    with pytest.raises(ValueError, match=r"input_ids\[1\]: token id 256 is outside .* \[0, 256\)"):
        generate(TinyTarget(model), None, [[1, 2], [3, 256]], 2)


def test_a_request_that_fits_the_model_autoregressively_fits_speculatively() -> None:
    # prompt + max_new_tokens reaches the model's last position: drafts past it are cut by
    # generate (the target never sees them) and scored at the last position by the head.
    torch.manual_seed(0)
    cfg = TinyConfig(d_model=64, n_layers=2, n_heads=2, d_ff=128, max_positions=32)
    model, head = TinyLM(cfg).double().eval(), EagleHead(cfg).double().eval()
    prompt = [[1, 2, 3, 4]]
    ar = generate(TinyTarget(model), None, prompt, 29)  # feeds positions up to 31
    for drafter in (
        EagleChainDrafter(model, head, depth=5),
        EagleDrafter(model, head, topk=2, depth=4, budget=8),
    ):
        assert generate(TinyTarget(model), drafter, prompt, 29).tokens == ar.tokens


def test_finished_rows_stop_advancing() -> None:
    # The long-prompt request ends at its first token (EOS); the short one runs on. The
    # target retires the finished row, so the batch stays within the model's positions and
    # every request gets what it gets alone.
    torch.manual_seed(0)
    cfg = TinyConfig(d_model=64, n_layers=2, n_heads=2, d_ff=128, max_positions=32)
    model, head = TinyLM(cfg).double().eval(), EagleHead(cfg).double().eval()
    # The long prompt takes every position: a retired row one past its last would be past
    # the model's.
    long, short = [7] * 24 + [1, 2, 3, 4, 5, 6, 7, 8], [5]
    assert len(long) == cfg.max_positions
    eos = generate(TinyTarget(model), None, [long], 1).tokens[0][0]
    alone = [
        generate(TinyTarget(model), None, [p], 10, eos_token_id=eos).tokens[0]
        for p in (long, short)
    ]
    for drafter in (None, EagleChainDrafter(model, head, depth=3)):
        target = TinyTarget(model)
        both = generate(target, drafter, [long, short], 10, eos_token_id=eos)
        assert both.tokens == alone
        assert target.lengths[0] == len(long)  # the prompt; the one token emitted is the root


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kv_cache_after_compaction_equals_autoregressive(seed: int) -> None:
    model = random_model(seed)
    prompts = [list(b"abc"), list(b"hello world"), list(b"x"), list(b"tree decoding")]
    ar_target = TinyTarget(model)
    ar = generate(ar_target, None, prompts, 30)
    spec_target = TinyTarget(model)
    spec = generate(spec_target, OracleDrafter(ar.tokens, seed), prompts, 30)
    assert spec.tokens == ar.tokens
    # A normal tensor: CUDA compaction (index_copy_) runs outside inference mode.
    assert not spec_target.cache.is_inference()
    assert spec.mean_accepted > 0.5  # deep, non-contiguous paths were accepted and compacted
    # Every committed entry: the prompt and all emitted tokens but the last (the next root).
    for b, prompt in enumerate(prompts):
        committed = len(prompt) + len(ar.tokens[b]) - 1
        got = spec_target.cache[:, :, b, :, :committed]
        want = ar_target.cache[:, :, b, :, :committed]
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_path_cut_at_eos_commits_only_the_emitted_tokens(
    shipped: tuple[Any, Any], seed: int
) -> None:
    # The oracle drafts each request's true continuation, so EOS sits inside accepted paths:
    # the target keeps the tokens up to the EOS (its lengths and cache as an autoregressive
    # run's), not the accepted drafts after it.
    model, _ = shipped
    prompts = PROMPTS[:4]
    free = generate(TinyTarget(model), None, prompts, 30).tokens
    eos = next(t for t in free[1][5:] if t not in free[1][:5])
    ar_target = TinyTarget(model)
    ar = generate(ar_target, None, prompts, 30, eos_token_id=eos)
    spec_target = TinyTarget(model)
    spec = generate(spec_target, OracleDrafter(free, seed), prompts, 30, eos_token_id=eos)
    assert spec.tokens == ar.tokens
    assert len(ar.tokens[1]) < 30  # stopped on EOS
    assert max(a for row in spec.accepted for a in row) >= 3  # paths deep enough to cut
    assert spec_target.lengths.tolist() == ar_target.lengths.tolist()
    for b, prompt in enumerate(prompts):
        committed = len(prompt) + len(ar.tokens[b]) - 1
        assert spec_target.lengths[b] == committed
        got = spec_target.cache[:, :, b, :, :committed]
        want = ar_target.cache[:, :, b, :, :committed]
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_truncated_result_matches_the_reference() -> None:
    tree = ss.TreeBatch([ss.Tree.chain([1, 2, 3, 4]), ss.Tree.chain([5, 6]), ss.Tree.chain([7])])
    result = ss.verify(tree, target_tokens=[2, 3, 4, 9, 6, 8, 0])
    assert isinstance(result, ss.BatchVerifyResult)
    keep = [2, 1, 1]
    got = result.truncate(np.array(keep, dtype=np.int32))
    want = ref.truncate_batch_result(
        result.num_accepted.tolist(),
        result.accepted_nodes.tolist(),
        result.tokens.tolist(),
        keep,
    )
    assert (got.num_accepted.tolist(), got.accepted_nodes.tolist(), got.tokens.tolist()) == want
    assert got.tokens.tolist()[0] == [2, 3, -1, -1]  # the last kept token is the bonus
    assert result.num_accepted.tolist() == [3, 1, 0]  # the result itself is unchanged
    for bad in ([0, 1, 1], [5, 1, 1], [1, 1]):
        with pytest.raises(ValueError, match="keep"):
            result.truncate(bad)
        with pytest.raises(ValueError, match="keep"):
            ref.truncate_batch_result([3, 1, 0], [[0] * 4] * 3, [[0] * 4] * 3, bad)
    with pytest.raises(TypeError, match="keep"):
        result.truncate([1.0, 1.0, 1.0])


def test_cold_calls_script_times_every_loop_call() -> None:
    """`scripts/cold_calls.py` (the per-call figures of docs/api.md) runs end to end: one row
    per call, each a positive time."""
    script = Path(__file__).parents[1] / "scripts" / "cold_calls.py"
    run = subprocess.run(
        [sys.executable, str(script), "--reps", "2"], capture_output=True, text=True, check=True
    )
    rows = run.stdout.splitlines()[1:]
    times = {row[:40].strip(): row[40:].split() for row in rows}
    assert {"no-op PyO3 getter", "DynamicTreeBuilder.expand_in_place", "compact_kv"} <= set(times)
    assert len(times) == 8
    assert all(float(median) > 0 and float(p25) > 0 for median, p25 in times.values())


def test_compare_builds_script_pairs_two_builds() -> None:
    """`scripts/compare_builds.py` (the A/B figures of docs/api.md) runs end to end against a
    second copy of the installed build: every row has both builds' times and their ratio."""
    from specsched import _core

    script = Path(__file__).parents[1] / "scripts" / "compare_builds.py"
    run = subprocess.run(
        [sys.executable, str(script), _core.__file__, "--reps", "2"],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = run.stdout.splitlines()
    headers = [i for i, line in enumerate(lines) if line.rstrip().endswith("(µs, medians)")]
    assert len(headers) == 2
    rows = [line for i, line in enumerate(lines) if i not in headers]
    assert len(rows) == 9 + 2 + 6  # builder steps and from_flat hot, then the loop's calls
    assert any(row.startswith("expand (B=64 K=8") for row in rows)
    assert any(row.startswith("TreeBatch.from_flat (B=64 N=64)") for row in rows)
    assert any(row.startswith("verify_greedy") for row in rows)
    assert any(row.startswith("DynamicTreeBuilder build, the loop's") for row in rows)
    for row in rows:
        this, other, ratio = (float(x) for x in row[44:].split())
        assert this > 0 and other > 0 and ratio > 0
