"""What each specsched call of the decode loop costs right after a target forward.

    python scripts/cold_calls.py [--reps 200]

In `specsched demo` every specsched call follows a model forward, which has evicted
specsched's (and numpy's, and the interpreter's) code and data from this CPU's caches, so a
call costs several times what a hot benchmark loop shows. This script times one call right
after each forward of the shipped tiny target over one step's draft trees (the 16-node dynamic
tree's first step), the calls taking turns so that all of them see the same machine, and
prints the median and the 25th percentile per call in µs. The yardsticks: an empty Python
call (the timer's own floor) and a no-op PyO3 getter (any call into the extension).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import specsched as ss
from _first_step import draft_all_levels, first_dynamic_step
from specsched import _core
from specsched.generate import TargetStep
from specsched.models.tiny import TinyTarget


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200, help="timed calls per kind")
    args = parser.parse_args()
    # One real step: the drafter's first trees, kept for every forward below.
    trees, drafter, model, prompts = first_dynamic_step()
    builder = drafter.builder
    assert builder is not None

    target = TinyTarget(model)
    target.prefill(prompts)
    result = ss.verify(trees, target.forward_tree(trees).logits)
    lengths = target.lengths.copy()

    def restart() -> None:
        builder.start_in_place()

    # name: (run before the forward, the timed call on the forward's output)
    calls: dict[str, tuple[Callable[[], None] | None, Callable[[TargetStep], Any]]] = {
        "empty Python call": (None, lambda step: None),
        "no-op PyO3 getter": (None, lambda step: builder.level),
        "DynamicTreeBuilder.start_in_place": (None, lambda step: builder.start_in_place()),
        "DynamicTreeBuilder.expand_in_place": (restart, lambda step: builder.expand_in_place()),
        "DynamicTreeBuilder.build_in_place": (
            lambda: draft_all_levels(builder),
            lambda step: builder.build_in_place("depth_first"),
        ),
        "verify (greedy)": (None, lambda step: ss.verify(trees, step.logits)),
        "_core.verify_greedy": (None, lambda step: _core.verify_greedy(trees, step.logits)),
        "compact_kv": (
            None,
            lambda step: ss.compact_kv(target.cache_host, result, lengths, 4, batch_dim=2),
        ),
    }
    times: dict[str, list[int]] = {name: [] for name in calls}
    clock = time.perf_counter_ns
    for _ in range(args.reps):
        for name, (before, call) in calls.items():
            if before is not None:
                before()
            step = target.forward_tree(trees)
            t0 = clock()
            call(step)
            times[name].append(clock() - t0)
    print(f"{'call right after a tree forward':40s} {'median':>8s} {'p25':>8s}  (µs)")
    for name, ns in times.items():
        print(f"{name:40s} {np.median(ns) / 1e3:8.1f} {np.percentile(ns, 25) / 1e3:8.1f}")


if __name__ == "__main__":
    main()
