"""The hostile-input matrix (tests/hostile_matrix.py), run in a subprocess so a segfault or an
abort in the extension fails this test, naming the case, instead of killing pytest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

MATRIX = Path(__file__).with_name("hostile_matrix.py")


@pytest.fixture(scope="module")
def matrix() -> dict[str, list[dict[str, object]]]:
    proc = subprocess.run(
        [sys.executable, str(MATRIX)], capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        started = [line for line in proc.stderr.splitlines() if line.startswith("START")]
        last = started[-1] if started else "(before the first case)"
        pytest.fail(
            f"the matrix process died with status {proc.returncode} during {last}\n"
            f"{proc.stderr[-3000:]}"
        )
    result: dict[str, list[dict[str, object]]] = json.loads(proc.stdout)
    return result


def test_every_bad_input_raises_the_documented_error(matrix: dict) -> None:
    cases = matrix["cases"]
    failed = [f"{c['fn']} / {c['kind']}: {c['problem']}" for c in cases if not c["ok"]]
    assert not failed, f"{len(failed)} of {len(cases)} cases failed:\n" + "\n".join(failed)
    # The matrix must not silently shrink: every public entry point has its row of cases.
    assert len(cases) >= 250
    fns = {c["fn"] for c in cases}
    for fn in (
        "Tree",
        "Tree.chain",
        "Tree.from_choices",
        "TreeBatch",
        "TreeBatch.from_flat",
        "TreeBatch.limit_depth",
        "verify",
        "kv_compaction_plan",
        "compact_kv",
        "commit_slots",
        "top_n_tree",
        "optimal_tree",
        "DynamicTreeBuilder",
        "sglang.build_tree_kernel_efficient",
        "sglang.verify_tree_greedy",
    ):
        assert fn in fns, fn


def test_unusual_valid_inputs_match_plain_ones(matrix: dict) -> None:
    accepted = matrix["accepted"]
    failed = [f"{c['fn']} / {c['kind']}: {c['problem']}" for c in accepted if not c["ok"]]
    assert not failed, "\n".join(failed)
    assert len(accepted) >= 8


class _Raising:
    """An array-like whose conversion raises `error`."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __array__(self, dtype: object = None, copy: object = None) -> object:
        raise self.error


def test_what_an_arguments_conversion_raises_is_passed_on_unless_numpy_refused_it() -> None:
    """Every exception raised while an argument became an array came out as a TypeError
    ("expected an array"): Ctrl-C in an `__array__` was swallowed, a MemoryError and a
    concurrent call's "Already borrowed" read as a wrong type. numpy's own refusals (a
    ragged list) are still a TypeError naming the argument, with numpy's error as the cause."""
    import specsched as ss

    tree = ss.Tree.chain([1, 2])
    for error in (KeyboardInterrupt(), MemoryError(), RuntimeError("Already borrowed")):
        with pytest.raises(type(error)):
            ss.verify(tree, target_tokens=_Raising(error))
    with pytest.raises(TypeError, match=r"^target_tokens: expected an array") as info:
        ss.verify(tree, target_tokens=[[1, 2], [3]])
    assert isinstance(info.value.__cause__, ValueError)
