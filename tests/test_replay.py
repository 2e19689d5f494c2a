"""`specsched.sim.replay`, the stdlib workloads and the `specsched replay` CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import specsched as ss
from specsched import reference as ref
from specsched import sim
from specsched.cli import main


def _brute_replay(workload: list[tuple[list[int], list[int]]], budget: int) -> tuple[int, int]:
    """n-gram replay written out by hand: propose with the reference, accept the longest prefix
    equal to the recorded text, then the bonus."""
    steps = accepted = 0
    for prompt, cont in workload:
        ctx, pos = list(prompt), 0
        while pos < len(cont):
            draft = ref.ngram_propose(ctx, 1, 4, budget)
            k = 0
            while k < len(draft) and pos + k < len(cont) and draft[k] == cont[pos + k]:
                k += 1
            commit = cont[pos : pos + k + 1]
            ctx += commit
            pos += len(commit)
            steps += 1
            accepted += k
    return steps, accepted


def test_ngram_replay_matches_a_hand_written_loop() -> None:
    work = sim.stdlib_workload("edit", requests=2, max_len=400)
    r = sim.replay(work, "ngram", 6)
    assert (r.steps, r.accepted) == _brute_replay(work, 6)
    assert r.tokens == sum(len(c) for _, c in work)
    # Every step commits its accepted drafts and a bonus, except a last step whose drafts
    # reach the end of the recorded text.
    assert r.steps + r.accepted - r.requests <= r.tokens <= r.steps + r.accepted


@pytest.mark.parametrize("drafter", ["suffix-tree", "suffix-chain"])
def test_suffix_replay_commits_the_recorded_text(drafter: str) -> None:
    work = sim.stdlib_workload("similar", requests=3, max_len=600)
    r = sim.replay(work, drafter, 8)  # type: ignore[arg-type]
    assert r.tokens == sum(len(c) for _, c in work)
    # Every step commits its accepted drafts and a bonus, except a last step whose drafts
    # reach the end of the recorded text.
    assert r.steps + r.accepted - r.requests <= r.tokens <= r.steps + r.accepted
    assert r.accepted > 0
    assert 0 < r.bytes_per_token


def test_tree_drafter_beats_ngram_on_edits() -> None:
    work = sim.stdlib_workload("edit", requests=3, max_len=1200)
    tree = sim.replay(work, "suffix-tree", 16)
    ngram = sim.replay(work, "ngram", 16)
    assert tree.accepted_per_step > ngram.accepted_per_step


def test_workloads_are_deterministic_and_byte_level() -> None:
    for kind in ("continue", "edit", "similar"):
        a = sim.stdlib_workload(kind, requests=2, max_len=500, seed=3)
        assert a == sim.stdlib_workload(kind, requests=2, max_len=500, seed=3)
        assert all(0 <= t < 256 for p, c in a for t in [*p, *c])
        assert all(p and c for p, c in a)


def test_replay_bad_input() -> None:
    work = [([1, 2], [3])]
    with pytest.raises(ValueError, match="drafter"):
        sim.replay(work, "eagle", 4)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="budget"):
        sim.replay(work, "ngram", 0)
    with pytest.raises(ValueError, match="workload"):
        sim.replay([], "ngram", 4)
    with pytest.raises(ValueError, match=r"workload\[0\]"):
        sim.replay([([], [1])], "ngram", 4)
    for drafter in ("ngram", "suffix-tree"):
        # A negative continuation token matched no draft and committed nothing: the replay
        # never advanced (a hang). Every token id is checked first, named.
        with pytest.raises(ValueError, match=r"workload\[1\] continuation\[1\]: token id -1"):
            sim.replay([([1], [2]), ([1, 2, 3], [4, -1, 5])], drafter, 4)
        with pytest.raises(ValueError, match=r"workload\[0\] prompt\[0\]: token id 2147483648"):
            sim.replay([([2**31], [1])], drafter, 4)
        with pytest.raises(TypeError, match=r"workload\[0\] continuation: expected int token"):
            sim.replay([([1], [4, 5.5])], drafter, 4)
    with pytest.raises(ValueError, match="kind"):
        sim.stdlib_workload("poems")
    with pytest.raises(ValueError, match="max_len: must be >= 2"):
        sim.stdlib_workload("continue", max_len=1)
    with pytest.raises(
        ValueError, match=r"^workload\[0\]: expected a \(prompt, continuation\) pair"
    ):
        sim.replay([[1, 2, 3]], "ngram", 4)  # type: ignore[list-item]
    for kwargs, match in (
        ({"requests": 1.5}, "^requests: expected an int, got float"),
        ({"requests": "2"}, "^requests: expected an int, got str"),
        ({"max_len": 300.5}, "^max_len: expected an int, got float"),
    ):
        with pytest.raises(TypeError, match=match):
            sim.stdlib_workload("continue", **kwargs)  # type: ignore[arg-type]
    # A short max_len still leaves each `similar` request a continuation (a 200-byte prompt
    # of a 150-byte text left none, an error naming the workload instead of --max-len).
    short = sim.stdlib_workload("similar", requests=3, max_len=150)
    assert all(len(prompt) == 75 and len(cont) == 75 for prompt, cont in short)


def test_cli_replay(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["replay", "--workload", "edit", "--requests", "2", "--max-len", "500", "--budget", "4"]
    assert main([*argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["drafter"] for r in rows] == ["suffix-tree", "suffix-chain", "ngram"]
    assert rows[2]["vs_ngram"] == 1.0
    assert main(argv) == 0
    assert "suffix-tree" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["replay", "--drafters", "eagle"])
    assert e.value.code == 2
    assert main(["replay", "--budget", "99999999999999999999"]) == 2
    assert "--budget: 99999999999999999999, a tree holds at most" in capsys.readouterr().err
    # A budget past half the suffix index's depth (a proposal from a long match has few
    # levels left below it): the drafters pick the match that scores best, so they still
    # draft, without a note.
    assert main([*argv[:-1], "40", "--drafters", "suffix-tree", "--json"]) == 0
    out = capsys.readouterr()
    assert not out.err and json.loads(out.out)[0]["tokens_per_step"] > 2.0
    # A numpy budget is a plain int in the result (its JSON failed).
    work = sim.stdlib_workload("edit", 1, 300, 0)
    result = sim.replay(work, "ngram", budget=np.int64(4))
    assert json.dumps(result.as_dict())
    assert isinstance(ss.SuffixDrafter(), ss.SuffixDrafter)
