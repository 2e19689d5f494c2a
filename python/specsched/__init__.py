"""specsched: the host-side engine of tree speculative decoding.

Build draft trees and their attention layouts (`Tree`, `TreeBatch`), verify them against the
target's output (`verify`), and put the KV cache in order (`kv_compaction_plan`, `compact_kv`,
`commit_slots`). The hot path is Rust working on numpy / torch buffers without copies.
"""

from specsched._core import (
    MAX_BATCH_NODES,
    MAX_NODES,
    MAX_TOKEN_ID,
    BatchVerifyResult,
    Draft,
    NgramDrafter,
    SuffixDrafter,
    Tree,
    TreeBatch,
    VerifyResult,
    __version__,
)
from specsched._kv import commit_slots, compact_kv, kv_compaction_plan
from specsched._verify import verify
from specsched.decide import decide

__all__ = [
    "MAX_BATCH_NODES",
    "MAX_NODES",
    "MAX_TOKEN_ID",
    "BatchVerifyResult",
    "Draft",
    "NgramDrafter",
    "SuffixDrafter",
    "Tree",
    "TreeBatch",
    "VerifyResult",
    "__version__",
    "commit_slots",
    "compact_kv",
    "decide",
    "kv_compaction_plan",
    "verify",
]
