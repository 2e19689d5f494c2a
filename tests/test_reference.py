"""Hand-checked cases for the pure-Python oracle (specsched.reference) itself.

The module is loaded by file path so these tests run without the compiled extension.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "python" / "specsched" / "reference.py"
_spec = importlib.util.spec_from_file_location("specsched_reference_oracle", _PATH)
assert _spec is not None and _spec.loader is not None
ref = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = ref
_spec.loader.exec_module(ref)

# 5-node tree:      0
#                 /   \
#                1     2
#               / \
#              3   4
P5 = [-1, 0, 0, 1, 1]
T5 = [100, 11, 12, 13, 14]
T, F = True, False
NINF = float("-inf")


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("parents", "tokens", "match"),
    [
        ([], [], "parents"),
        ([-1, 0], [1], "tokens"),
        ([0, 0], [1, 2], r"parents\[0\]"),
        ([-1, 0, 2], [1, 2, 3], r"parents\[2\]"),
        ([-1, 0, -1], [1, 2, 3], r"parents\[2\]"),
        ([-1, 1], [1, 2], r"parents\[1\]"),
    ],
)
def test_validate_tree_errors(parents: list[int], tokens: list[int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ref.validate_tree(parents, tokens)


def test_validate_tree_ok() -> None:
    ref.validate_tree(P5, T5)
    ref.validate_tree([-1], [7])


def test_validate_offsets() -> None:
    ref.validate_offsets([0, 5, 7], 7)
    for bad in ([0], [1, 7], [0, 3, 3, 7], [0, 5, 6]):
        with pytest.raises(ValueError, match="offsets"):
            ref.validate_offsets(bad, 7)


def test_validate_batch() -> None:
    ref.validate_batch([*P5, -1, 0], [*T5, 1, 2], [0, 5, 7])
    with pytest.raises(ValueError, match=r"parents\[6\]"):
        ref.validate_batch([*P5, -1, 1], [*T5, 1, 2], [0, 5, 7])
    with pytest.raises(ValueError, match=r"parents\[5\]"):
        ref.validate_batch([*P5, 0, 0], [*T5, 1, 2], [0, 5, 7])


# ---------------------------------------------------------------- single-tree layouts


def test_structure_5() -> None:
    assert ref.depths(P5) == [0, 1, 1, 2, 2]
    assert ref.num_leaves(P5) == 3
    assert ref.positions(P5, 10) == [10, 11, 11, 12, 12]
    assert ref.positions(P5) == [0, 1, 1, 2, 2]


def test_attention_mask_5() -> None:
    assert ref.attention_mask(P5) == [
        [T, F, F, F, F],
        [T, T, F, F, F],
        [T, F, T, F, F],
        [T, T, F, T, F],
        [T, T, F, F, T],
    ]
    m = ref.attention_mask(P5, prefix_len=2)
    assert m[0] == [T, T, T, F, F, F, F]
    assert m[3] == [T, T, T, T, F, T, F]


def test_attention_bias_5() -> None:
    b = ref.attention_bias(P5, 1)
    assert b[2] == [0.0, 0.0, NINF, 0.0, NINF, NINF]


def test_packed_mask_5() -> None:
    assert ref.packed_mask(P5) == [[0b00001], [0b00011], [0b00101], [0b01011], [0b10011]]


def test_packed_mask_multiword() -> None:
    # chain of 34 nodes: row 33 has bits 0..33 set -> two words
    pm = ref.packed_mask(ref.chain_parents(34))
    assert pm[0] == [1, 0]
    assert pm[31] == [0xFFFFFFFF, 0]
    assert pm[33] == [0xFFFFFFFF, 0b11]


def test_paths_and_links_5() -> None:
    assert ref.paths(P5) == [[0, 2, -1], [0, 1, 3], [0, 1, 4]]
    assert ref.sglang_links(P5) == ([1, 3, -1, -1, -1], [-1, 2, -1, 4, -1])


def test_single_root() -> None:
    assert ref.paths([-1]) == [[0]]
    assert ref.num_leaves([-1]) == 1
    assert ref.sglang_links([-1]) == ([-1], [-1])
    assert ref.packed_mask([-1]) == [[1]]


def test_chain() -> None:
    p = ref.chain_parents(4)
    assert p == [-1, 0, 1, 2]
    assert ref.depths(p) == [0, 1, 2, 3]
    assert ref.paths(p) == [[0, 1, 2, 3]]
    assert ref.sglang_links(p) == ([1, 2, 3, -1], [-1, -1, -1, -1])
    assert ref.packed_mask(p) == [[1], [3], [7], [15]]
    with pytest.raises(ValueError):
        ref.chain_parents(0)


def test_negative_prefix_len() -> None:
    with pytest.raises(ValueError, match="prefix_len"):
        ref.attention_mask(P5, -1)
    with pytest.raises(ValueError, match="prefix_len"):
        ref.positions(P5, -1)


def test_the_oracle_refuses_what_the_contract_refuses() -> None:
    # The reference is the oracle: it must not answer where the extension raises (a typo'd
    # order gave a breadth-first tree, a negative depth an empty "tree", True a prefix of 1).
    with pytest.raises(ValueError, match="order"):
        ref.from_choices([(0,), (0, 0)], order="depth-first")
    with pytest.raises(ValueError, match="max_depth"):
        ref.limit_depth(P5, [0] * len(P5), -1)
    with pytest.raises(TypeError, match="prefix_lens"):
        ref.batch_positions([-1, 0], [0, 2], True)


# ---------------------------------------------------------------- from_choices


def test_from_choices_order_and_tokens() -> None:
    # given order (0,), (1,), (0,0) -> node order root, (0,), (1,), (0,0)
    assert ref.from_choices([(0,), (1,), (0, 0)]) == ([-1, 0, 0, 1], [0, 0, 1, 0])
    # given order (0,0), (1,), (0,): tokens[1+j] follows choices[j] into node order
    parents, tokens = ref.from_choices([(0, 0), (1,), (0,)], tokens=[9, 30, 20, 10])
    assert parents == [-1, 0, 0, 1]
    assert tokens == [9, 10, 20, 30]


def test_from_choices_vllm_sort() -> None:
    # length first, then lexicographic: (1,) before (0, 0); (0, 1) before (1, 0)
    parents, tokens = ref.from_choices([(1, 0), (0, 1), (0, 0), (1,), (0,)])
    # nodes: 0 root, 1 (0,), 2 (1,), 3 (0,0), 4 (0,1), 5 (1,0)
    assert parents == [-1, 0, 0, 1, 1, 2]
    assert tokens == [0, 0, 1, 0, 1, 0]


@pytest.mark.parametrize(
    ("choices", "match"),
    [
        ([(0,), (0, 1, 0)], r"choices\[1\]"),  # missing prefix (0, 1)
        ([(0,), (1,), (0,)], r"choices\[2\]"),  # duplicate
        ([(0,), ()], r"choices\[1\]"),  # empty
        ([(0,), (-1,)], r"choices\[1\]"),  # negative
    ],
)
def test_from_choices_errors(choices: list[tuple[int, ...]], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ref.from_choices(choices)


def test_from_choices_tokens_length() -> None:
    with pytest.raises(ValueError, match="tokens"):
        ref.from_choices([(0,)], tokens=[1, 2, 3])


# ---------------------------------------------------------------- batch layouts

# batch: the 5-node tree, then a 2-node chain
BP = [*P5, -1, 0]
BT = [*T5, 50, 51]
BO = [0, 5, 7]


def test_batch_positions_and_depths() -> None:
    assert ref.batch_depths(BP, BO) == [0, 1, 1, 2, 2, 0, 1]
    assert ref.batch_positions(BP, BO, [3, 7]) == [3, 4, 4, 5, 5, 7, 8]
    assert ref.batch_positions(BP, BO, 1) == [1, 2, 2, 3, 3, 1, 2]
    with pytest.raises(ValueError, match="prefix_lens"):
        ref.batch_positions(BP, BO, [1])


def test_ragged_mask() -> None:
    flat, indptr = ref.ragged_mask(BP, BO, [0, 1])
    assert indptr == [0, 25, 25 + 2 * 3]
    assert flat[:25] == [x for row in ref.attention_mask(P5) for x in row]
    assert flat[25:] == [T, T, F, T, T, T]
    bias, indptr2 = ref.ragged_bias(BP, BO, [0, 1])
    assert indptr2 == indptr
    assert bias[25:] == [0.0, 0.0, NINF, 0.0, 0.0, 0.0]


def test_segment_packbits_10_element_segment() -> None:
    # tree [-1, 0] with prefix 3: 2 x 5 = 10 elements
    #   row 0: 1 1 1 | 1 0     row 1: 1 1 1 | 1 1
    # bits 0..7 = 1,1,1,1,0,1,1,1 -> 0b11101111 = 239; bits 8,9 = 1,1 -> 3
    # second tree [-1] with prefix 0: 1 element -> its own byte 1
    packed, indptr = ref.packed_ragged_mask([-1, 0, -1], [0, 2, 3], [3, 0])
    assert packed == [239, 3, 1]
    assert indptr == [0, 2, 3]


def test_qlen_and_padded_mask() -> None:
    q = ref.qlen_mask([-1, 0, 0, -1, 0, 1], [0, 3, 6])
    assert q == [[[T, F, F], [T, T, F], [T, F, T]], [[T, F, F], [T, T, F], [T, T, T]]]
    with pytest.raises(ValueError):
        ref.qlen_mask(BP, BO)
    pm = ref.padded_mask(BP, BO)
    assert pm[0] == ref.attention_mask(P5)
    assert pm[1] == [
        [T, F, F, F, F],
        [T, T, F, F, F],
        [F, F, F, F, F],
        [F, F, F, F, F],
        [F, F, F, F, F],
    ]


def test_padded_layout() -> None:
    # Tree 0: 0 -> 1 (tokens 7, 8); tree 1: 0 -> {1, 2} (tokens 4, 5, 6).
    tokens, positions, mask, rows, cols = ref.padded_layout(
        [-1, 0, -1, 0, 0], [7, 8, 4, 5, 6], [0, 2, 5], [10, 3]
    )
    assert tokens == [[7, 8, 0], [4, 5, 6]]
    assert positions == [[10, 11, 10], [3, 4, 4]]
    # Tree 0's padding slot attends to itself alone.
    assert mask == [[[T, F, F], [T, T, F], [F, F, T]], [[T, F, F], [T, T, F], [T, F, T]]]
    assert rows == [0, 0, 1, 1, 1]
    assert cols == [0, 1, 0, 1, 2]


def test_batch_packed_paths_links() -> None:
    assert ref.batch_packed_mask(BP, BO) == [[1], [3], [5], [11], [19], [1], [3]]
    # Nmax = 33 -> two words for every row
    big = ref.batch_packed_mask([-1, 0, *ref.chain_parents(33)], [0, 2, 35])
    assert big[1] == [3, 0]
    assert big[-1] == [0xFFFFFFFF, 1]
    assert ref.batch_paths(BP, BO) == [
        [[0, 2, -1], [0, 1, 3], [0, 1, 4]],
        [[0, 1, -1], [-1, -1, -1], [-1, -1, -1]],
    ]
    assert ref.batch_sglang_links(BP, BO) == (
        [1, 3, -1, -1, -1, 1, -1],
        [-1, 2, -1, 4, -1, -1, -1],
    )


# ---------------------------------------------------------------- verification


def test_argmax() -> None:
    assert ref.argmax([1.0, 3.0, 3.0, 2.0]) == 1
    assert ref.argmax([NINF, NINF]) == 0
    with pytest.raises(ValueError, match="NaN"):
        ref.argmax([1.0, math.nan])


def test_verify_walk_second_sibling() -> None:
    # root's choice 12: child 1 (token 11) mismatches, child 2 (token 12) matches;
    # node 2 is a leaf, its choice 77 is the bonus
    target = [12, 13, 77, 0, 0]
    assert ref.verify_walk(P5, T5, target) == ([0, 2], [12, 77])


def test_verify_walk_deep_and_none() -> None:
    # root picks 11 -> node 1; node 1 picks 14 -> node 4 (first sibling 13 mismatches)
    assert ref.verify_walk(P5, T5, [11, 14, 0, 0, 55]) == ([0, 1, 4], [11, 14, 55])
    # nothing accepted
    assert ref.verify_walk(P5, T5, [99, 0, 0, 0, 0]) == ([0], [99])


def test_verify_walk_duplicate_tokens_first_child() -> None:
    parents, tokens = [-1, 0, 0, 2], [0, 5, 5, 6]
    assert ref.verify_walk(parents, tokens, [5, 8, 6, 9]) == ([0, 1], [5, 8])


def _onehot(tok: int, vocab: int = 128) -> list[float]:
    row = [0.0] * vocab
    row[tok] = 1.0
    return row


def test_verify_logits_nan_unvisited_row() -> None:
    rows = [_onehot(12), [math.nan] * 128, _onehot(77), [math.nan] * 128, [math.nan] * 128]
    assert ref.verify_logits(P5, T5, rows) == ([0, 2], [12, 77])
    rows[2][5] = math.nan
    with pytest.raises(ValueError, match=r"row 2.*NaN"):
        ref.verify_logits(P5, T5, rows)


def test_batch_verify_and_sglang() -> None:
    target = [11, 14, 0, 0, 55, 51, 60]
    num, acc, toks = ref.batch_verify_walk(BP, BT, BO, target)
    assert num == [2, 1]
    assert acc == [[0, 1, 4], [0, 1, -1]]
    assert toks == [[11, 14, 55], [51, 60, -1]]
    predicts, accept_index, accept_length = ref.sglang_outputs(BO, acc, toks, num)
    assert predicts == [11, 14, 0, 0, 55, 51, 60]
    assert accept_index == [[0, 1, 4], [5, 6, -1]]
    assert accept_length == [2, 1]


# ---------------------------------------------------------------- KV


def test_kv_compaction_plan() -> None:
    assert ref.kv_compaction_plan([0, 1, 4], 10) == ([14], [12])
    assert ref.kv_compaction_plan([0, 2, 5, -1], 3) == ([5, 8], [4, 5])
    assert ref.kv_compaction_plan([0, 1, 2], 3) == ([], [])
    assert ref.batch_kv_compaction_plan([[0, 1, 4], [0, 2, -1]], [10, 0]) == (
        [0, 1],
        [14, 2],
        [12, 1],
    )


def test_compact_kv() -> None:
    np = pytest.importorskip("numpy")
    # single request: cache [heads=2, seq=8], prefix 3, accepted [0, 2, 4]
    cache = np.arange(16).reshape(2, 8)
    moves = ref.kv_compaction_plan([0, 2, 4], 3)
    assert moves == ([5, 7], [4, 5])
    ref.compact_kv(cache, moves, seq_dim=1)
    assert cache[:, 3:6].tolist() == [[3, 5, 7], [11, 13, 15]]
    # batch: cache [B=2, seq=6, d=1]
    cache = np.arange(12).reshape(2, 6, 1)
    plan = ref.batch_kv_compaction_plan([[0, 2], [0, 1]], [1, 1])
    assert plan == ([0], [3], [2])
    ref.compact_kv(cache, plan, seq_dim=1, batch_dim=0)
    assert cache[:, :, 0].tolist() == [[0, 1, 3, 3, 4, 5], [6, 7, 8, 9, 10, 11]]


def test_commit_slots() -> None:
    slots = [40, 41, 42, 43, 44]
    assert ref.commit_slots(slots, [0, 1, 4]) == ([40, 41, 44], [42, 43])
    assert ref.commit_slots(slots, [0, 2, -1]) == ([40, 42], [41, 43, 44])
    kept, freed = ref.batch_commit_slots([40, 41, 42, 43, 44, 90, 91], BO, [[0, 1, 4], [0, -1, -1]])
    assert kept == [[40, 41, 44], [90, -1, -1]]
    assert freed == [42, 43, 91]
