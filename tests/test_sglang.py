"""`specsched.sglang`: SGLang's EAGLE tree ops, on numpy arrays and torch CPU tensors.

The golden case is the input/expected-output vector of SGLang's public unit test
`test/srt/test_build_eagle_tree.py` (bs=2, topk=4, depth=4, N=8), copied number for number.
Random drafts are produced the way SGLang's `select_top_k_tokens` produces them and compared with
`specsched.reference`, with specsched's own tree layouts, and with `ss.verify`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import specsched as ss
from hypothesis import given, settings
from hypothesis import strategies as st
from specsched import reference as ref
from specsched import sglang as sg
from specsched.testing import sglang_draft

# SGLang test/srt/test_build_eagle_tree.py: inputs ...
SCORES = [
    [[[7.1127e-01, 2.8292e-01, 2.2995e-03, 1.7357e-03]],
     [[9.7476e-01, 2.2219e-02, 6.5031e-04, 1.3212e-04]]],
    [[[6.9142e-01, 1.2863e-02, 1.6873e-03, 1.1871e-03],
      [2.4787e-01, 1.8818e-02, 1.4204e-02, 9.2235e-04],
      [2.2971e-03, 1.6700e-06, 1.8737e-07, 8.3146e-08],
      [1.2771e-03, 2.4374e-04, 1.7832e-04, 1.1947e-05]],
     [[8.4832e-02, 6.6068e-02, 5.8304e-02, 5.7851e-02],
      [2.3616e-03, 1.1243e-03, 5.4368e-04, 2.7768e-04],
      [2.5286e-04, 1.5578e-04, 2.8817e-05, 1.2888e-05],
      [1.2834e-04, 2.5417e-06, 1.1279e-06, 1.6088e-08]]],
    [[[6.6438e-01, 2.6997e-02, 2.4236e-05, 4.0821e-06],
      [2.4402e-01, 2.8409e-03, 5.0935e-04, 2.9022e-04],
      [1.6178e-02, 2.0567e-03, 4.5892e-04, 3.0034e-05],
      [1.3023e-02, 5.0497e-04, 3.6371e-04, 8.7750e-05]],
     [[2.3263e-02, 2.0054e-02, 9.3990e-03, 2.7783e-03],
      [6.4156e-02, 5.5506e-04, 1.0429e-04, 9.7211e-05],
      [4.9950e-02, 5.0630e-03, 9.0068e-04, 3.3656e-04],
      [7.5817e-03, 8.5731e-04, 6.9972e-04, 6.0793e-04]]],
    [[[6.6420e-01, 1.0525e-04, 6.5864e-05, 1.2253e-06],
      [1.3019e-01, 1.0461e-01, 5.2083e-03, 1.6777e-03],
      [2.0103e-02, 6.7335e-03, 1.2625e-04, 1.0364e-05],
      [1.5142e-02, 7.0819e-04, 9.6595e-05, 8.7951e-05]],
     [[5.8608e-02, 1.8840e-03, 7.8535e-04, 4.4400e-04],
      [1.2185e-02, 2.0684e-03, 1.7418e-03, 1.4327e-03],
      [6.2455e-03, 6.1487e-03, 2.6862e-03, 1.8034e-03],
      [1.8590e-03, 1.6151e-03, 1.2481e-03, 3.6038e-04]]],
]  # fmt: skip
TOKENS = [
    [[29896, 29906, 29900, 29945], [13, 2, 29871, 28956]],
    [[29889, 29974, 29945, 29900, 29974, 29922, 29930, 29958,
      29889, 29974, 29930, 29945, 29974, 29922, 29930, 29958],
     [22550, 4136, 16492, 8439, 29871, 2, 3001, 13, 2, 13, 29906, 29946, 2, 13, 29871, 259]],
    [[29946, 29945, 29953, 29906, 29896, 29945, 29900, 29906,
      29896, 29945, 29906, 29953, 29896, 29945, 29906, 29946],
     [29871, 2, 29901, 29889, 29871, 2, 395, 259, 29901, 29871, 2, 29889, 3001, 1234, 7146, 2186]],
    [[29946, 29974, 29945, 29930, 29889, 29922, 29974, 29930,
      29974, 29946, 29930, 29922, 29889, 29974, 29945, 29922],
     [29941, 29906, 2, 29946, 29871, 450, 319, 14990, 29946, 29941, 2, 29906, 29871, 2, 3001, 13]],
]  # fmt: skip
PARENTS = [
    [[-1, 0, 1, 2, 3], [-1, 0, 1, 2, 3]],
    [[4, 8, 9, 10], [4, 5, 6, 7]],
    [[20, 24, 21, 28], [24, 28, 20, 21]],
    [[36, 40, 41, 44], [36, 40, 44, 45]],
]
VERIFIED_ID = [29974, 13]
SEQ_LENS = [5, 10]
# ... and expected outputs.
EXPECTED_POSITIONS = [5, 6, 6, 7, 7, 8, 8, 9, 10, 11, 12, 12, 12, 12, 13, 14]
EXPECTED_RETRIVE_INDEX = [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]]
EXPECTED_NEXT_TOKEN = [[1, 3, 4, 5, 6, 7, -1, -1], [1, 2, -1, 6, -1, -1, 7, -1]]
EXPECTED_NEXT_SIBLING = [[-1, 2, -1, -1, -1, -1, -1, -1], [-1, -1, 3, 4, 5, -1, -1, -1]]
EXPECTED_DRAFT_TOKENS = [
    29974, 29896, 29906, 29889, 29974, 29946, 29896, 29946,
    13, 13, 22550, 4136, 16492, 8439, 29871, 29941,
]  # fmt: skip


def published_inputs(lib):
    if lib == "torch":
        torch = pytest.importorskip("torch")
        scores = [torch.tensor(s, dtype=torch.float32) for s in SCORES]
        tokens = [torch.tensor(t, dtype=torch.int64) for t in TOKENS]
        parents = [torch.tensor(p, dtype=torch.int64) for p in PARENTS]
        vid = torch.tensor(VERIFIED_ID, dtype=torch.int32)
        seq = torch.tensor(SEQ_LENS, dtype=torch.int64)
    else:
        scores = [np.asarray(s, dtype=np.float32) for s in SCORES]
        tokens = [np.asarray(t, dtype=np.int64) for t in TOKENS]
        parents = [np.asarray(p, dtype=np.int64) for p in PARENTS]
        vid = np.asarray(VERIFIED_ID, dtype=np.int32)
        seq = np.asarray(SEQ_LENS, dtype=np.int64)
    return scores, tokens, parents, vid, seq


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_published_sglang_vector(lib):
    scores, tokens, parents, vid, seq = published_inputs(lib)
    parent_list, top_index, draft = sg.organize_draft_results(scores, tokens, parents, 8)
    out = sg.build_tree_kernel_efficient(
        verified_id=vid,
        parent_list=parent_list,
        top_scores_index=top_index,
        draft_tokens=draft,
        seq_lens=seq,
        seq_lens_sum=int(seq.sum()),
        topk=4,
        spec_steps=4,
        num_verify_tokens=8,
    )
    tree_mask, positions, r_index, r_next, r_sib, draft_tokens = out
    assert positions.tolist() == EXPECTED_POSITIONS
    assert r_index.tolist() == EXPECTED_RETRIVE_INDEX
    assert r_next.tolist() == EXPECTED_NEXT_TOKEN
    assert r_sib.tolist() == EXPECTED_NEXT_SIBLING
    assert draft_tokens.tolist() == EXPECTED_DRAFT_TOKENS
    assert [type(x).__module__.split(".")[0] for x in out] == [lib] * 6
    # The published test does not pin the FULL mask; check it against the tree it describes.
    assert tree_mask.shape == (sum(SEQ_LENS) * 8 + 2 * 8 * 8,)
    links = (np.asarray(r_next).ravel().tolist(), np.asarray(r_sib).ravel().tolist())
    parents_local = parents_from_links(links, 2, 8)
    batch = ss.TreeBatch.from_flat(parents_local, np.zeros(16, np.int64), [0, 8, 16])
    assert np.asarray(tree_mask).tolist() == batch.attention_mask(np.asarray(SEQ_LENS)).tolist()


def parents_from_links(links, bs, n):
    nxt, sib = links
    parents = [-1] * (bs * n)
    for b in range(bs):
        for v in range(n):
            c = nxt[b * n + v]
            while c != -1:
                parents[b * n + c] = v
                c = sib[b * n + c]
    return parents


def pool_size(topk, steps):
    """Candidates in an SGLang draft: `topk` at the first step, `topk²` at each later one."""
    return topk + (steps - 1) * topk * topk


def drawn_size_and_rng(data, topk, steps, min_nodes, max_nodes):
    """`(N, rng)`: a tree size from `min_nodes` up to `max_nodes` or what the pool holds, and
    a generator seeded by hypothesis."""
    n = data.draw(st.integers(min_nodes, min(pool_size(topk, steps) + 1, max_nodes)))
    return n, np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(1, 4),
    st.data(),
    st.booleans(),
)
def test_build_matches_reference_in_every_mask_mode(bs, topk, steps, data, ties):
    n, rng = drawn_size_and_rng(data, topk, steps, 1, 32)
    score_list, token_list, parents_list = sglang_draft(rng, bs, topk, steps, vocab=20, ties=ties)
    parent_list, top_index, draft = sg.organize_draft_results(
        score_list, token_list, parents_list, n
    )
    flat_scores = np.concatenate([s.reshape(bs, -1) for s in score_list], axis=1)
    flat_tokens = np.concatenate(token_list, axis=1)
    want_idx, want_draft = ref.sglang_organize(flat_scores.tolist(), flat_tokens.tolist(), n)
    assert top_index.tolist() == want_idx and draft.tolist() == want_draft
    seq = rng.integers(0, 6, size=bs)
    vid = rng.integers(0, 20, size=bs)
    for mode in sg.TreeMaskMode:
        mask, pos, r_index, r_next, r_sib, tokens = sg.build_tree_kernel_efficient(
            vid, parent_list, top_index, draft, seq, int(seq.sum()), topk, steps, n, mode
        )
        w_mask, w_pos, w_index, w_next, w_sib = ref.sglang_build_tree(
            parent_list.tolist(), want_idx, seq.tolist(), topk, n, int(mode)
        )
        assert mask.tolist() == w_mask
        assert pos.tolist() == w_pos
        assert r_index.tolist() == w_index
        assert r_next.tolist() == w_next
        assert r_sib.tolist() == w_sib
        rows = zip(vid.tolist(), draft.tolist(), strict=True)
        assert tokens.reshape(bs, n).tolist() == [[v, *d] for v, d in rows]
        if mode == sg.TreeMaskMode.QLEN_ONLY_BITPACKING:
            assert mask.dtype == [np.uint8, np.uint16, np.uint32, np.uint32][(n - 1) // 8]


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(5, 8), st.integers(3, 4), st.data())
def test_dense_masks_match_reference_past_32_and_64_nodes(bs, topk, steps, data):
    # Up to 64 nodes the rows are written from ancestor bit words (with AVX-512), past 64 by
    # copying parent rows: both against the reference, in both dense modes.
    n, rng = drawn_size_and_rng(data, topk, steps, 33, 130)
    parent_list, top_index, draft = organized_draft(rng, bs, topk, steps, n)
    assert_dense_builds_match_reference(rng, parent_list, top_index, draft, topk, steps, 40)


def organized_draft(rng, bs, topk, steps, n):
    """`(parent_list, top_scores_index, draft_tokens)` of a random SGLang draft."""
    score_list, token_list, parents_list = sglang_draft(rng, bs, topk, steps, vocab=20)
    return sg.organize_draft_results(score_list, token_list, parents_list, n)


def assert_dense_builds_match_reference(rng, parent_list, top_index, draft, topk, steps, max_seq):
    """Both dense mask modes, and the lists and positions with them, equal the reference's."""
    bs, n = top_index.shape[0], top_index.shape[1] + 1
    seq = rng.integers(0, max_seq, size=bs)
    vid = rng.integers(0, 20, size=bs)
    for mode in (sg.TreeMaskMode.FULL_MASK, sg.TreeMaskMode.QLEN_ONLY):
        got = sg.build_tree_kernel_efficient(
            vid, parent_list, top_index, draft, seq, int(seq.sum()), topk, steps, n, mode
        )
        want = ref.sglang_build_tree(
            parent_list.tolist(), top_index.tolist(), seq.tolist(), topk, n, int(mode)
        )
        for g, w in zip(got[:5], want, strict=True):
            assert np.asarray(g).ravel().tolist() == np.asarray(w).ravel().tolist()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 4), st.integers(2, 4), st.data())
def test_parents_shared_by_several_slots_match_reference(bs, topk, steps, data):
    # SGLang's drafting gives each draft slot its own parent, so a parent's children are one
    # run of nodes; a parent_list that repeats a parent (still a tree) splits them into
    # several runs, which must still be listed in node order, as the kernel lists them.
    n, rng = drawn_size_and_rng(data, topk, steps, 2, 64)
    parent_list, top_index, draft = organized_draft(rng, bs, topk, steps, n)
    parent_list = parent_list.copy()
    for b in range(bs):
        chosen = top_index[b].tolist()
        for slot in range(1, parent_list.shape[1]):
            # Any candidate selected before the slot's first one stays a valid parent.
            earlier = [c for c in chosen if c < slot * topk]
            if earlier and data.draw(st.booleans()):
                parent_list[b, slot] = earlier[data.draw(st.integers(0, len(earlier) - 1))]
    assert_dense_builds_match_reference(rng, parent_list, top_index, draft, topk, steps, 9)


@pytest.mark.parametrize("offset", [0, 1, 16, 48, 63])
def test_qlen_mask_at_any_buffer_alignment(offset):
    # At N = 64 the mask is stored in whole cache lines of the caller's buffer, wherever it
    # starts: bytes around the mask must stay as SGLang leaves them (True).
    bs, topk, steps, n = 3, 8, 3, 64
    rng = np.random.default_rng(offset)
    parent_list, top_index, draft = organized_draft(rng, bs, topk, steps, n)
    backing = np.ones(bs * n * n + 128, dtype=np.bool_)
    start = (-backing.ctypes.data) % 64 + offset
    mask_buf = backing[start : start + bs * n * n]
    seq = rng.integers(0, 9, size=bs)
    vid, mode = np.zeros(bs, np.int64), sg.TreeMaskMode.QLEN_ONLY
    out = sg.build_tree_kernel_efficient(
        vid, parent_list, top_index, draft, seq, int(seq.sum()), topk, steps, n, mode, mask_buf
    )
    want = ref.sglang_build_tree(
        parent_list.tolist(), top_index.tolist(), seq.tolist(), topk, n, 1
    )[0]
    assert out[0] is mask_buf and mask_buf.tolist() == want
    assert backing[:start].all() and backing[start + bs * n * n :].all()


@pytest.mark.parametrize("layout", ["int64", "int32_roots", "int32_drafts", "strided", "empty"])
def test_draft_tokens_put_each_root_before_its_drafts(layout):
    # int64 tokens are assembled by the binding, others by numpy: either way the values and
    # the dtype are those of SGLang's `torch.cat((verified_id[:, None], draft_tokens), 1)`.
    bs, topk, steps, n = (0 if layout == "empty" else 5), 4, 3, 12
    rng = np.random.default_rng(7)
    parent_list, top_index, draft = organized_draft(rng, max(bs, 1), topk, steps, n)
    parent_list, top_index, draft = parent_list[:bs], top_index[:bs], draft[:bs]
    vid = rng.integers(0, 20, size=bs)
    if layout == "int32_roots":
        vid = vid.astype(np.int32)
    elif layout == "int32_drafts":
        draft = draft.astype(np.int32)
    elif layout == "strided":
        # Every other column of a wider array: rows that are not contiguous.
        wide = np.zeros((bs, 2 * (n - 1)), np.int64)
        wide[:, ::2] = draft
        draft = wide[:, ::2]
    before = draft.copy()
    seq = np.zeros(bs, np.int64)
    tokens = sg.build_tree_kernel_efficient(
        vid, parent_list, top_index, draft, seq, 0, topk, steps, n, sg.TreeMaskMode.QLEN_ONLY
    )[5]
    want = np.concatenate((vid[:, None], draft), axis=1).reshape(-1)
    assert tokens.dtype == want.dtype and tokens.tolist() == want.tolist()
    assert np.array_equal(draft, before)


def verify_inputs(rng, bs, topk, steps, n):
    parent_list, top_index, draft = organized_draft(rng, bs, topk, steps, n)
    seq = np.zeros(bs, np.int64)
    vid = rng.integers(0, 20, size=bs)
    _, _, r_index, r_next, r_sib, tokens = sg.build_tree_kernel_efficient(
        vid, parent_list, top_index, draft, seq, 0, topk, steps, n, sg.TreeMaskMode.QLEN_ONLY
    )
    return r_index, r_next, r_sib, tokens.reshape(bs, n)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 4), st.data())
def test_verify_tree_greedy_matches_reference_and_ss_verify(bs, topk, steps, data):
    n = data.draw(st.integers(1, pool_size(topk, steps) + 1))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    r_index, r_next, r_sib, cand = verify_inputs(rng, bs, topk, steps, n)
    # Target predictions drawn from the request's own candidate tokens so that paths get
    # accepted, often past the first level (tokens drawn from 0..19 rarely went past one).
    target = np.take_along_axis(cand, rng.integers(0, n, size=(bs, n)), axis=1)
    width = data.draw(st.integers(1, steps + 1))
    predicts = np.zeros(bs * n, np.int32)
    accept_index = np.full((bs, width), -1, np.int32)
    accept_num = np.empty(bs, np.int32)
    sg.verify_tree_greedy(predicts, accept_index, accept_num, cand, r_index, r_next, r_sib, target)
    w_pred, w_index, w_num = ref.sglang_verify_tree_greedy(
        cand.tolist(),
        r_index.tolist(),
        r_next.tolist(),
        r_sib.tolist(),
        target.ravel().tolist(),
        width,
        [0] * (bs * n),
    )
    assert predicts.tolist() == w_pred
    assert accept_index.tolist() == w_index
    assert accept_num.tolist() == w_num
    if width == steps + 1:
        # With room for the deepest path it is specsched's own greedy walk.
        parents = parents_from_links((r_next.ravel().tolist(), r_sib.ravel().tolist()), bs, n)
        offsets = [b * n for b in range(bs + 1)]
        batch = ss.TreeBatch.from_flat(parents, cand.ravel(), offsets)
        rb = ss.verify(batch, target_tokens=target.ravel())
        p2, a2, n2 = rb.to_sglang()
        assert accept_num.tolist() == n2.tolist()
        assert predicts.tolist() == p2.tolist()
        assert accept_index[:, : a2.shape[1]].tolist() == a2.tolist()


def test_verify_tree_greedy_in_place_on_torch_cpu():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    r_index, r_next, r_sib, cand = verify_inputs(rng, 2, 2, 3, 6)
    target = torch.from_numpy(cand.copy())  # the target agrees with rank-0 drafts: deep paths
    predicts = torch.zeros(12, dtype=torch.int32)
    accept_index = torch.full((2, 4), -1, dtype=torch.int32)
    accept_num = torch.empty(2, dtype=torch.int32)
    args = [torch.from_numpy(a) for a in (cand, r_index, r_next, r_sib)]
    assert sg.verify_tree_greedy(predicts, accept_index, accept_num, *args, target) is None
    w_pred, w_index, w_num = ref.sglang_verify_tree_greedy(
        cand.tolist(), r_index.tolist(), r_next.tolist(), r_sib.tolist(),
        cand.ravel().tolist(), 4, [0] * 12,
    )  # fmt: skip
    assert predicts.tolist() == w_pred
    assert accept_index.tolist() == w_index
    assert accept_num.tolist() == w_num


def test_buffers_are_filled_like_sglang():
    scores, tokens, parents, vid, seq = published_inputs("numpy")
    pl, idx, draft = sg.organize_draft_results(scores, tokens, parents, 8)
    mask_buf = np.zeros(200, dtype=np.bool_)
    pos_buf = np.full(20, 7, dtype=np.int64)
    out = sg.build_tree_kernel_efficient(
        vid, pl, idx, draft, seq, 15, 4, 4, 8, sg.TreeMaskMode.QLEN_ONLY, mask_buf, pos_buf
    )
    assert out[0] is mask_buf and out[1] is pos_buf
    assert pos_buf[:16].tolist() == EXPECTED_POSITIONS and pos_buf[16:].tolist() == [7] * 4
    assert mask_buf[128:].all()  # SGLang fills the whole buffer with True first
    ref_mask = ref.sglang_build_tree(pl.tolist(), idx.tolist(), SEQ_LENS, 4, 8, 1)[0]
    assert mask_buf[:128].tolist() == ref_mask
    packed = np.full(20, 0xFF, dtype=np.uint8)
    out = sg.build_tree_kernel_efficient(
        vid, pl, idx, draft, seq, 15, 4, 4, 8, sg.TreeMaskMode.QLEN_ONLY_BITPACKING, packed
    )
    assert packed[16:].tolist() == [0] * 4
    assert (
        packed[:16].tolist()
        == ref.sglang_build_tree(pl.tolist(), idx.tolist(), SEQ_LENS, 4, 8, 2)[0]
    )


def build(parent_list, sel, n=3, topk=2, steps=3, **kw):
    bs = len(sel)
    args = dict(
        verified_id=np.zeros(bs, np.int64),
        parent_list=parent_list
        if isinstance(parent_list, np.ndarray)
        else np.asarray(parent_list, np.int64),
        top_scores_index=np.asarray(sel, np.int64),
        draft_tokens=np.zeros((bs, n - 1), np.int64),
        seq_lens=np.zeros(bs, np.int64),
        seq_lens_sum=0,
        topk=topk,
        spec_steps=steps,
        num_verify_tokens=n,
    )
    args.update(kw)
    return sg.build_tree_kernel_efficient(**args)


@pytest.mark.parametrize("mode", list(sg.TreeMaskMode))
def test_empty_batch_builds_empty_outputs(mode):
    out = build(np.zeros((0, 3), np.int64), np.zeros((0, 3), np.int64), n=4, tree_mask_mode=mode)
    assert [o.shape for o in out] == [(0,), (0,), (0, 4), (0, 4), (0, 4), (0,)]


def test_bad_input_is_a_clear_error():
    pl = [[-1, 0, 1], [-1, 0, 1]]
    # SGLang's "invalid eagle tree": candidate 4's parent (candidate 1) was not selected.
    with pytest.raises(ValueError, match=r"invalid eagle tree: request 1, node 2"):
        build(pl, [[0, 1], [0, 4]])
    with pytest.raises(ValueError, match=r"request 0, node 2.*sorted"):
        build(pl, [[1, 0], [0, 1]])
    with pytest.raises(IndexError, match=r"request 0, node 1: candidate 99"):
        build(pl, [[99, 100], [0, 1]])
    with pytest.raises(IndexError, match=r"parent_list"):
        build([[-1], [-1]], [[0, 4], [0, 1]])
    with pytest.raises(ValueError, match="topk"):
        build(pl, [[0, 1], [0, 1]], topk=0)
    with pytest.raises(ValueError, match="spec_steps"):
        build(pl, [[0, 1], [0, 1]], steps=0)
    with pytest.raises(ValueError, match="seq_lens_sum"):
        build(pl, [[0, 1], [0, 1]], seq_lens_sum=3)
    with pytest.raises(ValueError, match=r"seq_lens\[1\] = -1"):
        build(pl, [[0, 1], [0, 1]], seq_lens=np.array([1, -1]), seq_lens_sum=0)
    with pytest.raises(ValueError, match="at most 32"):
        build([[-1] * 40], [list(range(32))], n=33, topk=40, steps=1, tree_mask_mode=2)
    with pytest.raises(ValueError, match="num_verify_tokens"):
        build(pl, [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]], n=12, steps=3)
    with pytest.raises(TypeError, match="parent_list"):
        build(np.zeros((2, 3)), [[0, 1], [0, 1]])
    # A pool too large for the lookup tables (or for a machine word) is refused, not allocated.
    for topk, steps in [(2**40, 1), (2**33, 2**33)]:
        with pytest.raises(ValueError, match=r"topk=\d+, spec_steps=\d+ give a pool larger"):
            build(pl, [[0, 1], [0, 1]], topk=topk, steps=steps)
    nan_scores = [np.array([[[0.5, math.nan]]], np.float32)]
    with pytest.raises(ValueError, match=r"request 0, candidate 1: score is NaN"):
        sg.organize_draft_results(nan_scores, [np.array([[1, 2]])], [np.array([[-1, 0, 1]])], 2)
    with pytest.raises(ValueError, match="num_draft_token"):
        sg.organize_draft_results(
            [np.array([[[0.5, 0.1]]], np.float32)],
            [np.array([[1, 2]])],
            [np.array([[-1, 0, 1]])],
            4,
        )


def test_a_longer_mask_buffer_is_filled_only_after_the_kernel_and_never_over_an_argument():
    pl = np.array([[-1, 0, 1, 2, 3]])
    block = np.zeros(64, np.uint8)
    # top_scores_index lives in the part of the mask buffer past the kernel's 25 entries.
    sel = block[32:].view(np.int64)[:4].reshape(1, 4)
    sel[0] = [0, 1, 2, 3]
    with pytest.raises(ValueError, match="tree_mask_buf and top_scores_index: may share memory"):
        build(pl, sel, n=5, topk=4, steps=1, seq_lens=np.array([3]), seq_lens_sum=3,
              tree_mask_mode=sg.TreeMaskMode.QLEN_ONLY, tree_mask_buf=block.view(bool))  # fmt: skip
    assert sel.tolist() == [[0, 1, 2, 3]]
    # A refused call leaves the buffer's tail as it was; a good one fills it as SGLang does.
    buf = np.zeros(40, bool)
    with pytest.raises(ValueError, match="invalid eagle tree"):
        build(np.array([[-1, 0, 1, 2, 3]]), np.array([[0, 1, 2, 9]]), n=5, topk=2, steps=3,
              seq_lens=np.array([3]), seq_lens_sum=3, tree_mask_mode=sg.TreeMaskMode.QLEN_ONLY,
              tree_mask_buf=buf)  # fmt: skip
    assert not buf[25:].any()
    qlen = sg.TreeMaskMode.QLEN_ONLY
    out = build(pl, np.array([[0, 1, 2, 3]]), n=5, topk=4, steps=1, seq_lens=np.array([3]),
                seq_lens_sum=3, tree_mask_mode=qlen, tree_mask_buf=buf)  # fmt: skip
    assert out[0] is buf and buf[25:].all()


@pytest.mark.parametrize(
    ("kw", "exc", "match"),
    [
        ({"tree_mask_mode": 2.9}, TypeError, "tree_mask_mode: expected an int, got float"),
        ({"tree_mask_mode": True}, TypeError, "tree_mask_mode: expected an int, got bool"),
        ({"tree_mask_mode": "1"}, TypeError, "tree_mask_mode: expected an int, got str"),
        ({"tree_mask_mode": 3}, ValueError, "tree_mask_mode: expected 0"),
        ({"seq_lens_sum": 6.0}, TypeError, "seq_lens_sum: expected an int, got float"),
        ({"seq_lens_sum": True}, TypeError, "seq_lens_sum: expected an int, got bool"),
        ({"seq_lens_sum": -1}, ValueError, "seq_lens_sum: must be >= 0"),
        # FULL sizes its mask from seq_lens: checked before that allocation.
        ({"seq_lens": np.array([-1, 2**40]), "seq_lens_sum": 2**40 - 1}, ValueError,
         r"seq_lens\[0\] = -1"),
        ({"seq_lens": np.array([2**62, 0]), "seq_lens_sum": 2**62}, ValueError,
         "seq_lens: the FULL mask of these lengths has"),
    ],
)  # fmt: skip
def test_scalar_arguments_are_ints_named(kw: dict, exc: type[Exception], match: str):
    with pytest.raises(exc, match=match):
        build([[-1, 0, 1], [-1, 0, 1]], [[0, 1], [0, 1]], **kw)


def test_organize_needs_one_parents_entry_per_draft_step():
    steps = [np.zeros((1, 1, 2), np.float32), np.zeros((1, 2, 2), np.float32)]
    tokens = [np.zeros((1, 2), np.int64), np.zeros((1, 4), np.int64)]
    parents = [np.array([[-1, 0, 1]]), np.array([[0, 1]])]
    sg.organize_draft_results(steps, tokens, parents, 3)
    with pytest.raises(ValueError, match="got 2, 2 and 0"):
        sg.organize_draft_results(steps, tokens, [], 3)
    with pytest.raises(
        ValueError, match=r"parents_list\[0\]: expected 1 rows \(the batch of score_list"
    ):
        sg.organize_draft_results(steps, tokens, [np.zeros((2, 3)), parents[1]], 3)


def test_counts_batches_and_buffers_are_checked_by_name():
    pl = [[-1, 0, 1], [-1, 0, 1]]
    sel = [[0, 1], [0, 1]]
    with pytest.raises(ValueError, match="topk: must be >= 1, got -1"):
        build(pl, sel, topk=-1)
    with pytest.raises(ValueError, match="num_verify_tokens: must be >= 1, got -3"):
        build(pl, sel, num_verify_tokens=-3)
    with pytest.raises(TypeError, match="num_verify_tokens: expected an int, got float"):
        build(pl, sel, num_verify_tokens=3.7)
    with pytest.raises(ValueError, match=r"seq_lens: expected a 1-D array \[bs\]"):
        build(pl, sel, seq_lens=np.zeros((2, 1), np.int64))
    # A wrong seq_lens_sum is the mismatch, not an allocation sized from it.
    with pytest.raises(ValueError, match="seq_lens_sum: 1000000000000000 != sum"):
        build(pl, sel, seq_lens_sum=10**15, tree_mask_mode=sg.TreeMaskMode.FULL_MASK)
    with pytest.raises(TypeError, match="position_buf: expected dtype int64, got int32"):
        build(pl, sel, position_buf=np.zeros(6, np.int32))
    with pytest.raises(ValueError, match="position_buf: needs at least 6 entries, has 4"):
        build(pl, sel, position_buf=np.zeros(4, np.int64))
    with pytest.raises(TypeError, match="tree_mask_buf: expected dtype bool"):
        build(pl, sel, tree_mask_buf=np.zeros(18, np.uint8))
    steps = [np.zeros((2, 1, 2), np.float32), np.zeros((4, 2, 2), np.float32)]
    tokens = [np.zeros((2, 2), np.int64), np.zeros((4, 4), np.int64)]
    parents = [np.zeros((2, 3), np.int64), np.zeros((2, 2), np.int64)]
    with pytest.raises(ValueError, match=r"score_list\[1\]: expected 2 rows"):
        sg.organize_draft_results(steps, tokens, parents, 3)
    with pytest.raises(ValueError, match="num_draft_token: must be >= 1, got -1"):
        sg.organize_draft_results(steps[:1], tokens[:1], parents[:1], -1)


def test_outputs_sharing_memory_with_another_argument_are_refused():
    # Each torch tensor's numpy view has its own base, so rust-numpy's borrow registry cannot
    # see two tensors over one storage: the binding compares address ranges.
    torch = pytest.importorskip("torch")
    pl, vid = torch.tensor([[-1, 0, 1]]), torch.tensor([7])
    drafts, seq = torch.tensor([[1, 2, 3]]), torch.tensor([5])
    storage = torch.zeros(8, dtype=torch.int64)
    storage[:3] = torch.tensor([0, 1, 2])
    selection = storage[:3].reshape(1, 3)
    with pytest.raises(ValueError, match="position_buf and top_scores_index may share memory"):
        sg.build_tree_kernel_efficient(
            vid, pl, selection, drafts, seq, 5, 2, 2, 4, 1, None, storage
        )
    fine = sg.build_tree_kernel_efficient(vid, pl, selection.clone(), drafts, seq, 5, 2, 2, 4, 1)
    r_index, r_next, r_sib = fine[2], fine[3], fine[4]
    cand, target = fine[5].reshape(1, 4), torch.tensor([1, 2, 3, 0])
    block = torch.full((8,), -1, dtype=torch.int32)
    with pytest.raises(ValueError, match="predicts and accept_index may share memory"):
        sg.verify_tree_greedy(
            block[:4],
            block[2:6].reshape(1, 4),
            torch.zeros(1, dtype=torch.int32),
            cand,
            r_index,
            r_next,
            r_sib,
            target,
        )
    with pytest.raises(TypeError, match=r"score_list\[0\]: dtype torch.bfloat16"):
        sg.organize_draft_results(
            [torch.zeros((1, 1, 2), dtype=torch.bfloat16)], [torch.zeros((1, 2))], [pl], 2
        )


def test_verify_leaves_accept_index_past_the_path_as_it_was():
    # As sgl-kernel does: only the root and the accepted nodes are written.
    cand = np.array([[0, 5, 7]])
    ri, nt, ns = np.array([[0, 1, 2]]), np.array([[1, -1, -1]]), np.array([[-1, 2, -1]])
    accept_index = np.full((1, 3), 55, np.int32)
    sg.verify_tree_greedy(
        np.zeros(3, np.int32),
        accept_index,
        np.zeros(1, np.int32),
        cand,
        ri,
        nt,
        ns,
        np.array([7, 0, 0]),
    )
    assert accept_index.tolist() == [[0, 2, 55]]


def test_verify_bad_input():
    cand = np.array([[0, 5, 7]])
    ri = np.array([[0, 1, 2]])
    nt = np.array([[1, -1, -1]])
    ns = np.array([[-1, 2, -1]])
    tgt = np.array([7, 0, 0])
    good = (np.zeros(3, np.int32), np.full((1, 3), -1, np.int32), np.zeros(1, np.int32))
    with pytest.raises(IndexError, match=r"retrive_next_token\[0, 0\] = 9"):
        sg.verify_tree_greedy(*good, cand, ri, np.array([[9, -1, -1]]), ns, tgt)
    with pytest.raises(IndexError, match=r"retrive_index\[0, 2\] = 40"):
        sg.verify_tree_greedy(*good, cand, np.array([[0, 1, 40]]), nt, ns, tgt)
    with pytest.raises(ValueError, match="cycle"):
        sg.verify_tree_greedy(*good, cand, ri, nt, np.array([[-1, 2, 1]]), np.array([9, 0, 0]))
    # A child list leading back to the path (a node its own child, a child list reaching the
    # root) would accept nodes again, past what the tree holds.
    wide = (np.zeros(3, np.int32), np.full((1, 6), -1, np.int32), np.zeros(1, np.int32))
    for loop, cand_loop, again in (([[1, 1, -1]], [[0, 5, 7]], 1), ([[1, 0, -1]], [[5, 5, 7]], 0)):
        with pytest.raises(ValueError, match=f"^retrive_next_token: request 0: node {again} is"):
            sg.verify_tree_greedy(
                *wide, np.array(cand_loop), ri, np.array(loop), ns, np.array([5, 5, 5])
            )
        with pytest.raises(ValueError, match="retrive_next_token"):
            ref.sglang_verify_tree_greedy(
                cand_loop, ri.tolist(), loop, ns.tolist(), [5] * 3, 6, [0] * 3
            )
    with pytest.raises(TypeError, match="predicts: expected dtype int32"):
        sg.verify_tree_greedy(np.zeros(3, np.int64), *good[1:], cand, ri, nt, ns, tgt)
    with pytest.raises(ValueError, match="accept_index"):
        sg.verify_tree_greedy(good[0], np.zeros((2, 3), np.int32), good[2], cand, ri, nt, ns, tgt)
    with pytest.raises(ValueError, match="read-only"):
        ro = np.zeros(3, np.int32)
        ro.flags.writeable = False
        sg.verify_tree_greedy(ro, *good[1:], cand, ri, nt, ns, tgt)
    with pytest.raises(ValueError, match="target_predict"):
        sg.verify_tree_greedy(*good, cand, ri, nt, ns, np.array([7, 0]))
    # Requests without a root: named, not an out-of-bounds read of node 0 (a panic).
    empty = np.zeros((1, 0), np.int64)
    with pytest.raises(ValueError, match=r"candidates: expected shape \(1, N\) with N >= 1"):
        none = np.zeros(0, np.int64)
        sg.verify_tree_greedy(np.zeros(0, np.int32), *good[1:], empty, empty, empty, empty, none)


def test_sizes_from_the_callers_counts_are_checked_before_anything_is_allocated():
    # num_draft_token sized the outputs before the pool was checked: 2**40 aborted the process
    # on a failed allocation, 2**62 raised a PanicException (capacity overflow).
    scores, tokens = [np.zeros((4, 1, 3))], [np.zeros((4, 3), np.int64)]
    parents = [np.zeros((4, 4), np.int64)]
    for n in (2**40, 2**62):
        with pytest.raises(ValueError, match=f"num_draft_token: {n} tokens need"):
            sg.organize_draft_results(scores, tokens, parents, n)


def test_lengths_whose_sum_or_positions_pass_int64_are_refused():
    big = 2**63 - 1
    # The sum wrapped in release builds: three int64 lengths summed to 0 and matched it.
    lens = np.array([big, big, 2], np.int64)
    pl, sel = np.zeros((3, 3), np.int64), np.tile([0, 1], (3, 1))
    for total in (0, 12345):
        with pytest.raises(ValueError, match="sum\\(seq_lens\\) = more than 2\\*\\*64"):
            build(pl, sel, seq_lens=lens, seq_lens_sum=total, tree_mask_mode=1)
    with pytest.raises(ValueError, match="seq_lens_sum: 18446744073709551616 does not fit"):
        build(pl[:1], sel[:1], seq_lens=np.array([1]), seq_lens_sum=2**64, tree_mask_mode=1)
    # A root at int64's last position leaves no room for its children (they wrapped negative).
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 9223372036854775807: positions"):
        build(pl[:1], sel[:1], seq_lens=np.array([big]), seq_lens_sum=big, tree_mask_mode=1)
    fits = build(
        pl[:1], sel[:1], seq_lens=np.array([big - 2]), seq_lens_sum=big - 2, tree_mask_mode=1
    )
    assert fits[1].min() == big - 2 and fits[1].max() == big - 1
    # The bound is the tree's depth, at most spec_steps, not N - 1: one draft step at N = 4
    # reaches position seq_len + 1.
    one_step = sg.build_tree_kernel_efficient(
        np.zeros(1, np.int64), np.array([[-1, 0, 1, 2, 3]]), np.array([[0, 1, 2]]),
        np.zeros((1, 3), np.int64), np.array([big - 1]), big - 1, 4, 1, 4, 1,
    )  # fmt: skip
    assert one_step[1].tolist() == [big - 1, big, big, big]


def test_aliasing_is_seen_through_tensors_and_buffers_given_to_the_binding():
    # Only numpy arrays were measured: a tensor or memoryview over an output's memory was
    # read while the kernel wrote through it (the public wrapper converted first; `_core`
    # did not).
    torch = pytest.importorskip("torch")
    from specsched import _core

    back = np.zeros(8, np.int64)
    back[0] = 6
    cand = np.array([[0, 5, 7]])
    ri, nt, ns = np.array([[0, 1, 2]]), np.array([[1, -1, -1]]), np.array([[-1, 2, -1]])
    for target in (torch.from_numpy(back[:3]), memoryview(back[:3])):
        with pytest.raises(ValueError, match="predicts and target_predict may share memory"):
            _core.sglang_verify_tree_greedy(
                back.view(np.int32)[:3],
                np.full((1, 3), -1, np.int32),
                np.zeros(1, np.int32),
                cand,
                ri,
                nt,
                ns,
                target,
            )
    assert back[0] == 6


def test_organize_takes_an_empty_batch_and_refuses_float_parents():
    k = 2
    scores = [np.zeros((0, 1, k)), np.zeros((0, k, k))]
    tokens = [np.zeros((0, k), np.int64), np.zeros((0, k * k), np.int64)]
    parents = [np.zeros((0, k + 1), np.int64), np.zeros((0, k), np.int64)]
    # numpy cannot reshape an empty batch to (0, -1): SGLang's ops give empty outputs.
    out = sg.organize_draft_results(scores, tokens, parents, 4)
    assert [a.shape for a in out] == [(0, k + 1), (0, 3), (0, 3)]
    # Float parent indices were truncated (NaN became int64's minimum).
    one = (
        [np.zeros((1, 1, k)), np.zeros((1, k, k))],
        [np.zeros((1, k), np.int64), np.zeros((1, k * k), np.int64)],
    )
    with pytest.raises(TypeError, match=r"parents_list\[0\]: expected an integer array"):
        sg.organize_draft_results(*one, [np.full((1, k + 1), 0.9), np.zeros((1, k))], 4)


def test_full_mask_lengths_are_checked_before_the_mask_is_sized():
    args = (np.zeros(1, np.int64), np.zeros((1, 2), np.int64), np.zeros((1, 1), np.int64))
    drafts = np.zeros((1, 1), np.int64)
    with pytest.raises(TypeError, match="seq_lens: expected an integer array, got float64"):
        sg.build_tree_kernel_efficient(*args, drafts, np.array([np.nan]), 2, 2, 2, 2, 0)
    # 2**40 tokens of FULL mask rows: a MemoryError (4 TiB) before.
    with pytest.raises(ValueError, match="seq_lens: the FULL mask of these lengths has"):
        sg.build_tree_kernel_efficient(*args, drafts, np.array([2**40]), 2**40, 2, 2, 2, 0)


def test_token_ids_and_scores_of_another_kind_are_named():
    """Tokens are integers: a bool, float, text or duration array was cast into the returned
    `draft_tokens` (bool drafts came back as token 1, str ones as text), a uint64 id past
    int64 as float64; scores are numbers (a void step was numpy's unnamed promotion error)."""
    pl, sel = [[-1, 0, 1]], [[0, 1]]
    assert build(pl, sel, draft_tokens=np.array([[4, 5]], np.int32))[5].tolist() == [0, 4, 5]
    for arg, bad in [
        ("verified_id", np.array(["1"])),
        ("verified_id", np.array([1 + 0j])),
        ("draft_tokens", np.array([[True, False]])),
        ("draft_tokens", np.array([[1.0, 2.0]])),
        ("draft_tokens", np.array([[1, 2]], "m8[s]")),
        ("draft_tokens", np.array([[1, 2]], object)),
    ]:
        with pytest.raises(TypeError, match=f"{arg}: expected integer token ids, got dtype"):
            build(pl, sel, **{arg: bad})
    with pytest.raises(ValueError, match=f"verified_id: token id {2**63 + 1} does not fit"):
        build(pl, sel, verified_id=np.array([2**63 + 1], np.uint64))
    steps = [np.zeros((1, 1, 2), np.float32), np.zeros((1, 2, 2), np.float32)]
    tokens = [np.zeros((1, 2), np.int64), np.zeros((1, 4), np.int64)]
    parents = [np.zeros((1, 3), np.int64), np.zeros((1, 2), np.int64)]
    sg.organize_draft_results(steps, tokens, parents, 3)
    with pytest.raises(TypeError, match=r"token_list\[1\]: expected integer token ids"):
        sg.organize_draft_results(steps, [tokens[0], tokens[1].astype(bool)], parents, 3)
    with pytest.raises(TypeError, match=r"score_list\[1\]: expected scores \(numbers\)"):
        sg.organize_draft_results([steps[0], np.zeros((1, 2, 2), "V4")], tokens, parents, 3)


def test_errors_about_the_callers_buffers_name_them():
    """The binding's outputs are the caller's `position_buf` / `tree_mask_buf` when given:
    its refusals named its own `positions` / `tree_mask`, parameters the caller never saw."""
    pl, sel = [[-1, 0, 1]], [[0, 1]]
    qlen = sg.TreeMaskMode.QLEN_ONLY
    frozen_pos, frozen_mask = np.zeros(3, np.int64), np.zeros(9, np.bool_)
    frozen_pos.flags.writeable = frozen_mask.flags.writeable = False
    with pytest.raises(ValueError, match="position_buf: is read-only"):
        build(pl, sel, position_buf=frozen_pos)
    with pytest.raises(ValueError, match="tree_mask_buf: is read-only"):
        build(pl, sel, tree_mask_mode=qlen, tree_mask_buf=frozen_mask)
    odd = np.frombuffer(bytearray(8 * 3 + 1), np.int64, count=3, offset=1)
    with pytest.raises(ValueError, match="position_buf: its data is not aligned"):
        build(pl, sel, position_buf=odd)


def test_a_lazily_negated_tensor_is_named():
    torch = pytest.importorskip("torch")
    pl, vid, drafts, seq = (torch.tensor(x) for x in ([[-1, 0, 1]], [7], [[1, 2]], [5]))
    negated = torch.tensor([[0, -1]])._neg_view()  # reads [[0, 1]]
    with pytest.raises(TypeError, match=r"top_scores_index: a lazily negated view"):
        sg.build_tree_kernel_efficient(vid, pl, negated, drafts, seq, 5, 2, 2, 3, 1)
