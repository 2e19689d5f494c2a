"""`specsched.decide(profile)`: should this workload speculate, and how?

A workload profile (lengths, concurrency, the target's forward latency and compute knee,
deployment constraints, what drafters exist and how well they hit) goes in; a
`Recommendation` comes out: off, n-gram, suffix decoding, an EAGLE-3 chain or an EAGLE-3 tree
(topk / depth / budget), its expected end-to-end speed-up with a range, and the reasons, each
with its numbers. Every candidate is scored with the same model (`specsched.sim`):

- per request, GPU time = prefill + decode; prefill (`prompt_tokens * t_target / knee`, the
  compute-bound cost of the prompt) is never sped up, decode (`output_tokens - 1` tokens, the
  first comes from prefill) costs `step / (concurrency * E[tokens per step])`;
- `step = t_target(N) + draft_steps * t_draft + t_host`, with `t_target(N)` flat until
  `concurrency * N` reaches the knee and linear after it: at high concurrency verification
  stops being free, big trees lose, and speculation can lose outright;
- model-free drafters (n-gram, suffix) match on a share `hit_rate` of steps, each request
  independently: a step's forward is priced at its expected cost over the binomial number of
  requests that hit (the cost is convex in the tokens, so at high concurrency, where the
  requests rarely all hit at once, all-hit / all-miss pricing would overstate it);
- `E[tokens per step]` comes from the acceptance model on the candidate's tree (exact, Rust);
- mixed workloads (`classes`) are scored per class and combined by time, i.e. weighted by each
  class's request share and token counts; the reasons quote the output-token shares.

Defaults encode the published numbers (FIELD_NOTES §4): EAGLE-3 on Llama 3.3 70B at ~88%
acceptance gives 2.5-3.5x; n-gram ~1.2-1.5x; vLLM v0.18.0's EAGLE-3 does not run with chunked
prefill while n-gram does. Measure and pass your own acceptance rates whenever you can.

`specsched.decide` (the package attribute) is the function; import the types from this module:
`from specsched.decide import Profile, Recommendation`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specsched import sim
from specsched.sim import Acceptance, CostModel

__all__ = [
    "Candidate",
    "Profile",
    "ProfileError",
    "ProfileTypeError",
    "Recommendation",
    "WorkloadClass",
    "decide",
    "load_profile",
]

# Engines whose EAGLE-3 cannot be combined with chunked prefill.
EAGLE3_NO_CHUNKED_PREFILL = ("vllm-0.18.0",)
ENGINES = ("vllm-0.18.0", "vllm", "sglang", "trtllm", "other")


class ProfileError(ValueError):
    """An invalid or inconsistent workload profile; the message names the field."""


class ProfileTypeError(ProfileError, TypeError):
    """A profile field of the wrong type (a string or a float count): a TypeError, and a
    ProfileError for callers that catch every profile mistake at once."""


def _alternatives(topk: int) -> str:
    """What a tree of `topk` children a node covers past the top draft, in words."""
    if topk == 2:
        return "the target's second choice"
    if topk == 3:
        return "the target's second and third choices"
    suffix = "th" if 10 <= topk % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(topk % 10, "th")
    return f"the target's second to {topk}{suffix} choices"


@dataclass(frozen=True)
class WorkloadClass:
    """One request class of a mixed workload: its share of requests and mean lengths."""

    share: float
    prompt_tokens: float
    output_tokens: float


@dataclass
class Profile:
    """A workload. Lengths are means in tokens; times in milliseconds; rates in [0, 1].

    Give either `prompt_tokens` and `output_tokens` (one class), or `classes` (a mixed workload:
    each `{share, prompt_tokens, output_tokens}`, shares of requests summing to 1).
    """

    prompt_tokens: float | None = None
    output_tokens: float | None = None
    classes: list[WorkloadClass] | None = None
    concurrency: int = 1
    # Target: one decode forward in the memory-bound regime, and the tokens per forward at
    # which it turns compute-bound (the GPU's ops:byte ratio; ~300 for fp16 on an H100).
    target_forward_ms: float = 30.0
    knee_tokens: float = 300.0
    engine: str = "vllm-0.18.0"
    chunked_prefill: bool = False
    memory_headroom_gb: float | None = None
    host_overhead_ms: float = 0.05
    # EAGLE-3: per-token acceptance of the first draft, its decay per depth, the chance that a
    # lower-ranked sibling matches when the higher ones missed, and draft cost / target cost.
    eagle3_head: bool = False
    eagle3_acceptance: float = 0.88
    eagle3_depth_decay: float = 0.95
    eagle3_sibling_acceptance: float = 0.3
    eagle3_draft_ratio: float = 0.08
    eagle3_memory_gb: float = 2.0
    # Model-free drafters: fraction of steps with a match (None: estimated), per-token
    # acceptance of what they propose, and host cost per drafted token.
    ngram_hit_rate: float | None = None
    ngram_acceptance: float = 0.6
    suffix_hit_rate: float | None = None
    suffix_acceptance: float = 0.7
    suffix_ms_per_token: float = 0.02
    ngram_ms_per_token: float = 0.005
    # Uncertainty (absolute, on every acceptance and hit rate) and the gain worth turning on.
    acceptance_uncertainty: float = 0.05
    min_speedup: float = 1.1

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        if self.classes is not None:
            if self.prompt_tokens is not None or self.output_tokens is not None:
                raise ProfileError(
                    "classes: give either classes or prompt_tokens/output_tokens, not both"
                )
            if not isinstance(self.classes, list) or not self.classes:
                raise ProfileError("classes: expected a non-empty list of workload classes")
            converted = []
            for i, c in enumerate(self.classes):
                converted.append(_workload_class(c, f"classes[{i}]"))
            total = sum(c.share for c in converted)
            if abs(total - 1.0) > 1e-6:
                raise ProfileError(f"classes: shares sum to {total:.6g}, expected 1")
            self.classes = converted
        else:
            if self.prompt_tokens is None or self.output_tokens is None:
                missing = "prompt_tokens" if self.prompt_tokens is None else "output_tokens"
                raise ProfileError(f"{missing}: required (or give classes for a mixed workload)")
            _length("prompt_tokens", self.prompt_tokens, 0)
            _length("output_tokens", self.output_tokens, 1)
        _integer("concurrency", self.concurrency, 1)
        if self.concurrency > MAX_CONCURRENCY:
            raise ProfileError(
                f"concurrency: {self.concurrency}, expected at most {MAX_CONCURRENCY:,}"
            )
        for name in ("target_forward_ms", "knee_tokens", "eagle3_memory_gb", "min_speedup"):
            _positive(name, getattr(self, name))
        # In the profile's own names (the cost model's check named its `t_target_ms`).
        if not math.isfinite(self.target_forward_ms * self.concurrency / self.knee_tokens):
            raise ProfileError(
                f"knee_tokens: {self.knee_tokens!r}, too small for target_forward_ms "
                f"{self.target_forward_ms!r} at concurrency {self.concurrency} (the cost per "
                "token past the knee overflows)"
            )
        for name in ("host_overhead_ms", "suffix_ms_per_token", "ngram_ms_per_token"):
            _non_negative(name, getattr(self, name))
        if self.memory_headroom_gb is not None:
            _non_negative("memory_headroom_gb", self.memory_headroom_gb)
        _non_negative("eagle3_draft_ratio", self.eagle3_draft_ratio)
        for name in (
            "eagle3_acceptance",
            "eagle3_depth_decay",
            "eagle3_sibling_acceptance",
            "ngram_acceptance",
            "suffix_acceptance",
            "acceptance_uncertainty",
        ):
            _probability(name, getattr(self, name))
        for name in ("ngram_hit_rate", "suffix_hit_rate"):
            if getattr(self, name) is not None:
                _probability(name, getattr(self, name))
        for name in ("chunked_prefill", "eagle3_head"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ProfileTypeError(
                    f"{name}: expected true or false, got {getattr(self, name)!r}"
                )
            setattr(self, name, bool(getattr(self, name)))
        if self.engine not in ENGINES:
            raise ProfileError(f"engine: {self.engine!r}, expected one of {', '.join(ENGINES)}")
        # Checked numbers as Python's own: numpy scalars would carry into the model's results
        # (a float32 rounding every product, a report json cannot write).
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (bool, str, list)) or value is None:
                continue
            setattr(self, f.name, int(value) if f.name == "concurrency" else float(value))

    def workload(self) -> list[WorkloadClass]:
        if self.classes is not None:
            return list(self.classes)
        assert self.prompt_tokens is not None and self.output_tokens is not None
        return [WorkloadClass(1.0, float(self.prompt_tokens), float(self.output_tokens))]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Profile:
        """A profile from a mapping; unknown fields are errors."""
        if not isinstance(data, Mapping):
            raise ProfileTypeError(f"profile: expected a mapping, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        for key in data:
            if key not in known:
                raise ProfileError(
                    f"{key}: unknown profile field (known: {', '.join(sorted(known))})"
                )
        return cls(**dict(data))


# Not numbers here, though numpy registers them as such: a bool, and a duration or a date
# (np.timedelta64 is a numpy integer; a time is meant in ms, not in the duration's unit).
_NOT_NUMBERS = (bool, np.bool_, np.timedelta64, np.datetime64)


def _is_number(x: Any) -> bool:
    # numbers.Real: numpy's scalars too (a measured np.float32 or np.int64 is a number here).
    if not isinstance(x, numbers.Real) or isinstance(x, _NOT_NUMBERS):
        return False
    try:
        return not math.isnan(float(x))
    except OverflowError:
        return False  # past float64 (10**400, or such a Fraction): out of every range


def _checked(name: str, x: Any, in_range: bool, expected: str) -> None:
    """Refuses `x` unless it is a number in range: a ProfileTypeError when it is no number
    at all (a string, a bool, a duration), a ProfileError when its value is off."""
    if not isinstance(x, numbers.Real) or isinstance(x, _NOT_NUMBERS):
        raise ProfileTypeError(f"{name}: {x!r}, expected {expected}")
    if not (_is_number(x) and in_range):
        raise ProfileError(f"{name}: {x!r}, expected {expected}")


def _positive(name: str, x: Any) -> None:
    # knee_tokens may be infinite (verification free at any size); every other value is
    # bounded, as lengths are: 1e308 ms made every speed-up nan.
    unbounded = name == "knee_tokens"
    number = _is_number(x)
    ok = number and x > 0 and (unbounded or x <= MAX_VALUE)
    _checked(name, x, ok, f"a positive number up to {MAX_VALUE:g}")


def _non_negative(name: str, x: Any) -> None:
    _checked(name, x, _is_number(x) and 0 <= x <= MAX_VALUE, f"a number in [0, {MAX_VALUE:g}]")


def _probability(name: str, x: Any) -> None:
    _checked(name, x, _is_number(x) and 0 <= x <= 1, "a number in [0, 1]")


def _integer(name: str, x: Any, minimum: int) -> None:
    if isinstance(x, _NOT_NUMBERS) or not isinstance(x, numbers.Integral):
        raise ProfileTypeError(f"{name}: {x!r}, expected an integer >= {minimum}")
    if x < minimum:
        raise ProfileError(f"{name}: {x!r}, expected an integer >= {minimum}")


# Most concurrent requests a profile may give: the cost model's own limit.
MAX_CONCURRENCY = sim.MAX_CONCURRENCY
# Longest length a profile may give: far past any workload, and small enough that no product
# of the model overflows a float (1e308 tokens made every speed-up nan).
MAX_TOKENS = 1e12
# Largest time (ms), ratio or size (GB) a profile may give, for the same reason.
MAX_VALUE = 1e12


def _length(name: str, x: Any, minimum: float) -> None:
    ok = _is_number(x) and minimum <= x <= MAX_TOKENS
    _checked(name, x, ok, f"a length in [{minimum:g}, {MAX_TOKENS:g}] tokens")


def _workload_class(c: Any, where: str) -> WorkloadClass:
    if isinstance(c, WorkloadClass):
        c = dataclasses.asdict(c)
    if not isinstance(c, Mapping):
        raise ProfileTypeError(
            f"{where}: expected a table with share, prompt_tokens, output_tokens"
        )
    for key in c:
        if key not in ("share", "prompt_tokens", "output_tokens"):
            raise ProfileError(f"{where}.{key}: unknown field")
    for key in ("share", "prompt_tokens", "output_tokens"):
        if key not in c:
            raise ProfileError(f"{where}.{key}: required")
    share = c["share"]
    _checked(f"{where}.share", share, _is_number(share) and 0 < share <= 1, "a number in (0, 1]")
    _length(f"{where}.prompt_tokens", c["prompt_tokens"], 0)
    _length(f"{where}.output_tokens", c["output_tokens"], 1)
    return WorkloadClass(float(share), float(c["prompt_tokens"]), float(c["output_tokens"]))


def load_profile(path: str | Path) -> Profile:
    """A profile from a `.toml` or `.json` file."""
    p = Path(path)
    if p.suffix not in (".json", ".toml"):
        raise ProfileError(f"profile: {p} must end in .toml or .json")
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ProfileError(f"profile: cannot read {p}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ProfileError(f"profile: {p} is not UTF-8 text: {e}") from None
    if p.suffix == ".json":
        try:
            data = json.loads(text)
        # ValueError: an int past Python's digit limit; RecursionError: nesting no profile has.
        except (ValueError, RecursionError) as e:
            raise ProfileError(f"profile: {p} is not valid JSON: {e}") from None
    else:
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - Python 3.10
            try:
                import tomli as tomllib  # type: ignore[import-not-found, no-redef]
            except ImportError:
                raise ProfileError("profile: reading TOML needs Python 3.11+ or tomli") from None
        try:
            data = tomllib.loads(text)
        except (ValueError, RecursionError) as e:  # TOMLDecodeError is a ValueError
            raise ProfileError(f"profile: {p} is not valid TOML: {e}") from None
    return Profile.from_dict(data)


# ---------------------------------------------------------------------- candidates


@dataclass
class Candidate:
    """One method, scored: its best configuration, per-step tokens and the speed-up."""

    method: str
    config: dict[str, Any]
    expected_tokens: float
    step_ms: float
    speedup: float
    speedup_range: tuple[float, float]
    excluded: str | None = None

    def label(self) -> str:
        if not self.config:
            return self.method
        return f"{self.method} ({', '.join(f'{k}={v}' for k, v in self.config.items())})"


@dataclass
class Recommendation:
    method: str
    config: dict[str, Any]
    speedup: float
    speedup_range: tuple[float, float]
    expected_tokens: float
    reasons: list[str]
    candidates: list[Candidate] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "config": self.config,
            "speedup": round(self.speedup, 4),
            "speedup_range": [round(x, 4) for x in self.speedup_range],
            "expected_tokens_per_step": round(self.expected_tokens, 4),
            "reasons": self.reasons,
            "candidates": [
                {
                    "method": c.method,
                    "config": c.config,
                    "speedup": round(c.speedup, 4),
                    "speedup_range": [round(x, 4) for x in c.speedup_range],
                    "expected_tokens_per_step": round(c.expected_tokens, 4),
                    "step_ms": round(c.step_ms, 4),
                    "excluded": c.excluded,
                }
                for c in self.candidates
            ],
        }

    def __str__(self) -> str:
        cfg = ", ".join(f"{k}={v}" for k, v in self.config.items())
        lo, hi = self.speedup_range
        head = f"recommendation: {self.method}" + (f" ({cfg})" if cfg else "")
        lines = [head, f"expected speed-up: {self.speedup:.2f}x (range {lo:.2f}-{hi:.2f}x)"]
        lines += ["reasons:"] + [f"  - {r}" for r in self.reasons]
        lines.append("candidates:")
        for c in self.candidates:
            if c.excluded:
                lines.append(f"  {c.method:<13} excluded: {c.excluded}")
            else:
                lines.append(
                    f"  {c.label():<48} {c.speedup:5.2f}x  "
                    f"({c.speedup_range[0]:.2f}-{c.speedup_range[1]:.2f}x)  "
                    f"E[tokens/step]={c.expected_tokens:.2f}"
                )
        return "\n".join(lines)


class _Scorer:
    """End-to-end speed-up of a per-step (tokens, cost) over the profile's workload classes."""

    def __init__(self, profile: Profile) -> None:
        self.p = profile
        self.classes = profile.workload()
        self.cost = CostModel(
            t_target_ms=profile.target_forward_ms,
            knee_tokens=profile.knee_tokens,
            concurrency=profile.concurrency,
        )
        # GPU ms per prompt token when compute-bound.
        self.prefill_ms_per_token = profile.target_forward_ms / profile.knee_tokens

    def t_target(self, n: int) -> float:
        return self.cost.t_target(n)

    def t_target_mixed(self, hit: float, extra: int) -> float:
        """Expected forward when each request verifies `1 + extra` tokens with probability
        `hit`, independently of the others, else 1: `E[t(B + extra * H)]` with `H ~
        Binomial(B, hit)`. The forward's cost is convex in its tokens (flat, then linear past
        the knee), so pricing a step as all-hit or all-miss (`hit * t(1 + extra) + (1 - hit)
        * t(1)`) overstates it at high concurrency, where the rows rarely all hit at once."""
        b = self.p.concurrency
        if hit <= 0.0 or extra == 0:
            return float(self.cost.t_forward(b))
        if hit >= 1.0:
            return float(self.cost.t_forward(b * (1 + extra)))
        h = np.arange(b + 1)
        # log C(b, h) by a running sum of log((b - i + 1) / i): no lgamma in numpy.
        i = np.arange(1, b + 1)
        log_choose = np.concatenate(([0.0], np.cumsum(np.log((b - i + 1) / i))))
        log_pmf = log_choose + h * math.log(hit) + (b - h) * math.log1p(-hit)
        pmf = np.exp(log_pmf - log_pmf.max())
        forward = self.cost.t_forward(b + extra * h)
        return float((pmf * forward).sum() / pmf.sum())

    def times(self, expected_tokens: float, step_ms: float) -> tuple[float, float]:
        """(baseline, speculative) GPU ms per request, averaged over the classes."""
        b = self.p.concurrency
        base = spec = 0.0
        for c in self.classes:
            prefill = c.prompt_tokens * self.prefill_ms_per_token
            decode = max(c.output_tokens - 1.0, 0.0)
            base += c.share * (prefill + decode * self.t_target(1) / b)
            spec += c.share * (prefill + decode * step_ms / (b * expected_tokens))
        return base, spec

    def speedup(self, expected_tokens: float, step_ms: float) -> float:
        base, spec = self.times(expected_tokens, step_ms)
        return base / spec if spec > 0 else 1.0

    def decode_share(self) -> float:
        base, _ = self.times(1.0, self.t_target(1))
        b = self.p.concurrency
        decode = sum(
            c.share * max(c.output_tokens - 1, 0) * self.t_target(1) / b for c in self.classes
        )
        return decode / base if base > 0 else 0.0


def _clip(x: float) -> float:
    return min(1.0, max(0.0, x))


def _eagle3_model(
    p: Profile, alpha: float, depth: int, topk: int, sibling: float | None = None
) -> Acceptance:
    """Depth d, rank 0: alpha * decay^(d-1); rank r >= 1: the rank-0 miss times the chance
    `sibling` (default the profile's `eagle3_sibling_acceptance`) that each further candidate
    matches when the ones before missed."""
    s = p.eagle3_sibling_acceptance if sibling is None else sibling
    rows = []
    for d in range(depth):
        a = _clip(alpha * p.eagle3_depth_decay**d)
        rows.append([a] + [(1 - a) * s * (1 - s) ** (r - 1) for r in range(1, topk)])
    return Acceptance.table(rows)


def _chain_candidate(
    scorer: _Scorer,
    method: str,
    hit_rate: float,
    acceptance: float,
    host_per_token: float,
    draft_ratio: float,
    delta: float,
) -> Candidate:
    """A model-free (draft_ratio 0) or model chain drafter, scored over gamma = 1..10. When
    there is no match (probability 1 - hit_rate) the step verifies only the root."""
    p = scorer.p
    t_draft = draft_ratio * scorer.t_target(1)

    def score(gamma: int, h: float, a: float) -> tuple[float, float]:
        tokens = h * sim.expected_tokens_chain(a, gamma) + (1 - h)
        step = (
            scorer.t_target_mixed(h, gamma)
            + h * gamma * (t_draft + host_per_token)
            + p.host_overhead_ms
        )
        return tokens, step

    best: tuple[float, int, float, float] | None = None
    for gamma in range(1, 11):
        tokens, step = score(gamma, hit_rate, acceptance)
        s = scorer.speedup(tokens, step)
        if best is None or s > best[0] + 1e-12:
            best = (s, gamma, tokens, step)
    assert best is not None
    s, gamma, tokens, step = best
    # The speed-up over the rates moved by -delta..+delta: not monotone at high concurrency
    # (a better hit rate verifies more tokens in a batch past the knee), so the range is taken
    # over a grid that includes the point itself.
    ends = [
        scorer.speedup(*score(gamma, _clip(hit_rate + d), _clip(acceptance + d)))
        for d in np.linspace(-delta, delta, 9)
    ]
    return Candidate(
        method, {"num_speculative_tokens": gamma}, tokens, step, s, (min(ends), max(ends))
    )


def _eagle3_candidates(scorer: _Scorer, delta: float) -> tuple[Candidate, Candidate]:
    """EAGLE-3 chain (gamma = 1..10) and tree (topk x depth x budget grid), each at its best."""
    p = scorer.p
    b = p.concurrency
    a = p.eagle3_acceptance

    def draft_ms(topk: int) -> float:
        # The draft forward scores topk frontier tokens per request per step.
        return p.eagle3_draft_ratio * p.target_forward_ms * max(1.0, b * topk / p.knee_tokens)

    def score(
        alpha: float, budget: int, depth: int, topk: int, sibling: float | None = None
    ) -> tuple[float, float]:
        model = _eagle3_model(p, alpha, depth, topk, sibling)
        tree = sim.best_tree(model, budget, depth, topk)
        tokens = sim.expected_accept_length(tree, model)
        step = scorer.t_target(tree.num_nodes) + depth * draft_ms(topk) + p.host_overhead_ms
        return tokens, step

    def best(shapes: Sequence[tuple[int, int, int]]) -> tuple[float, int, int, int, float, float]:
        top = None
        for budget, depth, topk in shapes:
            tokens, step = score(a, budget, depth, topk)
            s = scorer.speedup(tokens, step)
            if top is None or s > top[0] + 1e-12:
                top = (s, budget, depth, topk, tokens, step)
        assert top is not None
        return top

    def candidate(method: str, top: tuple[float, int, int, int, float, float]) -> Candidate:
        s, budget, depth, topk, tokens, step = top
        # Every acceptance moves: the first token's and the siblings'.
        sib = p.eagle3_sibling_acceptance
        ends = [
            scorer.speedup(*score(_clip(a + d), budget, depth, topk, _clip(sib + d)))
            for d in np.linspace(-delta, delta, 9)
        ]
        lo, hi = min(ends), max(ends)
        if topk == 1:
            config: dict[str, Any] = {"num_speculative_tokens": depth}
        else:
            # The budget the tree fills: topk and depth may cap it below the grid's value.
            nodes = sim.best_tree(_eagle3_model(p, a, depth, topk), budget, depth, topk).num_nodes
            config = {"topk": topk, "depth": depth, "budget": nodes}
        return Candidate(method, config, tokens, step, s, (lo, hi))

    chain = candidate("eagle3_chain", best([(g + 1, g, 1) for g in range(1, 11)]))
    grid = [
        (budget, depth, topk)
        for topk in (2, 4, 8)
        for depth in range(2, 9)
        for budget in (4, 8, 16, 32, 64)
        if budget > depth + 1
    ]
    tree = candidate("eagle3_tree", best(grid))
    return chain, tree


def _as_profile(profile: Profile | Mapping[str, Any] | str | Path) -> Profile:
    if isinstance(profile, Profile):
        profile.validate()
        return profile
    if isinstance(profile, Mapping):
        return Profile.from_dict(profile)
    if isinstance(profile, (str, Path)):
        return load_profile(profile)
    raise ProfileTypeError(
        f"profile: expected a Profile, a mapping or a file path, got {type(profile).__name__}"
    )


def decide(profile: Profile | Mapping[str, Any] | str | Path) -> Recommendation:
    """Scores off, n-gram, suffix decoding, EAGLE-3 chain and EAGLE-3 tree on `profile` and
    recommends the fastest (off unless a method gains at least `min_speedup`)."""
    p = _as_profile(profile)
    scorer = _Scorer(p)
    delta = p.acceptance_uncertainty
    reasons: list[str] = []

    classes = scorer.classes
    decode_share = scorer.decode_share()
    if len(classes) > 1:
        out_total = sum(c.share * c.output_tokens for c in classes)
        shares = ", ".join(
            f"{c.share:.0%} of requests with {c.prompt_tokens:g}-token prompts and "
            f"{c.output_tokens:g} output tokens = {c.share * c.output_tokens / out_total:.0%} "
            "of output tokens"
            for c in classes
        )
        reasons.append(f"mixed workload, scored per class and combined by token share: {shares}")
    kind = "decode-heavy" if decode_share >= 0.5 else "prefill-heavy"
    bound = (
        f"; speculation only speeds up decode, so no method can beat "
        f"1/(1 - {decode_share:.3f}) = {1 / (1 - decode_share):.2f}x end to end"
        if decode_share < 0.9
        else ""
    )
    reasons.append(
        f"{kind}: decode is {decode_share:.0%} of GPU time per request at concurrency "
        f"{p.concurrency}{bound}"
    )
    knee_n = p.knee_tokens / p.concurrency
    if knee_n < 32:
        n_probe = min(64, max(2, math.ceil(2 * knee_n)))
        reasons.append(
            f"concurrency {p.concurrency}: the target turns compute-bound above "
            f"{p.knee_tokens:g} tokens per forward, so verification is free only up to "
            f"{knee_n:.1f} tokens per request (t_target({n_probe}) = "
            f"{scorer.t_target(n_probe):.1f} ms vs t_target(1) = {scorer.t_target(1):.1f} ms)"
        )

    candidates: list[Candidate] = []
    ngram_h = p.ngram_hit_rate
    if ngram_h is None:
        ngram_h = 0.3
        reasons.append("ngram_hit_rate not given: assumed 0.3 (measure it on your traffic)")
    candidates.append(
        _chain_candidate(
            scorer, "ngram", ngram_h, p.ngram_acceptance, p.ngram_ms_per_token, 0.0, delta
        )
    )
    if p.suffix_hit_rate is None:
        candidates.append(
            Candidate("suffix", {}, 1.0, 0.0, 1.0, (1.0, 1.0), "suffix_hit_rate not given")
        )
    else:
        candidates.append(
            _chain_candidate(
                scorer,
                "suffix",
                p.suffix_hit_rate,
                p.suffix_acceptance,
                p.suffix_ms_per_token,
                0.0,
                delta,
            )
        )
    eagle_excluded = None
    if not p.eagle3_head:
        eagle_excluded = "no EAGLE-3 draft head for this model"
    elif p.chunked_prefill and p.engine in EAGLE3_NO_CHUNKED_PREFILL:
        eagle_excluded = (
            f"{p.engine} cannot run EAGLE-3 with chunked prefill, which this deployment "
            "requires (n-gram and suffix decoding work with it)"
        )
    elif p.memory_headroom_gb is not None and p.memory_headroom_gb < p.eagle3_memory_gb:
        eagle_excluded = (
            f"memory headroom {p.memory_headroom_gb:g} GB < {p.eagle3_memory_gb:g} GB the "
            "EAGLE-3 head and its KV need"
        )
    if eagle_excluded:
        reasons.append(f"EAGLE-3 excluded: {eagle_excluded}")
        for m in ("eagle3_chain", "eagle3_tree"):
            candidates.append(Candidate(m, {}, 1.0, 0.0, 1.0, (1.0, 1.0), eagle_excluded))
    else:
        candidates.extend(_eagle3_candidates(scorer, delta))

    live = [c for c in candidates if c.excluded is None]
    best = max(live, key=lambda c: c.speedup)
    for c in live:
        reasons.append(
            f"{c.label()}: {c.expected_tokens:.2f} tokens per {c.step_ms:.2f} ms step vs "
            f"1 per {scorer.t_target(1):.2f} ms -> {c.speedup:.2f}x end to end "
            f"({c.speedup_range[0]:.2f}-{c.speedup_range[1]:.2f}x for rates +/-{delta:g})"
        )
    if best.speedup < p.min_speedup:
        reasons.append(
            f"off: the best method, {best.label()}, gains {best.speedup:.2f}x < min_speedup "
            f"{p.min_speedup:g}x, not worth the complexity and memory"
        )
        return Recommendation("off", {}, 1.0, (1.0, 1.0), 1.0, reasons, candidates)
    chain = next((c for c in live if c.method == "eagle3_chain"), None)
    if best.method == "eagle3_tree" and chain is not None:
        reasons.append(
            f"tree over chain: {best.expected_tokens:.2f} vs {chain.expected_tokens:.2f} tokens "
            f"per step ({best.speedup:.2f}x vs {chain.speedup:.2f}x); the tree verifies "
            f"{best.config['budget']} tokens over {best.config['depth']} draft steps and "
            f"covers {_alternatives(best.config['topk'])} where the top draft misses"
        )
    elif best.method == "eagle3_chain":
        tree = next(c for c in live if c.method == "eagle3_tree")
        per_token = p.target_forward_ms * p.concurrency / p.knee_tokens
        cause = (
            f"; past {knee_n:.1f} verified tokens per request each extra one costs "
            f"{per_token:.2f} ms of target time"
            if knee_n < 64
            else "; the tree's extra tokens do not repay their draft and verify cost"
        )
        reasons.append(
            f"chain over tree: the best tree ({tree.label()}) gets {tree.expected_tokens:.2f} "
            f"tokens per {tree.step_ms:.1f} ms step ({tree.speedup:.2f}x), the chain "
            f"{best.expected_tokens:.2f} per {best.step_ms:.1f} ms ({best.speedup:.2f}x){cause}"
        )
    return Recommendation(
        best.method,
        best.config,
        best.speedup,
        best.speedup_range,
        best.expected_tokens,
        reasons,
        candidates,
    )
