"""specsched.decide: a table of workload profiles with the expected recommendation and the
reason that must carry it; the combination of mixed workloads; the published ranges; bad
profiles naming their field."""

from __future__ import annotations

import importlib.util
import json
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import specsched as ss
from specsched import sim
from specsched.decide import Profile, ProfileError, Recommendation, decide, load_profile

DECODE_HEAVY = {"prompt_tokens": 200, "output_tokens": 500}

# (name, profile, expected method, substrings that must appear in the reasons)
TABLE: list[tuple[str, dict[str, Any], str, list[str]]] = [
    (
        "decode-heavy, batch 1, EAGLE-3 head: a wide tree",
        {**DECODE_HEAVY, "eagle3_head": True},
        "eagle3_tree",
        ["decode-heavy", "tree over chain"],
    ),
    (
        "no EAGLE-3 head: n-gram",
        {**DECODE_HEAVY, "ngram_hit_rate": 0.4},
        "ngram",
        ["EAGLE-3 excluded: no EAGLE-3 draft head"],
    ),
    (
        "chunked prefill on vLLM 0.18.0 rules EAGLE-3 out: n-gram",
        {
            "prompt_tokens": 2000,
            "output_tokens": 300,
            "eagle3_head": True,
            "chunked_prefill": True,
            "ngram_hit_rate": 0.5,
            "concurrency": 4,
        },
        "ngram",
        ["cannot run EAGLE-3 with chunked prefill"],
    ),
    (
        "the same on SGLang keeps EAGLE-3",
        {
            "prompt_tokens": 2000,
            "output_tokens": 300,
            "eagle3_head": True,
            "chunked_prefill": True,
            "ngram_hit_rate": 0.5,
            "concurrency": 4,
            "engine": "sglang",
        },
        "eagle3_tree",
        ["tree over chain"],
    ),
    (
        "concurrency 128: verify cost grows with N, the tree shrinks to a short chain",
        {**DECODE_HEAVY, "eagle3_head": True, "concurrency": 128},
        "eagle3_chain",
        ["concurrency 128", "compute-bound", "chain over tree"],
    ),
    (
        "concurrency 256: speculation turns off",
        {**DECODE_HEAVY, "eagle3_head": True, "concurrency": 256},
        "off",
        ["min_speedup"],
    ),
    (
        "prefill-heavy at concurrency 32: off",
        {"prompt_tokens": 8000, "output_tokens": 50, "eagle3_head": True, "concurrency": 32},
        "off",
        ["prefill-heavy", "no method can beat"],
    ),
    (
        "agentic, repetitive output: suffix decoding",
        {
            "prompt_tokens": 3000,
            "output_tokens": 800,
            "suffix_hit_rate": 0.8,
            "suffix_acceptance": 0.8,
            "ngram_hit_rate": 0.4,
        },
        "suffix",
        ["suffix (num_speculative_tokens="],
    ),
    (
        "not enough memory for the EAGLE-3 head",
        {**DECODE_HEAVY, "eagle3_head": True, "memory_headroom_gb": 0.5, "ngram_hit_rate": 0.4},
        "ngram",
        ["memory headroom 0.5 GB"],
    ),
    (
        "mixed 90% x 10 tokens / 10% x 500 tokens",
        {
            "classes": [
                {"share": 0.9, "prompt_tokens": 500, "output_tokens": 10},
                {"share": 0.1, "prompt_tokens": 500, "output_tokens": 500},
            ],
            "eagle3_head": True,
        },
        "eagle3_tree",
        ["combined by token share", "= 15% of output tokens", "= 85% of output tokens"],
    ),
]


def needs_toml() -> None:
    """TOML profiles need Python 3.11's tomllib, or tomli on 3.10."""
    if sys.version_info < (3, 11) and importlib.util.find_spec("tomli") is None:
        pytest.skip("reading TOML needs Python 3.11+ or tomli")


@pytest.mark.parametrize(("name", "profile", "method", "reasons"), TABLE, ids=[t[0] for t in TABLE])
def test_decision_table(
    name: str, profile: dict[str, Any], method: str, reasons: list[str]
) -> None:
    rec = decide(profile)
    assert isinstance(rec, Recommendation)
    text = "\n".join(rec.reasons)
    assert rec.method == method, f"{name}: got {rec.method}\n{text}"
    for r in reasons:
        assert r in text, f"{name}: missing {r!r} in\n{text}"
    # Every recommendation carries numbers: a speed-up, its range, and per-candidate reasons.
    lo, hi = rec.speedup_range
    assert lo <= rec.speedup <= hi
    assert any("x end to end" in r for r in rec.reasons)
    if method != "off":
        assert rec.speedup >= 1.1 and rec.config
        assert rec.speedup == max(c.speedup for c in rec.candidates if c.excluded is None)
    d = rec.to_dict()
    assert json.loads(json.dumps(d))["method"] == method


def test_published_ranges_at_batch_one() -> None:
    """EAGLE-3 ~2.5-3.5x on Llama 3.3 70B at ~88% acceptance, n-gram ~1.2-1.5x."""
    rec = decide({**DECODE_HEAVY, "eagle3_head": True})
    by = {c.method: c for c in rec.candidates}
    assert 2.5 <= by["eagle3_chain"].speedup <= 3.5
    assert 1.2 <= by["ngram"].speedup <= 1.5
    # A chain of ~4 drafts at 88% accepts ~3.2 tokens plus the bonus.
    assert by["eagle3_chain"].config["num_speculative_tokens"] in (4, 5, 6)


def test_speedup_falls_as_concurrency_rises() -> None:
    speeds = [
        decide({**DECODE_HEAVY, "eagle3_head": True, "concurrency": b}).speedup
        for b in (1, 16, 64, 128, 256)
    ]
    assert speeds == sorted(speeds, reverse=True)
    budgets = []
    for b in (1, 32, 64):
        rec = decide({**DECODE_HEAVY, "eagle3_head": True, "concurrency": b})
        tree = next(c for c in rec.candidates if c.method == "eagle3_tree")
        budgets.append(tree.config["budget"])
    assert budgets == sorted(budgets, reverse=True) and budgets[0] > budgets[-1]


def test_mixed_workload_is_combined_by_time() -> None:
    """The mixed speed-up is total baseline time over total speculative time, class by class."""
    classes = [
        {"share": 0.9, "prompt_tokens": 500, "output_tokens": 10},
        {"share": 0.1, "prompt_tokens": 500, "output_tokens": 500},
    ]
    p = Profile(classes=classes, ngram_hit_rate=0.5)
    rec = decide(p)
    ngram = next(c for c in rec.candidates if c.method == "ngram")
    t1 = p.target_forward_ms
    base = spec = 0.0
    for c in classes:
        prefill = c["prompt_tokens"] * t1 / p.knee_tokens
        base += c["share"] * (prefill + (c["output_tokens"] - 1) * t1)
        spec += c["share"] * (
            prefill + (c["output_tokens"] - 1) * ngram.step_ms / ngram.expected_tokens
        )
    assert ngram.speedup == pytest.approx(base / spec, rel=1e-12)
    # The mix gains less than its long class alone and more than its short class alone.
    long_only = decide({"prompt_tokens": 500, "output_tokens": 500, "ngram_hit_rate": 0.5})
    short_only = decide({"prompt_tokens": 500, "output_tokens": 10, "ngram_hit_rate": 0.5})
    pick = lambda r: next(c for c in r.candidates if c.method == "ngram").speedup  # noqa: E731
    assert pick(short_only) < ngram.speedup < pick(long_only)


def test_ngram_expected_tokens_use_the_chain_formula() -> None:
    rec = decide({**DECODE_HEAVY, "ngram_hit_rate": 0.4, "ngram_acceptance": 0.6})
    ngram = next(c for c in rec.candidates if c.method == "ngram")
    g = ngram.config["num_speculative_tokens"]
    assert ngram.expected_tokens == pytest.approx(0.4 * sim.expected_tokens_chain(0.6, g) + 0.6)


def test_ngram_steps_are_priced_over_independent_hits() -> None:
    """Each request hits on its own: the step's forward is the mean over every hit pattern
    (enumerated here for 8 requests), not the all-hit / all-miss mixture."""
    import itertools

    from specsched.decide import _Scorer

    p = Profile(
        prompt_tokens=100, output_tokens=400, concurrency=8, knee_tokens=20.0, ngram_hit_rate=0.3
    )
    scorer = _Scorer(p)
    for hit, extra in [(0.3, 4), (0.7, 1), (0.0, 3), (1.0, 3), (0.5, 0)]:
        want = 0.0
        for pattern in itertools.product([0, 1], repeat=8):
            k = sum(pattern)
            prob = hit**k * (1 - hit) ** (8 - k)
            want += prob * p.target_forward_ms * max(1.0, (8 + extra * k) / p.knee_tokens)
        assert scorer.t_target_mixed(hit, extra) == pytest.approx(want, rel=1e-12)
        mixture = hit * scorer.t_target(1 + extra) + (1 - hit) * scorer.t_target(1)
        assert scorer.t_target_mixed(hit, extra) <= mixture + 1e-12
    # Past the knee the mixture overstates the step; the n-gram candidate gains by it.
    busy = decide({**DECODE_HEAVY, "concurrency": 256, "ngram_hit_rate": 0.5})
    ngram = next(c for c in busy.candidates if c.method == "ngram")
    g = ngram.config["num_speculative_tokens"]
    s = _Scorer(Profile(**{**DECODE_HEAVY, "concurrency": 256, "ngram_hit_rate": 0.5}))
    assert s.t_target_mixed(0.5, g) < 0.5 * s.t_target(1 + g) + 0.5 * s.t_target(1)


def test_tree_range_moves_the_sibling_acceptance_too() -> None:
    # docs/spec-decider.md: "every acceptance ... moved by acceptance_uncertainty". The tree's
    # upper end is its speed-up with the first token's and the siblings' acceptance both up.
    base = {"prompt_tokens": 500, "output_tokens": 500, "eagle3_head": True}
    p = Profile.from_dict(base)
    tree = next(c for c in decide(base).candidates if c.method == "eagle3_tree")
    up = dict(
        base,
        eagle3_acceptance=p.eagle3_acceptance + 0.05,
        eagle3_sibling_acceptance=p.eagle3_sibling_acceptance + 0.05,
        acceptance_uncertainty=0.0,
    )
    moved = next(c for c in decide(up).candidates if c.method == "eagle3_tree")
    assert moved.config == tree.config
    assert tree.speedup_range[1] == pytest.approx(moved.speedup, rel=1e-12)


def test_every_speedup_lies_in_its_range() -> None:
    # The speed-up over the rates moved by +-delta peaks inside the interval at high
    # concurrency: the range covers the point (it printed "1.13x (range 1.00-1.10x)").
    rng = np.random.default_rng(0)
    for _ in range(60):
        profile = {
            "prompt_tokens": float(rng.choice([0, 200, 2000])),
            "output_tokens": float(rng.choice([50, 500, 2000])),
            "concurrency": int(rng.choice([1, 16, 64, 200, 256])),
            "ngram_hit_rate": float(rng.uniform(0.0, 0.6)),
            "ngram_acceptance": float(rng.uniform(0.3, 0.9)),
            "suffix_hit_rate": float(rng.uniform(0.0, 0.6)),
            "eagle3_head": True,
            "acceptance_uncertainty": float(rng.choice([0.05, 0.1, 0.2])),
        }
        rec = decide(profile)
        lo, hi = rec.speedup_range
        assert lo - 1e-12 <= rec.speedup <= hi + 1e-12, (profile, rec.speedup, lo, hi)
        for c in rec.candidates:
            if c.excluded is None:
                lo, hi = c.speedup_range
                assert lo - 1e-12 <= c.speedup <= hi + 1e-12, (profile, c)


def test_speedup_ranges_are_ordered_where_speculation_loses() -> None:
    # At 256 requests a better hit rate drafts more and loses more: the range's ends swap.
    rec = decide(
        {**DECODE_HEAVY, "concurrency": 256, "ngram_hit_rate": 0.1, "acceptance_uncertainty": 0.2}
    )
    for c in rec.candidates:
        assert c.speedup_range[0] <= c.speedup_range[1], c
    assert rec.speedup_range[0] <= rec.speedup_range[1]


def test_profile_files(tmp_path: Path) -> None:
    needs_toml()
    toml = tmp_path / "p.toml"
    toml.write_text(
        "concurrency = 4\neagle3_head = true\n\n"
        "[[classes]]\nshare = 0.5\nprompt_tokens = 100\noutput_tokens = 300\n\n"
        "[[classes]]\nshare = 0.5\nprompt_tokens = 4000\noutput_tokens = 50\n"
    )
    p = load_profile(toml)
    assert p.concurrency == 4 and len(p.workload()) == 2
    assert ss.decide(str(toml)).method == decide(p).method
    js = tmp_path / "p.json"
    js.write_text(json.dumps({**DECODE_HEAVY, "eagle3_head": True}))
    assert decide(js).method == "eagle3_tree"


@pytest.mark.parametrize(
    ("profile", "field"),
    [
        ({**DECODE_HEAVY, "bogus": 1}, "bogus: unknown profile field"),
        ({"prompt_tokens": -1, "output_tokens": 10}, "prompt_tokens"),
        ({"prompt_tokens": 10}, "output_tokens: required"),
        ({"prompt_tokens": 10, "output_tokens": 0}, "output_tokens"),
        ({**DECODE_HEAVY, "concurrency": 0}, "concurrency"),
        ({**DECODE_HEAVY, "concurrency": 2.5}, "concurrency"),
        ({**DECODE_HEAVY, "eagle3_acceptance": 1.2}, "eagle3_acceptance"),
        ({**DECODE_HEAVY, "ngram_hit_rate": -0.1}, "ngram_hit_rate"),
        ({**DECODE_HEAVY, "target_forward_ms": 0}, "target_forward_ms"),
        ({**DECODE_HEAVY, "knee_tokens": -3}, "knee_tokens"),
        # Named in the profile's words (it named the cost model's t_target_ms).
        ({**DECODE_HEAVY, "knee_tokens": 1e-320}, "too small for target_forward_ms 30"),
        ({**DECODE_HEAVY, "engine": "vllm-9"}, "engine"),
        ({**DECODE_HEAVY, "chunked_prefill": "yes"}, "chunked_prefill"),
        ({"classes": []}, "classes"),
        (
            {"classes": [{"share": 1.0, "prompt_tokens": 5, "output_tokens": -3}]},
            r"classes[0].output_tokens",
        ),
        (
            {
                "classes": [
                    {"share": 0.5, "prompt_tokens": 5, "output_tokens": 3},
                    {"share": 0.2, "prompt_tokens": 5, "output_tokens": 3},
                ]
            },
            "shares sum to 0.7",
        ),
        (
            {"classes": [{"share": 1.0, "prompt_tokens": 5, "output_tokens": 3, "x": 1}]},
            "classes[0].x: unknown field",
        ),
        ({**DECODE_HEAVY, "classes": [{"share": 1.0}]}, "classes: give either"),
    ],
)
def test_bad_profiles_name_the_field(profile: dict[str, Any], field: str) -> None:
    with pytest.raises(ProfileError) as e:
        decide(profile)
    assert field in str(e.value)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize(
    ("profile", "field"),
    [
        (5, "profile: expected a Profile"),
        ({**DECODE_HEAVY, "concurrency": 1.5}, "concurrency"),
        ({**DECODE_HEAVY, "eagle3_head": "yes"}, "eagle3_head"),
        ({**DECODE_HEAVY, "prompt_tokens": "x"}, "prompt_tokens"),
        ({**DECODE_HEAVY, "target_forward_ms": "30"}, "target_forward_ms"),
        ({**DECODE_HEAVY, "ngram_hit_rate": True}, "ngram_hit_rate"),
    ],
)
def test_wrong_types_are_type_errors(profile: Any, field: str) -> None:
    # A TypeError as everywhere else, and still a ProfileError for callers catching those.
    with pytest.raises(TypeError, match=f"^{field}") as e:
        decide(profile)
    assert isinstance(e.value, ProfileError)


def test_the_tree_reason_names_the_choices_it_covers() -> None:
    # README's example recommends topk=2: its tree never holds a third choice.
    rec = decide({**DECODE_HEAVY, "eagle3_head": True, "concurrency": 32})
    assert rec.method == "eagle3_tree" and rec.config["topk"] == 2
    reason = next(r for r in rec.reasons if r.startswith("tree over chain"))
    assert "covers the target's second choice where" in reason
    wide = decide({**DECODE_HEAVY, "eagle3_head": True})
    assert wide.method == "eagle3_tree" and wide.config["topk"] == 8
    assert "second to 8th choices" in next(r for r in wide.reasons if r.startswith("tree over"))


def test_profile_takes_numpy_scalars() -> None:
    # Measured values come as numpy scalars (np.float32, np.int64, np.bool_): numbers like any
    # other, stored as Python's own so results and reports carry no numpy types.
    numpy_profile = {
        **DECODE_HEAVY,
        "prompt_tokens": np.int64(DECODE_HEAVY["prompt_tokens"]),
        "concurrency": np.int32(DECODE_HEAVY.get("concurrency", 1)),
        "target_forward_ms": np.float32(25.0),
        "eagle3_acceptance": np.float32(0.75),
        "chunked_prefill": np.bool_(True),
    }
    plain = {k: v.item() if isinstance(v, np.generic) else v for k, v in numpy_profile.items()}
    p = Profile.from_dict(numpy_profile)
    assert type(p.prompt_tokens) is float and type(p.concurrency) is int
    assert type(p.target_forward_ms) is float and p.chunked_prefill is True
    assert decide(numpy_profile) == decide(plain)
    with pytest.raises(ProfileError, match="concurrency"):
        Profile.from_dict({**DECODE_HEAVY, "concurrency": np.float64(2.5)})
    with pytest.raises(ProfileError, match="prompt_tokens"):
        Profile.from_dict({**DECODE_HEAVY, "prompt_tokens": np.bool_(True)})
    # numpy registers a duration as an integer; it is not a count or a time in ms here.
    for field, value in [
        ("concurrency", np.timedelta64(4)),
        ("target_forward_ms", np.timedelta64(25, "ms")),
        ("eagle3_acceptance", np.timedelta64(1)),
        ("prompt_tokens", np.timedelta64(1)),
    ]:
        with pytest.raises(ProfileError, match=field):
            Profile.from_dict({**DECODE_HEAVY, field: value})
    with pytest.raises(ProfileError, match=r"classes\[0\].share"):
        Profile.from_dict(
            {"classes": [{"share": np.timedelta64(1), "prompt_tokens": 5, "output_tokens": 3}]}
        )
    # Past float64: out of range, said by name (float() raised OverflowError).
    with pytest.raises(ProfileError, match="prompt_tokens"):
        Profile.from_dict({**DECODE_HEAVY, "prompt_tokens": Fraction(10**400)})
    with pytest.raises(ProfileError, match="output_tokens"):
        Profile.from_dict({**DECODE_HEAVY, "output_tokens": 10**400})


def test_bad_files(tmp_path: Path) -> None:
    bad = tmp_path / "p.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="must end in"):
        load_profile(tmp_path / "p.yaml")
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "missing.toml")
    # Each named as the profile's, not a bare RecursionError / UnicodeDecodeError / ValueError.
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    deep_toml = tmp_path / "deep.toml"
    deep_toml.write_text("a = " + "[" * 100_000 + "]" * 100_000)
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"engine": "caf\xe9"}')
    huge = tmp_path / "huge.json"
    huge.write_text('{"concurrency": ' + "9" * 5000 + "}")
    for path, match in (
        (deep, "not valid JSON"),
        (deep_toml, "not valid TOML"),
        (latin, "not UTF-8 text"),
        (huge, "not valid JSON"),
    ):
        with pytest.raises(ProfileError, match=f"^profile: .*{path.name} is {match}"):
            load_profile(path)
    with pytest.raises(ProfileError, match="profile"):
        decide(42)  # type: ignore[arg-type]
