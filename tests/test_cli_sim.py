"""`specsched simulate` / `specsched decide`: outputs, JSON, plots, exit codes and one-line
error messages (in-process through `main`, and once through the installed entry point)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from specsched import sim
from specsched.cli import main


def needs_toml() -> None:
    """TOML profiles need Python 3.11's tomllib, or tomli on 3.10."""
    if sys.version_info < (3, 11) and importlib.util.find_spec("tomli") is None:
        pytest.skip("reading TOML needs Python 3.11+ or tomli")


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as e:  # argparse usage errors
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_simulate_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["simulate", "--per-rank", "0.6,0.2,0.1", "--budget", "8"], capsys)
    assert code == 0
    lines = [ln for ln in out.splitlines() if ln.startswith("per_rank")]
    assert [ln.split()[5] for ln in lines] == ["chain", "tree"]
    e_chain = sim.expected_accept_length(7, sim.Acceptance.per_rank([0.6, 0.2, 0.1]))
    assert f"{e_chain:.3f}" in lines[0]


def test_simulate_json_sweep(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--alpha", "0.6,0.85", "--budget", "4,16", "--steps", "20000", "--json"]
    code, out, err = run(argv, capsys)
    assert code == 0
    data = json.loads(out)
    assert len(data["rows"]) == 4
    row = data["rows"][1]  # alpha 0.6, N = 16
    assert row["budget"] == 16
    assert row["chain"]["expected_tokens"] == pytest.approx(sim.expected_tokens_chain(0.6, 15))
    assert row["tree"]["expected_tokens"] >= row["chain"]["expected_tokens"]
    lo, hi = row["tree"]["simulated"]["ci95"]
    assert lo < hi and sum(row["tree"]["simulated"]["accepted_histogram"]) == 20000
    assert "simulate [" in err and "4/4" in err  # progress on stderr, not stdout


def test_decide_flags_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["decide", "--prompt-tokens", "200", "--output-tokens", "500", "--eagle3-head"]
    code, out, _ = run([*argv, "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["method"] == "eagle3_tree"
    assert set(data["config"]) == {"topk", "depth", "budget"}
    assert data["speedup_range"][0] <= data["speedup"] <= data["speedup_range"][1]
    code, out, _ = run(argv, capsys)
    assert code == 0 and out.startswith("recommendation: eagle3_tree") and "reasons:" in out


def test_decide_profile_file_and_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    needs_toml()
    prof = tmp_path / "w.toml"
    prof.write_text("prompt_tokens = 2000\noutput_tokens = 300\nchunked_prefill = true\n")
    code, out, _ = run(["decide", "--profile", str(prof), "--eagle3-head", "--json"], capsys)
    assert code == 0 and json.loads(out)["method"] in ("ngram", "off")
    argv = ["decide", "--class", "0.9:500:10", "--class", "0.1:500:500", "--eagle3-head"]
    code, out, _ = run(argv, capsys)
    assert code == 0 and "85% of output tokens" in out
    # A flag wins over the file both ways: --no-eagle3-head turns a file's head off.
    headed = tmp_path / "h.toml"
    headed.write_text("prompt_tokens = 200\noutput_tokens = 500\neagle3_head = true\n")
    code, out, _ = run(["decide", "--profile", str(headed), "--json"], capsys)
    assert code == 0 and json.loads(out)["method"].startswith("eagle3")
    code, out, _ = run(["decide", "--profile", str(headed), "--no-eagle3-head", "--json"], capsys)
    assert code == 0 and not json.loads(out)["method"].startswith("eagle3")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simulate", "--alpha", "1.5"], "alpha: 1.5 is not a probability"),
        (["simulate", "--alpha", "x"], "argument --alpha"),
        # An empty list is not "unset" (the default alpha would answer a model not asked for).
        (["simulate", "--alpha", ","], "--alpha: expected at least one number"),
        # Lengths whose products overflow (every speed-up was nan, and --json printed NaN).
        (
            ["decide", "--prompt-tokens", "1e308", "--output-tokens", "1e308", "--json"],
            "prompt_tokens",
        ),
        (["simulate", "--budget", "0"], "--budget"),
        (["simulate", "--per-rank", "0.7,0.6"], "per_rank"),
        (["simulate", "--per-depth", "0.9", "--budget", "8"], "--per-depth: 1 depths"),
        # The chain compared at --budget 8 is 7 deep whatever --depth caps the tree at.
        (
            ["simulate", "--per-depth", "0.9,0.8", "--budget", "8", "--depth", "2"],
            "the comparison chain of --budget 8 is 7 drafts deep",
        ),
        (["simulate", "--budget", "100000", "--steps", "0"], "--budget: 100000, a tree holds"),
        (["simulate", "--concurrency", "0", "--measure-host"], "--concurrency: 0"),
        # Bounded as a decide profile's is (10**400 overflowed a forward's time: a traceback).
        (["simulate", "--concurrency", "1000001"], "--concurrency: 1000001, expected 1 to"),
        (
            [
                "decide",
                "--prompt-tokens",
                "10",
                "--output-tokens",
                "10",
                "--concurrency",
                "0",
                "--measure-host",
            ],
            "concurrency: 0",
        ),
        # Both kinds of lengths on one command line (flags win only over a profile file).
        (["decide", "--class", "1:100:500", "--prompt-tokens", "100000"], "not both"),
        # A cost per token past the knee that overflows (every speed-up was nan).
        (["simulate", "--t-target", "1e12", "--knee", "1e-300", "--steps", "0"], "knee_tokens"),
        (["simulate", "--t-target", "-1"], "t_target_ms"),
        (["simulate", "--alpha", "0.5", "--per-rank", "0.5"], "not allowed with"),
        (["decide", "--prompt-tokens", "-5", "--output-tokens", "9"], "prompt_tokens"),
        (["decide", "--output-tokens", "9"], "prompt_tokens: required"),
        (["decide", "--profile", "/nonexistent/p.toml"], "cannot read"),
        (["decide", "--class", "0.5:1"], "SHARE:PROMPT_TOKENS:OUTPUT_TOKENS"),
        (["decide", "--class", "0.5:10:10"], "shares sum to 0.5"),
        (["nonsense"], "invalid choice"),
        # Times whose sums overflow (1e308 ms printed an infinite or nan speed-up).
        (["simulate", "--steps", "0", "--t-target", "1e308"], "t_target_ms: 1e+308, expected"),
        (
            [
                "decide",
                "--prompt-tokens",
                "9",
                "--output-tokens",
                "9",
                "--target-forward-ms",
                "1e308",
            ],
            "target_forward_ms: 1e+308",
        ),
        # Flags named, not the API argument they become (max_children).
        (["simulate", "--steps", "0", "--topk", "99999999999999999999"], "--topk: 9999"),
        (["simulate", "--steps", "0", "--depth", "0"], "--depth: 0, expected 1 to"),
        (["simulate", "--steps", "0", "--per-rank", ""], "--per-rank: expected at least one"),
        # Conflicting or empty flags were silently ignored.
        (["simulate", "--steps", "0", "--measure-host", "--t-host", "5"], "not both"),
        (
            [
                "decide",
                "--prompt-tokens",
                "9",
                "--output-tokens",
                "9",
                "--measure-host",
                "--host-overhead-ms",
                "5",
            ],
            "--host-overhead-ms: give it or --measure-host, not both",
        ),
        (["simulate", "--steps", "0", "--plot", ""], "--plot: empty file name"),
        (["simulate", "--steps", "0", "--plot", "/nonexistent/x.png"], "--plot: /nonexistent"),
        # matplotlib wrote noext.png (or a hidden .png in the folder) and the command said
        # "wrote noext"; an unknown format failed after the sweep.
        (["simulate", "--steps", "0", "--plot", "noext"], "--plot: noext: expected a file"),
        (["simulate", "--steps", "0", "--plot", "x.webp2"], "--plot: x.webp2: expected a file"),
        (["decide", "--prompt-tokens", "9", "--output-tokens", "9", "--plot", "."], "is a folder"),
        # Before the sweep, naming the flag (it failed after the work: "[Errno 13] ...").
        (
            ["simulate", "--steps", "0", "--plot", "/proc/x.png"],
            "--plot: /proc/x.png: cannot write it",
        ),
        (["replay", "--seed", "-1", "--requests", "1"], "seed: must be >= 0, got -1"),
        (["decide", "--profile", "", "--prompt-tokens", "9", "--output-tokens", "9"], "--profile"),
        # A sweep that fails part-way: the progress bar's line is ended before the error.
        (
            ["simulate", "--per-rank", "0.1,0.8", "--budget", "4,8,16,65536", "--steps", "0"],
            "budget: the exact DP for 65536 nodes",
        ),
    ],
)
def test_bad_input_is_one_line_and_nonzero(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2
    assert message in err
    # The error has a line of its own (after a progress bar's carriage-return frames).
    lines = err.strip().splitlines()
    assert lines[-1].startswith("specsched") and message in lines[-1], err
    assert all(line.startswith("\r") or "[" in line for line in lines[:-1]), err
    assert "Traceback" not in err and out == ""


def test_simulate_shows_each_shapes_own_node_count(capsys: pytest.CaptureFixture[str]) -> None:
    # --depth 2 --topk 1 caps the best tree at 3 nodes: its row said N = 100.
    code, out, _ = run(["simulate", "--steps", "0", "--depth", "2", "--topk", "1",
                        "--budget", "100"], capsys)  # fmt: skip
    assert code == 0
    chain, tree = out.strip().splitlines()[-2:]
    assert chain.split()[2:4] == ["100", "chain"] and tree.split()[2:4] == ["3", "tree"]


def test_measure_host_scales_a_huge_batch_instead_of_allocating_it() -> None:
    # A million 16-node trees' masks are ~16 GB: measured under 64 MiB and scaled linearly.
    tree = sim.best_tree(sim.Acceptance.iid(0.8), 16, 6, 4)
    small = sim.measure_host_overhead(tree, 4000, min_time=0.05)
    huge = sim.measure_host_overhead(tree, 1_000_000, min_time=0.05)
    assert 50 < huge / small < 1000  # ~250x: the same batch timed, scaled by 10**6 / b


def test_unknown_profile_field_from_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"prompt_tokens": 1, "output_tokens": 2, "concurency": 8}))
    code, _, err = run(["decide", "--profile", str(prof)], capsys)
    assert code == 2 and "concurency: unknown profile field" in err


def test_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    a, b = tmp_path / "sim.png", tmp_path / "decide.png"
    code, _, err = run(["simulate", "--alpha", "0.8", "--steps", "0", "--plot", str(a)], capsys)
    assert code == 0 and a.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    argv = ["decide", "--prompt-tokens", "100", "--output-tokens", "400", "--plot", str(b)]
    code, _, err = run(argv, capsys)
    assert code == 0 and b.stat().st_size > 1000 and "decide sweep" in err


@pytest.mark.skipif(shutil.which("specsched") is None, reason="entry point not installed")
def test_entry_point_exit_code() -> None:
    bad = subprocess.run(
        ["specsched", "decide", "--eagle3-acceptance", "2"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    ok = subprocess.run(
        ["specsched", "simulate", "--alpha", "0.85", "--budget", "6", "--steps", "1000"],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0 and "chain" in ok.stdout


def test_simulate_json_writes_an_infinite_knee_as_null(capsys: pytest.CaptureFixture[str]) -> None:
    # JSON has no infinity, and --json never prints a non-standard constant.
    code, out, _ = run(
        ["simulate", "--alpha", "0.8", "--knee", "inf", "--steps", "100", "--json"], capsys
    )
    assert code == 0 and json.loads(out)["cost"]["knee_tokens"] is None


SIMULATE = ["simulate", "--alpha", "0.85", "--budget", "6", "--steps", "1000"]
DECIDE = ["decide", "--prompt-tokens", "100", "--output-tokens", "200"]


@pytest.mark.parametrize(
    ("command", "unbuffered"),
    [
        (SIMULATE, True),
        (SIMULATE, False),
        (DECIDE, False),
        # Unbuffered only: buffered, the whole bench would run before the write at exit.
        (["bench", "--quick"], True),
    ],
    ids=["simulate-unbuffered", "simulate-buffered", "decide-buffered", "bench-unbuffered"],
)
def test_a_reader_that_goes_away_is_not_an_error(command: list[str], unbuffered: bool) -> None:
    # `specsched simulate | head`: the pipe's reader has closed before the table is written.
    # Buffered stdout (a plain shell) writes at exit, unbuffered (PYTHONUNBUFFERED=1) at once.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        ["specsched", *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1
    assert "Broken pipe" not in err and "Traceback" not in err, err
