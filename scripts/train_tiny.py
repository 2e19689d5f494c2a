"""Trains the shipped tiny target and its EAGLE-style draft head on the Python standard library.

    python scripts/train_tiny.py            # writes python/specsched/models/tiny_stdlib/

Data: every `.py` file of this interpreter's standard library (tests excluded, sorted by path),
as bytes; every 20th file is held out. The target learns next-byte prediction on random
windows of the training files. The head is trained with the target frozen: at position t it
reads the target's feature f_t and the embedding of byte t+1, and learns to predict f_{t+1}
(smooth L1) and byte t+2 through the target's LM head (cross-entropy), as EAGLE does.

Reported (written to `config.json`): the target's held-out loss (nats per byte), the head's
held-out top-1 accuracy against the data, and its agreement with the target's own greedy
choice (the figure greedy speculative decoding accepts on).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

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


def head_losses(
    target: TinyLM, head: EagleHead, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, correct vs data, correct vs target greedy, count) on windows `x [B, L+1]`."""
    with torch.no_grad():
        target_logits, feats = target(x)
    # Position t: feature f_t and byte t+1 -> predict f_{t+1} and byte t+2.
    pred = head(feats[:, :-2], target.embed(x[:, 1:-1]))
    logits = target.logits(pred)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 2:].reshape(-1))
    reg = F.smooth_l1_loss(pred, feats[:, 1:-1])
    guess = logits.argmax(-1)
    return (
        ce + 10.0 * reg,
        (guess == x[:, 2:]).sum(),
        (guess == target_logits[:, 1:-1].argmax(-1)).sum(),
        torch.tensor(guess.numel()),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=WEIGHTS_DIR)
    ap.add_argument("--target-steps", type=int, default=1500)
    ap.add_argument("--head-steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    train, held = corpus(held_out_every=20)
    held_rng = np.random.default_rng(12345)
    held_batches = [windows(held, held_rng, 32, args.length) for _ in range(8)]
    print(f"corpus: {train.size} training bytes, {held.size} held-out bytes")

    cfg = TinyConfig()
    target = TinyLM(cfg)
    opt = torch.optim.AdamW(target.parameters(), lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95))
    t0 = time.perf_counter()
    for step in range(args.target_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.target_steps, 3e-3, 100)
        x = windows(train, rng, args.batch, args.length)
        logits, _ = target(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(target.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.target_steps - 1:
            print(f"target {step:5d} loss {loss.item():.3f} ({time.perf_counter() - t0:.0f} s)")
    target.eval()
    with torch.no_grad():
        held_loss = float(
            np.mean(
                [
                    F.cross_entropy(
                        target(x[:, :-1])[0].reshape(-1, cfg.vocab_size), x[:, 1:].reshape(-1)
                    ).item()
                    for x in held_batches
                ]
            )
        )
    print(f"target held-out loss {held_loss:.4f} nats/byte")
    for p in target.parameters():
        p.requires_grad_(False)

    head = EagleHead(cfg)
    opt = torch.optim.AdamW(head.parameters(), lr=2e-3, weight_decay=0.0)
    t0 = time.perf_counter()
    for step in range(args.head_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.head_steps, 2e-3, 50)
        loss, *_ = head_losses(target, head, windows(train, rng, args.batch, args.length + 1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.head_steps - 1:
            print(f"head {step:5d} loss {loss.item():.3f} ({time.perf_counter() - t0:.0f} s)")
    head.eval()
    with torch.no_grad():
        sums = np.sum(
            [[float(t) for t in head_losses(target, head, x)[1:]] for x in held_batches], 0
        )
    data_acc, agree = sums[0] / sums[2], sums[1] / sums[2]
    print(f"head held-out top-1 {data_acc:.3f}, agreement with the target's greedy {agree:.3f}")

    args.out.mkdir(parents=True, exist_ok=True)
    save_weights(target, args.out / "target.npz")
    save_weights(head, args.out / "draft_head.npz")
    meta = {
        "model": config_dict(cfg),
        "training": {
            "command": "python scripts/train_tiny.py"
            + "".join(
                f" --{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("out",)
            ),
            "train_bytes": int(train.size),
            "held_out_bytes": int(held.size),
            "torch": torch.__version__,
        },
        "metrics": {
            "target_held_out_loss_nats_per_byte": round(held_loss, 4),
            "head_held_out_top1": round(float(data_acc), 4),
            "head_agreement_with_target_greedy": round(float(agree), 4),
        },
    }
    (args.out / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
