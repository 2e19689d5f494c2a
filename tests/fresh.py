"""Scripts run in a fresh interpreter, for measurements the test process itself would skew
(a peak resident size: this process's earlier peak would hide a copy)."""

from __future__ import annotations

import subprocess
import sys


def fresh_lines(script: str, count: int) -> list[list[str]]:
    """Runs `script` in a new interpreter; its first `count` output lines, split on spaces."""
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split("\n")[:count]
    assert len(lines) == count and all(lines), proc.stdout
    return [line.split() for line in lines]


# Prepended to the read-in-place scripts: `verify_peak(case, x, nbytes)` verifies a chain of
# `len(x)` nodes whose every row holds its maximum at token 7 (the walk accepts, and so reads,
# every row) and prints `case missing grew nbytes`.
VERIFY_PEAK = """
import resource
import specsched as ss


def verify_peak(case, x, nbytes):
    n = len(x)
    ss.verify(ss.Tree.chain([7, 7]), x[:2])  # warm up
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = ss.verify(ss.Tree.chain([7] * n), x)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(case, n - 1 - r.num_accepted, (after - before) * 1024, nbytes)
"""


def assert_read_in_place(script: str, cases: int, fraction: int) -> None:
    """Runs a verify script (after `VERIFY_PEAK`) printing `case missing grew nbytes` per case
    (`missing`: rows the walk did not accept; `grew`: the peak resident size's growth during
    the call): every row was read, and the peak grew by under `nbytes / fraction`, where a
    copy would add `nbytes`."""
    for case, missing, grew, nbytes in fresh_lines(VERIFY_PEAK + script, cases):
        assert int(missing) == 0, case
        assert int(grew) < int(nbytes) / fraction, f"{case}: peak RSS grew by {grew} for {nbytes} B"
