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
    assert all(r["identical_to_autoregressive"] for r in rows.values())
    eagle = [r for name, r in rows.items() if name.startswith("eagle")]
    assert len(eagle) == 5
    assert all(r["tokens_per_forward"] > 1.0 for r in eagle)
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
