"""`specsched demo`: the whole speculative loop on the shipped tiny model.

Greedy decoding of four code prompts (one batch) with autoregressive decoding and with each
drafter; one row per method: tokens per target forward (the hardware-independent figure), mean
accepted draft tokens per step, wall time and its split between the target, the drafter and
specsched itself, and whether the output is token-for-token the autoregressive output. Then a
fixed-seed sampling run (reproducible; lossless in distribution, which the test suite checks
statistically).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from specsched._core import MAX_NODES

# Past it a demo run takes minutes (and 3 x budget stays far inside a tree's MAX_NODES).
MAX_DEMO_BUDGET = 1024
assert 3 * MAX_DEMO_BUDGET <= MAX_NODES

# More torch threads than any machine here has cores is a typo, not a setting.
MAX_THREADS = 1024

DEMO_PROMPTS = [
    b"    def __init__(self, name, value=None):\n        self.",
    b"import os\nimport sys\n\n\ndef main(",
    b"        for i in range(len(items)):\n            if items[i] ",
    b'class ParseError(Exception):\n    """',
]


def add_demo_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo", help="speculative generation on the shipped tiny model, every drafter"
    )
    p.add_argument("--device", default="cpu", help="torch device (cpu, cuda, ...)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--budget", type=int, default=16, help="verified tokens per tree (root incl.)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: the model is tiny, and on a shared host a second "
        "thread stalls at every OpenMP barrier when another process holds its core; 0 = "
        "torch's default)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")


def _methods(target: Any, head: Any, budget: int, metrics: dict[str, Any]) -> dict[str, Any]:
    """Fresh drafters by name (the suffix drafter's global cache starts empty for each).

    The EAGLE chain, dynamic tree and Sequoia tree at `budget` nodes draft to the same depth
    (`budget - 1` head forwards), so they differ only in how they spend the verify budget. The
    dynamic trees rank candidates with the head's greedy-calibrated temperature; the Sequoia
    tree is planned from the head's measured per-rank acceptance (both from the shipped
    config, measured on held-out text by scripts/train_tiny.py).
    """
    import specsched as ss
    from specsched.drafting import NgramChainDrafter, SuffixTreeDrafter
    from specsched.models.eagle import EagleChainDrafter, EagleDrafter, EagleStaticDrafter

    depth = budget - 1
    temperature = metrics["head_greedy_temperature"]
    static, _ = ss.optimal_tree(metrics["head_rank_acceptance"], budget, max_depth=depth)
    return {
        "autoregressive": None,
        "eagle chain, 7 nodes": EagleChainDrafter(target, head, depth=6),
        f"eagle chain, {budget} nodes": EagleChainDrafter(target, head, depth=depth),
        f"eagle dynamic tree, {budget} nodes": EagleDrafter(
            target, head, topk=2, depth=depth, budget=budget, temperature=temperature
        ),
        f"eagle dynamic tree, {3 * budget} nodes": EagleDrafter(
            target, head, topk=8, depth=depth, budget=3 * budget, temperature=temperature
        ),
        f"eagle Sequoia tree, {budget} nodes": EagleStaticDrafter(target, head, static),
        f"suffix tree, {budget} nodes": SuffixTreeDrafter(budget - 1),
        "n-gram chain, k=5": NgramChainDrafter(5),
    }


def _check_device(torch: Any, name: str) -> None:
    """`--device` as a ValueError (the CLI's one-line exit 2) rather than torch's traceback."""
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"--device {name!r}: {e}") from None
    if device.type == "cpu":
        return
    backend = getattr(torch, device.type, None)
    is_available = getattr(backend, "is_available", None)
    if is_available is None:
        # "meta" and the like hold no data: the model cannot run there.
        raise ValueError(f"--device {name!r}: not a device torch can compute on")
    if not is_available():
        raise ValueError(f"--device {name!r}: torch sees no {device.type} device here")
    count = getattr(backend, "device_count", None)
    if device.index is not None and count is not None and device.index >= count():
        raise ValueError(f"--device {name!r}: torch sees {count()} {device.type} device(s) here")


def demo_command(args: argparse.Namespace) -> int:
    try:
        import torch
    except ImportError:
        print("specsched demo: needs torch: pip install 'specsched[torch]'", file=sys.stderr)
        return 2
    from specsched.generate import generate
    from specsched.models.tiny import WEIGHTS_DIR, TinyTarget, load_tiny

    if args.max_new_tokens < 1 or args.budget < 2:
        raise ValueError("--max-new-tokens must be >= 1 and --budget >= 2")
    # Every EAGLE drafter drafts budget - 1 levels a step, and the largest tree has 3 x
    # budget nodes: 1024 takes ~20 s for 2 tokens on two cores, 8133 did not end in 10 min.
    if args.budget > MAX_DEMO_BUDGET:
        raise ValueError(
            f"--budget: {args.budget}, at most {MAX_DEMO_BUDGET} (each drafter drafts budget - 1 "
            f"levels a step, the largest tree has 3 x budget nodes: larger runs take minutes)"
        )
    if not 0 <= args.threads <= MAX_THREADS:
        raise ValueError(f"--threads must be in [0, {MAX_THREADS}]")
    if args.threads:
        torch.set_num_threads(args.threads)
    _check_device(torch, args.device)
    meta = json.loads((WEIGHTS_DIR / "config.json").read_text())
    target, head = load_tiny(device=args.device)
    prompts = [list(p) for p in DEMO_PROMPTS]
    # Checked before the first run: past the model's positions the error came thousands of
    # steps in, naming no flag. The last token emitted is never fed back, so a prompt of L
    # tokens leaves room for max_positions - L + 1.
    longest, positions = max(map(len, prompts)), target.cfg.max_positions
    # The EAGLE drafters draft budget - 1 levels past the longest prompt: past the model's
    # positions a run drafted thousands of levels for trees cut back to fit.
    if longest + args.budget - 1 > positions:
        raise ValueError(
            f"--budget: {args.budget}, but the model holds {positions} positions and the "
            f"longest prompt takes {longest}: at most {positions - longest + 1}"
        )
    if longest + args.max_new_tokens > positions + 1:
        raise ValueError(
            f"--max-new-tokens: {args.max_new_tokens}, but the model holds {positions} positions "
            f"and the longest prompt takes {longest}: at most {positions - longest + 1}"
        )
    # One short untimed run per method first, each with drafters of its own (a suffix
    # drafter's cache must start empty for the timed run): the first method measured would
    # otherwise carry the process's first calls (code paged in, torch's first allocations),
    # 88 µs a step for autoregressive decoding against 36 once warm.
    for drafter in _methods(target, head, args.budget, meta["metrics"]).values():
        generate(TinyTarget(target), drafter, prompts, min(8, args.max_new_tokens))
    rows = []
    reference: list[list[int]] | None = None
    for name, drafter in _methods(target, head, args.budget, meta["metrics"]).items():
        run = generate(TinyTarget(target), drafter, prompts, args.max_new_tokens)
        if reference is None:
            reference = run.tokens
        rows.append(_row(name, run, reference))
        rows[-1]["numeric_tie"] = _numeric_tie(target, prompts, reference, run.tokens)
    tree_drafter = f"eagle dynamic tree, {args.budget} nodes"
    sampled = [
        generate(
            TinyTarget(target),
            None if name is None else _methods(target, head, args.budget, meta["metrics"])[name],
            prompts,
            args.max_new_tokens,
            temperature=0.8,
            top_p=0.95,
            seed=2026,
        )
        for name in (None, tree_drafter, tree_drafter)
    ]
    report = {
        "model": meta["metrics"],
        "device": str(args.device),
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "greedy": rows,
        "sampling": {
            "temperature": 0.8,
            "top_p": 0.95,
            "seed": 2026,
            "autoregressive_tokens_per_forward": round(sampled[0].tokens_per_forward, 3),
            "eagle_tree_tokens_per_forward": round(sampled[1].tokens_per_forward, 3),
            "same_seed_same_tokens": sampled[2].tokens == sampled[1].tokens,
        },
        "sample": bytes(prompts[0] + (reference or [[]])[0]).decode("utf-8", "replace"),
    }
    if args.json:
        print(json.dumps(report, indent=2, allow_nan=False))
    else:
        _print_table(report)
    ok = all(r["identical_to_autoregressive"] or r["numeric_tie"] for r in rows)
    return 0 if ok else 1


def _numeric_tie(
    model: Any, prompts: list[list[int]], reference: list[list[int]], got: list[list[int]]
) -> str | None:
    """Where `got` leaves the autoregressive `reference`, when every such place is a
    floating-point tie of the target's two tokens (logits within 1e-4 relative): a tree
    forward and a one-token forward round differently, so greedy argmax may pick either.
    None when identical, or when any divergence is not a tie (a real failure)."""
    import torch

    ties = []
    for b, (want, have) in enumerate(zip(reference, got, strict=True)):
        i = next((j for j, (x, y) in enumerate(zip(want, have, strict=False)) if x != y), None)
        if i is None:
            continue
        with torch.inference_mode():
            context = torch.as_tensor([prompts[b] + want[:i]], device=model.embed.weight.device)
            logits = model(context)[0][0, -1].double()
        gap = abs(float(logits[want[i]] - logits[have[i]]))
        if gap > 1e-4 * max(1.0, float(logits.abs().max())):
            return None
        ties.append(f"request {b} token {i}")
    return ", ".join(ties) or None


def _row(name: str, run: Any, reference: list[list[int]]) -> dict[str, Any]:
    steps_nodes = run.step_nodes
    total = run.target_s + run.draft_s + run.specsched_s
    return {
        "method": name,
        "nodes_per_step": round(sum(steps_nodes) / max(1, len(steps_nodes)) / len(run.tokens), 1),
        "tokens_per_forward": round(run.tokens_per_forward, 3),
        "mean_accepted": round(run.mean_accepted, 3),
        "target_forwards": sum(run.forwards),
        "wall_s": round(run.wall_s, 3),
        "target_pct": round(100 * run.target_s / total, 1),
        "draft_pct": round(100 * run.draft_s / total, 1),
        "specsched_pct": round(100 * run.specsched_s / total, 2),
        "specsched_us_per_step": round(1e6 * run.specsched_s / max(1, run.steps), 1),
        # Where specsched's time goes, µs a step: builders in the drafter, the target's tree
        # layout, verification, KV compaction (they sum to specsched_us_per_step).
        "specsched_split_us_per_step": {
            part: round(1e6 * seconds / max(1, run.steps), 1)
            for part, seconds in (
                ("build", run.build_s),
                ("layout", run.layout_s),
                ("verify", run.verify_s),
                ("kv", run.kv_s),
            )
        },
        "specsched_share_of_target_forward_pct": round(100 * run.specsched_share, 2),
        "identical_to_autoregressive": run.tokens == reference,
    }


def _print_table(report: dict[str, Any]) -> None:
    m = report["model"]
    print(
        f"tiny byte-level target (held-out loss {m['target_held_out_loss_nats_per_byte']} "
        f"nats/byte), EAGLE-style head (top-1 agreement with the target "
        f"{m['head_agreement_with_target_greedy']:.0%}); {report['prompts']} prompts x "
        f"{report['max_new_tokens']} new tokens, greedy, device {report['device']}\n"
    )
    head = (
        f"{'method':<32} {'nodes':>5} {'tok/fwd':>7} {'accept':>6} {'fwds':>5} {'wall s':>6}"
        f" {'target':>6} {'draft':>5} {'specsched/step':>14} {'= AR':>4}"
    )
    print(head)
    print("-" * len(head))
    for r in report["greedy"]:
        same = "yes" if r["identical_to_autoregressive"] else "tie" if r["numeric_tie"] else "NO"
        own = (
            f"{r['specsched_us_per_step']:.0f} µs {r['specsched_share_of_target_forward_pct']:.1f}%"
        )
        print(
            f"{r['method']:<32} {r['nodes_per_step']:>5} {r['tokens_per_forward']:>7.2f} "
            f"{r['mean_accepted']:>6.2f} {r['target_forwards']:>5} {r['wall_s']:>6.2f} "
            f"{r['target_pct']:>5.0f}% {r['draft_pct']:>4.0f}% {own:>14} {same:>4}"
        )
    print(
        "\n= AR: output identical to autoregressive greedy decoding (tie: it first differs where "
        "the target's\ntwo best logits tie in floating point, so either token is the "
        "target's greedy choice)."
        "\nnodes: tokens verified per request and step; tok/fwd: tokens emitted per target "
        "forward\n(1.00 = autoregressive); accept: draft tokens accepted per step; target, "
        "draft: shares of the\nloop's time; specsched/step: its own time per step (tree "
        "build, the target's padded\nlayout, verify, KV compaction) and that time as a share "
        "of the target's tree forward,\nmeasured in the loop: each call follows a CPU model "
        "forward that evicted the caches and\ncosts several times what it costs hot "
        "(benches/test_generate.py: verify + compaction\n~20 µs per step); the dynamic trees "
        "call the builder once per draft level, after each head\nforward. On a CPU a tree "
        "forward costs more than a one-token forward, so wall\ntime lags tokens per forward; "
        "on a GPU (--device cuda) the forward is memory-bound and the\ntwo converge."
    )
    s = report["sampling"]
    print(
        f"\nsampling (temperature {s['temperature']}, top-p {s['top_p']}, seed {s['seed']}): "
        f"tokens per forward {s['autoregressive_tokens_per_forward']:.2f} autoregressive, "
        f"{s['eagle_tree_tokens_per_forward']:.2f} with the dynamic tree; same seed, same "
        f"tokens: {'yes' if s['same_seed_same_tokens'] else 'NO'} (the loop is lossless in "
        "distribution: tests/test_generate.py)"
    )
    print("\ngreedy continuation of prompt 1:\n" + report["sample"])
