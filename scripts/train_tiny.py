"""Trains the shipped tiny target and its EAGLE-style draft head on the Python standard library.

    python scripts/train_tiny.py            # writes python/specsched/models/tiny_stdlib/

Data: every `.py` file of this interpreter's standard library (tests excluded, sorted by path),
as bytes; every 20th file is held out. The target learns next-byte prediction on random
windows of the training files. The head is trained with the target frozen: at position t it
reads the target's feature f_t and the embedding of byte t+1, and learns to predict f_{t+1}
(smooth L1) and byte t+2 through the target's LM head (cross-entropy), as EAGLE does.

Reported (written to `config.json`): the target's held-out loss (nats per byte), the head's
held-out top-1 accuracy against the data, its agreement with the target's own greedy choice
(the figure greedy speculative decoding accepts on), and `head_rank_acceptance[r]`: how often
the target's greedy token is the head's rank-r candidate, the per-rank acceptance vector
`specsched.optimal_tree` plans a static (Sequoia) tree from, and `head_greedy_temperature`: the
temperature T for which softmax(head logits / T) best predicts (least cross-entropy) the
target's greedy token. A dynamic tree ranks candidates by cumulative draft probability as an
estimate of acceptance; under greedy verification a candidate is accepted when it IS the
target's argmax, and the raw head probabilities understate that (temperature scaling, Guo et
al. 2017, with the target's greedy token as the label).

    python scripts/train_tiny.py --evaluate-only   # recompute the metrics of saved weights
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from specsched._replay import stdlib_files
from specsched.models.tiny import (
    WEIGHTS_DIR,
    EagleHead,
    TinyConfig,
    TinyLM,
    config_dict,
    load_tiny,
    save_weights,
)


def corpus(held_out_every: int) -> tuple[np.ndarray, np.ndarray]:
    train, held = [], []
    for i, path in enumerate(stdlib_files()):
        (held if i % held_out_every == 0 else train).append(path.read_bytes() + b"\n")
    return (
        np.frombuffer(b"".join(train), dtype=np.uint8),
        np.frombuffer(b"".join(held), dtype=np.uint8),
    )


def windows(data: np.ndarray, rng: np.random.Generator, batch: int, length: int) -> torch.Tensor:
    starts = rng.integers(0, data.size - length - 1, size=batch)
    return torch.from_numpy(np.stack([data[s : s + length + 1] for s in starts]).astype(np.int64))


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def fit(
    name: str,
    module: torch.nn.Module,
    opt: torch.optim.Optimizer,
    loss_fn: Callable[[], torch.Tensor],
    steps: int,
    peak: float,
    warmup: int,
) -> None:
    """`steps` AdamW steps with linear warm-up and cosine decay; leaves `module` in eval mode."""
    t0 = time.perf_counter()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, peak, warmup)
        loss = loss_fn()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"{name} {step:5d} loss {loss.item():.3f} ({time.perf_counter() - t0:.0f} s)")
    module.eval()


def head_loss(target: TinyLM, head: EagleHead, x: torch.Tensor) -> torch.Tensor:
    """EAGLE's loss on windows `x [B, L+1]`: position t reads the feature f_t and byte t+1
    and predicts f_{t+1} (smooth L1) and byte t+2 (cross-entropy through the LM head)."""
    with torch.no_grad():
        _, feats = target(x)
    pred = head(feats[:, :-2], target.embed(x[:, 1:-1]))
    logits = target.logits(pred)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 2:].reshape(-1))
    return ce + 10.0 * F.smooth_l1_loss(pred, feats[:, 1:-1])


def evaluate(target: TinyLM, head: EagleHead, held_batches: list[torch.Tensor]) -> dict[str, Any]:
    """Held-out metrics of a trained target and head (see the module docstring)."""
    vocab = target.cfg.vocab_size
    losses, data_hits, ranks, count = [], 0, np.zeros(8), 0
    head_logits, greedy_labels = [], []
    with torch.no_grad():
        for x in held_batches:
            logits, feats = target(x[:, :-1])
            losses.append(F.cross_entropy(logits.reshape(-1, vocab), x[:, 1:].reshape(-1)).item())
            guess = target.logits(head(feats[:, :-1], target.embed(x[:, 1:-1])))
            data_hits += int((guess.argmax(-1) == x[:, 2:]).sum())
            greedy = logits[:, 1:].argmax(-1)
            top = guess.topk(ranks.size, dim=-1).indices
            ranks += (top == greedy[..., None]).reshape(-1, ranks.size).sum(0).numpy()
            count += greedy.numel()
            head_logits.append(guess.reshape(-1, vocab))
            greedy_labels.append(greedy.reshape(-1))
        logits, labels = torch.cat(head_logits), torch.cat(greedy_labels)
        temps = np.geomspace(0.1, 3.0, 61)
        ce = [F.cross_entropy(logits / float(t), labels).item() for t in temps]
    return {
        "target_held_out_loss_nats_per_byte": round(float(np.mean(losses)), 4),
        "head_held_out_top1": round(data_hits / count, 4),
        "head_agreement_with_target_greedy": round(float(ranks[0]) / count, 4),
        "head_rank_acceptance": [round(float(r) / count, 4) for r in ranks],
        "head_greedy_temperature": round(float(temps[int(np.argmin(ce))]), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=WEIGHTS_DIR)
    ap.add_argument("--target-steps", type=int, default=1500)
    ap.add_argument("--head-steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--evaluate-only", action="store_true", help="update saved weights' metrics")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    train, held = corpus(held_out_every=20)
    held_rng = np.random.default_rng(12345)
    held_batches = [windows(held, held_rng, 32, args.length) for _ in range(8)]
    print(f"corpus: {train.size} training bytes, {held.size} held-out bytes")
    if args.evaluate_only:
        saved, saved_head = load_tiny(args.out)
        meta = json.loads((args.out / "config.json").read_text())
        meta["metrics"] = evaluate(saved, saved_head, held_batches)
        (args.out / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
        print(json.dumps(meta["metrics"], indent=2))
        return

    cfg = TinyConfig()
    target = TinyLM(cfg)
    opt = torch.optim.AdamW(target.parameters(), lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95))

    def lm_loss() -> torch.Tensor:
        x = windows(train, rng, args.batch, args.length)
        logits, _ = target(x[:, :-1])
        return F.cross_entropy(logits.reshape(-1, cfg.vocab_size), x[:, 1:].reshape(-1))

    fit("target", target, opt, lm_loss, args.target_steps, peak=3e-3, warmup=100)
    for p in target.parameters():
        p.requires_grad_(False)

    head = EagleHead(cfg)
    opt = torch.optim.AdamW(head.parameters(), lr=2e-3, weight_decay=0.0)
    fit(
        "head",
        head,
        opt,
        lambda: head_loss(target, head, windows(train, rng, args.batch, args.length + 1)),
        args.head_steps,
        peak=2e-3,
        warmup=50,
    )
    metrics = evaluate(target, head, held_batches)
    print(json.dumps(metrics, indent=2))

    args.out.mkdir(parents=True, exist_ok=True)
    save_weights(target, args.out / "target.npz")
    save_weights(head, args.out / "draft_head.npz")
    meta = {
        "model": config_dict(cfg),
        "training": {
            "command": "python scripts/train_tiny.py"
            + "".join(
                f" --{k.replace('_', '-')} {v}"
                for k, v in vars(args).items()
                if k not in ("out", "evaluate_only")
            ),
            "train_bytes": int(train.size),
            "held_out_bytes": int(held.size),
            "torch": torch.__version__,
        },
        "metrics": metrics,
    }
    (args.out / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
