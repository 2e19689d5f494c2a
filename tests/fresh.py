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
