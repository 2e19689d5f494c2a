"""`specsched.sim`: how many tokens a draft tree buys, and what that is worth in wall-clock time.

An acceptance model (`Acceptance`) says how likely the target is to pick each drafted child
given its parent was accepted; the target picks at most one child per node. From it:

- `expected_tokens_chain(alpha, gamma)`: `(1 - alpha^(gamma+1)) / (1 - alpha)` tokens per target
  call for a chain of `gamma` drafts (the bonus token included);
- `expected_accept_length(tree, model)`: `1 + sum over v != root of P(path to v accepted)`, the
  same quantity (tau, bonus included) for any `Tree`;
- `simulate(tree_or_chain, model, steps, seed)`: Monte Carlo over the real verify walk (Rust),
  with the mean, its confidence interval and the distribution of the accepted length;
- `speedup(expected_tokens, budget, draft_steps, cost)`: wall-clock speed-up under a cost model
  `t_target(N) + draft_steps * t_draft + t_host` against plain decoding (`t_target(1)`), where
  `t_target` is flat while the batch is memory-bound and grows with `concurrency * N` past the
  compute knee;
- `measure_host_overhead(tree, batch_size)`: specsched's own per-step host work, measured, for
  `t_host`.

Chains and trees are compared at the same verify budget `N` (nodes, root included): a chain of
`N - 1` drafts against `best_tree(model, N, ...)`.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np

from specsched import _core
from specsched._args import float_arg, int_arg
from specsched._core import MAX_NODES, AcceptanceStats, Tree, TreeBatch

__all__ = [
    "Acceptance",
    "CostModel",
    "ReplayResult",
    "SimResult",
    "best_tree",
    "chain_tree",
    "expected_accept_length",
    "expected_tokens_chain",
    "measure_host_overhead",
    "path_probabilities",
    "replay",
    "simulate",
    "speedup",
    "stdlib_workload",
]

Kind = Literal["iid", "per_depth", "per_rank", "table"]

# Longest time a cost model takes, in ms (31 years): past it sums of times overflow.
MAX_MS = 1e12
# Most concurrent requests a cost model (and a `decide` profile) may give: far past any
# serving batch, and small enough that a batch's tokens stay exact in float64.
MAX_CONCURRENCY = 1_000_000


def _prob(name: str, x: float) -> float:
    # Anything `float()` reads (a numpy or torch scalar, a Fraction), but not text or a bool:
    # those are the wrong type, not a value out of range.
    if isinstance(x, (bool, np.bool_, str, bytes)):
        raise TypeError(f"{name}: expected a probability in [0, 1], got {type(x).__name__}")
    try:
        x = float(x)
    except OverflowError:  # an int past float64: out of range
        raise ValueError(f"{name}: {x} is not a probability in [0, 1]") from None
    except (TypeError, ValueError):
        raise TypeError(
            f"{name}: expected a probability in [0, 1], got {type(x).__name__}"
        ) from None
    if not (0.0 <= x <= 1.0):  # also rejects NaN
        raise ValueError(f"{name}: {x} is not a probability in [0, 1]")
    return x


@dataclass(frozen=True)
class Acceptance:
    """An acceptance model.

    - `Acceptance.iid(alpha)`: every drafted child independently matches with probability
      `alpha`, the first match (in sibling order) wins: rank r is picked with
      `alpha * (1 - alpha)**r`. On a chain this is the classic per-token acceptance.
    - `Acceptance.per_depth([a1, a2, ...])`: the same with `alpha` depending on the depth.
    - `Acceptance.per_rank([p0, p1, ...])` (Sequoia): the target picks the rank-r child with
      probability `p_r`, `sum(p) <= 1`.
    - `Acceptance.table([[p00, p01, ...], [p10, ...], ...])`: measured acceptance by depth
      (rows, depth 1 first) and rank (columns), each row summing to at most 1.
    """

    kind: Kind
    values: tuple[float, ...] | tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        if self.kind not in ("iid", "per_depth", "per_rank", "table"):
            raise ValueError(
                f"acceptance: unknown kind {self.kind!r}, expected 'iid', 'per_depth', "
                "'per_rank' or 'table'"
            )
        if not self.values:
            raise ValueError(f"acceptance: the {self.kind} model needs at least one value")
        if self.kind == "iid" and len(self.values) != 1:
            raise ValueError("acceptance: an iid model takes exactly one alpha")
        rows = self.values if self.kind == "table" else (self.values,)
        checked: list[tuple[float, ...]] = []
        row: Any
        for d, row in enumerate(rows):
            if isinstance(row, (int, float)):
                raise ValueError(f"table[{d}]: expected a row of probabilities, got {row!r}")
            name = {"iid": "alpha", "table": f"table[{d}]"}.get(self.kind, self.kind)
            vals = tuple(
                _prob(name if self.kind == "iid" else f"{name}[{i}]", v) for i, v in enumerate(row)
            )
            if self.kind in ("per_rank", "table") and sum(vals) > 1.0 + 1e-9:
                raise ValueError(
                    f"{name}: sums to {sum(vals):.6g}, but the target picks at most one child "
                    "(the sum must be <= 1)"
                )
            checked.append(vals)
        object.__setattr__(self, "values", tuple(checked) if self.kind == "table" else checked[0])

    @classmethod
    def iid(cls, alpha: float) -> Acceptance:
        return cls("iid", (alpha,))

    @classmethod
    def per_depth(cls, values: Sequence[float]) -> Acceptance:
        return cls("per_depth", tuple(values))

    @classmethod
    def per_rank(cls, values: Sequence[float]) -> Acceptance:
        return cls("per_rank", tuple(values))

    @classmethod
    def table(cls, rows: Sequence[Sequence[float]]) -> Acceptance:
        return cls("table", tuple(tuple(r) for r in rows))

    @classmethod
    def from_stats(cls, stats: AcceptanceStats, min_trials: int = 1) -> Acceptance:
        """The empirical model of live traffic: `hits / trials` per (depth, rank) as counted by
        `AcceptanceStats` (the same conditional probability the table model means). Cells with
        fewer than `min_trials` trials count as 0; a row whose estimates sum past 1 (sampling
        noise across ranks seen different numbers of times) is scaled back to 1."""
        if not isinstance(stats, AcceptanceStats):
            raise TypeError(f"stats: expected an AcceptanceStats, got {type(stats).__name__}")
        trials = np.asarray(stats.trials, dtype=np.float64)
        hits = np.asarray(stats.hits, dtype=np.float64)
        if trials.size == 0 or not trials.any():
            raise ValueError("stats: no verified trees recorded yet")
        probs = np.where(trials >= max(1, min_trials), hits / np.maximum(trials, 1.0), 0.0)
        sums = probs.sum(axis=1, keepdims=True)
        probs = np.where(sums > 1.0, probs / np.maximum(sums, 1.0), probs)
        return cls.table(probs.tolist())

    def core_values(self) -> list[list[float]]:
        """The values as the extension takes them: one row, or one row per depth."""
        if self.kind == "table":
            return [list(cast("tuple[float, ...]", r)) for r in self.values]
        return [list(cast("tuple[float, ...]", self.values))]

    def describe(self) -> str:
        if self.kind == "iid":
            return f"iid alpha={self.values[0]:g}"
        rows = self.core_values()
        text = "; ".join(", ".join(f"{v:.3g}" for v in r) for r in rows)
        return f"{self.kind} [{text}]"


ModelLike = Acceptance | float


def as_model(model: ModelLike) -> Acceptance:
    """An `Acceptance`; a bare number is `Acceptance.iid(number)`."""
    if isinstance(model, Acceptance):
        return model
    if isinstance(model, (int, float)) and not isinstance(model, bool):
        return Acceptance.iid(float(model))
    raise TypeError(f"model: expected an Acceptance or an alpha, got {type(model).__name__}")


def expected_tokens_chain(alpha: float, gamma: int) -> float:
    """Expected tokens per target call of a chain of `gamma` drafts at per-token acceptance
    `alpha`, bonus included: `(1 - alpha**(gamma + 1)) / (1 - alpha)` (`gamma + 1` at 1)."""
    return float(_core.sim_chain_expected_tokens(_prob("alpha", alpha), int_arg(gamma, "gamma", 0)))


def chain_tree(gamma: int) -> Tree:
    """A chain of `gamma` drafts (`gamma + 1` nodes); tokens are irrelevant to the model."""
    gamma = int_arg(gamma, "gamma", 0)
    # Before the tokens are allocated (2**40 drafts asked numpy for 8 TiB).
    if gamma > MAX_NODES - 1:
        raise ValueError(f"gamma: {gamma} drafts, a tree holds at most {MAX_NODES - 1}")
    return Tree.chain(np.zeros(gamma + 1, dtype=np.int64))


def _tree(tree_or_chain: Tree | int) -> Tree:
    if isinstance(tree_or_chain, Tree):
        return tree_or_chain
    if isinstance(tree_or_chain, (int, np.integer)) and not isinstance(tree_or_chain, bool):
        return chain_tree(int(tree_or_chain))
    raise TypeError(
        f"tree: expected a Tree or a chain length (int), got {type(tree_or_chain).__name__}"
    )


def expected_accept_length(tree: Tree | int, model: ModelLike) -> float:
    """Expected tokens per step (tau, bonus included) of `tree` (or a chain of that many
    drafts): `1 + sum over v != root of P(path to v accepted)`."""
    m = as_model(model)
    return float(_core.sim_expected_tokens(_tree(tree), m.kind, m.core_values()))


def path_probabilities(tree: Tree | int, model: ModelLike) -> np.ndarray:
    """float64 `[N]`: probability that the path from the root to each node is accepted."""
    m = as_model(model)
    return _core.sim_path_probs(_tree(tree), m.kind, m.core_values())


def best_tree(
    model: ModelLike, budget: int, max_depth: int | None = None, topk: int | None = None
) -> Tree:
    """The tree of at most `budget` nodes (root included), depth <= `max_depth`, at most `topk`
    children per node, maximizing the expected accepted length: best-first by path
    probability (EAGLE-2's rerank) when acceptance never grows with rank, else Sequoia's exact
    DP over the model's rows (a later rank worth more than an earlier one can only be reached
    with its siblings, which best-first does not weigh); the DP's size limits apply."""
    m = as_model(model)
    budget = int_arg(budget, "budget", 1)
    depth = budget - 1 if max_depth is None else int_arg(max_depth, "max_depth", 0)
    k = budget if topk is None else int_arg(topk, "topk", 1)
    return _core.sim_best_tree(m.kind, m.core_values(), budget, depth, k)


@dataclass(frozen=True)
class SimResult:
    """Monte-Carlo result. `histogram[k]` steps accepted `k` drafts (and emitted `k + 1`)."""

    steps: int
    histogram: np.ndarray
    seed: int

    @property
    def mean_accepted(self) -> float:
        """Mean accepted draft tokens per step (bonus excluded)."""
        k = np.arange(len(self.histogram))
        return float((k * self.histogram).sum() / self.steps)

    @property
    def mean_tokens(self) -> float:
        """Mean tokens per step (tau): accepted drafts plus the bonus."""
        return self.mean_accepted + 1.0

    @property
    def std(self) -> float:
        """Sample standard deviation of the per-step accepted length."""
        if self.steps < 2:
            return 0.0
        k = np.arange(len(self.histogram))
        var = float((self.histogram * (k - self.mean_accepted) ** 2).sum()) / (self.steps - 1)
        return math.sqrt(var)

    @property
    def ci95(self) -> tuple[float, float]:
        """95% confidence interval of `mean_tokens` (normal approximation)."""
        half = 1.959964 * self.std / math.sqrt(self.steps)
        return (self.mean_tokens - half, self.mean_tokens + half)

    @property
    def accepted_distribution(self) -> np.ndarray:
        """float64: fraction of steps that accepted `k` drafts, k = 0..max_depth."""
        return self.histogram / self.steps

    @property
    def tokens_distribution(self) -> dict[int, float]:
        """Fraction of steps that emitted `t` tokens, t = 1..max_depth + 1."""
        return {k + 1: float(f) for k, f in enumerate(self.accepted_distribution)}

    def to_dict(self) -> dict[str, object]:
        lo, hi = self.ci95
        return {
            "steps": self.steps,
            "seed": self.seed,
            "mean_tokens": self.mean_tokens,
            "mean_accepted": self.mean_accepted,
            "std": self.std,
            "ci95": [lo, hi],
            "accepted_histogram": [int(c) for c in self.histogram],
        }


def simulate(
    tree_or_chain: Tree | int,
    model: ModelLike,
    steps: int = 100_000,
    seed: int = 0,
    *,
    threads: int | None = None,
) -> SimResult:
    """Monte-Carlo verification: per step, sample which child (if any) the target picks at each
    node the walk reaches and run specsched's walk. Reproducible from `seed`, and the same for
    every `threads` (None: all cores; at most 1,024, each an OS thread started for the call).
    Only the tree's shape matters, not its tokens."""
    m = as_model(model)
    tree = _tree(tree_or_chain)
    steps = int_arg(steps, "steps", 1)
    seed = int_arg(seed, "seed", 0)
    if seed >= 1 << 64:
        raise ValueError(f"seed: {seed} does not fit 64 bits")
    if threads is not None:
        threads = int_arg(threads, "threads", 1)
    n, hist = _core.sim_simulate(tree, m.kind, m.core_values(), steps, seed, threads)
    return SimResult(steps=int(n), histogram=hist, seed=seed)


@dataclass(frozen=True)
class CostModel:
    """Wall-clock cost of one speculative step, in milliseconds.

    `t_target(N) = t_target_ms * max(1, concurrency * N / knee_tokens)`: a decode forward is
    memory-bound (flat in the tokens it scores) until the batch scores `knee_tokens` tokens,
    then compute-bound (linear). `knee_tokens` is the GPU's ops:byte ratio in tokens (~300 on
    an H100 for a dense fp16 model); infinity keeps verification free at any size.
    """

    t_target_ms: float
    knee_tokens: float = math.inf
    t_draft_ms: float = 0.0
    t_host_ms: float = 0.0
    concurrency: int = 1

    def __post_init__(self) -> None:
        for name in ("t_target_ms", "knee_tokens", "t_draft_ms", "t_host_ms"):
            v = getattr(self, name)
            if isinstance(v, (bool, np.bool_)) or not isinstance(
                v, (int, float, np.integer, np.floating)
            ):
                raise TypeError(f"{name}: expected a number, got {type(v).__name__}")
            try:
                float(v)
            except OverflowError:  # only an int gets here
                bits = int(v).bit_length()
                raise ValueError(f"{name}: an int of {bits} bits, past float64") from None
        # knee_tokens may be infinite (verification free at any size); a forward's time may
        # not: every speed-up would come out as nan. Times are bounded (1e12 ms, 31 years):
        # past that their sums overflow (1e308 ms printed an infinite speed-up).
        for name, finite in (("t_target_ms", True), ("knee_tokens", False)):
            v = getattr(self, name)
            if not (v > 0 and not math.isnan(v)) or (finite and not v <= MAX_MS):
                kind = f"a positive number up to {MAX_MS:g}" if finite else "a positive number"
                raise ValueError(f"{name}: {v!r}, expected {kind}")
        for name in ("t_draft_ms", "t_host_ms"):
            v = getattr(self, name)
            if not 0 <= v <= MAX_MS:
                raise ValueError(f"{name}: {v!r}, expected a number in [0, {MAX_MS:g}]")
        if not math.isfinite(self.t_target_ms / self.knee_tokens):
            # Past the knee each token costs t_target_ms / knee_tokens: an infinite cost per
            # token made every speed-up nan.
            raise ValueError(
                f"knee_tokens: {self.knee_tokens!r}, too small for t_target_ms "
                f"{self.t_target_ms!r} (the cost per token past the knee overflows)"
            )
        concurrency = int_arg(self.concurrency, "concurrency", 1)
        if concurrency > MAX_CONCURRENCY:
            raise ValueError(f"concurrency: {concurrency}, expected at most {MAX_CONCURRENCY:,}")
        # A Python int, not the numpy scalar or tensor it was given as (frozen: set directly).
        object.__setattr__(self, "concurrency", concurrency)

    def t_target(self, n: int) -> float:
        """Target forward over `n` tokens per request, for the whole batch."""
        return float(self.t_forward(self.concurrency * n))

    def t_forward(self, tokens: Any) -> Any:
        """Target forward over `tokens` tokens in all (rows may verify different counts); a
        numpy array of token counts gives an array of times."""
        return self.t_target_ms * np.maximum(1.0, np.divide(tokens, self.knee_tokens))

    def step_ms(self, budget: int, draft_steps: int) -> float:
        """One speculative step: verify `budget` tokens, `draft_steps` draft forwards, host."""
        return self.t_target(budget) + draft_steps * self.t_draft_ms + self.t_host_ms


def speedup(expected_tokens: float, budget: int, draft_steps: int, cost: CostModel) -> float:
    """Wall-clock speed-up over plain decoding:
    `expected_tokens * t_target(1) / (t_target(budget) + draft_steps * t_draft + t_host)`."""
    expected_tokens = float_arg(expected_tokens, "expected_tokens")
    if not (expected_tokens >= 1.0):
        raise ValueError(f"expected_tokens: {expected_tokens}, expected >= 1 (the bonus token)")
    if not isinstance(cost, CostModel):
        raise TypeError(f"cost: expected a CostModel, got {type(cost).__name__}")
    budget = int_arg(budget, "budget", 1)
    draft_steps = int_arg(draft_steps, "draft_steps", 0)
    return expected_tokens * cost.t_target(1) / cost.step_ms(budget, draft_steps)


# The attention masks a host-overhead measurement builds at most (see measure_host_overhead).
_MEASURE_MASK_BYTES = 64 << 20


def measure_host_overhead(
    tree: Tree | int,
    batch_size: int = 1,
    *,
    prefix_len: int = 1024,
    accept: float = 0.8,
    min_time: float = 0.2,
    seed: int = 0,
) -> float:
    """Median milliseconds of specsched's own host work for one step of `batch_size` copies of
    `tree`: build the batch, its positions and ragged attention mask, verify from the target's
    tokens, and plan the KV compaction. Target choices follow `accept` per visited node.

    Each request's share of the step is its own (layouts, walk, plan), so the work grows
    linearly with the batch: a batch whose attention masks pass 64 MiB is measured at the
    largest size under that (at least one request) and scaled to `batch_size`, rather than
    allocating gigabytes for one estimate (a `decide` profile may claim 10**6 requests)."""
    tree = _tree(tree)
    requested = int_arg(batch_size, "batch_size", 1)
    prefix_len = int_arg(prefix_len, "prefix_len", 0)
    _prob("accept", accept)
    rng = np.random.default_rng(int_arg(seed, "seed", 0))
    n = tree.num_nodes
    b = max(1, min(requested, _MEASURE_MASK_BYTES // (n * (prefix_len + n))))
    parents = np.tile(tree.parents, b)
    tokens = np.tile(np.arange(n, dtype=np.int64), b)
    offsets = np.arange(b + 1, dtype=np.int64) * n
    # The target picks the first child with probability `accept`, otherwise a token no
    # child carries, so the walk goes as deep as a real one would.
    first_child = tree.sglang_links()[0]  # each node's first child, -1 at a leaf
    hit = rng.random(b * n) < accept
    choice = np.where(hit, np.tile(first_child, b), -1)
    prefix = np.full(b, prefix_len, dtype=np.int64)

    def step() -> None:
        batch = TreeBatch.from_flat(parents, tokens, offsets)
        batch.positions(prefix)
        batch.attention_mask(prefix)
        result = _core.verify_target_tokens(batch, choice)
        _core.kv_compaction_plan(result, prefix)

    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 5 or (time.perf_counter() - start < min_time and len(times) < 10_000):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3 * (requested / b)


# Replay of model-free drafters on recorded text (issue 7); defined in specsched._replay.
from specsched._replay import ReplayResult, replay, stdlib_workload  # noqa: E402
