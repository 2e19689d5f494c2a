"""The speculative decode loop, and the two small protocols a model plugs into it.

One step, for every request of the batch at once:

1. the drafter proposes a tree per request whose root is the request's last emitted token;
2. the target scores every tree node in one forward (tree attention mask, positions
   `length + depth`, KV written at `length + node`: DESIGN §1 and §5);
3. `verify` picks each request's accepted path and bonus token (greedy, or lossless sampling);
4. the target keeps the accepted path's KV (`compact_kv` / `commit_slots`) and drops the rest;
5. the drafter is told what was committed (tokens, and the target's features on the path).

Greedy speculative output is token-for-token the target's autoregressive greedy output; sampled
output has the target's distribution (the default sample-and-match rule, DESIGN §4).

`drafter=None` runs the same loop with root-only trees: plain autoregressive decoding, one token
per target forward, which is the baseline every figure here is compared against.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from specsched import _torch
from specsched._args import int_arg
from specsched._core import BatchVerifyResult, TreeBatch
from specsched._verify import verify


@dataclass
class TargetStep:
    """What a target forward gives the loop.

    `logits`: the target's next-token logits, one row per scored position (numpy or torch, any
    device `verify` accepts). `features`: the hidden states an EAGLE-style drafter reads (same
    rows), or None.
    """

    logits: Any
    features: Any = None


class TargetModel(Protocol):
    """A causal LM with a KV cache that can score a draft tree in one forward.

    The target keeps, per batch row, the committed length `L_b` of its cache.
    """

    def prefill(self, input_ids: Sequence[Sequence[int]]) -> TargetStep:
        """Starts a batch: runs each prompt into the cache (`L_b = len(prompt_b)`). `logits
        [B, V]`: the prediction after each prompt's last token; `features [B, P_max, d]` (row
        b valid for its prompt length) or None."""
        ...

    def forward_tree(self, trees: TreeBatch) -> TargetStep:
        """Scores `trees` (one per batch row; node i of row b at position `L_b + depth(i)`,
        attending to the committed cache and its own ancestors, KV written at `L_b + i`).
        `logits [T, V]` and `features [T, d]` (or None), one row per node, flat."""
        ...

    def accept(self, result: BatchVerifyResult) -> None:
        """Keeps each row's accepted path (`result.accepted_nodes`) at `L_b + 0..k_b`, then
        `L_b += k_b + 1`. A row that EOS or the length limit ended inside its path arrives cut
        there (`BatchVerifyResult.truncate`): the cache keeps only tokens the row emitted."""
        ...

    # Optional: `synchronize`, a callable waiting for the work the target queued on its device
    # (CUDA runs kernels asynchronously), or None when there is none. `generate` calls it
    # after the target's calls, so that their device time is counted as target time, not in
    # the next host wait (verify's).
    # Optional: `retire(rows)`, the rows whose requests finished: the loop still feeds them
    # root-only trees (the batch keeps its shape) and ignores their outputs, so the target
    # may stop advancing them. Their root-only trees should then sit at the last position
    # the request used (`L_b - 1`): `L_b` itself is one past it, which can be past the
    # model's last position for a request that used every one.
    # Optional: `vocab_size` (int): prompts with a token id outside `[0, vocab_size)` are
    # refused before the prefill (an embedding lookup would fail on the device instead).
    # Optional: `max_positions` (int or None): the positions the model encodes. Trees are cut
    # below it, so a request near the end of the model's context is verified as deep as its
    # autoregressive decoding could go, not refused for drafts it would never emit.
    # Optional: `layout_seconds` (float, cumulative), the time `forward_tree` spent in
    # specsched's tree layouts (`TreeBatch.padded_layout`, `pad_trees`): reported as
    # specsched's (`layout_s`), not the target's.


class Drafter(Protocol):
    """Proposes draft trees. Optional: `build_seconds` (float, cumulative time spent inside
    specsched's tree builders, reported as specsched's share) and `finish()` (called once when
    the batch is done)."""

    def start(
        self, input_ids: Sequence[Sequence[int]], first_tokens: np.ndarray, prefill: TargetStep
    ) -> None:
        """A new batch: the prompts, the first emitted token of each and the prefill output."""
        ...

    def propose(self, roots: np.ndarray, active: np.ndarray) -> TreeBatch:
        """One tree per row with root token `roots[b]`. Rows with `active[b] == False` are
        finished: a drafter may give them the root alone (the shipped chain, static and n-gram
        drafters do), else the loop cuts their trees to it, as it cuts any tree deeper than
        its row's tokens left allow (`TreeBatch.limit_depth`, a specsched call)."""
        ...

    def commit(
        self, trees: TreeBatch, result: BatchVerifyResult, step: TargetStep, kept: np.ndarray
    ) -> None:
        """The target verified `trees` (`step` is its forward); `result` is what it accepted.
        `kept[b]` (int64): the tokens row b committed, `result.tokens[b, :kept[b]]`: its
        accepted path and bonus token, cut after EOS or at the length limit; 0 for a row that
        had finished. Tokens past that were never emitted: a drafter must not learn them."""
        ...


@dataclass
class Generation:
    """Tokens and per-step statistics of one `generate` call.

    `tokens[b]`: the new tokens of request b (EOS included when it stopped on one).
    `accepted[b]`: draft tokens accepted and emitted at each verify step while b was running
    (a path cut at EOS or at `max_new_tokens` counts the drafts it kept).
    `forwards[b]`: target forwards b took part in (its prefill included).
    Times are seconds: `target_s` (prefill and tree forwards, without the target's
    `layout_seconds`), `draft_s` (the drafter, without the time it spent in specsched's
    builders), `build_s`, `layout_s`, `verify_s` and `kv_s` (specsched: tree building, the
    target's tree layouts, verification, KV compaction), `wall_s` (the whole call).
    """

    tokens: list[list[int]]
    accepted: list[list[int]]
    forwards: list[int]
    steps: int = 0
    prefill_s: float = 0.0
    target_s: float = 0.0
    draft_s: float = 0.0
    build_s: float = 0.0
    layout_s: float = 0.0
    verify_s: float = 0.0
    kv_s: float = 0.0
    wall_s: float = 0.0
    step_nodes: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_forward(self) -> float:
        """Emitted tokens per target forward, per request (1.0 for autoregressive decoding)."""
        return self.num_tokens / max(1, sum(self.forwards))

    @property
    def mean_accepted(self) -> float:
        """Mean draft tokens accepted per verify step (bonus excluded)."""
        flat = [a for row in self.accepted for a in row]
        return float(np.mean(flat)) if flat else 0.0

    @property
    def specsched_s(self) -> float:
        """specsched's own time: tree building, the target's tree layouts, verification and KV
        compaction."""
        return self.build_s + self.layout_s + self.verify_s + self.kv_s

    @property
    def specsched_share(self) -> float:
        """specsched's time over the target's tree-forward time (prefill excluded)."""
        tree_forward_s = self.target_s - self.prefill_s
        return self.specsched_s / tree_forward_s if tree_forward_s > 0 else 0.0


class RetiredRows:
    """The rows of a target's batch whose requests finished, for a target's `retire`: `rows`
    (bool `[B]`), `running` (its negation: `compact_kv(..., active=running)` keeps a retired
    row's length with no array arithmetic, where a numpy op costs ~20 µs right after a
    forward) and `any`, a plain bool the target reads on every accept instead of reducing the
    mask."""

    def __init__(self, batch: int = 0) -> None:
        self.rows = np.zeros(batch, dtype=bool)
        self.running = np.ones(batch, dtype=bool)
        self.any = False

    def add(self, rows: np.ndarray) -> None:
        self.rows[rows] = True
        self.running[rows] = False
        self.any = True

    def tree_lengths(self, lengths: np.ndarray) -> np.ndarray:
        """The lengths a target lays its trees out at (`padded_layout(...)`): a retired row's
        root-only tree sits at the last position its request used, `L_b - 1`, not one past
        it (which may be past the model's last position)."""
        return lengths - self.rows if self.any else lengths


class PaddedTrees(NamedTuple):
    """A ragged tree batch laid out as the `[B, n]` (n = largest tree) batch a model runs.

    `tokens`, `positions` int64 `[B, n]` (positions `lengths[b] + depth`); `tree_mask` bool
    `[B, n, n]`, ancestor-or-self within each tree, and padding slots see only themselves (so
    no attention row is empty); `rows`, `cols` int64 `[T]`: where flat node t sits, to gather
    the model's per-slot outputs back into tree order (`out[rows, cols]`).

    A named tuple, not a frozen dataclass: right after a model forward, a frozen dataclass's
    five `object.__setattr__` calls cost 6-8 µs a step.
    """

    tokens: np.ndarray
    positions: np.ndarray
    tree_mask: np.ndarray
    rows: np.ndarray
    cols: np.ndarray


def pad_trees(trees: TreeBatch, lengths: np.ndarray) -> PaddedTrees:
    """`trees` padded to `[B, max_nodes]` for a model whose rows hold `lengths` tokens: one
    specsched call (`TreeBatch.padded_layout`), where the numpy formulation took ~100 µs a
    step right after a CPU model forward."""
    return PaddedTrees._make(trees.padded_layout(lengths))


def root_only(roots: np.ndarray) -> TreeBatch:
    """A batch of single-node trees: autoregressive decoding in the tree loop's terms."""
    parents, offsets = _root_only_layout(roots.shape[0])
    return TreeBatch.from_flat(parents, roots, offsets)


@functools.cache
def _root_only_layout(b: int) -> tuple[np.ndarray, np.ndarray]:
    """The parents and offsets of `b` single-node trees, made once per batch size (read-only):
    right after a target forward `np.full` and `np.arange` cost ~50 µs, twice what the batch's
    construction does, on every step of autoregressive decoding."""
    parents, offsets = np.full(b, -1, np.int32), np.arange(b + 1, dtype=np.int64)
    parents.flags.writeable = offsets.flags.writeable = False
    return parents, offsets


def _step_seed(seed: int | None, step: int) -> int | None:
    """An independent 64-bit seed per verify step (the draws are keyed by (seed, row, node))."""
    if seed is None:
        return None
    return int(np.random.SeedSequence([seed, step]).generate_state(1, np.uint64)[0])


def _check_eos(eos_token_id: Any, vocab_size: int | None) -> frozenset[int]:
    """The ids a request stops on: one int, or a sequence of them (HF's `eos_token_id` is a
    list for models with several end tokens)."""
    if eos_token_id is None:
        return frozenset()
    ids = eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]
    out = set()
    for j, x in enumerate(ids):
        arg = "eos_token_id" if ids is not eos_token_id else f"eos_token_id[{j}]"
        tok = int_arg(x, arg)
        if tok < 0 or (vocab_size is not None and tok >= vocab_size):
            span = "[0, ∞)" if vocab_size is None else f"the target's vocabulary [0, {vocab_size})"
            raise ValueError(f"{arg}: {tok} is outside {span}: no token would match it")
        out.add(tok)
    return frozenset(out)


def _check_sampling(temperature: Any, top_k: Any, top_p: Any, seed: Any, n: int) -> float:
    """`temperature` as a float (one for every request) and `seed` as None or an int in
    `[0, 2**64)`, each named when it is not; `top_k` and `top_p` (scalars or one per request)
    by `verify`'s own rules on a one-token stand-in of the batch, greedy or not: before the
    target's prefill, not at the first step after it, and never ignored unchecked."""
    if isinstance(temperature, (bool, np.bool_)) or not isinstance(
        temperature, (int, float, np.integer, np.floating)
    ):
        kind = type(temperature).__name__
        raise TypeError(f"temperature: expected a float (one for every request), got {kind}")
    if seed is not None:
        s = int_arg(seed, "seed")
        if not 0 <= s < 1 << 64:
            raise ValueError(f"seed: expected an int in [0, 2**64), got {s}")
    if top_k is not None or top_p is not None or temperature != 0:
        stand_in = root_only(np.zeros(n, dtype=np.int64))
        verify(stand_in, np.zeros((n, 1)), temperature=temperature, top_k=top_k, top_p=top_p)
    return float(temperature)


_INT64_MAX = (1 << 63) - 1


def _check_target(target: Any) -> None:
    """A target has the protocol's methods: named before anything runs, not as an
    AttributeError (after its prefill, for a target without `forward_tree`)."""
    methods = ("prefill", "forward_tree", "accept")
    missing = [m for m in methods if not callable(getattr(target, m, None))]
    if missing:
        raise TypeError(
            f"target: expected a TargetModel (prefill, forward_tree, accept), got "
            f"{type(target).__name__} without {', '.join(missing)}"
        )


def _check_drafter(drafter: Any) -> None:
    """A drafter has the protocol's methods (None decodes autoregressively): named before the
    target's prefill, not as an AttributeError after it."""
    if drafter is None:
        return
    missing = [m for m in ("start", "propose", "commit") if not callable(getattr(drafter, m, None))]
    if missing:
        raise TypeError(
            f"drafter: expected a Drafter (start, propose, commit) or None, got "
            f"{type(drafter).__name__} without {', '.join(missing)}"
        )


def _check_prompts(input_ids: Sequence[Sequence[int]], vocab_size: int | None) -> list[list[int]]:
    if isinstance(input_ids, (str, bytes)) or not isinstance(input_ids, Sequence):
        raise TypeError("input_ids: expected a sequence of token sequences")
    if len(input_ids) == 0:
        raise ValueError("input_ids: expected at least one prompt")
    prompts = []
    for b, prompt in enumerate(input_ids):
        # A tensor (on any device) as a list: numpy reads CPU memory only.
        tokens: Any = prompt.tolist() if _torch.is_tensor(prompt) else prompt  # type: ignore[attr-defined]
        try:
            row = np.asarray(tokens)
        except (ValueError, TypeError):  # ragged: numpy's "inhomogeneous shape"
            raise TypeError(f"input_ids[{b}]: expected a sequence of int token ids") from None
        # numpy reads True among ints as 1: a bool is not a token id.
        if isinstance(tokens, (list, tuple)) and any(
            isinstance(t, (bool, np.bool_)) for t in tokens
        ):
            raise TypeError(f"input_ids[{b}]: a bool among the token ids; give ints")
        if row.ndim != 1 or not (row.size == 0 or row.dtype.kind in "iu"):
            raise TypeError(
                f"input_ids[{b}]: expected a sequence of int token ids, got dtype {row.dtype} "
                f"shape {row.shape}"
            )
        if row.size == 0:
            raise ValueError(f"input_ids[{b}]: empty prompt")
        low, high = int(row.min()), int(row.max())
        if low < 0:
            raise ValueError(f"input_ids[{b}]: negative token id {low}")
        if vocab_size is not None and high >= vocab_size:
            raise ValueError(
                f"input_ids[{b}]: token id {high} is outside the target's vocabulary "
                f"[0, {vocab_size})"
            )
        prompts.append(row.tolist())
    return prompts


def generate(
    target: TargetModel,
    drafter: Drafter | None,
    input_ids: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
) -> Generation:
    """Generates up to `max_new_tokens` tokens per prompt with tree speculative decoding.

    `drafter=None` decodes autoregressively through the same loop. `temperature=0` is greedy;
    otherwise each token is sampled from the target's distribution after `temperature`, `top_k`
    and `top_p` (lossless; `seed`, an int in `[0, 2**64)`, makes the run reproducible). A
    request stops after `max_new_tokens` tokens or after emitting `eos_token_id` (one id, or
    a sequence of them, as HF's generation configs give it); tokens accepted past either are
    dropped. A request with `r` tokens left is verified only to depth `r - 1`. A finished
    request stays in the batch with root-only trees until every request is done (as HF's
    `generate` keeps finished rows): the target's batch never changes shape; a target with
    `retire(rows)` is told, and stops advancing those rows.
    """
    # A Python int: a numpy uint64 made the lengths left float64 (uint64 - int64). A limit
    # past int64 is no limit a run can reach: clamped, so the lengths left stay int64.
    max_new_tokens = min(int_arg(max_new_tokens, "max_new_tokens", 1), _INT64_MAX)
    _check_drafter(drafter)
    _check_target(target)
    vocab_size = getattr(target, "vocab_size", None)
    prompts = _check_prompts(input_ids, vocab_size)
    max_positions = getattr(target, "max_positions", None)
    # Row b's root (its last emitted token, e emitted) sits at position len(prompt) + e - 1,
    # its depth-d node at that + d: `room[b] - e` is the deepest depth below max_positions.
    room = (
        None
        if max_positions is None
        else int(max_positions) - np.array([len(p) for p in prompts], dtype=np.int64)
    )
    eos_ids = _check_eos(eos_token_id, vocab_size)
    temperature = _check_sampling(temperature, top_k, top_p, seed, len(prompts))
    greedy = temperature == 0.0
    sampling: dict[str, Any] = (
        {} if greedy else {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    )
    clock = time.perf_counter
    n = len(prompts)
    out = Generation([[] for _ in range(n)], [[] for _ in range(n)], forwards=[1] * n)
    wall0 = clock()

    sync = getattr(target, "synchronize", None)
    retire = getattr(target, "retire", None)
    t0 = clock()
    prefill = target.prefill(prompts)
    if sync is not None:
        sync()
    out.prefill_s = out.target_s = clock() - t0

    # The prefill's last row per prompt is "node 0 of a root-only tree": verify picks the
    # first token with exactly the rules every later token gets.
    t0 = clock()
    last = np.array([p[-1] for p in prompts], dtype=np.int64)
    first = (
        verify(root_only(last), prefill.logits)
        if greedy
        else verify(root_only(last), prefill.logits, seed=_step_seed(seed, 0), **sampling)
    )
    assert isinstance(first, BatchVerifyResult)
    out.verify_s += clock() - t0
    roots = np.array(first.tokens[:, 0], dtype=np.int64)
    active = np.ones(n, dtype=bool)
    for b in range(n):
        _emit(out, b, roots[b : b + 1], max_new_tokens, eos_ids, active)
    if retire is not None and not active.all():
        retire(np.flatnonzero(~active))

    # A run that fails part-way (a target error, an interrupt) still lets the drafter let go
    # of its requests: an index shared across batches would otherwise keep them forever.
    with _finished_on_failure(drafter):
        if drafter is not None:
            t0 = clock()
            drafter.start(prompts, roots.copy(), prefill)
            out.draft_s += clock() - t0
        build0 = float(getattr(drafter, "build_seconds", 0.0))
        layout0 = float(getattr(target, "layout_seconds", 0.0))

        while active.any():
            out.steps += 1
            # The loop's own bookkeeping, outside every timer (a greedy step draws nothing).
            step_seed = None if greedy else _step_seed(seed, out.steps)
            rows = np.flatnonzero(active).tolist()  # running this step
            if drafter is None:
                # The root-only batch autoregressive decoding verifies: specsched's tree work.
                t0 = clock()
                trees = root_only(roots)
                out.build_s += clock() - t0
            else:
                t0 = clock()
                trees = drafter.propose(roots.copy(), active.copy())
                out.draft_s += clock() - t0
                if not isinstance(trees, TreeBatch):
                    kind = type(trees).__name__
                    raise ValueError(f"drafter.propose: returned a {kind}, expected a TreeBatch")
                if trees.num_trees != n:
                    raise ValueError(f"drafter.propose: {trees.num_trees} trees for {n} requests")
                offsets = trees.offsets
                if not np.array_equal(trees.tokens[offsets[:-1]], roots):
                    raise ValueError(
                        "drafter.propose: a tree's root is not its request's last token"
                    )
                # A request with r tokens left can use a path of at most r tokens: the drafts at
                # depth <= r - 1 and the bonus token (deeper nodes would be verified for nothing,
                # at positions no autoregressive run of the request reaches); nor nodes past the
                # target's last position; a finished row, its root alone. The cut is a specsched
                # call: only when some tree is deeper than its row can use (the shipped drafters
                # give finished rows the root alone).
                shortest = min(max_new_tokens - len(out.tokens[b]) for b in rows)
                if room is not None:
                    shortest = min(
                        shortest, min(int(room[b]) - len(out.tokens[b]) for b in rows) + 1
                    )
                if trees.max_depth >= shortest or (
                    len(rows) < n and bool((np.diff(offsets)[~active] > 1).any())
                ):
                    # Each row's deepest usable level, as the loop's bookkeeping; the cut
                    # itself is specsched's tree work, not the drafter's. A root already past
                    # the last position keeps depth 0: the target refuses it, as it would
                    # refuse the autoregressive step.
                    emitted = np.fromiter(map(len, out.tokens), np.int64, n)
                    deepest = max_new_tokens - emitted - 1
                    if room is not None:
                        deepest = np.maximum(np.minimum(deepest, room - emitted), 0)
                    deepest = np.where(active, deepest, 0)
                    t0 = clock()
                    trees = trees.limit_depth(deepest)
                    out.build_s += clock() - t0
            t1 = clock()
            step = target.forward_tree(trees)
            if sync is not None:
                sync()
            t2 = clock()
            # Greedy: `verify(trees, logits)` alone, which `verify` answers without handling
            # options (1-4 µs less a step in the demo's loop).
            result = (
                verify(trees, step.logits)
                if greedy
                else verify(trees, step.logits, seed=step_seed, **sampling)
            )
            assert isinstance(result, BatchVerifyResult)
            t3 = clock()

            # The loop's bookkeeping, outside every timer: the tokens each row emits, its
            # accepted path and bonus cut after EOS (0 for a row that had finished).
            num_accepted = result.num_accepted
            emitted = result.tokens
            kept = np.zeros(n, dtype=np.int64)
            finished: list[int] = []
            cut = False
            for b in rows:
                k = int(num_accepted[b])
                out.forwards[b] += 1
                row = out.tokens[b]
                before = len(row)
                if _emit(out, b, emitted[b, : k + 1], max_new_tokens, eos_ids, active):
                    finished.append(b)
                kept[b] = len(row) - before
                cut |= bool(kept[b] <= k)
                # Drafts the row emitted: a path cut at EOS or at the length limit keeps fewer
                # than the verifier accepted, and the tokens past the cut never existed.
                out.accepted[b].append(min(k, int(kept[b])))
                # The next root is the last token emitted (the bonus, or the EOS a cut path
                # ended on), which a drafter sees as its request's last token.
                roots[b] = row[-1]

            t4 = clock()
            # The target keeps what the row emitted, as an autoregressive run would have: a
            # path cut after EOS commits its tokens up to the EOS, not the accepted drafts
            # past it (a retired row's root-only result stands as it is).
            target.accept(
                result.truncate(np.where(kept > 0, kept, num_accepted + 1)) if cut else result
            )
            if sync is not None:
                sync()
            t5 = clock()
            out.target_s += t2 - t1
            out.verify_s += t3 - t2
            out.kv_s += t5 - t4
            out.step_nodes.append(int(trees.num_nodes))
            if drafter is not None:
                t6 = clock()
                drafter.commit(trees, result, step, kept)
                out.draft_s += clock() - t6
            if finished and retire is not None and active.any():
                retire(np.array(finished, dtype=np.int64))

    if drafter is not None:
        built = float(getattr(drafter, "build_seconds", 0.0)) - build0
        out.build_s += built
        out.draft_s -= built
        finish = getattr(drafter, "finish", None)
        if finish is not None:
            finish()
    # specsched's layouts inside the target's forwards: specsched's time, not the target's.
    out.layout_s = float(getattr(target, "layout_seconds", 0.0)) - layout0
    out.target_s -= out.layout_s
    out.wall_s = clock() - wall0
    return out


@contextlib.contextmanager
def _finished_on_failure(drafter: Drafter | None) -> Iterator[None]:
    """Calls the drafter's optional `finish` when the block raises, then re-raises (an error
    `finish` raises then is dropped: the first failure is the one to report)."""
    try:
        yield
    except BaseException:
        finish = getattr(drafter, "finish", None)
        if finish is not None:
            with contextlib.suppress(Exception):
                finish()
        raise


def _emit(
    out: Generation,
    b: int,
    tokens: np.ndarray,
    max_new_tokens: int,
    eos_ids: frozenset[int],
    active: np.ndarray,
) -> bool:
    """Appends request b's newly committed tokens, cut at EOS and at the length limit; True
    when the request finished."""
    row = out.tokens[b]
    for tok in tokens.tolist():
        row.append(tok)
        if tok in eos_ids or len(row) >= max_new_tokens:
            active[b] = False
            return True
    return False
