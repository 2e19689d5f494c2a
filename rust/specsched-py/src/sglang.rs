//! `specsched.sglang` kernels: SGLang's `organize_draft_results` selection, the
//! `build_tree_kernel_efficient` layouts and `verify_tree_greedy`, writing into the caller's
//! (or freshly allocated) arrays exactly as sgl-kernel's ops do.

use numpy::PyArray2;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use specsched_core::topology::sglang::{self, BuildOut, GreedyIn, MaskOut};

use crate::convert::{owned, try_collect, IntoPyResult};
use crate::ndconv::{
    check_outputs_disjoint, fixed, float_array, i64_array, out_array, with_float_view,
};

type IndexPair<'py> = (Bound<'py, PyArray2<i64>>, Bound<'py, PyArray2<i64>>);

/// `(top_scores_index, draft_tokens)`, both int64 `[bs, N - 1]`, from the concatenated
/// `scores [bs, M]` and `tokens [bs, M]`.
#[pyfunction]
pub fn sglang_organize<'py>(
    py: Python<'py>,
    scores: &Bound<'py, PyAny>,
    tokens: &Bound<'py, PyAny>,
    #[pyo3(from_py_with = crate::convert::num_draft_token_arg)] num_draft_token: usize,
) -> PyResult<IndexPair<'py>> {
    let s = float_array(scores, "score_list", 2)?;
    let t = i64_array(tokens, "token_list", 2)?;
    let tv = fixed(t.view(), "token_list")?;
    // Two-dimensional: `float_array` checked it.
    let scores_dim = with_float_view!(s, sv => (sv.shape()[0], sv.shape()[1]));
    // Sized only once the pool is known to hold the candidates: `num_draft_token` is the
    // caller's, and a vector of it would be allocated before the kernel refuses it.
    let (bs, k) = sglang::organize_output_shape(scores_dim, tv.dim(), num_draft_token).py()?;
    // Fallibly: a broadcast pool claims any batch size at no cost.
    let zeros = || try_collect(bs * k, std::iter::repeat_n(0i64, bs * k), "score_list");
    let (mut idx, mut toks) = (zeros()?, zeros()?);
    with_float_view!(s, sv => {
        let sv = fixed(sv, "score_list")?;
        py.detach(|| sglang::organize_draft_results(sv, tv, num_draft_token, &mut idx, &mut toks))
    })
    .py()?;
    let idx = owned(py, idx, &[bs, k])?.cast_into::<PyArray2<i64>>()?;
    let toks = owned(py, toks, &[bs, k])?.cast_into::<PyArray2<i64>>()?;
    Ok((idx, toks))
}

/// Fills `tree_mask`, `positions`, `retrive_index`, `retrive_next_token` and
/// `retrive_next_sibling` in place (mode 0 FULL, 1 QLEN_ONLY, 2 QLEN_ONLY_BITPACKING), and, when
/// `tokens = (verified_id, draft_tokens, out)` is given, the verify-side tokens into `out`.
#[pyfunction]
#[pyo3(signature = (
    parent_list, selected_index, seq_lens, seq_lens_sum, tree_mask, positions, retrive_index,
    retrive_next_token, retrive_next_sibling, topk, depth, num_verify_tokens, tree_mask_mode,
    tokens=None,
))]
#[allow(clippy::too_many_arguments)]
pub fn sglang_build_tree(
    py: Python<'_>,
    parent_list: &Bound<'_, PyAny>,
    selected_index: &Bound<'_, PyAny>,
    seq_lens: &Bound<'_, PyAny>,
    #[pyo3(from_py_with = crate::convert::seq_lens_sum_arg)] seq_lens_sum: i64,
    tree_mask: &Bound<'_, PyAny>,
    positions: &Bound<'_, PyAny>,
    retrive_index: &Bound<'_, PyAny>,
    retrive_next_token: &Bound<'_, PyAny>,
    retrive_next_sibling: &Bound<'_, PyAny>,
    #[pyo3(from_py_with = crate::convert::sglang_topk_arg)] topk: usize,
    #[pyo3(from_py_with = crate::convert::sglang_depth_arg)] depth: usize,
    #[pyo3(from_py_with = crate::convert::num_verify_tokens_arg)] num_verify_tokens: usize,
    #[pyo3(from_py_with = crate::convert::tree_mask_mode_arg)] tree_mask_mode: i64,
    tokens: Option<(Bound<'_, PyAny>, Bound<'_, PyAny>, Bound<'_, PyAny>)>,
) -> PyResult<()> {
    // Named as the wrapper's caller passes them (`build_tree_kernel_efficient`'s buffers):
    // an error about either can only be about a buffer of theirs.
    let outputs = [
        ("tree_mask_buf", tree_mask),
        ("position_buf", positions),
        ("retrive_index", retrive_index),
        ("retrive_next_token", retrive_next_token),
        ("retrive_next_sibling", retrive_next_sibling),
    ];
    let inputs = [
        ("parent_list", parent_list),
        ("top_scores_index", selected_index),
        ("seq_lens", seq_lens),
    ];
    // Fixed arrays, not vectors: no allocation on a call whose binding costs a few µs.
    match &tokens {
        Some((verified_id, draft_tokens, out)) => {
            let [a, b, c, d, e] = outputs;
            let [f, g, h] = inputs;
            check_outputs_disjoint(
                &[a, b, c, d, e, ("draft_tokens_out", out)],
                &[
                    f,
                    g,
                    h,
                    ("verified_id", verified_id),
                    ("draft_tokens", draft_tokens),
                ],
            )?;
        }
        None => check_outputs_disjoint(&outputs, &inputs)?,
    }
    let mut token_arrays = match &tokens {
        Some((verified_id, draft_tokens, out)) => Some((
            i64_array(verified_id, "verified_id", 1)?,
            i64_array(draft_tokens, "draft_tokens", 2)?,
            out_array::<i64>(out, "draft_tokens_out", "int64")?,
        )),
        None => None,
    };
    let mut token_job = match &mut token_arrays {
        Some((roots, drafts, out)) => Some((
            fixed(roots.view(), "verified_id")?,
            fixed(drafts.view(), "draft_tokens")?,
            out.as_slice_mut()?,
        )),
        None => None,
    };
    let pl = i64_array(parent_list, "parent_list", 2)?;
    let sel = i64_array(selected_index, "top_scores_index", 2)?;
    let sl = i64_array(seq_lens, "seq_lens", 1)?;
    let seq = sglang::check_seq_lens(fixed(sl.view(), "seq_lens")?).py()?;
    // Checked: each length fits int64, three of them can overflow a wrapping sum.
    let total = seq.iter().try_fold(0usize, |sum, &s| sum.checked_add(s));
    if total.is_none_or(|total| usize::try_from(seq_lens_sum) != Ok(total)) {
        let shown = total.map_or_else(|| "more than 2**64".to_string(), |t| t.to_string());
        return Err(PyValueError::new_err(format!(
            "seq_lens_sum: {seq_lens_sum} != sum(seq_lens) = {shown}"
        )));
    }
    let (plv, selv) = (
        fixed(pl.view(), "parent_list")?,
        fixed(sel.view(), "top_scores_index")?,
    );
    let mut pos = out_array::<i64>(positions, "position_buf", "int64")?;
    let mut ri = out_array::<i64>(retrive_index, "retrive_index", "int64")?;
    let mut nt = out_array::<i64>(retrive_next_token, "retrive_next_token", "int64")?;
    let mut ns = out_array::<i64>(retrive_next_sibling, "retrive_next_sibling", "int64")?;
    let (pos, ri, nt, ns) = (
        pos.as_slice_mut()?,
        ri.as_slice_mut()?,
        nt.as_slice_mut()?,
        ns.as_slice_mut()?,
    );
    let mut run = |mask: MaskOut<'_>| {
        let out = BuildOut {
            tree_mask: mask,
            positions: pos,
            retrive_index: ri,
            retrive_next_token: nt,
            retrive_next_sibling: ns,
        };
        // The tokens and the tree in one release of the GIL.
        py.detach(|| {
            if let Some((roots, drafts, tokens_out)) = token_job.take() {
                sglang::root_then_drafts(roots, drafts, tokens_out)?;
            }
            sglang::build_tree(plv, selv, &seq, topk, depth, num_verify_tokens, out)
        })
        .py()
    };
    match tree_mask_mode {
        0 | 1 => {
            let mut m = out_array::<bool>(tree_mask, "tree_mask_buf", "bool")?;
            let m = m.as_slice_mut()?;
            run(if tree_mask_mode == 0 {
                MaskOut::Full(m)
            } else {
                MaskOut::Qlen(m)
            })
        }
        2 => match sglang::packed_word_bytes(num_verify_tokens).py()? {
            1 => run(MaskOut::Packed8(
                out_array::<u8>(tree_mask, "tree_mask_buf", "uint8")?.as_slice_mut()?,
            )),
            2 => run(MaskOut::Packed16(
                out_array::<u16>(tree_mask, "tree_mask_buf", "uint16")?.as_slice_mut()?,
            )),
            _ => run(MaskOut::Packed32(
                out_array::<u32>(tree_mask, "tree_mask_buf", "uint32")?.as_slice_mut()?,
            )),
        },
        m => Err(PyValueError::new_err(format!(
            "tree_mask_mode: expected 0 (FULL_MASK), 1 (QLEN_ONLY) or 2 (QLEN_ONLY_BITPACKING), got {m}"
        ))),
    }
}

/// sgl-kernel `verify_tree_greedy`: writes `predicts`, `accept_index`, `accept_token_num`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn sglang_verify_tree_greedy(
    py: Python<'_>,
    predicts: &Bound<'_, PyAny>,
    accept_index: &Bound<'_, PyAny>,
    accept_token_num: &Bound<'_, PyAny>,
    candidates: &Bound<'_, PyAny>,
    retrive_index: &Bound<'_, PyAny>,
    retrive_next_token: &Bound<'_, PyAny>,
    retrive_next_sibling: &Bound<'_, PyAny>,
    target_predict: &Bound<'_, PyAny>,
) -> PyResult<()> {
    check_outputs_disjoint(
        &[
            ("predicts", predicts),
            ("accept_index", accept_index),
            ("accept_token_num", accept_token_num),
        ],
        &[
            ("candidates", candidates),
            ("retrive_index", retrive_index),
            ("retrive_next_token", retrive_next_token),
            ("retrive_next_sibling", retrive_next_sibling),
            ("target_predict", target_predict),
        ],
    )?;
    let c = i64_array(candidates, "candidates", 2)?;
    let ri = i64_array(retrive_index, "retrive_index", 2)?;
    let nt = i64_array(retrive_next_token, "retrive_next_token", 2)?;
    let ns = i64_array(retrive_next_sibling, "retrive_next_sibling", 2)?;
    let tp = i64_array(target_predict, "target_predict", 1)?;
    let inp = GreedyIn {
        candidates: fixed(c.view(), "candidates")?,
        retrive_index: fixed(ri.view(), "retrive_index")?,
        retrive_next_token: fixed(nt.view(), "retrive_next_token")?,
        retrive_next_sibling: fixed(ns.view(), "retrive_next_sibling")?,
        target_predict: fixed(tp.view(), "target_predict")?,
    };
    let mut p = out_array::<i32>(predicts, "predicts", "int32")?;
    let mut a = out_array::<i32>(accept_index, "accept_index", "int32")?;
    let mut n = out_array::<i32>(accept_token_num, "accept_token_num", "int32")?;
    if a.as_array().ndim() != 2 {
        return Err(PyValueError::new_err(format!(
            "accept_index: expected a 2-D array [bs, S + 1], got shape {:?}",
            a.as_array().shape()
        )));
    }
    let bs = inp.candidates.nrows();
    if a.as_array().shape()[0] != bs {
        return Err(PyValueError::new_err(format!(
            "accept_index: expected {bs} rows (one per request), got shape {:?}",
            a.as_array().shape()
        )));
    }
    let (p, a, n) = (p.as_slice_mut()?, a.as_slice_mut()?, n.as_slice_mut()?);
    py.detach(|| sglang::verify_tree_greedy(inp, p, a, n)).py()
}
