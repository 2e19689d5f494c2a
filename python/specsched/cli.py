"""The `specsched` command line.

`specsched demo` runs tree speculative generation end to end on the shipped tiny model (torch
needed): autoregressive decoding and every drafter side by side, with tokens per target
forward, the time split and a token-for-token check against autoregressive greedy output.

`specsched bench [--quick]` times the Rust kernels against the pure-Python reference (and
reports the ratio) on serving-sized inputs: a quick check of what the engine buys on this
machine. The full comparison, with vectorized numpy/torch peers, is `pytest benches/
--benchmark-only`.

`specsched simulate` compares a chain and the best tree at the same verify budget (analytic
and Monte Carlo, with wall-clock speed-ups); `specsched decide` recommends a speculation method
for a workload profile; `specsched replay` compares model-free drafters (suffix tree, suffix
chain, n-gram) on byte-level replays of the standard library's source. All take `--json`;
simulate and decide also `--plot FILE.png` (needs matplotlib, the `plot` extra). Bad input
exits with status 2 and a one-line message.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NoReturn

import numpy as np

import specsched as ss
from specsched import reference as ref
from specsched._cli_demo import add_demo_parser, demo_command
from specsched._cli_replay import add_replay_parser, replay_command
from specsched._cli_sim import (
    add_decide_parser,
    add_simulate_parser,
    decide_command,
    end_progress,
    simulate_command,
)
from specsched.testing import logits_with_choices, random_batch, target_choices


def _median_seconds(fn: Callable[[], Any], min_time: float, max_runs: int) -> float:
    """Median of repeated timings: at least 3 runs, until `min_time` has passed."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < min_time and len(times) < max_runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class _LazyRows:
    """Rows of a logits array as lists, converted only when the reference reads them."""

    def __init__(self, logits: np.ndarray) -> None:
        self.logits = logits

    def __getitem__(self, i: int) -> list[float]:
        return self.logits[i].tolist()


Case = tuple[str, str, Callable[[], Any], Callable[[], Any]]


def _cases(quick: bool) -> list[Case]:
    """(kernel, size, rust, reference) for every row of the table."""
    cases: list[Case] = []
    sizes = [(1, 8), (32, 64)] if quick else [(1, 8), (32, 64), (256, 64), (256, 128)]
    for b, n in sizes:
        parents, tokens, offsets = random_batch(b, n, vocab=32000)
        plist, tlist, olist = parents.tolist(), tokens.tolist(), offsets.tolist()
        prefix = [1000] * b
        prefix_array = np.asarray(prefix)

        def rust_layout(p=parents, t=tokens, o=offsets, pre=prefix_array) -> None:
            batch = ss.TreeBatch.from_flat(p, t, o)
            batch.padded_mask()
            batch.positions(pre)
            batch.paths()

        def ref_layout(p=plist, t=tlist, o=olist, pre=prefix) -> None:
            ref.validate_batch(p, t, o)
            ref.padded_mask(p, o)
            ref.batch_positions(p, o, pre)
            ref.batch_paths(p, o)

        cases.append(("batch + mask/positions/paths", f"B={b} N={n}", rust_layout, ref_layout))

        choice = target_choices(parents, tokens, offsets, vocab=32000)
        batch = ss.TreeBatch.from_flat(parents, tokens, offsets)
        clist = choice.tolist()
        cases.append(
            (
                "verify(target_tokens)",
                f"B={b} N={n}",
                partial(ss.verify, batch, target_tokens=choice),
                partial(ref.batch_verify_walk, plist, tlist, olist, clist),
            )
        )
    b, n, v = (8, 64, 32000) if quick else (8, 64, 128256)
    parents, tokens, offsets = random_batch(b, n, vocab=v)
    choice = target_choices(parents, tokens, offsets, vocab=v)
    logits = logits_with_choices(choice, v)
    batch = ss.TreeBatch.from_flat(parents, tokens, offsets)
    rows = _LazyRows(logits)
    plist, tlist, olist = parents.tolist(), tokens.tolist(), offsets.tolist()

    def ref_logits() -> None:
        for i in range(b):
            s, e = olist[i], olist[i + 1]
            local = _OffsetRows(rows, s)
            ref.verify_logits(plist[s:e], tlist[s:e], local)

    cases.append(
        (
            "verify(logits) f32",
            f"B={b} N={n} V={v}",
            lambda: ss.verify(batch, logits),
            ref_logits,
        )
    )
    return cases


class _OffsetRows:
    """Tree-local row access into a batch's logits."""

    def __init__(self, rows: _LazyRows, offset: int) -> None:
        self.rows, self.offset = rows, offset

    def __getitem__(self, i: int) -> list[float]:
        return self.rows[self.offset + i]


def bench(quick: bool) -> int:
    min_time = 0.2 if quick else 1.0
    header = f"{'kernel':<30} {'size':<22} {'rust':>10} {'reference':>12} {'speed-up':>9}"
    print(header)
    print("-" * len(header))
    for kernel, size, rust, reference in _cases(quick):
        t_rust = _median_seconds(rust, min_time, 100_000)
        t_ref = _median_seconds(reference, min_time, 50)
        print(
            f"{kernel:<30} {size:<22} {_fmt(t_rust):>10} {_fmt(t_ref):>12} {t_ref / t_rust:>8.0f}x"
        )
    print(
        "\nmedians of repeated calls; full tables with vectorized peers: "
        "pytest benches/ --benchmark-only"
    )
    return 0


def _fmt(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr, status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="specsched", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p_bench = sub.add_parser("bench", help="time the Rust kernels against the reference")
    p_bench.add_argument("--quick", action="store_true", help="small sizes, ~10 s")
    add_simulate_parser(sub)
    add_decide_parser(sub)
    add_replay_parser(sub)
    add_demo_parser(sub)
    args = parser.parse_args(argv)
    commands = {
        "bench": lambda: bench(args.quick),
        "simulate": lambda: simulate_command(args),
        "decide": lambda: decide_command(args),
        "replay": lambda: replay_command(args),
        "demo": lambda: demo_command(args),
    }
    try:
        status = commands[args.command]()
        # Buffered stdout (no PYTHONUNBUFFERED) writes at exit, outside this handler: flush
        # here so a reader that went away is found now.
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        # The reader went away (`specsched decide | head`): not an error to report. Python's
        # recipe: point stdout at devnull so the flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ValueError, TypeError, OSError) as e:
        end_progress()
        print(f"specsched {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
