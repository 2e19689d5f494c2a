"""specsched: the host-side engine of tree speculative decoding.

Build draft trees and their attention layouts (`Tree`, `TreeBatch`), verify them against the
target's output (`verify`), and put the KV cache in order (`kv_compaction_plan`, `compact_kv`,
`commit_slots`). The hot path is Rust working on numpy / torch buffers without copies.
`generate` runs the whole speculative decode loop for any target and drafter that follow the
small protocols of `specsched.generate`.
"""

from specsched._core import (
    DRAFT_SUM_TOL,
    MAX_BATCH_NODES,
    MAX_NODES,
    MAX_TOKEN_ID,
    AcceptanceStats,
    BatchVerifyResult,
    Draft,
    DraftBuffers,
    DynamicTreeBuilder,
    NgramDrafter,
    SuffixDrafter,
    Tree,
    TreeBatch,
    VerifyResult,
    __version__,
    expected_accept_length,
    optimal_tree,
    top_n_tree,
)
from specsched._kv import commit_slots, compact_kv, kv_compaction_plan
from specsched._sequoia import TreeChoice, choose_tree
from specsched._verify import verify
from specsched.decide import decide
from specsched.generate import generate

__all__ = [
    "DRAFT_SUM_TOL",
    "MAX_BATCH_NODES",
    "MAX_NODES",
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
    "TreeChoice",
    "VerifyResult",
    "__version__",
    "choose_tree",
    "commit_slots",
    "compact_kv",
    "decide",
    "expected_accept_length",
    "generate",
    "kv_compaction_plan",
    "optimal_tree",
    "top_n_tree",
    "verify",
]
