"""The decode loop's first step on the shipped tiny model, shared by the timing scripts."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch
from specsched._cli_demo import DEMO_PROMPTS, _methods
from specsched.generate import generate
from specsched.models.tiny import WEIGHTS_DIR, TinyTarget, load_tiny


def first_dynamic_step() -> tuple[Any, Any, Any, list[list[int]]]:
    """`(trees, drafter, model, prompts)`: the 16-node dynamic drafter's first trees over the
    demo's prompts (its builder left as a short run ended it), on one torch thread."""
    torch.set_num_threads(1)
    meta = json.loads((WEIGHTS_DIR / "config.json").read_text())
    model, head = load_tiny(device="cpu")
    prompts = [list(p) for p in DEMO_PROMPTS]
    drafter = _methods(model, head, 16, meta["metrics"])["eagle dynamic tree, 16 nodes"]
    first: list[Any] = []
    propose = drafter.propose

    def keep_first(roots: np.ndarray, active: np.ndarray) -> Any:
        trees = propose(roots, active)
        if not first:
            first.append(trees)
        return trees

    drafter.propose = keep_first
    generate(TinyTarget(model), drafter, prompts, 8)
    return first[0], drafter, model, prompts


def draft_all_levels(builder: Any) -> None:
    """`start_in_place` and every level's `expand_in_place` of `builder` from what its buffers
    hold (a drafter's last top-k, or primed values: valid input for every level), so that
    `build_in_place` can follow."""
    builder.start_in_place()
    for _ in range(builder.depth - 1):
        builder.expand_in_place()
