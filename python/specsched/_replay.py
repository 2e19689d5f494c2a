"""Replay evaluation of model-free drafters on recorded text (`specsched.sim.replay`).

A *workload* is a list of requests `(prompt, continuation)`. Replay drives a drafter through
every request as a greedy target would: at each step the drafter proposes a tree from the
committed context, the target's choice at every node is the recorded token that follows the
node's path (`continuation[pos + depth]`), `ss.verify` walks the tree, and the accepted tokens
plus the bonus are committed. Requests run one after another, so a drafter with a global cache
(`SuffixDrafter`) sees the earlier requests' responses. This is how ArcticInference's simulator
evaluates suffix decoding: no model is needed, and the acceptance is exact for greedy decoding.

`stdlib_workload` builds workloads from the Python standard library's source at byte level
(tokens 0..255): text present on every machine, written by nobody here.
"""

from __future__ import annotations

import random
import sysconfig
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from specsched._args import int_arg
from specsched._core import MAX_TOKEN_ID, NgramDrafter, SuffixDrafter, Tree, VerifyResult
from specsched._verify import verify

DrafterName = Literal["suffix-tree", "suffix-chain", "ngram"]
DRAFTERS: tuple[DrafterName, ...] = ("suffix-tree", "suffix-chain", "ngram")
WORKLOADS = ("continue", "edit", "similar")

Request = tuple[Sequence[int], Sequence[int]]


@dataclass(frozen=True)
class ReplayResult:
    """What one drafter did on one workload."""

    drafter: str
    budget: int
    requests: int
    steps: int
    tokens: int
    accepted: int
    draft_seconds: float
    memory_bytes: int
    indexed_tokens: int

    @property
    def accepted_per_step(self) -> float:
        """Mean accepted draft tokens per verify step (bonus excluded)."""
        return self.accepted / self.steps if self.steps else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Mean committed tokens per verify step (bonus included)."""
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def draft_us_per_step(self) -> float:
        """Mean wall time of one proposal, microseconds."""
        return 1e6 * self.draft_seconds / self.steps if self.steps else 0.0

    @property
    def bytes_per_token(self) -> float:
        """Drafter memory per indexed token at the peak (0 for the stateless n-gram)."""
        return self.memory_bytes / self.indexed_tokens if self.indexed_tokens else 0.0

    def as_dict(self) -> dict[str, float | int | str]:
        return {
            "drafter": self.drafter,
            "budget": self.budget,
            "requests": self.requests,
            "steps": self.steps,
            "tokens": self.tokens,
            "accepted_per_step": self.accepted_per_step,
            "tokens_per_step": self.tokens_per_step,
            "draft_us_per_step": self.draft_us_per_step,
            "bytes_per_token": self.bytes_per_token,
        }


def _check(workload: Sequence[Request], budget: int, drafter: str) -> None:
    if drafter not in DRAFTERS:
        raise ValueError(f"drafter: expected one of {', '.join(DRAFTERS)}, got {drafter!r}")
    int_arg(budget, "budget", 1)
    if not workload:
        raise ValueError("workload: no requests")
    for i, request in enumerate(workload):
        try:
            prompt, cont = request
        except (TypeError, ValueError):
            kind = type(request).__name__
            raise ValueError(
                f"workload[{i}]: expected a (prompt, continuation) pair, got {kind}"
            ) from None
        if len(prompt) == 0:
            raise ValueError(f"workload[{i}]: empty prompt (a draft's root is a context token)")
        if len(cont) == 0:
            raise ValueError(f"workload[{i}]: empty continuation")
        _check_tokens(prompt, f"workload[{i}] prompt")
        _check_tokens(cont, f"workload[{i}] continuation")


def _check_tokens(tokens: Sequence[int], what: str) -> None:
    """Token ids are ints in `0..=MAX_TOKEN_ID` (a negative continuation token would match no
    draft and commit nothing: the replay would never advance)."""
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"{what}: expected a 1-D sequence of token ids, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{what}: expected int token ids, got {arr.dtype}")
    bad = np.flatnonzero((arr < 0) | (arr > MAX_TOKEN_ID))
    if bad.size:
        j = int(bad[0])
        raise ValueError(f"{what}[{j}]: token id {arr[j]} is outside [0, {MAX_TOKEN_ID}]")


def replay(
    workload: Sequence[Request],
    drafter: DrafterName = "suffix-tree",
    budget: int = 16,
    *,
    min_prob: float = 0.1,
    max_spec_factor: float = 1.0,
    max_depth: int = 64,
    max_global_tokens: int = 1 << 22,
    min_n: int = 1,
    max_n: int = 4,
) -> ReplayResult:
    """Replays `workload` with one drafter proposing at most `budget` draft tokens per step.

    `suffix-tree` and `suffix-chain` are a `SuffixDrafter` (trees, or chains of each node's
    most frequent child) with `min_prob`, `max_spec_factor`, `max_depth` and a global response
    cache of `max_global_tokens`; `ngram` is vLLM's prompt lookup with `k = budget`.
    """
    _check(workload, budget, drafter)
    budget = int(budget)  # a numpy int would reach the result (and its JSON) as one
    suffix = SuffixDrafter(max_depth, max_global_tokens)
    ngram = NgramDrafter(min_n, max_n, budget)
    steps = tokens = accepted = 0
    draft_s = 0.0
    peak_mem = peak_tokens = 0
    for rid, (prompt, cont) in enumerate(workload):
        target = np.asarray(cont, dtype=np.int64)
        # The n-gram context lives in one growing buffer; proposals read a view of it.
        context = np.empty(len(prompt) + len(cont), dtype=np.int64)
        context[: len(prompt)] = prompt
        n = len(prompt)
        if drafter != "ngram":
            suffix.start_request(rid, np.asarray(prompt, dtype=np.int64))
        pos = 0
        while pos < len(target):
            t0 = time.perf_counter()
            tree: Tree
            if drafter == "ngram":
                tree = ngram.propose(context[:n])
            else:
                tree = suffix.propose(
                    rid, budget, min_prob, max_spec_factor, chain=drafter == "suffix-chain"
                ).tree
            draft_s += time.perf_counter() - t0
            depth = tree.depths + pos
            choice = np.where(depth < len(target), target[np.minimum(depth, len(target) - 1)], -1)
            r = verify(tree, target_tokens=choice)
            assert isinstance(r, VerifyResult)
            committed = r.tokens[: r.num_accepted + (1 if r.bonus_token >= 0 else 0)]
            steps += 1
            accepted += r.num_accepted
            tokens += len(committed)
            pos += len(committed)
            if drafter == "ngram":
                context[n : n + len(committed)] = committed
                n += len(committed)
            else:
                suffix.append(rid, committed)
        if drafter != "ngram":
            if suffix.memory_bytes > peak_mem:
                peak_mem, peak_tokens = suffix.memory_bytes, suffix.num_indexed_tokens
            suffix.finish_request(rid)
    return ReplayResult(
        drafter, budget, len(workload), steps, tokens, accepted, draft_s, peak_mem, peak_tokens
    )


# --- workloads from the standard library's source ------------------------------------------------


def stdlib_files(limit: int | None = None) -> list[Path]:
    """The standard library's `.py` files (tests excluded), sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p
        for p in root.rglob("*.py")
        if "test" not in p.parts and "tests" not in p.parts and "site-packages" not in p.parts
    )
    return files[:limit] if limit is not None else files


def _edit(text: bytes, rng: random.Random, edits: int) -> bytes:
    """`text` with small line-level edits: renamed identifiers, dropped, duplicated and new
    comment lines, the kind of rewrite an agent makes to a file it just read."""
    lines = text.split(b"\n")
    words = sorted({w for w in text.replace(b"(", b" ").replace(b".", b" ").split() if w.isalpha()})
    for _ in range(edits):
        kind = rng.randrange(4)
        i = rng.randrange(len(lines))
        if kind == 0 and words:
            old = rng.choice(words)
            lines = [ln.replace(old, old + b"_v2") for ln in lines]
        elif kind == 1 and len(lines) > 1:
            del lines[i]
        elif kind == 2:
            lines.insert(i, lines[i])
        else:
            lines.insert(i, b"# edited: " + rng.choice(words or [b"x"]))
    return b"\n".join(lines)


def stdlib_workload(
    kind: str, requests: int = 8, max_len: int = 3000, seed: int = 0
) -> list[tuple[list[int], list[int]]]:
    """Byte-level workloads from stdlib source files (each at most `max_len` bytes).

    - `continue`: prompt = the first half of a file, continuation = the rest.
    - `edit`: prompt = a file and an instruction line, continuation = the file with small
      edits (code editing / agentic rewriting).
    - `similar`: prompt = the first 200 bytes of a file (at most half of `max_len`),
      continuation = the rest, over files of one package in order, so earlier responses help
      later ones (the global cache).
    """
    if kind not in WORKLOADS:
        raise ValueError(f"kind: expected one of {', '.join(WORKLOADS)}, got {kind!r}")
    requests = int_arg(requests, "requests", 1)
    if int_arg(max_len, "max_len") < 2:
        raise ValueError(f"max_len: must be >= 2 (a prompt and a continuation), got {max_len}")
    # >= 0: random.Random seeds with abs(seed), so -1 silently was the workload of 1.
    rng = random.Random(int_arg(seed, "seed", 0))
    files = [p for p in stdlib_files() if p.stat().st_size >= 400]
    if kind == "similar":
        by_pkg: dict[Path, list[Path]] = {}
        for p in files:
            by_pkg.setdefault(p.parent, []).append(p)
        pkg = max(by_pkg.values(), key=len)
        chosen = pkg[:requests]
    else:
        chosen = rng.sample(files, min(requests, len(files)))
    out: list[tuple[list[int], list[int]]] = []
    for p in chosen:
        text = p.read_bytes()[:max_len]
        if kind == "continue":
            half = len(text) // 2
            out.append((list(text[:half]), list(text[half:])))
        elif kind == "edit":
            edited = _edit(text, rng, edits=max(1, len(text) // 600))
            out.append(
                (list(text + b"\n# Rewrite the file above with small edits.\n"), list(edited))
            )
        else:
            # A short max_len keeps a continuation (200 bytes of 150 would leave none).
            head = min(200, len(text) // 2)
            out.append((list(text[:head]), list(text[head:])))
    return out


def compare(
    workload: Sequence[Request], budget: int = 16, drafters: Sequence[str] = DRAFTERS, **kw: float
) -> list[ReplayResult]:
    """`replay` for each drafter at the same budget."""
    return [replay(workload, d, budget, **kw) for d in drafters]  # type: ignore[arg-type]
