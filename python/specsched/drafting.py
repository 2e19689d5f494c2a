"""Model-free drafters for the decode loop (`specsched.generate`): no draft model, no torch.

- `SuffixTreeDrafter`: specsched's `SuffixDrafter` (count-weighted suffix trees over each
  request's context and over past responses) proposing trees; responses of finished requests
  enter its global cache, so later `generate` calls draft from earlier ones.
- `NgramChainDrafter`: vLLM's prompt-lookup n-gram proposer (a chain).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import count
from typing import Any

import numpy as np

from specsched._args import float_arg, int_arg
from specsched._core import NgramDrafter, SuffixDrafter, TreeBatch
from specsched.generate import TargetStep

# Request ids for every SuffixTreeDrafter in the process: drafters sharing one `index` must not
# reuse each other's ids (a live id is refused, and finishing a cached id again replaces its
# response in the global cache).
_REQUEST_IDS = count()


def _fresh_request_ids(index: SuffixDrafter, n: int) -> np.ndarray:
    """`n` ids the index has neither live nor cached (ids it was given directly are skipped)."""
    cached = set(index.cached_responses)
    ids: list[int] = []
    while len(ids) < n:
        rid = next(_REQUEST_IDS)
        if rid not in cached and not index.has_request(rid):
            ids.append(rid)
    return np.array(ids, dtype=np.int64)


class SuffixTreeDrafter:
    """Suffix-tree drafts of up to `budget` draft tokens per request (`chain=True`: chains).

    `index`: a `SuffixDrafter` to draft from and cache responses in, which several drafters
    (batches, threads) may share; by default one of its own."""

    def __init__(
        self,
        budget: int = 16,
        *,
        max_depth: int = 64,
        min_prob: float = 0.1,
        max_spec_factor: float = 1.0,
        chain: bool = False,
        index: SuffixDrafter | None = None,
    ) -> None:
        # Checked here, not at the first `propose` after the target's prefill (where the
        # errors would name `budgets`, the index's argument).
        budget = int_arg(budget, "budget", 1)
        if budget > np.iinfo(np.int64).max:
            raise ValueError(f"budget: {budget} does not fit in int64")
        min_prob = float_arg(min_prob, "min_prob")
        if not 0 < min_prob <= 1:
            raise ValueError(f"min_prob: expected a value in (0, 1], got {min_prob}")
        max_spec_factor = float_arg(max_spec_factor, "max_spec_factor")
        if not (math.isfinite(max_spec_factor) and max_spec_factor >= 0):
            raise ValueError(
                f"max_spec_factor: expected a finite value >= 0, got {max_spec_factor}"
            )
        if not isinstance(chain, (bool, np.bool_)):
            raise TypeError(f"chain: expected a bool, got {type(chain).__name__}")
        if index is not None and not isinstance(index, SuffixDrafter):
            raise TypeError(
                f"index: expected a specsched.SuffixDrafter or None, got {type(index).__name__}"
            )
        self.index = index if index is not None else SuffixDrafter(max_depth=max_depth)
        self.budget, self.min_prob, self.chain = budget, min_prob, bool(chain)
        self.factor = max_spec_factor
        self.request_ids = np.zeros(0, dtype=np.int64)

    def start(
        self, input_ids: Sequence[Sequence[int]], first_tokens: np.ndarray, prefill: TargetStep
    ) -> None:
        # Requests of a run that never finished are dropped (not cached): a shared index would
        # otherwise keep them, and their memory, forever.
        self._drop_live()
        ids = _fresh_request_ids(self.index, len(input_ids))
        try:
            for rid, prompt, first in zip(ids, input_ids, first_tokens, strict=True):
                # The first token is the response's: it goes to the global cache with the rest.
                self.index.start_request(int(rid), np.asarray(prompt, dtype=np.int64))
                self.index.append(int(rid), np.array([first], dtype=np.int64))
        except BaseException:
            # A bad prompt part-way: the rows already started leave with it.
            self.request_ids = ids
            self._drop_live()
            raise
        self.request_ids = ids

    def _drop_live(self) -> None:
        for rid in self.request_ids:
            if self.index.has_request(int(rid)):
                self.index.finish_request(int(rid), cache=False)
        self.request_ids = np.zeros(0, dtype=np.int64)

    def propose(self, roots: np.ndarray, active: np.ndarray) -> TreeBatch:
        return self.index.propose_batch(
            self.request_ids,
            self.budget,
            self.min_prob,
            self.factor,
            chain=self.chain,
        )

    def commit(self, trees: TreeBatch, result: Any, step: TargetStep, kept: np.ndarray) -> None:
        tokens = result.tokens
        for b in np.flatnonzero(kept):
            self.index.append(int(self.request_ids[b]), tokens[b, : kept[b]])

    def finish(self) -> None:
        """Caches the finished responses in the global index and forgets the requests."""
        for rid in self.request_ids:
            self.index.finish_request(int(rid), cache=True)
        self.request_ids = np.zeros(0, dtype=np.int64)


class NgramChainDrafter:
    """vLLM's n-gram proposer: the `k` tokens after the earliest occurrence of the longest
    context suffix of length `min_n..max_n` (vLLM's tie rule)."""

    def __init__(self, k: int = 5, *, min_n: int = 1, max_n: int = 4) -> None:
        self.proposer = NgramDrafter(min_n=min_n, max_n=max_n, k=k)
        self.contexts: list[list[int]] = []

    def start(
        self, input_ids: Sequence[Sequence[int]], first_tokens: np.ndarray, prefill: TargetStep
    ) -> None:
        self.contexts = [[*p, int(f)] for p, f in zip(input_ids, first_tokens, strict=True)]

    def propose(self, roots: np.ndarray, active: np.ndarray) -> TreeBatch:
        # A finished row proposes from its last token alone: nothing precedes it to match, so
        # its tree is the root alone (what the loop would cut it to).
        return self.proposer.propose_batch(
            [
                np.array(c if a else c[-1:], dtype=np.int64)
                for c, a in zip(self.contexts, active, strict=True)
            ]
        )

    def commit(self, trees: TreeBatch, result: Any, step: TargetStep, kept: np.ndarray) -> None:
        for b in np.flatnonzero(kept):
            self.contexts[b].extend(result.tokens[b, : kept[b]].tolist())
