"""Typed stubs of the Rust extension `specsched._core` (the API users see in their editor)."""

from typing import Any, ClassVar, Literal, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "DRAFT_SUM_TOL",
    "MAX_BATCH_NODES",
    "MAX_NODES",
    "MAX_OUTPUT_ELEMENTS",
    "MAX_TOKEN_ID",
    "AcceptanceStats",
    "BatchVerifyResult",
    "Draft",
    "DraftBuffers",
    "DynamicTreeBuilder",
    "NgramDrafter",
    "SuffixDrafter",
    "Tree",
    "TreeBatch",
    "VerifyResult",
    "__version__",
    "cache_moves",
    "check_cache_buffers",
    "choose_tree",
    "commit_slots",
    "compact_kv",
    "expected_accept_length",
    "key_by_storage",
    "kv_compaction_plan",
    "optimal_tree",
    "sglang_build_tree",
    "sglang_organize",
    "sglang_verify_tree_greedy",
    "sim_best_tree",
    "sim_chain_expected_tokens",
    "sim_expected_tokens",
    "sim_path_probs",
    "sim_simulate",
    "top_n_tree",
    "verify_greedy",
    "verify_sampled",
    "verify_target_tokens",
]

__version__: str
MAX_NODES: int
MAX_BATCH_NODES: int
DRAFT_SUM_TOL: float
MAX_OUTPUT_ELEMENTS: int

MAX_TOKEN_ID: int

@final
class Tree:
    """A draft tree: node 0 is the root (the last committed token), `parents[i] < i`."""

    def __new__(cls, parents: npt.ArrayLike, tokens: npt.ArrayLike) -> Tree:
        """Validates int32/int64 `parents [N]` and int32/int64/uint32 `tokens [N]`."""
    @staticmethod
    def chain(tokens: npt.ArrayLike) -> Tree:
        """Root plus a linear draft: `tokens[0]` is the root."""
    @staticmethod
    def from_choices(
        choices: Any,
        tokens: npt.ArrayLike | None = None,
        order: Literal["breadth_first", "depth_first"] = "breadth_first",
    ) -> Tree:
        """A tree from Medusa/EAGLE/vLLM/TensorRT-LLM choice paths, nodes sorted by (len, path)
        or, depth first, by path."""
    @property
    def num_nodes(self) -> int:
        """Number of nodes N, root included."""
    @property
    def max_depth(self) -> int:
        """Depth of the deepest node (the root has depth 0)."""
    @property
    def num_leaves(self) -> int:
        """Number of nodes without children."""
    @property
    def parents(self) -> npt.NDArray[np.int32]:
        """Parent of each node, -1 for the root (read-only view)."""
    @property
    def tokens(self) -> npt.NDArray[np.int64]:
        """Token of each node (read-only view)."""
    @property
    def depths(self) -> npt.NDArray[np.int32]:
        """Depth of each node (read-only view)."""
    def __len__(self) -> int: ...
    def __eq__(self, other: object, /) -> bool: ...
    # Equality by value, no hash (as for a list): not a set member or dict key.
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def __reduce__(self) -> tuple[type[Tree], tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]]]:
        """Pickles as `Tree(parents, tokens)`."""
    def __copy__(self) -> Tree: ...
    def __deepcopy__(self, memo: Any, /) -> Tree: ...
    def attention_mask(
        self, prefix_len: int = 0, *, out: npt.NDArray[np.bool_] | None = None
    ) -> npt.NDArray[np.bool_]:
        """bool `[N, prefix_len + N]`: True where row i may attend (prefix, ancestors, itself)."""
    def attention_bias(
        self,
        prefix_len: int = 0,
        dtype: npt.DTypeLike | None = None,
        *,
        out: npt.NDArray[np.floating[Any]] | None = None,
    ) -> npt.NDArray[np.floating[Any]]:
        """0 / -inf `[N, prefix_len + N]` in float16, float32 (default) or float64."""
    def packed_mask(self, *, out: npt.NDArray[np.uint32] | None = None) -> npt.NDArray[np.uint32]:
        """uint32 `[N, ceil(N/32)]`: bit j of row i set iff j is i or an ancestor of i."""
    def positions(
        self, prefix_len: int = 0, *, out: npt.NDArray[np.int64] | None = None
    ) -> npt.NDArray[np.int64]:
        """int64 `[N]`: prefix_len + depth."""
    def paths(self) -> npt.NDArray[np.int32]:
        """int32 `[num_leaves, max_depth + 1]` root-to-leaf paths, -1 padded."""
    def sglang_links(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """SGLang `(retrive_next_token, retrive_next_sibling)`, -1 = none."""
    def limit_depth(self, max_depth: int) -> Tree:
        """The tree without its nodes deeper than `max_depth` (0: the root alone), order kept."""

@final
class TreeBatch:
    """B trees stored flat and ragged with CSR offsets; parents are tree-local."""

    def __new__(cls, trees: Any) -> TreeBatch:
        """Concatenates a non-empty sequence of Tree."""
    @classmethod
    def from_flat(
        cls, parents: npt.ArrayLike, tokens: npt.ArrayLike, offsets: npt.ArrayLike
    ) -> TreeBatch:
        """Validates flat tree-local parents, tokens and offsets `[B+1]`."""
    @property
    def num_trees(self) -> int:
        """Number of trees B."""
    @property
    def num_nodes(self) -> int:
        """Total node count T."""
    @property
    def max_depth(self) -> int:
        """Deepest tree's depth."""
    @property
    def max_nodes(self) -> int:
        """Largest tree's node count."""
    @property
    def offsets(self) -> npt.NDArray[np.int64]:
        """int64 `[B+1]` CSR offsets."""
    @property
    def parents(self) -> npt.NDArray[np.int32]:
        """Tree-local parents `[T]` (read-only view)."""
    @property
    def tokens(self) -> npt.NDArray[np.int64]:
        """Tokens `[T]` (read-only view)."""
    @property
    def depths(self) -> npt.NDArray[np.int32]:
        """Depths `[T]` (read-only view)."""
    def __len__(self) -> int: ...
    def __getitem__(self, index: int, /) -> Tree: ...
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickles as `TreeBatch.from_flat(parents, tokens, offsets)`."""
    def __copy__(self) -> TreeBatch: ...
    def __deepcopy__(self, memo: Any, /) -> TreeBatch: ...
    def limit_depth(self, max_depth: npt.ArrayLike) -> TreeBatch:
        """Without the nodes of tree b deeper than `max_depth[b]` (an int for every tree, or an
        int array `[B]`), order kept: a request with r tokens left can use depth <= r - 1."""
    def positions(
        self, prefix_lens: npt.ArrayLike | None = None, *, out: npt.NDArray[np.int64] | None = None
    ) -> npt.NDArray[np.int64]:
        """int64 `[T]`: prefix_b + depth."""
    def attention_mask(
        self, prefix_lens: npt.ArrayLike | None = None, *, out: npt.NDArray[np.bool_] | None = None
    ) -> npt.NDArray[np.bool_]:
        """FlashInfer ragged custom mask: each request's `[N_b, prefix_b + N_b]` mask, flat."""
    def mask_indptr(self, prefix_lens: npt.ArrayLike | None = None) -> npt.NDArray[np.int64]:
        """int64 `[B+1]`: offsets of each request's segment in the ragged mask."""
    def attention_bias(
        self,
        prefix_lens: npt.ArrayLike | None = None,
        dtype: npt.DTypeLike | None = None,
        *,
        out: npt.NDArray[np.floating[Any]] | None = None,
    ) -> npt.NDArray[np.floating[Any]]:
        """The ragged mask as 0 / -inf."""
    def packed_attention_mask(
        self, prefix_lens: npt.ArrayLike | None = None
    ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
        """FlashInfer `segment_packbits(mask, indptr, bitorder="little")`: (bytes, byte indptr)."""
    def qlen_mask(self, *, out: npt.NDArray[np.bool_] | None = None) -> npt.NDArray[np.bool_]:
        """SGLang QLEN_ONLY bool `[B, N, N]` (all trees the same size)."""
    def padded_mask(self, *, out: npt.NDArray[np.bool_] | None = None) -> npt.NDArray[np.bool_]:
        """bool `[B, Nmax, Nmax]`, False outside each tree."""
    def packed_mask(self, *, out: npt.NDArray[np.uint32] | None = None) -> npt.NDArray[np.uint32]:
        """uint32 `[T, ceil(Nmax/32)]`: each node's ancestor bits within its tree."""
    def padded_layout(
        self, prefix_lens: npt.ArrayLike | None = None
    ) -> tuple[
        npt.NDArray[np.int64],
        npt.NDArray[np.int64],
        npt.NDArray[np.bool_],
        npt.NDArray[np.int64],
        npt.NDArray[np.int64],
    ]:
        """`(tokens, positions, tree_mask, rows, cols)`: the batch as the `[B, Nmax]` batch a
        model runs. Tree b in slots `0..N_b` of row b (tokens; positions prefix_b + depth; the
        padded mask); a padding slot has token 0, position prefix_b and sees itself alone.
        `rows`, `cols` int64 `[T]`: the slot of each flat node (`out[rows, cols]`)."""
    def paths(self) -> npt.NDArray[np.int32]:
        """int32 `[B, Lmax, Dmax + 1]` root-to-leaf paths, tree-local, -1 padded."""
    def sglang_links(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """SGLang next-token / next-sibling links `[T]`, tree-local."""

@final
class VerifyResult:
    """The accepted path of one tree."""

    @property
    def accepted_nodes(self) -> npt.NDArray[np.int32]:
        """int32 `[k+1]`: 0, a1, ..., ak."""
    @property
    def tokens(self) -> npt.NDArray[np.int64]:
        """int64 `[k+1]`: accepted draft tokens, then the bonus token."""
    @property
    def num_accepted(self) -> int:
        """k, draft tokens accepted (bonus excluded)."""
    @property
    def bonus_token(self) -> int:
        """The target's token after the last accepted node."""
    @property
    def num_nodes(self) -> int:
        """Node count of the verified tree."""
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickles as its parts (accepted_nodes, tokens, num_nodes), checked when restored."""

@final
class BatchVerifyResult:
    """Accepted paths of a batch, `[B, D+1]` arrays padded with -1."""

    @property
    def num_accepted(self) -> npt.NDArray[np.int32]:
        """int32 `[B]`."""
    @property
    def accepted_nodes(self) -> npt.NDArray[np.int32]:
        """int32 `[B, D+1]`, tree-local, -1 padded."""
    @property
    def tokens(self) -> npt.NDArray[np.int64]:
        """int64 `[B, D+1]`, -1 padded."""
    @property
    def offsets(self) -> npt.NDArray[np.int64]:
        """int64 `[B+1]` offsets of the verified batch."""
    def __len__(self) -> int: ...
    def __getitem__(self, index: int, /) -> VerifyResult: ...
    def truncate(self, keep: npt.ArrayLike) -> BatchVerifyResult:
        """The result as if each row had stopped after its first `keep[b]` tokens (a path cut
        at EOS): `keep[b]` in `1..=num_accepted[b] + 1`; the last kept token is the bonus."""
    def to_sglang(
        self,
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """SGLang `verify_tree_greedy` outputs: (predicts, accept_index, accept_length)."""
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickles as its parts (num_accepted, accepted_nodes, tokens, offsets), checked when
        restored."""

def verify_target_tokens(
    tree: Tree | TreeBatch,
    target_tokens: npt.ArrayLike,
    nan_rows: npt.ArrayLike | None = None,
    no_finite_rows: npt.ArrayLike | None = None,
) -> VerifyResult | BatchVerifyResult:
    """The walk alone, given the target's choice per node; `nan_rows` / `no_finite_rows` mark
    rows the walk must not reach."""

def verify_greedy(
    tree: Tree | TreeBatch, logits: npt.ArrayLike, logits_dtype: str | None = None
) -> VerifyResult | BatchVerifyResult:
    """Greedy verification from host logits; only the visited rows are reduced."""

def verify_sampled(
    tree: Tree | TreeBatch,
    logits: npt.ArrayLike,
    temperature: npt.NDArray[np.float64],
    top_k: npt.NDArray[np.int64],
    top_p: npt.NDArray[np.float64],
    seed: int | npt.NDArray[np.uint64],
    *,
    logits_dtype: str | None = None,
    rule: str = "match",
    draft_probs: npt.ArrayLike | None = None,
    without_replacement: bool = False,
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
) -> VerifyResult | BatchVerifyResult:
    """Sampled verification from host logits ("match", "rejection" or lossy "typical")."""

def kv_compaction_plan(
    result: VerifyResult | BatchVerifyResult,
    prefix_lens: npt.ArrayLike,
    active: npt.ArrayLike | None = None,
) -> tuple[npt.NDArray[np.int64], ...]:
    """`(src, dst)` for a VerifyResult, `(req, src, dst)` for a batch (`active`: bool `[B]`,
    the requests that commit; the others move nothing)."""

def compact_kv(
    cache: npt.NDArray[Any] | list[npt.NDArray[Any]] | tuple[npt.NDArray[Any], ...],
    result: VerifyResult | BatchVerifyResult,
    prefix_lens: npt.ArrayLike,
    seq_dim: int,
    batch_dim: int | None = None,
    active: npt.ArrayLike | None = None,
) -> int | npt.NDArray[np.int64]:
    """Applies the compaction plan in place on a host buffer, or on each of a list or tuple of
    them (one shape, no two sharing memory); returns the committed lengths (a request not
    `active` moves nothing and keeps its prefix)."""

def check_cache_buffers(
    buffers: list[tuple[int, list[int], list[int], int]], listed: bool = True
) -> None:
    """The checks `compact_kv` makes of host buffers, for buffers held elsewhere given as
    `(address, shape, byte strides, itemsize)`: at least one, one shape, none whose indices
    share memory, no two that may share memory (ValueError naming `cache[i]`, or `cache` when
    not `listed`, or the entries)."""

def cache_moves(
    cache_shape: list[int],
    result: VerifyResult | BatchVerifyResult,
    prefix_lens: npt.ArrayLike,
    seq_dim: int,
    batch_dim: int | None = None,
    active: npt.ArrayLike | None = None,
) -> tuple[
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    int,
    int,
    int | npt.NDArray[np.int64],
]:
    """Checked moves `(req, src, dst, seq_dim, batch_dim, committed)` for a cache held
    elsewhere, with the committed lengths `compact_kv` returns."""

def commit_slots(
    slots: npt.ArrayLike, result: VerifyResult | BatchVerifyResult
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Paged caches: (kept, freed) slot ids."""

def key_by_storage(view: npt.NDArray[Any], tensor: Any) -> npt.NDArray[Any]:
    """`view` (of CPU tensor `tensor`'s memory) based on the tensor's storage object, so that
    rust-numpy's borrow registry sees every view of one storage as one buffer; `view` itself
    when it is not in that storage."""

def sim_chain_expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens per target call of a chain of `gamma` drafts (bonus included)."""

def sim_expected_tokens(tree: Tree, kind: str, values: list[list[float]]) -> float:
    """`1 + sum of P(path to v accepted)` under the acceptance model `(kind, values)`."""

def sim_path_probs(tree: Tree, kind: str, values: list[list[float]]) -> npt.NDArray[np.float64]:
    """Probability that the path to each node is accepted (1 at the root)."""

def sim_best_tree(
    kind: str, values: list[list[float]], budget: int, max_depth: int, max_children: int
) -> Tree:
    """The best-first tree of at most `budget` nodes under the acceptance model."""

def sim_simulate(
    tree: Tree,
    kind: str,
    values: list[list[float]],
    steps: int,
    seed: int,
    threads: int | None = None,
) -> tuple[int, npt.NDArray[np.int64]]:
    """Monte-Carlo verification: `(steps, histogram of accepted draft tokens)`."""

# Tree construction (issue 5)

def top_n_tree(
    parents: npt.ArrayLike,
    scores: npt.ArrayLike,
    budget: int,
    tokens: npt.ArrayLike | None = None,
    root_token: int = 0,
    cumulative: bool = True,
) -> tuple[Tree, npt.NDArray[np.int64]]:
    """Best `budget - 1` pool candidates (score, then shallower, then pool index) as a Tree."""

def optimal_tree(
    accept_probs: npt.ArrayLike, budget: int, max_depth: int | None = None, method: str = "auto"
) -> tuple[list[tuple[int, ...]], float]:
    """Sequoia-optimal tree as choice paths, and its expected tokens per step."""

def expected_accept_length(tree: Tree, accept_probs: npt.ArrayLike) -> float:
    """`1 + sum over draft nodes of prod accept_probs[rank]` along the path."""

def choose_tree(
    accept_probs: npt.ArrayLike, t_draft: float, t_verify: dict[int, float], max_depth: int
) -> tuple[list[tuple[int, ...]], int, int, float, float]:
    """`(choices, budget, depth, expected, time_per_token)` minimizing time per token."""

@final
class DynamicTreeBuilder:
    """Batched EAGLE-2/3 drafting: `start`, `expand` per draft step, then `build`."""

    def __new__(cls, batch: int, topk: int, depth: int, budget: int) -> DynamicTreeBuilder:
        """State for `batch` requests, top-`topk` per node, `depth` levels, `budget` nodes."""
    @property
    def batch(self) -> int:
        """Requests B."""
    @property
    def topk(self) -> int:
        """Frontier width and children per frontier node K."""
    @property
    def depth(self) -> int:
        """Deepest level the builder drafts."""
    @property
    def budget(self) -> int:
        """Nodes per built tree, root included."""
    @property
    def level(self) -> int:
        """Levels drafted so far (0 before `start`)."""
    @property
    def settled(self) -> bool:
        """True when no further level can change what `build` returns (False before start)."""
    def start(
        self,
        root_tokens: npt.ArrayLike,
        topk_tokens: npt.ArrayLike,
        topk_logprobs: npt.ArrayLike,
        prefix_lens: npt.ArrayLike | int | None = None,
        active: npt.ArrayLike | None = None,
    ) -> tuple[
        npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_], npt.NDArray[np.int64]
    ]:
        """`(tokens [B,K], parent_index [B,K], attention_mask [B,K,K], positions [B,K])`.
        `active` (bool `[B]`, None = all): the requests still running; the others build to
        their root alone and never keep the builder from settling."""
    def expand(
        self, topk_tokens: npt.ArrayLike, topk_logprobs: npt.ArrayLike
    ) -> tuple[
        npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_], npt.NDArray[np.int64]
    ]:
        """One draft step from `[B,K,K]` inputs; mask is `[B, K, level*K]`."""
    def build(
        self, order: Literal["pool", "depth_first"] = "pool"
    ) -> tuple[TreeBatch, npt.NDArray[np.int64]]:
        """`(TreeBatch, pool_index [B, budget-1])` reranked from every drafted candidate (a
        request not running: its root alone, pool row -1)."""
    @property
    def buffers(self) -> DraftBuffers:
        """Persistent buffers (made on first use) for the `*_in_place` calls."""
    def start_in_place(self) -> bool:
        """`start` from `buffers` (roots, prefix lengths, the root's top-k), into `buffers`;
        returns `settled`."""
    def expand_in_place(self) -> bool:
        """`expand` from `buffers.topk_tokens` / `buffers.topk_logprobs`, into `buffers`;
        returns `settled`."""
    def build_in_place(self, order: Literal["pool", "depth_first"] = "pool") -> TreeBatch:
        """`build`, the pool indices written into `buffers.pool_index` (no new array)."""

@final
class DraftBuffers:
    """A `DynamicTreeBuilder`'s persistent numpy buffers (views of one block): roots, prefix
    lengths and the draft's top-k go in, each step comes out, overwritten by the next call."""

    @property
    def root_tokens(self) -> npt.NDArray[np.int64]:
        """int64 `[B]`: each request's root token (read by `start_in_place`)."""
    @property
    def prefix_lens(self) -> npt.NDArray[np.int64]:
        """int64 `[B]`: tokens committed before each root (read by `start_in_place`)."""

    @property
    def topk_tokens(self) -> npt.NDArray[np.int64]:
        """int64 `[B, K, K]`: the draft's top-k per frontier slot (start reads `[:, 0]`)."""
    @property
    def topk_logprobs(self) -> npt.NDArray[np.float32]:
        """float32 `[B, K, K]`: their log probabilities."""
    @property
    def tokens(self) -> npt.NDArray[np.int64]:
        """int64 `[B, K]`: the frontier's tokens."""
    @property
    def parent_index(self) -> npt.NDArray[np.int64]:
        """int64 `[B, K]`: each frontier node's parent slot in the previous frontier."""
    @property
    def positions(self) -> npt.NDArray[np.int64]:
        """int64 `[B, K]`: prefix length + depth."""
    @property
    def attention_mask(self) -> npt.NDArray[np.bool_]:
        """bool `[B, K, depth*K]`: after level L, the first `L*K` columns; the rest False."""
    @property
    def pool_index(self) -> npt.NDArray[np.int64]:
        """int64 `[B, budget-1]`: the built trees' pool indices (written by `build_in_place`)."""
    @property
    def active(self) -> npt.NDArray[np.bool_]:
        """bool `[B]`, True when made: the requests still running (read by `start_in_place`)."""

@final
class AcceptanceStats:
    """Online acceptance counts per (depth, sibling rank), fed with verify results."""

    def __new__(cls) -> AcceptanceStats:
        """An empty accumulator."""
    def update(self, tree: Tree | TreeBatch, result: VerifyResult | BatchVerifyResult) -> None:
        """Records the verified tree(s) and their accepted paths."""
    def merge(self, other: AcceptanceStats) -> None:
        """Adds another accumulator's counts."""
    def __reduce__(
        self,
    ) -> tuple[
        type[AcceptanceStats],
        tuple[()],
        tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], int, int],
    ]:
        """Pickles as its counts (`trials`, `hits`, `steps`, accepted drafts)."""
    def __setstate__(self, state: tuple[npt.ArrayLike, npt.ArrayLike, int, int]) -> None:
        """Restores the counts `__reduce__` gave (checked: ValueError naming the first off)."""
    @property
    def steps(self) -> int:
        """Verified trees recorded."""
    @property
    def mean_accepted(self) -> float:
        """Mean accepted draft tokens per verified tree (bonus excluded)."""
    @property
    def trials(self) -> npt.NDArray[np.int64]:
        """int64 `[depths, ranks]`: children of reached nodes (by child depth - 1, rank)."""
    @property
    def hits(self) -> npt.NDArray[np.int64]:
        """int64 `[depths, ranks]`: accepted children."""
    def accept_probs(self) -> npt.NDArray[np.float64]:
        """Fitted acceptance per rank, pooled over depths."""
    def confidence_interval(
        self, z: float = 1.96
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Wilson score intervals `(low, high)` per rank."""
    def optimal_tree(
        self, budget: int, max_depth: int | None = None
    ) -> tuple[list[tuple[int, ...]], float]:
        """Sequoia-optimal tree for the fitted vector."""

def sglang_organize(
    scores: npt.ArrayLike, tokens: npt.ArrayLike, num_draft_token: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """`(top_scores_index, draft_tokens)` `[bs, N-1]` from the concatenated pool."""

def sglang_build_tree(
    parent_list: npt.ArrayLike,
    selected_index: npt.ArrayLike,
    seq_lens: npt.ArrayLike,
    seq_lens_sum: int,
    tree_mask: npt.NDArray[Any],
    positions: npt.NDArray[np.int64],
    retrive_index: npt.NDArray[np.int64],
    retrive_next_token: npt.NDArray[np.int64],
    retrive_next_sibling: npt.NDArray[np.int64],
    topk: int,
    depth: int,
    num_verify_tokens: int,
    tree_mask_mode: int,
    tokens: tuple[npt.ArrayLike, npt.ArrayLike, npt.NDArray[np.int64]] | None = None,
) -> None:
    """sgl-kernel `build_tree_efficient`: fills the five output arrays in place, and with
    `tokens = (verified_id, draft_tokens, out)` the verify-side tokens `[bs, N]` into `out`."""

def sglang_verify_tree_greedy(
    predicts: npt.NDArray[np.int32],
    accept_index: npt.NDArray[np.int32],
    accept_token_num: npt.NDArray[np.int32],
    candidates: npt.ArrayLike,
    retrive_index: npt.ArrayLike,
    retrive_next_token: npt.ArrayLike,
    retrive_next_sibling: npt.ArrayLike,
    target_predict: npt.ArrayLike,
) -> None:
    """sgl-kernel `verify_tree_greedy`: fills predicts, accept_index, accept_token_num."""

@final
class Draft:
    """A suffix drafter's proposal: the tree, per-node path probabilities and its score."""

    @property
    def tree(self) -> Tree:
        """The draft tree; node 0 is the last context token."""
    @property
    def probs(self) -> npt.NDArray[np.float64]:
        """float64 [N]: path probability of each node under the frequency model (root 1)."""
    @property
    def score(self) -> float:
        """Sum of the draft nodes' path probabilities (expected accepted length)."""
    @property
    def match_len(self) -> int:
        """Length of the matched context suffix (0: no match)."""

@final
class SuffixDrafter:
    """Suffix-trie tree drafter over request contexts and past responses (thread-safe)."""

    def __new__(cls, max_depth: int = 64, max_global_tokens: int = ...) -> SuffixDrafter: ...
    @property
    def max_depth(self) -> int:
        """Longest indexed string (match plus draft)."""
    @property
    def max_global_tokens(self) -> int:
        """Token budget of the global response cache (FIFO eviction)."""
    @property
    def num_requests(self) -> int:
        """Live requests."""
    @property
    def num_global_tokens(self) -> int:
        """Tokens held by the global response cache."""
    @property
    def num_indexed_tokens(self) -> int:
        """Tokens indexed over every live request and the global cache."""
    @property
    def memory_bytes(self) -> int:
        """Heap bytes held by every index."""
    @property
    def cached_responses(self) -> list[int]:
        """Request ids whose responses are cached, oldest first."""
    def has_request(self, request_id: int) -> bool:
        """Whether `request_id` is live."""
    def start_request(self, request_id: int, prompt: npt.ArrayLike) -> None:
        """Starts indexing a request with its prompt."""
    def append(self, request_id: int, tokens: npt.ArrayLike) -> None:
        """Appends committed tokens to a live request."""
    def finish_request(self, request_id: int, cache: bool = True) -> None:
        """Ends a request; its response enters the global cache when `cache`."""
    def remove_response(self, request_id: int) -> None:
        """Removes a cached response from the global cache."""
    def propose(
        self,
        request_id: int,
        budget: int,
        min_prob: float = 0.1,
        max_spec_factor: float = 1.0,
        *,
        chain: bool = False,
        use_global: bool = True,
    ) -> Draft:
        """Best-first count-weighted draft tree for one request."""
    def propose_batch(
        self,
        request_ids: npt.ArrayLike,
        budgets: int | npt.ArrayLike,
        min_prob: float = 0.1,
        max_spec_factor: float = 1.0,
        *,
        chain: bool = False,
        use_global: bool = True,
    ) -> TreeBatch:
        """Draft trees for many requests, in parallel with the GIL released."""

@final
class NgramDrafter:
    """vLLM's n-gram (prompt-lookup) proposer: a chain after the longest earlier match."""

    def __new__(
        cls, min_n: int = 1, max_n: int = 4, k: int = 5, max_model_len: int = ...
    ) -> NgramDrafter: ...
    @property
    def min_n(self) -> int:
        """Shortest n-gram matched."""
    @property
    def max_n(self) -> int:
        """Longest n-gram matched."""
    @property
    def k(self) -> int:
        """Most tokens proposed."""
    @property
    def max_model_len(self) -> int:
        """Context length limit (vLLM's max_model_len)."""
    def propose_tokens(self, context: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """The draft tokens vLLM would propose (possibly none)."""
    def propose(self, context: npt.ArrayLike) -> Tree:
        """The proposal as a chain whose root is the last context token."""
    def propose_batch(self, contexts: Any) -> TreeBatch:
        """Chains for many contexts, in parallel with the GIL released."""
