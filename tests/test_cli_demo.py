"""`specsched demo`: the README's main command, on the shipped model."""

from __future__ import annotations

import json

import pytest
from specsched.cli import main

pytest.importorskip("torch")


def test_demo_reports_every_method_identical_to_autoregressive(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--max-new-tokens", "24", "--json", "--threads", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["method"]: r for r in report["greedy"]}
    assert rows["autoregressive"]["tokens_per_forward"] == 1.0
    # float32 here; exact equality is tested in float64 (tests/test_generate.py).
    assert all(r["identical_to_autoregressive"] or r["numeric_tie"] for r in rows.values())
    eagle = [r for name, r in rows.items() if name.startswith("eagle")]
    assert len(eagle) == 5
    assert all(r["tokens_per_forward"] > 1.0 for r in eagle)
    for r in rows.values():
        split = r["specsched_split_us_per_step"]
        assert set(split) == {"build", "layout", "verify", "kv"}
        assert split["layout"] > 0 and split["verify"] > 0 and split["kv"] > 0
        assert sum(split.values()) == pytest.approx(r["specsched_us_per_step"], abs=0.3)
    assert report["sampling"]["same_seed_same_tokens"]
    assert report["model"]["head_rank_acceptance"][0] > 0.3


def test_demo_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--max-new-tokens", "8", "--budget", "8"]) == 0
    out = capsys.readouterr().out
    assert "tok/fwd" in out and "eagle dynamic tree, 8 nodes" in out
    assert " NO" not in out


def test_demo_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--budget", "1"]) == 2
    assert "--budget" in capsys.readouterr().err
    # The limit is the flag's own (its largest tree is 3 x budget), not an internal tree's.
    # The limit is the demo's own (budget - 1 draft levels a step, a 3 x budget tree), not
    # an internal tree's; 8133 fit the model's positions but did not end in 10 minutes.
    for budget in ("1025", "8133", "21846"):
        assert main(["demo", "--budget", budget]) == 2
        assert f"--budget: {budget}, at most 1024" in capsys.readouterr().err
    # Named before any run (an overflow naming nothing; a position error thousands of
    # steps in).
    assert main(["demo", "--threads", "99999999999999999999"]) == 2
    assert "--threads must be in [0, 1024]" in capsys.readouterr().err
    # The longest prompt is 60 tokens; the last token emitted is never fed back: 8133 fit.
    assert main(["demo", "--max-new-tokens", "8134"]) == 2
    assert "8192 positions and the longest prompt takes 60: at most 8133" in (
        capsys.readouterr().err
    )
    # A device torch cannot make or does not have: one line and exit 2, not a traceback.
    assert main(["demo", "--device", "bogus"]) == 2
    assert "--device 'bogus'" in capsys.readouterr().err
    # A device type that holds no data (torch's tensors there have no values).
    assert main(["demo", "--device", "meta"]) == 2
    assert "not a device torch can compute on" in capsys.readouterr().err
    import torch

    if not torch.cuda.is_available():
        assert main(["demo", "--device", "cuda"]) == 2
        assert "no cuda device" in capsys.readouterr().err


def test_numeric_tie_accepts_only_floating_point_ties() -> None:
    import copy

    import torch
    from specsched._cli_demo import _numeric_tie
    from specsched.models.tiny import load_tiny

    model, _ = load_tiny()
    prompts = [list(b"import os\n")]
    with torch.inference_mode():
        logits = model(torch.tensor(prompts))[0][0, -1]
    best, worst = int(logits.argmax()), int(logits.argmin())
    assert _numeric_tie(model, prompts, [[best]], [[best]]) is None  # identical
    assert _numeric_tie(model, prompts, [[best]], [[worst]]) is None  # a real difference
    # Two tokens with the same (tied) LM-head row have exactly equal logits everywhere.
    twin = next(t for t in range(256) if t not in prompts[0] and t != best)
    tied = copy.deepcopy(model)
    with torch.no_grad():
        tied.embed.weight[twin] = tied.embed.weight[best]
    assert _numeric_tie(tied, prompts, [[best]], [[twin]]) == "request 0 token 0"
