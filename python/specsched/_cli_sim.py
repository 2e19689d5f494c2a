"""`specsched simulate` and `specsched decide`: the command-line faces of `specsched.sim` and
`specsched.decide`. Tables on stdout (or `--json`), progress on stderr, optional plots."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from typing import Any

import numpy as np

from specsched import sim
from specsched._core import MAX_NODES
from specsched.decide import Profile, ProfileError, decide, load_profile
from specsched.sim import Acceptance, CostModel


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


_progress_open = False  # a progress bar is on stderr's last line, unended


def _progress(done: int, total: int, what: str) -> None:
    """A one-line progress bar on stderr for sweeps (only when there is something to wait for)."""
    global _progress_open
    if total < 4:
        return
    width = 24
    filled = width * done // total
    _progress_open = done != total
    end = "" if _progress_open else "\n"
    sys.stderr.write(f"\r{what} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}{end}")
    sys.stderr.flush()


def end_progress() -> None:
    """Ends a progress bar a failed sweep left open, so that an error gets a line of its own."""
    global _progress_open
    if _progress_open:
        sys.stderr.write("\n")
        _progress_open = False


# --------------------------------------------------------------------------- simulate


def add_simulate_parser(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="chain vs best tree at the same verify budget: expected tokens and speed-up",
        description="Chain vs the best tree at the same verify budget N (nodes, root included): "
        "exact expected tokens per step, a Monte-Carlo check over the real verify walk, and "
        "the wall-clock speed-up under t_target(N) + draft_steps * t_draft + t_host.",
    )
    model = p.add_mutually_exclusive_group()
    model.add_argument("--alpha", type=_floats, help="iid acceptance, or a comma list to sweep")
    model.add_argument("--per-rank", type=_floats, help="Sequoia per-rank acceptance p0,p1,...")
    model.add_argument("--per-depth", type=_floats, help="acceptance by depth a1,a2,...")
    p.add_argument("--budget", type=_ints, default=[8], help="verify budget(s) N, e.g. 4,8,16")
    p.add_argument("--depth", type=int, default=None, help="max tree depth (default N-1)")
    p.add_argument("--topk", type=int, default=None, help="max children per node")
    p.add_argument("--steps", type=int, default=100_000, help="Monte-Carlo steps (0: skip)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--t-target", type=float, default=30.0, help="target forward, ms")
    p.add_argument("--t-draft", type=float, default=1.5, help="one draft step, ms")
    p.add_argument("--t-host", type=float, default=None, help="host work per step, ms")
    p.add_argument("--measure-host", action="store_true", help="t_host = specsched's measured work")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--knee", type=float, default=300.0, help="tokens/forward at compute knee")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--plot", metavar="FILE.png", help="speed-up vs acceptance, tokens vs budget")


def _models(args: argparse.Namespace) -> list[Acceptance]:
    # An empty list (`--alpha ""` from a variable that expanded empty) is not "unset".
    for flag, values in (("--per-rank", args.per_rank), ("--per-depth", args.per_depth)):
        if values is not None and not values:
            raise ValueError(f"{flag}: expected at least one number")
    if args.per_rank is not None:
        return [Acceptance.per_rank(args.per_rank)]
    if args.per_depth is not None:
        return [Acceptance.per_depth(args.per_depth)]
    if args.alpha is not None and not args.alpha:
        raise ValueError("--alpha: expected at least one number")
    return [Acceptance.iid(a) for a in (args.alpha if args.alpha is not None else [0.8])]


def _compare(
    model: Acceptance,
    budget: int,
    cost: CostModel,
    depth: int | None,
    topk: int | None,
    steps: int,
    seed: int,
) -> dict[str, Any]:
    """One row: chain of `budget - 1` drafts vs the best tree of `budget` nodes."""
    row: dict[str, Any] = {"model": model.describe(), "budget": budget}
    chain = sim.chain_tree(budget - 1)
    tree = sim.best_tree(model, budget, depth, topk)
    for name, t, draft_steps in (
        ("chain", chain, budget - 1),
        ("tree", tree, tree.max_depth),
    ):
        e = sim.expected_accept_length(t, model)
        entry: dict[str, Any] = {
            "nodes": t.num_nodes,
            "depth": t.max_depth,
            "leaves": t.num_leaves,
            "expected_tokens": e,
            "draft_steps": draft_steps,
            "speedup": sim.speedup(e, t.num_nodes, draft_steps, cost),
        }
        if steps > 0:
            r = sim.simulate(t, model, steps, seed)
            entry["simulated"] = r.to_dict()
        if name == "tree":
            entry["parents"] = t.parents.tolist()
        row[name] = entry
    return row


def simulate_command(args: argparse.Namespace) -> int:
    if args.steps < 0:
        raise ValueError(f"--steps: {args.steps}, expected >= 0")
    if any(b < 1 for b in args.budget) or not args.budget:
        raise ValueError(f"--budget: {args.budget}, expected positive node counts")
    if max(args.budget) > MAX_NODES:
        raise ValueError(f"--budget: {max(args.budget)}, a tree holds at most {MAX_NODES} nodes")
    if not 1 <= args.concurrency <= sim.MAX_CONCURRENCY:
        raise ValueError(
            f"--concurrency: {args.concurrency}, expected 1 to {sim.MAX_CONCURRENCY:,}"
        )
    for flag, value in (("--depth", args.depth), ("--topk", args.topk)):
        if value is not None and not 1 <= value <= MAX_NODES:
            raise ValueError(f"{flag}: {value}, expected 1 to {MAX_NODES}")
    if args.measure_host and args.t_host is not None:
        raise ValueError("--t-host: give it or --measure-host, not both")
    _check_plot_path(args.plot)
    models = _models(args)
    for model in models:
        # The comparison chain of `budget - 1` drafts needs a depth for each of its drafts.
        if model.kind == "per_depth" and len(model.values) < max(args.budget) - 1:
            raise ValueError(
                f"--per-depth: {len(model.values)} depths, but the comparison chain of "
                f"--budget {max(args.budget)} is {max(args.budget) - 1} drafts deep; give one "
                "acceptance per depth up to it, or a smaller --budget"
            )
    if args.measure_host:
        t_host = sim.measure_host_overhead(
            sim.best_tree(models[0], max(args.budget), args.depth, args.topk), args.concurrency
        )
    else:
        t_host = 0.05 if args.t_host is None else args.t_host
    cost = CostModel(
        t_target_ms=args.t_target,
        knee_tokens=args.knee,
        t_draft_ms=args.t_draft,
        t_host_ms=t_host,
        concurrency=args.concurrency,
    )
    jobs = [(m, b) for m in models for b in args.budget]
    rows = []
    for i, (m, b) in enumerate(jobs):
        rows.append(_compare(m, b, cost, args.depth, args.topk, args.steps, args.seed))
        _progress(i + 1, len(jobs), "simulate")
    if args.plot is not None:
        _plot_simulate(args.plot, models[0], args.budget[0], cost, args.depth, args.topk)
    if args.json:
        # An infinite knee (verification free at any size) as null: JSON has no infinity.
        cost_fields = {
            k: None if isinstance(v, float) and math.isinf(v) else v
            for k, v in dataclasses.asdict(cost).items()
        }
        out = {"cost": cost_fields, "steps": args.steps, "rows": rows}
        print(json.dumps(out, indent=2, allow_nan=False))
        return 0
    print(
        f"cost: t_target(N) = {cost.t_target_ms:g} ms x max(1, {cost.concurrency} N / "
        f"{cost.knee_tokens:g}), t_draft = {cost.t_draft_ms:g} ms/step, "
        f"t_host = {cost.t_host_ms:.4g} ms"
    )
    w = max(24, *(len(r["model"]) for r in rows))
    head = (
        f"{'model':<{w}} {'N':>3}  {'shape':<6} {'depth':>5} {'leaves':>6} "
        f"{'E[tokens]':>9} {'simulated (95% CI)':>24} {'speed-up':>8}"
    )
    print(head)
    print("-" * len(head))
    for row in rows:
        for name in ("chain", "tree"):
            e = row[name]
            simulated = ""
            if "simulated" in e:
                lo, hi = e["simulated"]["ci95"]
                simulated = f"{e['simulated']['mean_tokens']:.3f} [{lo:.3f}, {hi:.3f}]"
            # N is each shape's own node count: a --depth / --topk cap can leave the best
            # tree below the budget (its speed-up is for the nodes it has).
            print(
                f"{row['model']:<{w}} {e['nodes']:>3}  {name:<6} {e['depth']:>5} "
                f"{e['leaves']:>6} {e['expected_tokens']:>9.3f} {simulated:>24} "
                f"{e['speedup']:>7.2f}x"
            )
    return 0


def _check_plot_path(path: str | None) -> None:
    """`--plot`'s file, checked before any work: an empty name wrote nothing, and a missing
    folder failed after the sweep with an error that named no flag."""
    if path is None:
        return
    if not path:
        raise ValueError("--plot: empty file name")
    if os.path.isdir(path):
        raise ValueError(f"--plot: {path} is a folder; name the image file")
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise ValueError(f"--plot: {path}: no such folder {folder!r}")
    # Opened for writing once, before the work (os.access says yes to root everywhere):
    # an unwritable path failed after the sweep with an error that named no flag.
    existed = os.path.exists(path)
    try:
        with open(path, "ab"):
            pass
    except OSError as e:
        raise ValueError(f"--plot: {path}: cannot write it ({e.strerror})") from None
    if not existed:
        os.remove(path)
    # matplotlib picks the format from the extension and appends .png to a name without one
    # (the command reported writing a file that did not exist): named here, before the sweep.
    extension = os.path.splitext(path)[1].lower().lstrip(".")
    if extension not in PLOT_FORMATS:
        raise ValueError(
            f"--plot: {path}: expected a file ending in one of "
            f"{', '.join('.' + f for f in PLOT_FORMATS)}"
        )


# What matplotlib writes without extra backends.
PLOT_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg", "eps", "ps")


def _require_matplotlib() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install 'specsched[plot]'") from None
    return plt


def _plot_simulate(
    path: str,
    model: Acceptance,
    budget: int,
    cost: CostModel,
    depth: int | None,
    topk: int | None,
) -> None:
    """Left: speed-up vs iid acceptance, chain and tree at `budget`. Right: expected tokens vs
    budget for `model`, chain and tree."""
    plt = _require_matplotlib()
    alphas = np.linspace(0.3, 0.95, 27)
    chain_s, tree_s = [], []
    for a in alphas:
        m = Acceptance.iid(float(a))
        tree = sim.best_tree(m, budget, depth, topk)
        chain_s.append(
            sim.speedup(sim.expected_tokens_chain(a, budget - 1), budget, budget - 1, cost)
        )
        e = sim.expected_accept_length(tree, m)
        tree_s.append(sim.speedup(e, tree.num_nodes, tree.max_depth, cost))
    budgets = [b for b in range(2, 65) if model.kind != "per_depth" or b - 1 <= len(model.values)]
    chain_e = [sim.expected_accept_length(b - 1, model) for b in budgets]
    tree_e = [
        sim.expected_accept_length(sim.best_tree(model, b, depth, topk), model) for b in budgets
    ]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax1.plot(alphas, chain_s, label=f"chain ({budget - 1} drafts)")
    ax1.plot(alphas, tree_s, label=f"best tree (N = {budget})")
    ax1.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax1.set_xlabel("acceptance rate (iid per token)")
    ax1.set_ylabel("wall-clock speed-up")
    ax1.set_title(f"speed-up at equal verify budget N = {budget}")
    ax1.legend()
    ax2.plot(budgets, chain_e, label="chain")
    ax2.plot(budgets, tree_e, label="best tree")
    ax2.set_xlabel("verify budget N (nodes, root included)")
    ax2.set_ylabel("expected tokens per step")
    ax2.set_title(f"accepted length vs budget ({model.describe()})")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}", file=sys.stderr)


# --------------------------------------------------------------------------- decide

_FLAG_FIELDS = [f for f in dataclasses.fields(Profile) if f.name != "classes"]


def _workload_class(text: str) -> dict[str, float]:
    try:
        share, prompt, output = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected SHARE:PROMPT_TOKENS:OUTPUT_TOKENS, got {text!r}"
        ) from None
    return {"share": share, "prompt_tokens": prompt, "output_tokens": output}


def add_decide_parser(sub: Any) -> None:
    p = sub.add_parser(
        "decide",
        help="recommend a speculation method for a workload",
        description="Recommend off / n-gram / suffix / EAGLE-3 chain / EAGLE-3 tree for a "
        "workload profile (a TOML or JSON file, flags, or both: flags win).",
    )
    p.add_argument("--profile", metavar="FILE", help="a .toml or .json profile")
    p.add_argument(
        "--class",
        dest="classes",
        action="append",
        type=_workload_class,
        metavar="SHARE:PROMPT:OUTPUT",
        help="a request class of a mixed workload (repeat), e.g. 0.9:500:10",
    )
    for f in _FLAG_FIELDS:
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            # --x / --no-x: a flag wins over the profile file both ways (store_true could not
            # turn a file's `eagle3_head = true` off).
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None)
        elif f.name == "engine":
            p.add_argument(flag, dest=f.name, default=None)
        elif f.name == "concurrency":
            p.add_argument(flag, dest=f.name, type=int, default=None)
        else:
            p.add_argument(flag, dest=f.name, type=float, default=None)
    p.add_argument(
        "--measure-host", action="store_true", help="host_overhead_ms = specsched's measured work"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--plot", metavar="FILE.png", help="speed-up vs EAGLE-3 acceptance")


def _profile_from_args(args: argparse.Namespace) -> Profile:
    data: dict[str, Any] = {}
    if args.measure_host and args.host_overhead_ms is not None:
        raise ProfileError("--host-overhead-ms: give it or --measure-host, not both")
    _check_plot_path(args.plot)
    if args.profile is not None:
        if not args.profile:
            raise ProfileError("--profile: empty file name")
        data = dataclasses.asdict(load_profile(args.profile))
        data = {k: v for k, v in data.items() if v is not None}
    flags = {f.name: getattr(args, f.name) for f in _FLAG_FIELDS}
    data.update({k: v for k, v in flags.items() if v is not None})
    if args.classes:
        if flags.get("prompt_tokens") is not None or flags.get("output_tokens") is not None:
            # Both on one command line: refused, as Profile refuses both (flags win only
            # over a profile file's values).
            raise ProfileError(
                "--class: give either --class or --prompt-tokens / --output-tokens, not both"
            )
        data["classes"] = args.classes
        data.pop("prompt_tokens", None)
        data.pop("output_tokens", None)
    if "classes" in data and ("prompt_tokens" in data or "output_tokens" in data):
        data.pop("classes")
    profile = Profile.from_dict(data)  # checked before any measurement
    if args.measure_host:
        # Specsched's work for a 16-node tree per request at this concurrency.
        tree = sim.best_tree(Acceptance.iid(0.8), 16, 6, 4)
        data["host_overhead_ms"] = sim.measure_host_overhead(tree, profile.concurrency)
        profile = Profile.from_dict(data)
    return profile


def decide_command(args: argparse.Namespace) -> int:
    profile = _profile_from_args(args)
    rec = decide(profile)
    if args.plot is not None:
        _plot_decide(args.plot, profile)
    if args.json:
        print(json.dumps(rec.to_dict(), indent=2, allow_nan=False))
    else:
        print(rec)
    return 0


def _plot_decide(path: str, profile: Profile) -> None:
    """Expected speed-up of every candidate as the EAGLE-3 acceptance varies."""
    plt = _require_matplotlib()
    alphas = [round(a, 3) for a in np.linspace(0.5, 0.95, 19)]
    series: dict[str, list[float]] = {}
    for i, a in enumerate(alphas):
        p = dataclasses.replace(profile, eagle3_acceptance=a, eagle3_head=True)
        for c in decide(p).candidates:
            if c.excluded is None:
                series.setdefault(c.method, []).append(c.speedup)
        _progress(i + 1, len(alphas), "decide sweep")
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for method, ys in series.items():
        if len(ys) == len(alphas):
            ax.plot(alphas, ys, label=method)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("EAGLE-3 acceptance (first draft token)")
    ax.set_ylabel("end-to-end speed-up")
    ax.set_title(f"concurrency {profile.concurrency}, best configuration per method")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}", file=sys.stderr)


__all__ = [
    "add_decide_parser",
    "add_simulate_parser",
    "decide_command",
    "simulate_command",
]
