"""Two builds of the extension in one process: each measurement alternates between them.

    python scripts/compare_builds.py OTHER_CORE_SO [--reps 200]

OTHER_CORE_SO is another build's `_core.abi3.so` (for example `git worktree add ../old REV`,
then `maturin build --release` there and unzip the wheel). It and the installed
`specsched._core` are imported as two more modules, and every timed call alternates between
them, so
the machine's drift (on shared cores its speed swings by up to 2x within minutes) hits both
builds alike; runs of two builds one after the other cannot tell 10% apart here.

Prints, per call, the median µs of the installed build and of OTHER and the median of the
paired ratios installed / OTHER: the `DynamicTreeBuilder` steps and `TreeBatch.from_flat` hot
(three and two configurations), then the decode loop's calls right after a forward of the
shipped tiny target (the 16-node dynamic tree's first step, as `scripts/cold_calls.py` times
them).
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from specsched import _core

# (batch, topk, depth, budget): the demo's two dynamic trees and the benchmark's batch.
HOT_CONFIGS = [(4, 2, 15, 16), (4, 8, 15, 48), (64, 8, 6, 64)]
# (batch, nodes) of the random tree batches `TreeBatch.from_flat` builds hot.
FROM_FLAT_SIZES = [(4, 16), (64, 64)]


def load_copy(path: Path, into: Path, package: str) -> ModuleType:
    """A copy of the extension at `path`, imported as `{package}._core` (its init function
    is `PyInit__core` whatever the package)."""
    (into / package).mkdir()
    (into / package / "__init__.py").write_text("")
    shutil.copy(path, into / package / "_core.abi3.so")
    if str(into) not in sys.path:
        sys.path.insert(0, str(into))
    return importlib.import_module(f"{package}._core")


def report(title: str, times: dict[str, dict[str, list[int]]]) -> None:
    print(f"{title:44s} {'this':>8s} {'other':>8s} {'this/other':>11s}  (µs, medians)")
    for name, by_build in times.items():
        this, other = np.array(by_build["this"]), np.array(by_build["other"])
        medians = f"{np.median(this) / 1e3:8.2f} {np.median(other) / 1e3:8.2f}"
        print(f"{name:44s} {medians} {np.median(this / other):11.2f}")


def primed_builders(
    builds: dict[str, ModuleType],
    shape: tuple[int, int, int, int],
    logprobs: np.ndarray,
    tokens: np.ndarray,
) -> dict[str, Any]:
    """A `DynamicTreeBuilder(*shape)` per build, its buffers holding roots, prefix lengths
    and a top-k (broadcast to `[B, K, K]`) that every level may read again."""
    builders = {}
    for side, core in builds.items():
        builder = core.DynamicTreeBuilder(*shape)
        buf = builder.buffers
        buf.root_tokens[:], buf.prefix_lens[:] = 1, 10
        buf.topk_logprobs[:], buf.topk_tokens[:] = logprobs, tokens
        builders[side] = builder
    return builders


def loop_build(builder: Any) -> Any:
    """The decode loop's `build`: `build_in_place` where the build has it (stop 20 on), else
    `build`, whose pool indices come back in a new array."""
    in_place = getattr(builder, "build_in_place", None)
    return in_place("depth_first") if in_place is not None else builder.build("depth_first")


def hot(builds: dict[str, ModuleType], reps: int) -> None:
    rng = np.random.default_rng(0)
    times: dict[str, dict[str, list[int]]] = {}
    clock = time.perf_counter_ns
    for batch, k, depth, budget in HOT_CONFIGS:
        logprobs = np.log(rng.dirichlet(np.ones(4 * k), size=(batch, k))[:, :, :k])
        logprobs = np.sort(logprobs, axis=-1)[..., ::-1].astype(np.float32)
        tokens = rng.integers(0, 256, size=(batch, k, k))
        builders = primed_builders(builds, (batch, k, depth, budget), logprobs, tokens)
        label = f"B={batch} K={k} depth={depth} budget={budget}"
        rows = {step: f"{step} ({label})" for step in ("start", "expand", "build")}
        for row in rows.values():
            times[row] = {"this": [], "other": []}
        for rep in range(reps):
            for side in ("this", "other") if rep % 2 else ("other", "this"):
                builder = builders[side]
                t0 = clock()
                builder.start_in_place()
                times[rows["start"]][side].append(clock() - t0)
                for _ in range(depth - 1):
                    t0 = clock()
                    builder.expand_in_place()
                    times[rows["expand"]][side].append(clock() - t0)
                t0 = clock()
                loop_build(builder)
                times[rows["build"]][side].append(clock() - t0)
    for batch, n in FROM_FLAT_SIZES:
        # Random trees: node i hangs under any earlier node.
        local = [[-1] + [int(rng.integers(0, i)) for i in range(1, n)] for _ in range(batch)]
        flat = (
            np.concatenate(local).astype(np.int32),
            rng.integers(0, 256, size=batch * n),
            np.arange(batch + 1, dtype=np.int64) * n,
        )
        row = f"TreeBatch.from_flat (B={batch} N={n})"
        times[row] = {"this": [], "other": []}
        for rep in range(reps):
            for side in ("this", "other") if rep % 2 else ("other", "this"):
                t0 = clock()
                builds[side].TreeBatch.from_flat(*flat)
                times[row][side].append(clock() - t0)
    report("hot", times)


def cold(builds: dict[str, ModuleType], reps: int) -> None:
    from _first_step import draft_all_levels, first_dynamic_step
    from specsched.models.tiny import TinyTarget

    step_trees, _, model, prompts = first_dynamic_step()
    flat = (step_trees.parents, step_trees.tokens, step_trees.offsets)
    trees = {side: core.TreeBatch.from_flat(*flat) for side, core in builds.items()}
    target = TinyTarget(model)
    target.prefill(prompts)
    logits = target.forward_tree(step_trees).logits
    results = {side: core.verify_greedy(trees[side], logits) for side, core in builds.items()}
    lengths = target.lengths.copy()
    top2 = np.log(np.array([0.6, 0.3], dtype=np.float32))
    builders = primed_builders(builds, (4, 2, 15, 16), top2, np.arange(2))

    def restart(side: str) -> None:
        builders[side].start_in_place()

    # name: (run before the forward, the timed call on the forward's logits)
    calls: dict[str, tuple[Callable[[str], None] | None, Callable[[str, Any], Any]]] = {
        "no-op PyO3 getter": (None, lambda side, lg: builders[side].level),
        "DynamicTreeBuilder.start_in_place": (None, lambda side, lg: restart(side)),
        "DynamicTreeBuilder.expand_in_place": (
            restart,
            lambda side, lg: builders[side].expand_in_place(),
        ),
        "DynamicTreeBuilder build, the loop's": (
            lambda side: draft_all_levels(builders[side]),
            lambda side, lg: loop_build(builders[side]),
        ),
        "verify_greedy": (None, lambda side, lg: builds[side].verify_greedy(trees[side], lg)),
        "compact_kv": (
            None,
            lambda side, lg: builds[side].compact_kv(
                target.cache_host, results[side], lengths, 4, 2
            ),
        ),
    }
    times: dict[str, dict[str, list[int]]] = {name: {"this": [], "other": []} for name in calls}
    clock = time.perf_counter_ns
    for rep in range(reps):
        for name, (before, call) in calls.items():
            for side in ("this", "other") if rep % 2 else ("other", "this"):
                if before is not None:
                    before(side)
                lg = target.forward_tree(step_trees).logits
                t0 = clock()
                call(side, lg)
                times[name][side].append(clock() - t0)
    report("right after a tree forward", times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="another build's _core.abi3.so")
    parser.add_argument("--reps", type=int, default=200, help="timed rounds per call")
    parser.add_argument("--hot-only", action="store_true", help="skip the tiny-model part")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        # Both builds as copies, loaded alike: the installed module itself has run the
        # warm-up's calls, which alone makes it ~15% faster right after a forward.
        this = Path(_core.__file__)
        builds = {
            "this": load_copy(this, Path(tmp), "specsched_this"),
            "other": load_copy(args.other, Path(tmp), "specsched_other"),
        }
        hot(builds, args.reps)
        if not args.hot_only:
            cold(builds, args.reps)


if __name__ == "__main__":
    main()
