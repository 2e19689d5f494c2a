"""`specsched replay`: model-free drafters (suffix tree, suffix chain, vLLM n-gram) replayed on
byte-level workloads built from the standard library's source, at equal draft budgets."""

from __future__ import annotations

import argparse
import json
from typing import Any

from specsched._core import MAX_NODES
from specsched._replay import DRAFTERS, WORKLOADS, compare, stdlib_workload


def _names(allowed: tuple[str, ...]) -> Any:
    def parse(text: str) -> list[str]:
        names = [x.strip() for x in text.split(",") if x.strip()]
        if "all" in names:
            return list(allowed)
        bad = [x for x in names if x not in allowed]
        if bad or not names:
            raise argparse.ArgumentTypeError(
                f"expected a comma list of {', '.join(allowed)} or all, got {text!r}"
            )
        return names

    return parse


def _budgets(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"budgets must be >= 1, got {text!r}")
    return out


def add_replay_parser(sub: Any) -> None:
    p = sub.add_parser(
        "replay",
        help="suffix tree vs suffix chain vs n-gram on stdlib-source replays",
        description="Replays drafters against recorded text (greedy verification against the "
        "true continuation) and reports accepted draft tokens per step, draft latency per "
        "step and drafter memory per indexed token. Workloads: continue (second half of a "
        "file), edit (rewrite a file with small edits), similar (files of one package in "
        "turn: the global cache).",
    )
    p.add_argument("--workload", type=_names(WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--drafters", type=_names(DRAFTERS), default=list(DRAFTERS))
    p.add_argument("--budget", type=_budgets, default=[16], help="draft tokens per step")
    p.add_argument("--requests", type=int, default=8, help="requests per workload")
    p.add_argument("--max-len", type=int, default=3000, help="bytes per file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-prob", type=float, default=0.1)
    p.add_argument("--max-spec-factor", type=float, default=1.0)
    p.add_argument("--max-depth", type=int, default=64)
    p.add_argument("--json", action="store_true", help="machine-readable output")


def replay_command(args: argparse.Namespace) -> int:
    if max(args.budget) > MAX_NODES - 1:
        raise ValueError(
            f"--budget: {max(args.budget)}, a tree holds at most {MAX_NODES - 1} draft tokens"
        )
    rows: list[dict[str, Any]] = []
    for kind in args.workload:
        work = stdlib_workload(kind, args.requests, args.max_len, args.seed)
        for budget in args.budget:
            results = compare(
                work,
                budget,
                args.drafters,
                min_prob=args.min_prob,
                max_spec_factor=args.max_spec_factor,
                max_depth=args.max_depth,
            )
            base = {r.drafter: r.accepted_per_step for r in results}.get("ngram")
            for r in results:
                row: dict[str, Any] = {"workload": kind, **r.as_dict()}
                row["vs_ngram"] = r.accepted_per_step / base if base else None
                rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2, allow_nan=False))
        return 0
    head = f"{'workload':9} {'drafter':13} {'budget':>6} {'steps':>6} {'acc/step':>9} "
    head += f"{'vs ngram':>9} {'draft us':>9} {'B/token':>8}"
    print(head)
    for row in rows:
        ratio = f"{row['vs_ngram']:.2f}x" if row["vs_ngram"] is not None else "-"
        print(
            f"{row['workload']:9} {row['drafter']:13} {row['budget']:>6} {row['steps']:>6} "
            f"{row['accepted_per_step']:>9.3f} {ratio:>9} {row['draft_us_per_step']:>9.1f} "
            f"{row['bytes_per_token']:>8.0f}"
        )
    return 0
