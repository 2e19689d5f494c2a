"""EAGLE-style drafters for the decode loop (`specsched.generate`), driving an `EagleHead`.

The head keeps its own KV cache `[2, B, H, S, D]`. Draft position p holds the pair
(target feature f_p, token x_{p+1}); its output predicts f_{p+1}, whose LM-head logits give the
candidates for x_{p+2}. After each verify step the accepted path's pairs (the target's features
on the path, each with the token that followed it) are *pending*; the next proposal feeds them
in one head forward (EAGLE's "accepted tokens" pass), whose last output drafts depth 1. Tree
tokens are then fed level by level after the committed entries and forgotten afterwards:
committed lengths only grow by what the target accepted.

- `EagleDrafter`: EAGLE-2/3 dynamic trees. Each level keeps the best `topk` of the `topk²`
  children by cumulative log probability and the final tree is the best `budget - 1`
  candidates, all bookkeeping in specsched's Rust `DynamicTreeBuilder`.
- `EagleChainDrafter`: the greedy chain (the head's top-1 at every level, as vLLM's EAGLE
  proposer drafts). A chain needs no per-level selection, so it crosses into specsched once
  per step (the chain `TreeBatch`), not once per level.
- `EagleStaticDrafter`: a fixed topology (choices, e.g. from `specsched.optimal_tree` or a
  published EAGLE/Medusa tree) filled with the head's rank-r candidate at each rank-r child.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from specsched._args import float_arg, int_arg
from specsched._core import MAX_NODES, DynamicTreeBuilder, Tree, TreeBatch
from specsched.generate import TargetStep
from specsched.models.tiny import EagleHead, TinyLM, cache_mask, check_headroom, grow_seq

_F32_TINY = float(torch.finfo(torch.float32).tiny)


def _check_pair(target: Any, head: Any) -> None:
    """A TinyLM target and an EagleHead drafting for it (same width, dtype and device), named
    when constructing a drafter rather than as a torch error after the target's prefill."""
    if not isinstance(target, TinyLM):
        raise TypeError(
            f"target: expected the TinyLM the head drafts for, got {type(target).__name__} "
            "(a TinyTarget wraps one: pass its .model)"
        )
    if not isinstance(head, EagleHead):
        raise TypeError(f"head: expected an EagleHead, got {type(head).__name__}")
    if head.cfg.d_model != target.cfg.d_model:
        raise ValueError(
            f"head: d_model {head.cfg.d_model} does not match the target's {target.cfg.d_model}"
        )
    t, h = next(target.parameters()), next(head.parameters())
    if (h.dtype, h.device) != (t.dtype, t.device):
        raise ValueError(
            f"head: {h.dtype} on {h.device}, but the target is {t.dtype} on {t.device}"
        )


class _HeadState:
    """The head's cache, committed lengths and pending (feature, next token) pairs."""

    def __init__(
        self, target: TinyLM, head: EagleHead, headroom: int, temperature: float = 1.0
    ) -> None:
        _check_pair(target, head)
        # Finite: at inf every candidate scores the same (uniform drafts, nothing ranked).
        temperature = float_arg(temperature, "temperature")
        if not 0 < temperature < float("inf"):
            raise ValueError(f"temperature: expected a finite value > 0, got {temperature}")
        headroom = check_headroom(headroom, target.cfg.max_positions)
        self.target, self.head, self.headroom = target, head, headroom
        self.temperature = temperature
        param = next(head.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.cache = torch.empty(0)
        self.lengths = torch.zeros(0, dtype=torch.int64)
        self.pending_features: list[torch.Tensor] = []
        self.pending_tokens: list[torch.Tensor] = []
        self.build_seconds = 0.0

    def start(
        self, prompts: Sequence[Sequence[int]], first_tokens: np.ndarray, prefill: TargetStep
    ) -> None:
        b = len(prompts)
        cfg = self.head.cfg
        shape = (2, b, cfg.n_heads, 0, cfg.head_dim)
        empty = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.cache = grow_seq(empty, 3, 1, self.headroom)
        self.lengths = torch.zeros(b, dtype=torch.int64, device=self.device)
        features = prefill.features
        if features is None:
            raise ValueError(
                "prefill: the target returned no features (hidden states); an EAGLE head "
                "drafts from them (HFTarget needs features=True)"
            )
        self.pending_features = [features[i, : len(p)] for i, p in enumerate(prompts)]
        self.pending_tokens = [
            torch.as_tensor([*p[1:], int(first_tokens[i])], device=self.device)
            for i, p in enumerate(prompts)
        ]

    def draft_logprobs(self, predicted: torch.Tensor) -> torch.Tensor:
        logits = self.target.logits(predicted).float()
        if self.temperature != 1:
            # The row's maximum first: logits over a tiny temperature overflowed float32 to
            # inf, and log_softmax made NaN of inf - inf; below the maximum they go to -inf.
            # A temperature under float32's smallest normal divides as that one (torch reads
            # the divisor as float32: 5e-324 became 0, and 0 / 0 NaN), as the device sampler
            # clamps its own.
            divisor = max(self.temperature, _F32_TINY)
            logits = (logits - logits.amax(-1, keepdim=True)) / divisor
        return torch.log_softmax(logits, -1)

    def feed(
        self,
        features: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        columns: torch.Tensor,
        tree_mask: torch.Tensor,
    ) -> torch.Tensor:
        """One head forward over `[B, n]` inputs written at `lengths + columns` (columns
        `[n]` or `[B, n]`), attending to the committed entries and `tree_mask [B, n, m]` over
        the tree columns `lengths + 0..m`."""
        needed = int(self.lengths.max()) + tree_mask.shape[-1]
        self.cache = grow_seq(self.cache, 3, needed, self.headroom)
        # A draft past the model's last position is past its request's token budget too, and
        # `generate` cuts it before the target sees it: the head scores it at the last
        # position rather than failing the step.
        positions = positions.clamp(max=self.head.cfg.max_positions - 1)
        write_at = self.lengths[:, None] + columns
        return self.head.step(
            features,
            self.target.embed(tokens),
            positions,
            write_at,
            cache_mask(self.lengths, tree_mask),
            self.cache,
        )

    def feed_pending(self) -> torch.Tensor:
        """Feeds every row's pending pairs; returns the last output per row `[B, d]` (the
        predicted feature at the root's position) and commits them."""
        counts = torch.as_tensor([t.shape[0] for t in self.pending_tokens], device=self.device)
        b, m = counts.shape[0], int(counts.max())
        d = self.head.cfg.d_model
        features = torch.zeros((b, m, d), dtype=self.dtype, device=self.device)
        tokens = torch.zeros((b, m), dtype=torch.int64, device=self.device)
        for i in range(b):
            features[i, : counts[i]] = self.pending_features[i]
            tokens[i, : counts[i]] = self.pending_tokens[i]
        columns = torch.arange(m, device=self.device)
        causal = torch.ones((m, m), dtype=torch.bool, device=self.device).tril().expand(b, m, m)
        out = self.feed(features, tokens, self.lengths[:, None] + columns, columns, causal)
        self.lengths = self.lengths + counts
        return out[torch.arange(b, device=self.device), counts - 1]

    def commit(self, trees: TreeBatch, result: Any, step: TargetStep) -> None:
        accepted = result.accepted_nodes
        kept = result.num_accepted.astype(np.int64) + 1
        offsets = trees.offsets
        flat = np.concatenate([offsets[i] + accepted[i, : kept[i]] for i in range(len(kept))])
        features = step.features[torch.as_tensor(flat, device=step.features.device)]
        tokens = torch.tensor(result.tokens, device=self.device)  # copies the read-only view
        self.pending_features = list(features.to(self.dtype).split(kept.tolist()))
        self.pending_tokens = [tokens[i, : kept[i]] for i in range(len(kept))]


class _HeadDrafter:
    """What every head drafter shares: the head's state, start, commit, builder time."""

    state: _HeadState
    # Per pattern of running rows (`active.tobytes()`): the flat parents and offsets of the
    # topology for each running row and the root alone for each finished one, and which of
    # the `[B, n]` tokens they keep (None: all). Rows only finish, so a batch meets at most
    # B + 1 patterns.
    _layouts: dict[bytes, tuple[np.ndarray, np.ndarray, np.ndarray | None]]

    def _fixed_trees(
        self, parents: np.ndarray, tokens: torch.Tensor, active: np.ndarray
    ) -> TreeBatch:
        """`tokens [B, n]` over copies of one topology (`parents [n]`) as a TreeBatch, the root
        alone for a finished row (`active[b] == False`: the loop would cut its tree to that).
        Only the specsched call counts as build time; a layout is made once per pattern."""
        n = tokens.shape[1]
        active = np.asarray(active, dtype=bool)
        key = active.tobytes()
        if key not in self._layouts:
            sizes = np.where(active, n, 1)
            flat_parents = np.concatenate([parents if a else parents[:1] for a in active])
            offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            take = None
            if not active.all():
                take = np.concatenate([np.arange(int(s)) + r * n for r, s in enumerate(sizes)])
            self._layouts[key] = (flat_parents.astype(np.int32), offsets, take)
        flat_parents, offsets, take = self._layouts[key]
        flat = tokens.reshape(-1).cpu().numpy()
        if take is not None:
            flat = flat[take]
        t0 = time.perf_counter()
        trees = TreeBatch.from_flat(flat_parents, flat, offsets)
        self.state.build_seconds += time.perf_counter() - t0
        return trees

    @property
    def build_seconds(self) -> float:
        return self.state.build_seconds

    def start(
        self, input_ids: Sequence[Sequence[int]], first_tokens: np.ndarray, prefill: TargetStep
    ) -> None:
        self.state.start(input_ids, first_tokens, prefill)
        self._layouts = {}

    def commit(self, trees: TreeBatch, result: Any, step: TargetStep, kept: np.ndarray) -> None:
        # A row's head state matters only while it runs, and then it kept its whole path.
        self.state.commit(trees, result, step)


class EagleDrafter(_HeadDrafter):
    """EAGLE-2/3 dynamic tree drafting with specsched's `DynamicTreeBuilder`.

    Candidates are ranked by cumulative log probability of softmax(head logits /
    `temperature`): the tree keeps the nodes most likely to be accepted, so the probabilities
    should estimate acceptance. `scripts/train_tiny.py` fits the temperature that makes them
    predict the target's greedy token (`head_greedy_temperature` in the shipped config).
    Drafting stops before `depth` levels once the builder is `settled` (no deeper candidate
    can enter any request's tree): the same trees, fewer head forwards. A finished request
    (`active[b] == False`) gets its root alone from the builder, and its drafts never keep
    the others drafting.
    """

    def __init__(
        self,
        target: TinyLM,
        head: EagleHead,
        *,
        topk: int = 8,
        depth: int = 6,
        budget: int = 48,
        temperature: float = 1.0,
        headroom: int = 512,
    ) -> None:
        # First: it checks the target and head the rest reads.
        self.state = _HeadState(target, head, headroom, temperature)
        self.topk, self.depth, self.budget = (
            int_arg(topk, "topk", 1),
            int_arg(depth, "depth", 1),
            int_arg(budget, "budget", 1),
        )
        if topk > target.cfg.vocab_size:
            raise ValueError(
                f"topk: {topk} candidates from a vocabulary of {target.cfg.vocab_size}"
            )
        # The builder's own checks of the three together (a budget past the 1 + topk * depth
        # nodes drafted), here rather than in `start` after the target's prefill.
        DynamicTreeBuilder(1, self.topk, self.depth, self.budget)
        self.builder: DynamicTreeBuilder | None = None
        self.io: _BuilderIO | None = None

    def start(
        self, input_ids: Sequence[Sequence[int]], first_tokens: np.ndarray, prefill: TargetStep
    ) -> None:
        super().start(input_ids, first_tokens, prefill)
        self.builder = DynamicTreeBuilder(len(input_ids), self.topk, self.depth, self.budget)
        self.io = _BuilderIO(self.builder)

    @torch.inference_mode()
    def propose(self, roots: np.ndarray, active: np.ndarray) -> TreeBatch:
        state, builder, io, k = self.state, self.builder, self.io, self.topk
        if builder is None or io is None:
            raise RuntimeError("propose: call start() first")
        clock = time.perf_counter
        dev = state.device
        root_out = state.feed_pending()
        # The roots, their positions, the running rows and the draft's top-k go straight into
        # the builder's buffers (the root's top-k into slot 0): those writes are the drafter's
        # cost; the builder's starts at t0.
        np.copyto(io.root_tokens, roots)
        np.copyto(io.active, active)
        if dev.type == "cpu":
            torch.sub(state.lengths, 1, out=io.prefix_lens)
        else:
            io.prefix_lens.copy_(state.lengths - 1)
        io.put_topk(state.draft_logprobs(root_out), k, slot=0)
        t0 = clock()
        settled = builder.start_in_place()
        state.build_seconds += clock() - t0
        features = root_out[:, None].expand(-1, k, -1)
        slots = torch.arange(k, device=dev)
        out = None
        for level in range(1, self.depth):
            if settled:
                # No deeper candidate can enter any request's tree: the same trees as at
                # full depth, without the remaining head forwards.
                break
            if out is not None:
                # The new frontier's parents' features, gathered only when a level follows.
                features = out.gather(1, io.parent_index.to(dev)[:, :, None].expand_as(out))
            # The step the builder wrote: read here, before the next call overwrites it.
            out = state.feed(
                features,
                io.tokens.to(dev),
                io.positions.to(dev),
                (level - 1) * k + slots,
                io.attention_mask[:, :, : level * k].to(dev),
            )
            io.put_topk(state.draft_logprobs(out), k)
            t0 = clock()
            settled = builder.expand_in_place()
            state.build_seconds += clock() - t0
        t0 = clock()
        # Depth first: the head's best path is nodes 0, 1, 2, ..., so an accepted prefix of it
        # needs no KV moves.
        trees = builder.build_in_place("depth_first")
        state.build_seconds += clock() - t0
        return trees


class _BuilderIO:
    """Torch views of a `DynamicTreeBuilder`'s buffers (zero-copy, on the host): the draft's
    top-k is written into them and each step read from them, so a draft level allocates and
    converts nothing on the builder's side."""

    def __init__(self, builder: DynamicTreeBuilder) -> None:
        buf = builder.buffers
        self.root_tokens = buf.root_tokens  # written from the loop's numpy roots
        self.active = buf.active  # and its running rows
        self.prefix_lens = torch.from_numpy(buf.prefix_lens)
        self.topk_tokens = torch.from_numpy(buf.topk_tokens)
        self.topk_logprobs = torch.from_numpy(buf.topk_logprobs)
        self.tokens = torch.from_numpy(buf.tokens)
        self.parent_index = torch.from_numpy(buf.parent_index)
        self.positions = torch.from_numpy(buf.positions)
        self.attention_mask = torch.from_numpy(buf.attention_mask)

    def put_topk(self, logprobs: torch.Tensor, k: int, slot: int | None = None) -> None:
        """The top-`k` of `logprobs` (`[B, K, V]`, or `[B, V]` into frontier `slot`)."""
        tokens, values = self.topk_tokens, self.topk_logprobs
        if slot is not None:
            tokens, values = tokens[:, slot], values[:, slot]
        if logprobs.shape[:-1] != values.shape[:-1] or k != values.shape[-1]:
            # `out=` would quietly resize the views instead of failing.
            raise ValueError(
                f"put_topk: top-{k} of {tuple(logprobs.shape)} does not fit {tuple(values.shape)}"
            )
        if logprobs.device.type == "cpu" and logprobs.dtype == values.dtype:
            torch.topk(logprobs, k, dim=-1, out=(values, tokens))
        else:
            top = logprobs.topk(k, dim=-1)
            values.copy_(top.values)
            tokens.copy_(top.indices)


class EagleChainDrafter(_HeadDrafter):
    """The greedy chain: the head's top-1 at each of `depth` levels (`depth + 1` verified
    tokens). Same drafts as `EagleDrafter(topk=1, depth=depth, budget=depth + 1)`, which pays
    one builder call per level for a selection a chain does not need."""

    def __init__(
        self, target: TinyLM, head: EagleHead, *, depth: int = 6, headroom: int = 512
    ) -> None:
        depth = int_arg(depth, "depth", 1)
        if depth > MAX_NODES - 1:
            raise ValueError(f"depth: {depth} drafts, a tree holds at most {MAX_NODES - 1}")
        self.depth = depth
        self.state = _HeadState(target, head, headroom)
        self.parents = np.arange(-1, depth, dtype=np.int32)  # node i's parent is i - 1
        self._layouts = {}

    @torch.inference_mode()
    def propose(self, roots: np.ndarray, active: np.ndarray) -> TreeBatch:
        state, depth = self.state, self.depth
        dev = state.device
        b = roots.shape[0]
        tokens = torch.empty((b, depth + 1), dtype=torch.int64, device=dev)
        tokens[:, 0] = torch.as_tensor(roots, device=dev)
        ancestors = torch.ones((b, 1, depth), dtype=torch.bool, device=dev)
        out = state.feed_pending()  # predicts the feature at the root's position
        for level in range(1, depth + 1):
            tokens[:, level] = state.draft_logprobs(out).topk(1, dim=-1).indices[:, 0]
            if level == depth:
                break  # the last draft is verified, never fed
            out = state.feed(
                out[:, None],
                tokens[:, level : level + 1],
                state.lengths[:, None] - 1 + level,
                torch.tensor([level - 1], device=dev),
                ancestors[:, :, :level],
            )[:, 0]
        return self._fixed_trees(self.parents, tokens, active)


class EagleStaticDrafter(_HeadDrafter):
    """A fixed tree (choice paths) whose rank-r children take the head's r-th candidate."""

    def __init__(
        self,
        target: TinyLM,
        head: EagleHead,
        choices: Sequence[Sequence[int]],
        *,
        headroom: int = 512,
    ) -> None:
        # Depth first, children by rank: the head's best path is nodes 0, 1, 2, ..., so when
        # the target accepts (a prefix of) it the accepted KV entries are already in place and
        # compaction moves nothing.
        # First: it checks the target and head the rest reads.
        self.state = _HeadState(target, head, headroom)
        self.topology = Tree.from_choices(choices, order="depth_first")
        parents = self.topology.parents
        depths = self.topology.depths
        # Without tokens, a node's token is its rank among its siblings (its path's last
        # entry: a sparse choice list such as [(1,)] takes the head's second candidate).
        ranks = self.topology.tokens.astype(np.int64)
        if ranks.size > 1 and ranks[1:].max() >= target.cfg.vocab_size:
            raise ValueError(
                f"choices: rank {ranks[1:].max()} needs more candidates than the vocabulary's "
                f"{target.cfg.vocab_size}"
            )
        self.parents = np.asarray(parents)
        # Per level t >= 1, fixed by the topology: its nodes, their parents, the distinct
        # parents (whose head outputs give the candidates), each node's slot among those
        # parents, its sibling rank, and how many candidates per parent the level needs.
        self.levels = []
        for t in range(1, int(depths.max()) + 1):
            nodes = np.flatnonzero(depths == t)
            node_parents = self.parents[nodes]
            sources = np.unique(node_parents)
            self.levels.append(
                (
                    nodes,
                    node_parents,
                    sources,
                    np.searchsorted(sources, node_parents),
                    ranks[nodes],
                    int(ranks[nodes].max()) + 1,
                )
            )
        self.ancestors = torch.as_tensor(self.topology.attention_mask()[:, 1:])
        self._layouts = {}

    @torch.inference_mode()
    def propose(self, roots: np.ndarray, active: np.ndarray) -> TreeBatch:
        state = self.state
        dev = state.device
        b, n = roots.shape[0], self.topology.num_nodes
        tokens = torch.zeros((b, n), dtype=torch.int64, device=dev)
        tokens[:, 0] = torch.as_tensor(roots, device=dev)
        outputs = torch.zeros((b, n, state.head.cfg.d_model), dtype=state.dtype, device=dev)
        outputs[:, 0] = state.feed_pending()
        ancestors = self.ancestors.to(dev)
        for depth, (nodes, parents, sources, slot, rank, need) in enumerate(self.levels, 1):
            cands = state.draft_logprobs(outputs[:, sources]).topk(need, dim=-1)
            slots, ranks = torch.as_tensor(slot, device=dev), torch.as_tensor(rank, device=dev)
            tokens[:, nodes] = cands.indices[:, slots, ranks]
            if depth == len(self.levels):
                break  # leaves are verified, never fed
            columns = torch.as_tensor(nodes - 1, device=dev)
            outputs[:, nodes] = state.feed(
                outputs[:, parents],
                tokens[:, nodes],
                state.lengths[:, None] - 1 + depth,
                columns,
                ancestors[nodes][:, : int(nodes.max())].expand(b, -1, -1),
            )
        return self._fixed_trees(self.parents, tokens, active)
