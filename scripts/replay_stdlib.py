"""Replay model-free drafters on workloads built from the Python standard library's source.

    python scripts/replay_stdlib.py [--requests 16] [--json]

Runs `specsched replay` over every workload (continue, edit, similar) at draft budgets 8, 16
and 32 with the three drafters (suffix tree, suffix chain, vLLM n-gram), so the comparison at
equal budget can be reproduced on any machine with Python: the text is the stdlib's own source,
tokenized at byte level. Extra arguments go to `specsched replay`.
"""

from __future__ import annotations

import sys

from specsched.cli import main

if __name__ == "__main__":
    sys.exit(main(["replay", "--workload", "all", "--budget", "8,16,32", *sys.argv[1:]]))
