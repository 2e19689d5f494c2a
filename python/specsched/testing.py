"""Workload builders shared by the CLI, the benchmarks and the tests, and the Monte-Carlo
proof harness for verification rules.

Trees shaped like EAGLE's dynamic trees (a few candidates per level, depth ~5-8) and target
outputs with a controllable acceptance rate, all seeded so runs are comparable. The harness
(`toy_models`, `simulate`, `check_rule`) runs seeded speculative decoding on toy models and
measures how far the emitted tokens are from the target's own distribution.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from specsched._args import float_arg, int_arg
from specsched._core import Tree, TreeBatch


def eagle_like_parents(num_nodes: int, rng: np.random.Generator, branching: int = 4) -> np.ndarray:
    """Tree-local parents of an EAGLE-like tree: node i hangs under one of the `branching`
    nodes before it, so depth grows roughly as N / branching while siblings stay common."""
    parents = np.empty(num_nodes, dtype=np.int32)
    parents[0] = -1
    for i in range(1, num_nodes):
        parents[i] = rng.integers(max(0, i - branching), i)
    return parents


def random_batch(
    num_trees: int, num_nodes: int, vocab: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flat `(parents int32, tokens int64, offsets int64)` of `num_trees` EAGLE-like trees."""
    rng = np.random.default_rng(seed)
    parents = np.concatenate([eagle_like_parents(num_nodes, rng) for _ in range(num_trees)])
    tokens = rng.integers(0, vocab, size=num_trees * num_nodes, dtype=np.int64)
    offsets = np.arange(num_trees + 1, dtype=np.int64) * num_nodes
    return parents, tokens, offsets


def target_choices(
    parents: np.ndarray,
    tokens: np.ndarray,
    offsets: np.ndarray,
    vocab: int,
    accept_rate: float = 0.7,
    seed: int = 0,
) -> np.ndarray:
    """A target choice per node: with probability `accept_rate` the token of one of the node's
    children (so the walk goes deeper), otherwise a random token."""
    rng = np.random.default_rng(seed)
    choice = rng.integers(0, vocab, size=len(parents), dtype=np.int64)
    for b in range(len(offsets) - 1):
        start, end = int(offsets[b]), int(offsets[b + 1])
        children: dict[int, list[int]] = {}
        for local in range(1, end - start):
            children.setdefault(int(parents[start + local]), []).append(local)
        for v, kids in children.items():
            if rng.random() < accept_rate:
                choice[start + v] = tokens[start + kids[rng.integers(len(kids))]]
    return choice


def logits_with_choices(choice: np.ndarray, vocab: int, seed: int = 0) -> np.ndarray:
    """float32 logits `[T, vocab]` whose row argmax is `choice` (random elsewhere)."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((len(choice), vocab), dtype=np.float32)
    logits[np.arange(len(choice)), choice] = 10.0
    return logits


# --------------------------------------------------------------------------------------------
# Monte-Carlo proof harness for verification rules (issue 4)
# --------------------------------------------------------------------------------------------
#
# A lossless rule makes speculative decoding emit exactly what the target alone would sample.
# The harness checks that empirically: toy context-dependent target and draft models over a
# small vocabulary, many seeded speculative steps through `ss.verify`, and the empirical joint
# distribution of the first `length` emitted tokens compared with the exact autoregressive one
# (total-variation distance and a chi-square test). A biased rule fails the same test.

# The static draft tree of every step: root with 3 children, two of which have 2 children,
# and one grandchild with a child (depth 3, 9 nodes).
HARNESS_PARENTS = (-1, 0, 0, 0, 1, 1, 2, 2, 4)

RULES = ("match", "with_replacement", "without_replacement", "typical")


@dataclass(frozen=True)
class ToyModels:
    """Order-2 toy language models: `target_logits[a, b]` / `draft_logits[a, b]` are the logits
    of the token after the context `(a, b)`; a sequence starts from `context`."""

    target_logits: np.ndarray
    draft_logits: np.ndarray
    context: tuple[int, int]

    @property
    def vocab(self) -> int:
        return int(self.target_logits.shape[-1])


_TOY_MAX_VOCAB = 256


def toy_models(vocab: int = 5, seed: int = 0, mismatch: float = 1.0) -> ToyModels:
    """Random target and draft models; the draft is the target plus `mismatch`-sized noise, so
    acceptance is partial and a rule that mishandles the draft shows up as bias.

    `vocab` in [2, 256] (the context is tokens (0, 1); each model is a `[V, V, V]` table),
    `seed` an int >= 0, `mismatch` a finite number >= 0."""
    vocab = int_arg(vocab, "vocab", 2)
    if vocab > _TOY_MAX_VOCAB:
        raise ValueError(
            f"vocab: at most {_TOY_MAX_VOCAB} (each model is a [V, V, V] table), got {vocab}"
        )
    seed = int_arg(seed, "seed", 0)
    mismatch = float_arg(mismatch, "mismatch")
    if not (math.isfinite(mismatch) and mismatch >= 0):
        raise ValueError(f"mismatch: expected a finite number >= 0, got {mismatch}")
    rng = np.random.default_rng(seed)
    target = rng.standard_normal((vocab, vocab, vocab)) * 1.3
    draft = target + rng.standard_normal((vocab, vocab, vocab)) * mismatch
    return ToyModels(target, draft, (0, 1))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def processed_table(
    models: ToyModels, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> np.ndarray:
    """The target's processed next-token distribution for every context, `[V, V, V]`, from the
    reference implementation (greedy = one-hot argmax)."""
    from specsched import reference

    v = models.vocab
    out = np.zeros((v, v, v))
    for a in range(v):
        for b in range(v):
            row = models.target_logits[a, b].tolist()
            if temperature == 0:
                out[a, b, reference.argmax(row)] = 1.0
            else:
                out[a, b] = reference.processed_probs(row, temperature, top_k, top_p)
    return out


def exact_joint(table: np.ndarray, context: tuple[int, int], length: int = 3) -> np.ndarray:
    """The exact distribution of the first `length` tokens of autoregressive sampling from
    `table` (`[V, V, V]`, context `(a, b)` → next token), flattened to `[V**length]`."""
    v = table.shape[-1]
    joint = np.ones(1)
    # Track the last two tokens of every prefix; the prefix index is row-major over tokens.
    prev2 = np.array([context[0]])
    prev1 = np.array([context[1]])
    for _ in range(length):
        nxt = table[prev2, prev1]  # [prefixes, V]
        joint = (joint[:, None] * nxt).reshape(-1)
        prev2 = np.repeat(prev1, v)
        prev1 = np.tile(np.arange(v), len(nxt))
    return joint


@dataclass
class SimResult:
    """Counts of the first `length` emitted tokens (flattened, row-major) over `steps` runs,
    and, per run's first step, the accepted count."""

    counts: np.ndarray
    steps: int
    first_num_accepted: np.ndarray
    first_root_children: np.ndarray


Verifier = Callable[[Any, np.ndarray, np.ndarray, int], Any]


def rule_verifier(
    rule: str,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    **typical: float,
) -> Verifier:
    """`verifier(batch, logits, draft_probs, seed)` running `ss.verify` under `rule`."""
    import specsched as ss

    if rule not in RULES:
        raise ValueError(f"rule: expected one of {RULES}, got {rule!r}")

    def verify(batch: Any, logits: np.ndarray, draft_probs: np.ndarray, seed: int) -> Any:
        kw: dict[str, Any] = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
        if rule in ("with_replacement", "without_replacement"):
            kw.update(draft_probs=draft_probs, draft_sampling=rule)
        elif rule == "typical":
            kw.update(rule="typical", **typical)
        return ss.verify(batch, logits, seed=seed, **kw)

    return verify


def drafts_are_sampled(rule: str) -> str | None:
    """How the draft proposes children under `rule`: None (deterministic top-k) or the
    sampling mode."""
    return rule if rule in ("with_replacement", "without_replacement") else None


def simulate(
    models: ToyModels,
    verifier: Verifier,
    steps: int,
    seed: int = 0,
    draft_sampling: str | None = None,
    length: int = 3,
    chunk: int = 50_000,
) -> SimResult:
    """Runs `steps` independent generations from `models.context`, each made of speculative
    steps over the static tree `HARNESS_PARENTS` until `length` tokens are emitted.

    Children are the draft's top tokens at their parent (`draft_sampling=None`: deterministic
    drafts, as EAGLE's top-k trees), or drawn from the draft distribution with or without
    replacement. Every verify call gets its own seed (a call's draws are keyed by request
    index, so reusing a seed across calls would correlate runs).
    """
    import specsched as ss

    parents = np.asarray(HARNESS_PARENTS, dtype=np.int32)
    n = len(parents)
    kids = [[c for c in range(1, n) if parents[c] == v] for v in range(n)]
    v = models.vocab
    seeds = np.random.SeedSequence(seed)
    rng = np.random.default_rng(seeds.spawn(1)[0])
    seqs = np.full((steps, length), -1, dtype=np.int64)
    filled = np.zeros(steps, dtype=np.int64)
    hist = np.tile(np.asarray(models.context, dtype=np.int64), (steps, 1))
    first_acc = np.full(steps, -1, dtype=np.int32)
    first_children = np.zeros((steps, len(kids[0])), dtype=np.int64)
    call = 0
    first_round = True
    while True:
        active = np.flatnonzero(filled < length)
        if len(active) == 0:
            break
        for lo in range(0, len(active), chunk):
            idx = active[lo : lo + chunk]
            r = len(idx)
            tok = np.zeros((r, n), dtype=np.int64)
            prev = np.zeros((r, n), dtype=np.int64)  # token before each node on its path
            tok[:, 0] = hist[idx, 1]
            prev[:, 0] = hist[idx, 0]
            q = np.zeros((r, n, v))
            for node in range(n):
                q[:, node] = _softmax(models.draft_logits[prev[:, node], tok[:, node]])
                cs = kids[node]
                if not cs:
                    continue
                qn = q[:, node]
                if draft_sampling is None:
                    picks = np.argsort(-qn, axis=1, kind="stable")[:, : len(cs)]
                elif draft_sampling == "with_replacement":
                    cdf = np.cumsum(qn, axis=1)
                    u = rng.random((r, len(cs))) * cdf[:, -1:]
                    picks = np.minimum((cdf[:, None, :] <= u[:, :, None]).sum(axis=2), v - 1)
                else:  # Gumbel-top-k: a sample without replacement
                    g = np.log(qn) - np.log(-np.log(rng.random((r, v))))
                    picks = np.argsort(-g, axis=1)[:, : len(cs)]
                for j, c in enumerate(cs):
                    tok[:, c] = picks[:, j]
                    prev[:, c] = tok[:, node]
            logits = models.target_logits[prev.reshape(-1), tok.reshape(-1)]
            batch = ss.TreeBatch.from_flat(
                np.tile(parents, r), tok.reshape(-1), np.arange(r + 1, dtype=np.int64) * n
            )
            call_seed = int(np.random.SeedSequence([seed, call]).generate_state(2, np.uint64)[0])
            call += 1
            res = verifier(batch, logits, q.reshape(r * n, v), call_seed)
            num = np.asarray(res.num_accepted)
            emitted = np.asarray(res.tokens)
            if first_round:
                first_acc[idx] = num
                first_children[idx] = tok[:, kids[0]]
            for j in range(emitted.shape[1]):
                live = (j <= num) & (filled[idx] < length)
                rows = idx[live]
                seqs[rows, filled[rows]] = emitted[live, j]
                filled[rows] += 1
                hist[rows, 0] = hist[rows, 1]
                hist[rows, 1] = emitted[live, j]
            # Tokens past `length` are not needed; the run's history then stops mattering.
        first_round = False
    flat = np.zeros(steps, dtype=np.int64)
    for j in range(length):
        flat = flat * v + seqs[:, j]
    counts = np.bincount(flat, minlength=v**length)
    return SimResult(counts, steps, first_acc, first_children)


def tv_distance(counts: np.ndarray, probs: np.ndarray) -> float:
    """Total-variation distance between the empirical distribution of `counts` and `probs`."""
    return float(0.5 * np.abs(counts / counts.sum() - probs).sum())


def tv_noise(probs: np.ndarray, n: int) -> float:
    """Expected TV distance of an exact sampler with `n` draws (normal approximation:
    E|p̂ - p| = sqrt(2 p (1 - p) / (π n)) per cell)."""
    return float(0.5 * np.sqrt(2 * probs * (1 - probs) / (np.pi * n)).sum())


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Pearson's chi-square goodness-of-fit p-value; cells expected below `min_expected` are
    pooled into one. The tail uses the Wilson-Hilferty approximation (accurate to ~1e-3 here,
    plenty for a pass/fail threshold of 1e-3)."""
    if (counts[probs == 0] > 0).any():
        return 0.0  # a token sequence of probability 0 was emitted
    n = counts.sum()
    expected = probs * n
    small = expected < min_expected
    obs = np.append(counts[~small], counts[small].sum())
    exp_ = np.append(expected[~small], expected[small].sum())
    keep = exp_ > 0
    obs, exp_ = obs[keep], exp_[keep]
    stat = float(((obs - exp_) ** 2 / exp_).sum())
    dof = len(obs) - 1
    if dof < 1:
        return 1.0
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


@dataclass
class Verdict:
    tv: float
    noise: float
    pvalue: float

    @property
    def lossless(self) -> bool:
        """Within the sampling noise: TV at most 3x its expected value and chi-square p > 1e-3
        (a deterministic target, e.g. greedy, has no noise: then TV must be 0)."""
        return self.tv <= 3 * self.noise and self.pvalue > 1e-3


def check_rule(
    models: ToyModels,
    rule: str,
    steps: int = 200_000,
    seed: int = 0,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    verifier: Verifier | None = None,
    length: int = 3,
    **typical: float,
) -> tuple[Verdict, SimResult]:
    """Simulates `rule` (or a custom `verifier` with `rule`'s drafting) and compares the first
    `length` emitted tokens with the exact processed target."""
    if verifier is None:
        verifier = rule_verifier(rule, temperature, top_k, top_p, **typical)
    sim = simulate(models, verifier, steps, seed, drafts_are_sampled(rule), length)
    joint = exact_joint(processed_table(models, temperature, top_k, top_p), models.context, length)
    verdict = Verdict(
        tv_distance(sim.counts, joint),
        tv_noise(joint, steps),
        chi_square_pvalue(sim.counts, joint),
    )
    return verdict, sim


def sglang_draft(
    rng: np.random.Generator, bs: int, topk: int, steps: int, vocab: int = 32000, ties: bool = False
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """`(score_list, token_list, parents_list)` as SGLang's `select_top_k_tokens` drafts them:
    step 0 is the root's top-k, every later step expands the k frontier nodes by k and keeps the
    best k path products. `ties` draws probabilities from a few values so scores tie often."""

    def probs(shape: tuple[int, ...]) -> np.ndarray:
        p = rng.choice([0.5, 0.25, 0.125], size=shape) if ties else rng.random(shape)
        return -np.sort(-p, axis=-1).astype(np.float32)

    p0 = probs((bs, topk))
    score_list = [p0[:, None, :]]
    token_list = [rng.integers(0, vocab, size=(bs, topk))]
    parents_list = [np.tile(np.arange(-1, topk), (bs, 1))]
    scores = p0
    for i in range(1, steps):
        expand = scores[:, :, None] * probs((bs, topk, topk))
        flat = expand.reshape(bs, -1)
        cs = np.argsort(-flat, axis=1, kind="stable")[:, :topk]
        scores = np.take_along_axis(flat, cs, axis=1)
        score_list.append(expand)
        token_list.append(rng.integers(0, vocab, size=(bs, topk * topk)))
        parents_list.append(cs + topk * topk * (i - 1) + topk)
    return score_list, token_list, parents_list


class OracleDrafter:
    """A `specsched.generate.Drafter` for tests: random trees (1..19 nodes) that hide a known
    continuation (e.g. the autoregressive output) on the path to a random node, cut at a random
    depth, so acceptance is deep, non-contiguous and random."""

    def __init__(self, continuation: list[list[int]], seed: int, vocab: int = 256) -> None:
        self.truth = continuation
        self.rng = np.random.default_rng(seed)
        self.vocab = vocab
        self.done = [0] * len(continuation)

    def start(self, input_ids: Any, first_tokens: np.ndarray, prefill: Any) -> None:
        self.done = [1] * len(input_ids)

    def propose(self, roots: np.ndarray, active: np.ndarray) -> TreeBatch:
        trees = []
        for b, root in enumerate(roots):
            n = int(self.rng.integers(1, 20))
            parents = [-1] + [int(self.rng.integers(0, i)) for i in range(1, n)]
            tokens = [int(root)] + [int(self.rng.integers(0, self.vocab)) for _ in range(1, n)]
            # Put the truth on the path to a random node (a prefix of it, at random depth).
            v, path = int(self.rng.integers(0, n)), []
            while v > 0:
                path.append(v)
                v = parents[v]
            truth = self.truth[b][self.done[b] :]
            keep = int(self.rng.integers(0, len(path) + 1))
            for depth, node in enumerate(reversed(path)):
                if depth < keep and depth < len(truth):
                    tokens[node] = truth[depth]
            trees.append(Tree(np.array(parents, np.int32), np.array(tokens, np.int64)))
        return TreeBatch(trees)

    def commit(self, trees: TreeBatch, result: Any, step: Any, kept: Any) -> None:
        for b in range(trees.num_trees):
            self.done[b] += int(kept[b])
