//! SGLang's EAGLE tree kernels, with their exact input and output contracts.
//!
//! SGLang drafts `S` steps of top-`K` per request into a pool of `K + (S-1)·K²` scored
//! candidates; candidate `g`'s parent is the candidate `parent_list[g / K]` (slot 0 is the
//! root). [`organize_draft_results`] keeps the best `N - 1` candidates (sorted by pool index, so
//! parents come first) and [`build_tree`] turns that selection into the verify-side layouts:
//! tree mask (FULL, QLEN_ONLY or QLEN_ONLY_BITPACKING), positions, `retrive_index` and the
//! first-child / next-sibling lists. [`verify_tree_greedy`] is the greedy walk over those
//! lists, writing SGLang's `predicts`, `accept_index` and `accept_token_num`. Unlike the CUDA
//! kernels, a selection that is not a tree (SGLang's "invalid eagle tree") or an index outside
//! its array is an error naming the request and node, never a skipped node or a stray read.
//! Cost: O(M + N log N) per request to organize, O(N · row) to build, O(S · N) to verify.

use ndarray::{ArrayView1, ArrayView2};

use crate::error::{Error, Result};
use crate::topology::{score_key, select_top_scores, ScoreLike};
use crate::tree::IndexLike;

/// SGLang's `TreeMaskMode`, with the output buffer it fills.
pub enum MaskOut<'a> {
    /// FULL_MASK: per request, `N` rows of `seq_len + N` bools (prefix all True), concatenated.
    Full(&'a mut [bool]),
    /// QLEN_ONLY: `[bs, N, N]` bools.
    Qlen(&'a mut [bool]),
    /// QLEN_ONLY_BITPACKING: one word per row, bit `j` set iff node `j` is self or ancestor.
    Packed8(&'a mut [u8]),
    Packed16(&'a mut [u16]),
    Packed32(&'a mut [u32]),
}

/// Width in bytes of a QLEN_ONLY_BITPACKING word for `n` draft tokens (1, 2 or 4), as SGLang
/// picks its dtype: `[uint8, uint16, uint32][ceil(log2((n + 7) / 8))]`.
pub fn packed_word_bytes(n: usize) -> Result<usize> {
    match n.div_ceil(8) {
        0 | 1 => Ok(1),
        2 => Ok(2),
        3 | 4 => Ok(4),
        _ => Err(Error::value(
            "num_verify_tokens",
            format!("{n} draft tokens do not fit a bit-packed mask row (at most 32)"),
        )),
    }
}

/// Pool size of SGLang's drafting: `K` root children, then `K²` per later step (saturating
/// at `usize::MAX`).
pub fn pool_size(topk: usize, steps: usize) -> usize {
    steps
        .saturating_sub(1)
        .saturating_mul(topk.saturating_mul(topk))
        .saturating_add(topk)
}

/// Largest pool [`build_tree`] accepts: its lookup tables take 12 bytes per candidate, and
/// SGLang's drafting (top-k of at most a few tens, tens of steps) stays far below.
pub const MAX_POOL: usize = 1 << 20;

fn check_shape(topk: usize, steps: usize, n: usize) -> Result<()> {
    if topk < 1 {
        return Err(Error::value("topk", format!("must be >= 1, got {topk}")));
    }
    if steps < 1 {
        return Err(Error::value(
            "spec_steps",
            format!("must be >= 1, got {steps}"),
        ));
    }
    if n < 1 {
        return Err(Error::value(
            "num_verify_tokens",
            "must be >= 1 (the root counts as one token)",
        ));
    }
    let pool = pool_size(topk, steps);
    if pool > MAX_POOL {
        return Err(Error::value(
            "topk",
            format!(
                "topk={topk}, spec_steps={steps} give a pool larger than the {MAX_POOL} \
                 candidates supported"
            ),
        ));
    }
    if n - 1 > pool {
        return Err(Error::value(
            "num_verify_tokens",
            format!(
                "{n} tokens need {} candidates but topk={topk}, spec_steps={steps} draft only {pool}",
                n - 1
            ),
        ));
    }
    Ok(())
}

/// The shape `[bs, N - 1]` of `organize_draft_results`'s outputs for pools of `scores_dim`
/// and `tokens_dim` (`[bs, M]` each), after checking that the pool holds `N - 1` candidates:
/// callers size their buffers with it before reading anything.
pub fn organize_output_shape(
    scores_dim: (usize, usize),
    tokens_dim: (usize, usize),
    num_draft_token: usize,
) -> Result<(usize, usize)> {
    let (bs, m) = scores_dim;
    if tokens_dim != (bs, m) {
        return Err(Error::value(
            "token_list",
            format!(
                "concatenates to shape {tokens_dim:?} but score_list to {:?}",
                (bs, m)
            ),
        ));
    }
    if num_draft_token < 1 {
        return Err(Error::value(
            "num_draft_token",
            "must be >= 1 (the root counts as one token)",
        ));
    }
    let k = num_draft_token - 1;
    if k > m {
        return Err(Error::value(
            "num_draft_token",
            format!("{num_draft_token} tokens need {k} candidates but the pool has {m}"),
        ));
    }
    if m >= u32::MAX as usize {
        return Err(Error::value("score_list", "pool too large"));
    }
    Ok((bs, k))
}

/// `organize_draft_results`: for each request, the `N - 1` best candidates of `scores`
/// (`[bs, M]`, higher first, ties to the lower pool index), sorted by pool index, and their
/// tokens gathered from `tokens` (`[bs, M]`). Writes `top_index` and `draft_tokens`, both
/// `[bs, N - 1]` row-major.
pub fn organize_draft_results<S: ScoreLike, T: IndexLike>(
    scores: ArrayView2<'_, S>,
    tokens: ArrayView2<'_, T>,
    num_draft_token: usize,
    top_index: &mut [i64],
    draft_tokens: &mut [i64],
) -> Result<()> {
    let (bs, k) = organize_output_shape(scores.dim(), tokens.dim(), num_draft_token)?;
    let m = scores.ncols();
    if top_index.len() != bs * k || draft_tokens.len() != bs * k {
        return Err(Error::value(
            "out",
            format!("output buffers must hold {} entries", bs * k),
        ));
    }
    let (mut keys, mut scratch) = (Vec::with_capacity(m), Vec::with_capacity(m));
    let mut chosen = Vec::with_capacity(k);
    for b in 0..bs {
        keys.clear();
        for g in 0..m {
            let s = scores[(b, g)].to_f64();
            if s.is_nan() {
                return Err(Error::value(
                    "score_list",
                    format!("request {b}, candidate {g}: score is NaN (invalid draft output)"),
                ));
            }
            // Pool index grows with the draft step, so it also breaks ties towards the
            // shallower candidate: scores and pool index are the whole order.
            keys.push(score_key(s));
        }
        select_top_scores(&keys, k, &mut scratch, &mut chosen);
        for (j, &g) in chosen.iter().enumerate() {
            top_index[b * k + j] = g as i64;
            draft_tokens[b * k + j] = tokens[(b, g as usize)].to_i64();
        }
    }
    Ok(())
}

/// Outputs of [`build_tree`]; all `[bs, N]` row-major except the mask.
pub struct BuildOut<'a> {
    pub tree_mask: MaskOut<'a>,
    pub positions: &'a mut [i64],
    pub retrive_index: &'a mut [i64],
    pub retrive_next_token: &'a mut [i64],
    pub retrive_next_sibling: &'a mut [i64],
}

/// SGLang's verify-side `draft_tokens`: each request's verified token, then its `N - 1`
/// selected tokens, `[bs, N]` row-major into `out` (`torch.cat((verified_id[:, None],
/// draft_tokens), 1)`).
pub fn root_then_drafts(
    verified_id: ArrayView1<'_, i64>,
    draft_tokens: ArrayView2<'_, i64>,
    out: &mut [i64],
) -> Result<()> {
    let (bs, k) = draft_tokens.dim();
    if verified_id.len() != bs {
        return Err(Error::value(
            "verified_id",
            format!(
                "expected {bs} entries (one per row of draft_tokens), got {}",
                verified_id.len()
            ),
        ));
    }
    if out.len() != bs * (k + 1) {
        return Err(Error::value(
            "draft_tokens",
            format!(
                "the output must hold {} entries, got {}",
                bs * (k + 1),
                out.len()
            ),
        ));
    }
    for ((row, &root), drafts) in out
        .chunks_exact_mut(k + 1)
        .zip(&verified_id)
        .zip(draft_tokens.rows())
    {
        row[0] = root;
        match drafts.to_slice() {
            Some(d) => row[1..].copy_from_slice(d),
            None => row[1..].iter_mut().zip(drafts).for_each(|(o, &d)| *o = d),
        }
    }
    Ok(())
}

/// Total length of the FULL mask, `sum(seq_lens) · N + bs · N²`, or `None` past `usize`.
pub fn full_mask_len(seq_lens: &[usize], n: usize) -> Option<usize> {
    let rows = seq_lens
        .iter()
        .try_fold(0usize, |acc, &s| acc.checked_add(s.checked_add(n)?))?;
    rows.checked_mul(n)
}

/// Checked `seq_lens` (`>= 0`).
pub fn check_seq_lens(seq_lens: ArrayView1<'_, i64>) -> Result<Vec<usize>> {
    seq_lens
        .iter()
        .enumerate()
        .map(|(b, &s)| {
            usize::try_from(s).map_err(|_| {
                Error::value("seq_lens", format!("seq_lens[{b}] = {s}, expected >= 0"))
            })
        })
        .collect()
}

/// One request's rows of the outputs, `[N]` each, written by [`RequestTree::link`].
struct RequestRows<'a> {
    positions: &'a mut [i64],
    next_token: &'a mut [i64],
    next_sibling: &'a mut [i64],
    /// Ancestor sets as bit words, exact when `N <= 64`: bit `j` of `anc[i]` is set iff node
    /// `j` is node `i` or one of its ancestors (one OR per node; mask rows are read from it).
    anc: &'a mut [u64],
}

/// Scratch for linking one request's tree, reused for each request of a batch (no
/// per-request allocation or reset).
struct RequestTree {
    /// Parent node of each node.
    parent: Vec<usize>,
    /// `placed[g] = stamp(tag, node)`: pool candidate `g` is node `node` of the request whose
    /// tag is `tag` (request index + 1), an O(1) parent lookup with no per-request reset.
    /// Entry `pool` stands for the root (the parent of slot 0), entry `pool + 1` for a parent
    /// that is not a candidate (never stamped: tags start at 1).
    placed: Vec<u64>,
    /// Draft slot of each pool candidate (`g / topk`, without a division per node).
    slot_of: Vec<u32>,
    /// Rows as plain slices, copied here when the caller's rows are strided: ndarray indexing
    /// per node costs more than the work per node.
    sel_buf: Vec<i64>,
    pl_buf: Vec<i64>,
}

/// A request tag and a node in one word: one store per placed node.
fn stamp(tag: u32, node: usize) -> u64 {
    (u64::from(tag) << 32) | node as u64
}

/// The node of `stamp` if it carries `tag`.
fn stamped(stamp: u64, tag: u32) -> Option<usize> {
    ((stamp >> 32) as u32 == tag).then_some(stamp as u32 as usize)
}

impl RequestTree {
    fn new(n: usize, pool: usize, topk: usize, width: usize) -> Self {
        Self {
            parent: vec![0; n],
            placed: vec![0; pool + 2],
            // Runs of `topk` (no division per candidate).
            slot_of: (0..pool.div_ceil(topk))
                .flat_map(|slot| std::iter::repeat_n(slot as u32, topk))
                .take(pool)
                .collect(),
            sel_buf: vec![0; n - 1],
            pl_buf: vec![0; width],
        }
    }

    /// Links request `b`'s nodes to their parents, writing its positions (the root at
    /// `root_pos`, each child one past its parent), first-child / next-sibling lists and
    /// ancestor words (exact when `N <= 64`, unused otherwise), or names the first node that
    /// is not part of a tree.
    ///
    /// The selection is sorted and the candidates of one draft slot share a parent, so when
    /// no two slots share one (SGLang's drafting never repeats a parent) a parent's children
    /// are one run of consecutive nodes: each node's links are then plain stores, chosen
    /// without a branch, not SGLang's read-modify-write of the parent's list head. A repeated
    /// parent is found on the way and the lists are rebuilt the general way.
    /// `PARENTS`: also record each node's parent in `self.parent`, for mask rows copied from
    /// their parents' (without it the loop keeps one pointer fewer live, and stores less; the
    /// caller then has `N <= 64`, so the ancestor words are exact and name every parent).
    // Not inlined into the batch loop, where the per-node pointers would spill to the stack.
    #[inline(never)]
    fn link<const PARENTS: bool>(
        &mut self,
        b: usize,
        sel: ArrayView1<'_, i64>,
        pl: ArrayView1<'_, i64>,
        root_pos: i64,
        rows: RequestRows<'_>,
    ) -> Result<()> {
        let sel = row_slice(sel, &mut self.sel_buf);
        let pl = row_slice(pl, &mut self.pl_buf);
        let Self {
            parent,
            placed,
            slot_of,
            ..
        } = self;
        // Slices, not the vectors: a vector's pointer and length are reloaded after every
        // store through another pointer, which the compiler cannot prove is not into them.
        let pool = slot_of.len();
        // Exact lengths, so the lookups below need no bounds checks.
        let (placed, slot_of) = (&mut placed[..pool + 2], &slot_of[..pool]);
        let tag = b as u32 + 1;
        let (root, not_placed) = (pool, pool + 1);
        placed[root] = stamp(tag, 0);
        let n = sel.len() + 1;
        let RequestRows {
            positions,
            next_token,
            next_sibling,
            anc,
        } = rows;
        // Equal lengths, so the compiler drops the per-node bounds checks.
        let (positions, next_token, next_sibling, anc, parent) = (
            &mut positions[..n],
            &mut next_token[..n],
            &mut next_sibling[..n],
            &mut anc[..n],
            &mut parent[..n],
        );
        // Every node but the last gets its next sibling in the loop.
        next_token.fill(-1);
        next_sibling[n - 1] = -1;
        positions[0] = root_pos;
        anc[0] = 1;
        let (mut prev, mut prev_slot, mut repeated) = (-1i64, u32::MAX, false);
        for i in 1..n {
            let g = sel[i - 1];
            // Unsigned: a negative g fails the range test too, and `slot_of[g]` needs no check.
            if g <= prev || g as u64 >= pool as u64 {
                return Err(bad_candidate(b, i, g, prev, pool));
            }
            prev = g;
            let slot = slot_of[g as usize];
            // Slot 0 hangs under the root whatever `parent_list` holds (it has no columns after
            // one draft step).
            let at = if slot == 0 {
                root
            } else {
                match pl.get(slot as usize) {
                    Some(&pg) if (pg as u64) < pool as u64 => pg as usize,
                    Some(_) => not_placed,
                    None => return Err(missing_parent_column(b, i, g, slot, pl.len())),
                }
            };
            // Candidates are stamped as they are placed, so a parent that is selected before
            // node i is found in O(1); anything else is not a tree.
            // Only nodes before i carry this request's tag (`p < i` tells the compiler so: no
            // bounds checks on the parent's rows below).
            let Some(p) = stamped(placed[at], tag).filter(|&p| p < i) else {
                return Err(not_a_tree(b, i, g, pl[slot as usize]));
            };
            positions[i] = positions[p] + 1;
            // Bits past 63 wrap, but the words are only read when `N <= 64`.
            anc[i] = anc[p] | 1u64 << (i & 63);
            placed[g as usize] = stamp(tag, i);
            if PARENTS {
                parent[i] = p;
            }
            // A new slot starts a run under `p`: node i is `p`'s first child, and node i - 1
            // (the previous run's last) has no next sibling. Otherwise i - 1's sibling is i,
            // and node i's own (still empty) list head takes the dead store.
            let new_run = slot != prev_slot;
            prev_slot = slot;
            next_sibling[i - 1] = if new_run { -1 } else { i as i64 };
            let (head, first) = if new_run { (p, i as i64) } else { (i, -1) };
            repeated |= next_token[head] >= 0;
            next_token[head] = first;
        }
        if repeated {
            // Some parent had children in two slots: list every parent's children in node
            // order, as SGLang's kernel does.
            next_token.fill(-1);
            debug_assert!(
                PARENTS || n <= 64,
                "ancestor words are exact only up to 64 nodes"
            );
            for i in (1..n).rev() {
                // Without recorded parents the words hold them: ancestors precede their
                // descendants, so a node's parent is its highest-numbered proper ancestor.
                let p = if PARENTS {
                    parent[i]
                } else {
                    63 - (anc[i] & !(1u64 << i)).leading_zeros() as usize
                };
                next_sibling[i] = next_token[p];
                next_token[p] = i as i64;
            }
        }
        Ok(())
    }
}

/// The error for node `i`, whose candidate `g` has its slot's parent past `parent_list`.
#[cold]
fn missing_parent_column(b: usize, i: usize, g: i64, slot: u32, columns: usize) -> Error {
    Error::index(
        "parent_list",
        format!(
            "request {b}, node {i}: candidate {g} needs parent_list[{b}, {slot}] but \
             parent_list has {columns} columns"
        ),
    )
}

/// The error for node `i`, whose candidate `g` hangs under candidate `pg`, not selected
/// before it.
#[cold]
fn not_a_tree(b: usize, i: usize, g: i64, pg: i64) -> Error {
    Error::value(
        "top_scores_index",
        format!(
            "invalid eagle tree: request {b}, node {i} (candidate {g}) has parent candidate \
             {pg}, which is not selected before it"
        ),
    )
}

/// The error for node `i`'s candidate `g`, which is outside the pool or breaks the order.
#[cold]
fn bad_candidate(b: usize, i: usize, g: i64, prev: i64, pool: usize) -> Error {
    if g < 0 || g as usize >= pool {
        Error::index(
            "top_scores_index",
            format!("request {b}, node {i}: candidate {g} is outside the pool [0, {pool})"),
        )
    } else {
        Error::value(
            "top_scores_index",
            format!(
                "request {b}, node {i}: candidate {g} does not follow {prev} (the selection \
                 must be sorted and without repeats)"
            ),
        )
    }
}

/// `build_tree_kernel_efficient` (sgl-kernel `build_tree_efficient`): the tree of each request
/// from `parent_list` (`[bs, W]`) and the sorted selection `selected_index` (`[bs, N - 1]`).
/// Node 0 is the root (the verified token); node `i >= 1` is candidate `selected_index[b, i-1]`.
/// On an error the outputs hold partial results (as a CUDA kernel's would after a bad node).
pub fn build_tree(
    parent_list: ArrayView2<'_, i64>,
    selected_index: ArrayView2<'_, i64>,
    seq_lens: &[usize],
    topk: usize,
    steps: usize,
    n: usize,
    out: BuildOut<'_>,
) -> Result<()> {
    let shape = (topk, steps, n);
    build_tree_rows(
        parent_list,
        selected_index,
        seq_lens,
        shape,
        out,
        RowWriter::fastest(),
    )
}

/// [`build_tree`], with dense mask rows written by `writer` where it can (`N <= 64`; copied
/// from parents otherwise): tests run every writer this CPU supports against the copies.
fn build_tree_rows(
    parent_list: ArrayView2<'_, i64>,
    selected_index: ArrayView2<'_, i64>,
    seq_lens: &[usize],
    (topk, steps, n): (usize, usize, usize),
    out: BuildOut<'_>,
    writer: RowWriter,
) -> Result<()> {
    check_shape(topk, steps, n)?;
    let bs = seq_lens.len();
    if selected_index.dim() != (bs, n - 1) {
        return Err(Error::value(
            "top_scores_index",
            format!(
                "expected shape ({bs}, {}), got {:?}",
                n - 1,
                selected_index.dim()
            ),
        ));
    }
    if parent_list.nrows() != bs {
        return Err(Error::value(
            "parent_list",
            format!("expected {bs} rows, got {}", parent_list.nrows()),
        ));
    }
    // A request's positions run from its length to its length + depth, and a node is at most
    // `steps` draft steps (and N - 1 nodes) below the root: int64 all.
    let deepest = (n - 1).min(steps);
    let last_position = i64::MAX as usize - deepest;
    if let Some((b, s)) = seq_lens
        .iter()
        .enumerate()
        .find(|&(_, &s)| s > last_position)
    {
        return Err(Error::value(
            "seq_lens",
            format!("seq_lens[{b}] = {s}: positions up to {s} + {deepest} do not fit in int64"),
        ));
    }
    let total = bs * n;
    for (name, len) in [
        ("positions", out.positions.len()),
        ("retrive_index", out.retrive_index.len()),
        ("retrive_next_token", out.retrive_next_token.len()),
        ("retrive_next_sibling", out.retrive_next_sibling.len()),
    ] {
        if len != total {
            return Err(Error::value(
                name,
                format!("expected {total} entries, got {len}"),
            ));
        }
    }
    let mask_len = match &out.tree_mask {
        MaskOut::Full(m) => (
            m.len(),
            full_mask_len(seq_lens, n).ok_or_else(|| {
                Error::value(
                    "seq_lens",
                    "the FULL mask of these lengths does not fit in memory",
                )
            })?,
        ),
        MaskOut::Qlen(m) => (m.len(), bs * n * n),
        MaskOut::Packed8(m) => (m.len(), total),
        MaskOut::Packed16(m) => (m.len(), total),
        MaskOut::Packed32(m) => (m.len(), total),
    };
    if mask_len.0 != mask_len.1 {
        return Err(Error::value(
            "tree_mask",
            format!("expected {} entries, got {}", mask_len.1, mask_len.0),
        ));
    }
    let word_bits = match &out.tree_mask {
        MaskOut::Packed8(_) => 8,
        MaskOut::Packed16(_) => 16,
        MaskOut::Packed32(_) => 32,
        MaskOut::Full(_) | MaskOut::Qlen(_) => usize::MAX,
    };
    if n > word_bits {
        return Err(Error::value(
            "tree_mask",
            format!("{n} draft tokens do not fit a {word_bits}-bit packed mask row"),
        ));
    }
    if bs == 0 {
        // Nothing to write, so nothing to allocate.
        return Ok(());
    }
    let pool = pool_size(topk, steps);
    let width = parent_list.ncols();
    let BuildOut {
        mut tree_mask,
        positions,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
    } = out;
    // Rows come straight from the ancestor words when they are exact and the CPU can spread
    // bits to bytes; otherwise each row copies its parent's, which needs the parents.
    let writer = if n <= 64 { writer } else { RowWriter::Copy };
    let from_words = writer != RowWriter::Copy;
    let mut tree = RequestTree::new(n, pool, topk, width);
    // The whole batch's words when they are exact (`N <= 64`): the packed masks, and the QLEN
    // mask when `from_words`, are written from them in one pass after linking. Otherwise one
    // request's (unused: rows are copied from parents).
    let mut words = vec![0u64; if n <= 64 { bs * n } else { n }];
    let mut full_base = 0usize;
    for (b, &seq_len) in seq_lens.iter().enumerate() {
        let rows = b * n..(b + 1) * n;
        let anc = if n <= 64 {
            &mut words[rows.clone()]
        } else {
            &mut words[..]
        };
        let (sel, pl) = (selected_index.row(b), parent_list.row(b));
        let rows_out = RequestRows {
            positions: &mut positions[rows.clone()],
            next_token: &mut retrive_next_token[rows.clone()],
            next_sibling: &mut retrive_next_sibling[rows.clone()],
            anc,
        };
        // Parents only for rows copied from them (the word writers read the ancestor words).
        if writer == RowWriter::Copy {
            tree.link::<true>(b, sel, pl, seq_len as i64, rows_out)?;
        } else {
            tree.link::<false>(b, sel, pl, seq_len as i64, rows_out)?;
        }
        let (parent, anc) = (&tree.parent[..], &*anc);
        match &mut tree_mask {
            MaskOut::Full(m) => {
                let cols = seq_len + n;
                let seg = &mut m[full_base..full_base + n * cols];
                fill_rows(seg, cols, seq_len, writer, parent, anc);
                full_base += n * cols;
            }
            MaskOut::Qlen(m) if !from_words => fill_rows(
                &mut m[rows.start * n..rows.end * n],
                n,
                0,
                writer,
                parent,
                anc,
            ),
            MaskOut::Qlen(_)
            | MaskOut::Packed8(_)
            | MaskOut::Packed16(_)
            | MaskOut::Packed32(_) => {}
        }
    }
    for (k, r) in retrive_index.iter_mut().enumerate() {
        *r = k as i64;
    }
    match tree_mask {
        // The QLEN mask is the batch's rows back to back: one stream of words, spread to bytes.
        MaskOut::Qlen(m) if from_words => spread_rows(m, n, &words, writer),
        // N fits the word (checked above), so each row is its ancestor word, narrowed.
        MaskOut::Packed8(m) => narrow_words(m, &words, |a| a as u8),
        MaskOut::Packed16(m) => narrow_words(m, &words, |a| a as u16),
        MaskOut::Packed32(m) => narrow_words(m, &words, |a| a as u32),
        MaskOut::Full(_) | MaskOut::Qlen(_) => {}
    }
    Ok(())
}

/// A request row's elements as one slice: borrowed when the row is contiguous, else copied
/// into `buf` (ndarray indexing per element costs more than the work done per element).
fn row_slice<'a>(row: ArrayView1<'a, i64>, buf: &'a mut [i64]) -> &'a [i64] {
    match row.to_slice() {
        Some(s) => s,
        None => {
            buf.iter_mut().zip(row.iter()).for_each(|(d, &x)| *d = x);
            buf
        }
    }
}

/// How dense mask rows are written. A row's tree part is its parent's plus its own bit, or,
/// read the other way, byte `j` is bit `j` of the row's ancestor word: spreading a word's bits
/// to bytes takes a few vector instructions, where copying the parent's row costs a `memmove`
/// call (most of the build at `N = 64` without them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RowWriter {
    /// Each row copies its parent's (any `N`, any CPU).
    Copy,
    /// From ancestor words, two 32-byte AVX2 stores per row (`N <= 64`).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// From ancestor words, one masked 64-byte AVX-512BW store per row (`N <= 64`).
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl RowWriter {
    /// Every writer, slowest first.
    #[cfg(test)]
    const ALL: &'static [RowWriter] = &[
        RowWriter::Copy,
        #[cfg(target_arch = "x86_64")]
        RowWriter::Avx2,
        #[cfg(target_arch = "x86_64")]
        RowWriter::Avx512,
    ];

    /// Whether this CPU runs `self`.
    fn supported(self) -> bool {
        match self {
            RowWriter::Copy => true,
            #[cfg(target_arch = "x86_64")]
            RowWriter::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            RowWriter::Avx512 => std::arch::is_x86_feature_detected!("avx512bw"),
        }
    }

    /// The fastest writer this CPU runs.
    fn fastest() -> Self {
        #[cfg(target_arch = "x86_64")]
        for writer in [RowWriter::Avx512, RowWriter::Avx2] {
            if writer.supported() {
                return writer;
            }
        }
        RowWriter::Copy
    }
}

/// Dense rows of `cols` bools: `prefix` leading Trues, then the tree part (`cols - prefix`
/// nodes, `parent` and `anc` one entry per row), written by `writer` (copied from parents for
/// [`RowWriter::Copy`], from the ancestor words `anc` otherwise).
fn fill_rows(
    seg: &mut [bool],
    cols: usize,
    prefix: usize,
    writer: RowWriter,
    parent: &[usize],
    // Read by the x86-64 writers only: elsewhere every row is copied from its parent's.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] anc: &[u64],
) {
    match writer {
        RowWriter::Copy => copy_rows(seg, cols, prefix, parent),
        #[cfg(target_arch = "x86_64")]
        RowWriter::Avx2 => {
            assert!(writer.supported());
            // SAFETY: the CPU has AVX2 (asserted above).
            unsafe { spread::rows_avx2(seg, cols, prefix, anc) }
        }
        #[cfg(target_arch = "x86_64")]
        RowWriter::Avx512 => {
            assert!(anc.len() <= 64 && writer.supported());
            // SAFETY: the CPU has AVX-512BW (asserted above).
            unsafe { spread::rows(seg, cols, prefix, anc) }
        }
    }
}

/// The QLEN mask of the whole batch (`words.len()` rows of `n` bytes, back to back) from the
/// rows' ancestor words, by a writer other than [`RowWriter::Copy`] (`n <= 64`).
fn spread_rows(mask: &mut [bool], n: usize, words: &[u64], writer: RowWriter) {
    assert!(n <= 64 && mask.len() == words.len() * n && writer.supported());
    match writer {
        RowWriter::Copy => unreachable!("spread_rows: rows copied from parents have no words"),
        // SAFETY: the CPU has AVX2 (asserted above).
        #[cfg(target_arch = "x86_64")]
        RowWriter::Avx2 => unsafe { spread::rows_avx2(mask, n, 0, words) },
        // SAFETY: the CPU has AVX-512BW, and the lengths match (asserted above).
        #[cfg(target_arch = "x86_64")]
        RowWriter::Avx512 => unsafe { spread::stream(mask, n, words) },
    }
}

/// [`fill_rows`] by copying each parent's row (any `N`, any CPU).
fn copy_rows(seg: &mut [bool], cols: usize, prefix: usize, parent: &[usize]) {
    for (i, &p) in parent.iter().enumerate() {
        let row = i * cols;
        seg[row..row + prefix].fill(true);
        if i == 0 {
            seg[row + prefix..row + cols].fill(false);
        } else {
            seg.copy_within(p * cols + prefix..(p + 1) * cols, row + prefix);
        }
        seg[row + prefix + i] = true;
    }
}

/// Mask rows written from ancestor words ([`RowWriter::Avx512`], [`RowWriter::Avx2`]).
#[cfg(target_arch = "x86_64")]
mod spread {
    use std::arch::x86_64::*;

    /// [`super::fill_rows`] from the ancestor words `anc` (`anc.len() == N <= 64`): byte `j`
    /// of a row's tree part is bit `j` of its word.
    ///
    /// # Safety
    /// The CPU must support AVX-512BW.
    #[target_feature(enable = "avx512bw")]
    pub(super) unsafe fn rows(seg: &mut [bool], cols: usize, prefix: usize, anc: &[u64]) {
        let n = anc.len();
        assert!(n <= 64 && prefix + n <= cols && seg.len() >= n * cols);
        let ones = _mm512_set1_epi8(1);
        let in_row = u64::MAX >> (64 - n);
        for (i, &bits) in anc.iter().enumerate() {
            let row = &mut seg[i * cols..(i + 1) * cols];
            if prefix > 0 {
                row[..prefix].fill(true);
            }
            // SAFETY: the store writes only the bytes selected by `in_row`, `row[prefix..prefix
            // + n]`, in bounds (asserted above); unaligned stores are allowed; each byte is 0
            // or 1, a valid `bool`.
            unsafe {
                _mm512_mask_storeu_epi8(
                    row.as_mut_ptr().add(prefix).cast(),
                    in_row,
                    _mm512_maskz_mov_epi8(bits, ones),
                );
            }
        }
    }

    /// Spreads a 64-bit word to 64 bytes with AVX2: byte `j` is bit `j` (0 or 1).
    #[derive(Clone, Copy)]
    struct Spread {
        /// `vpshufb` indices of the low and high 32 bytes: byte `k` takes byte `k / 8`
        /// (`4 + k / 8`) of the word, broadcast to every 16-byte lane (`vpshufb` picks within
        /// a lane).
        lo: __m256i,
        hi: __m256i,
        /// Bit `k % 8` of byte `k`.
        bit: __m256i,
        ones: __m256i,
    }

    impl Spread {
        #[target_feature(enable = "avx2")]
        fn new() -> Self {
            let [lo, hi] = [0i8, 4].map(|first| {
                let pick: [i8; 32] = std::array::from_fn(|k| first + (k / 8) as i8);
                // SAFETY: `pick` holds the 32 bytes read; unaligned loads are allowed.
                unsafe { _mm256_loadu_si256(pick.as_ptr().cast()) }
            });
            Self {
                lo,
                hi,
                bit: _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64),
                ones: _mm256_set1_epi8(1),
            }
        }

        /// Bytes `0..32` and `32..64` of `word` spread. One broadcast serves both halves, and
        /// a kept bit becomes 1 by an unsigned min (a compare and a mask otherwise).
        #[target_feature(enable = "avx2")]
        fn halves(self, word: u64) -> (__m256i, __m256i) {
            let word = _mm256_set1_epi64x(word as i64);
            let half = |pick| {
                let kept = _mm256_and_si256(_mm256_shuffle_epi8(word, pick), self.bit);
                _mm256_min_epu8(kept, self.ones)
            };
            (half(self.lo), half(self.hi))
        }
    }

    /// [`super::fill_rows`] from the ancestor words `words` with AVX2: `words.len()` rows of
    /// `cols` bytes, `prefix` Trues then the tree part (`cols - prefix <= 64` nodes), byte `j`
    /// of which is bit `j` of the row's word. `seg` may hold several requests' rows back to
    /// back (the QLEN mask of a batch is one call).
    ///
    /// AVX2 has no byte-masked store, so each row's tree part is written as a whole 64 bytes,
    /// past the row's end into the rows after it (bits past the tree part are 0), which are
    /// written in full afterwards; the rows whose 64 bytes would pass the end of `seg` go
    /// through a buffer instead.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn rows_avx2(seg: &mut [bool], cols: usize, prefix: usize, words: &[u64]) {
        let width = cols.saturating_sub(prefix);
        assert!((1..=64).contains(&width) && seg.len() == words.len() * cols);
        let spread = Spread::new();
        let base = seg.as_mut_ptr();
        for (i, &w) in words.iter().enumerate() {
            let row = i * cols;
            if prefix > 0 {
                // A call to `memset` otherwise, for nothing, on every row of a QLEN mask.
                seg[row..row + prefix].fill(true);
            }
            let (lo, hi) = spread.halves(w);
            let at = row + prefix;
            if at + 64 <= seg.len() {
                // SAFETY: `seg[at..at + 64]` is in bounds (checked above); unaligned stores are
                // allowed; each byte is 0 or 1, a valid `bool`. The bytes past this row's end
                // are rows `i + 1..`, written in full by the iterations after this one.
                unsafe {
                    _mm256_storeu_si256(base.add(at).cast(), lo);
                    _mm256_storeu_si256(base.add(at + 32).cast(), hi);
                }
            } else {
                let mut buf = [0u8; 64];
                // SAFETY: `buf` holds 64 bytes; unaligned stores are allowed. The copy reads
                // `width <= 64` of them and writes `seg[at..at + width]`, this row's tree part
                // (in bounds: `seg` holds `words.len()` whole rows), with bytes 0 or 1, valid
                // `bool`s.
                unsafe {
                    _mm256_storeu_si256(buf.as_mut_ptr().cast(), lo);
                    _mm256_storeu_si256(buf.as_mut_ptr().add(32).cast(), hi);
                    std::ptr::copy_nonoverlapping(buf.as_ptr(), base.add(at).cast(), width);
                }
            }
        }
    }

    /// The rows of `words` (`n <= 64` bits each) back to back in `out`, one byte per bit;
    /// `words` holds whole requests (`[bs, n]` rows, a multiple of `n`).
    ///
    /// At `n = 64` a row is a whole cache line's worth of bytes but rarely starts on a line
    /// (numpy aligns buffers to 16 bytes), so each store there takes the tail of one word and
    /// the head of the next and lands on a line boundary: no store splits a line, where one
    /// store per row splits every one of them. Other widths are written row by row.
    ///
    /// # Safety
    /// The CPU must support AVX-512BW.
    #[target_feature(enable = "avx512bw")]
    pub(super) unsafe fn stream(out: &mut [bool], n: usize, words: &[u64]) {
        assert!(
            (1..=64).contains(&n) && words.len().is_multiple_of(n) && out.len() == words.len() * n
        );
        let (base, len) = (out.as_mut_ptr(), out.len());
        let shift = base.align_offset(64);
        if n < 64 || shift == 0 || shift >= 64 || words.is_empty() {
            for (seg, anc) in out.chunks_mut(n * n).zip(words.chunks(n)) {
                // SAFETY: AVX-512BW (this function's contract); `seg` holds `anc.len()` rows
                // of `n` bytes.
                unsafe { rows(seg, n, 0, anc) };
            }
            return;
        }
        let ones = _mm512_set1_epi8(1);
        let head = u64::MAX >> (64 - shift);
        // SAFETY (all three stores): with `len = 64 · words.len()` and `0 < shift < 64`, the
        // head store writes only `out[..shift]` (its mask), line store `k <= words.len() - 2`
        // writes all of `out[shift + 64k..shift + 64k + 64]`, which ends by `len - 64 + shift`
        // and starts on a 64-byte boundary (`shift` is `out`'s offset to one), as the aligned
        // store requires, and the tail store writes only `out[len - 64 + shift..]` (its mask).
        // Each byte is 0 or 1, a valid `bool`.
        unsafe {
            _mm512_mask_storeu_epi8(base.cast(), head, _mm512_maskz_mov_epi8(words[0], ones));
        }
        for (k, pair) in words.windows(2).enumerate() {
            let line = (pair[0] >> shift) | (pair[1] << (64 - shift));
            unsafe {
                _mm512_store_si512(
                    base.add(shift + 64 * k).cast(),
                    _mm512_maskz_mov_epi8(line, ones),
                );
            }
        }
        let last = words[words.len() - 1];
        unsafe {
            _mm512_mask_storeu_epi8(
                base.add(len - (64 - shift)).cast(),
                u64::MAX >> shift,
                _mm512_maskz_mov_epi8(last >> shift, ones),
            );
        }
    }
}

fn narrow_words<W>(rows: &mut [W], anc: &[u64], narrow: impl Fn(u64) -> W) {
    for (row, &a) in rows.iter_mut().zip(anc) {
        *row = narrow(a);
    }
}

/// Inputs of [`verify_tree_greedy`], all `[bs, N]` except `target_predict` (`[bs · N]`).
pub struct GreedyIn<'a> {
    pub candidates: ArrayView2<'a, i64>,
    pub retrive_index: ArrayView2<'a, i64>,
    pub retrive_next_token: ArrayView2<'a, i64>,
    pub retrive_next_sibling: ArrayView2<'a, i64>,
    pub target_predict: ArrayView1<'a, i64>,
}

/// sgl-kernel `verify_tree_greedy`: per request, walk from the root over first-child /
/// next-sibling lists for at most `S` levels (`S + 1` = `accept_index` width), accepting the
/// first child whose candidate token equals the target's prediction at the last accepted node.
/// Writes `predicts[g]` (int32, global flat index) at every accepted node and the stop node,
/// `accept_index[b]` = global indices of the root and accepted nodes (-1 after them) and
/// `accept_token_num[b]` = drafts accepted. `predicts` elsewhere is left as the caller set it.
pub fn verify_tree_greedy(
    inp: GreedyIn<'_>,
    predicts: &mut [i32],
    accept_index: &mut [i32],
    accept_token_num: &mut [i32],
) -> Result<()> {
    let (bs, n) = inp.candidates.dim();
    for (name, d) in [
        ("retrive_index", inp.retrive_index.dim()),
        ("retrive_next_token", inp.retrive_next_token.dim()),
        ("retrive_next_sibling", inp.retrive_next_sibling.dim()),
    ] {
        if d != (bs, n) {
            return Err(Error::value(
                name,
                format!("expected shape {:?} like candidates, got {d:?}", (bs, n)),
            ));
        }
    }
    let total = bs * n;
    if inp.target_predict.len() != total {
        return Err(Error::value(
            "target_predict",
            format!("expected {total} entries, got {}", inp.target_predict.len()),
        ));
    }
    if predicts.len() != total {
        return Err(Error::value(
            "predicts",
            format!("expected {total} entries, got {}", predicts.len()),
        ));
    }
    if accept_token_num.len() != bs {
        return Err(Error::value(
            "accept_token_num",
            format!("expected {bs} entries, got {}", accept_token_num.len()),
        ));
    }
    if bs == 0 {
        return Ok(());
    }
    if n == 0 {
        // Every request's walk starts at its root, node 0.
        return Err(Error::value(
            "candidates",
            format!("expected shape ({bs}, N) with N >= 1 (the root), got ({bs}, 0)"),
        ));
    }
    if accept_index.is_empty() || !accept_index.len().is_multiple_of(bs) {
        return Err(Error::value(
            "accept_index",
            format!(
                "expected shape ({bs}, S + 1), got {} entries",
                accept_index.len()
            ),
        ));
    }
    let width = accept_index.len() / bs;
    let global = |b: usize, i: usize| -> Result<usize> {
        let g = inp.retrive_index[(b, i)];
        if g < 0 || g >= total as i64 {
            return Err(Error::index(
                "retrive_index",
                format!("retrive_index[{b}, {i}] = {g} is outside [0, {total})"),
            ));
        }
        Ok(g as usize)
    };
    let local = |arr: &ArrayView2<'_, i64>, name: &'static str, b: usize, i: usize| {
        let c = arr[(b, i)];
        if c < -1 || c >= n as i64 {
            return Err(Error::index(
                name,
                format!("{name}[{b}, {i}] = {c} is outside [-1, {n})"),
            ));
        }
        Ok(c)
    };
    // `on_path[i] == b + 1`: node i is on request b's accepted path (no reset per request).
    let mut on_path = vec![0usize; n];
    for b in 0..bs {
        // Entries past the path are left as they are, as the kernel leaves them (SGLang
        // allocates the buffer filled with -1).
        let row = &mut accept_index[b * width..(b + 1) * width];
        let mut last = global(b, 0)?;
        row[0] = last as i32;
        on_path[0] = b + 1;
        let mut k = 0usize;
        let mut cur = 0i64;
        // Local index of the last accepted node.
        let mut at = 0usize;
        for _ in 1..width {
            cur = local(
                &inp.retrive_next_token,
                "retrive_next_token",
                b,
                cur as usize,
            )?;
            let want = inp.target_predict[last];
            let mut hops = 0usize;
            while cur != -1 {
                let c = cur as usize;
                if inp.candidates[(b, c)] == want {
                    // A node reached again (a child list leading back to the path) would be
                    // accepted again, past what the tree holds: the lists are no tree.
                    if on_path[c] == b + 1 {
                        return Err(Error::value(
                            "retrive_next_token",
                            format!(
                                "request {b}: node {c} is reached again from node {} (the \
                                 child and sibling lists do not form a tree)",
                                at
                            ),
                        ));
                    }
                    on_path[c] = b + 1;
                    at = c;
                    let g = global(b, c)?;
                    predicts[last] = to_i32(want, b)?;
                    k += 1;
                    row[k] = g as i32;
                    last = g;
                    break;
                }
                hops += 1;
                if hops > n {
                    return Err(Error::value(
                        "retrive_next_sibling",
                        format!("request {b}: the sibling list from node {c} has a cycle"),
                    ));
                }
                cur = local(&inp.retrive_next_sibling, "retrive_next_sibling", b, c)?;
            }
            if cur == -1 {
                break;
            }
        }
        accept_token_num[b] = k as i32;
        predicts[last] = to_i32(inp.target_predict[last], b)?;
    }
    Ok(())
}

fn to_i32(tok: i64, b: usize) -> Result<i32> {
    i32::try_from(tok).map_err(|_| {
        Error::value(
            "target_predict",
            format!("request {b}: token {tok} does not fit SGLang's int32 predicts"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;

    #[derive(Debug)]
    struct Built {
        mask: Vec<bool>,
        positions: Vec<i64>,
        next_token: Vec<i64>,
        next_sibling: Vec<i64>,
    }

    fn build(
        parent_list: &Array2<i64>,
        sel: &Array2<i64>,
        seq: &[usize],
        topk: usize,
    ) -> Result<Built> {
        let n = sel.ncols() + 1;
        let bs = seq.len();
        // Junk in every output, as in a reused buffer: the build must write each entry.
        let mut mask = vec![true; bs * n * n];
        let mut positions = vec![7; bs * n];
        let mut ri = vec![7; bs * n];
        let mut nt = vec![7; bs * n];
        let mut ns = vec![7; bs * n];
        build_tree(
            parent_list.view(),
            sel.view(),
            seq,
            topk,
            3,
            n,
            BuildOut {
                tree_mask: MaskOut::Qlen(&mut mask),
                positions: &mut positions,
                retrive_index: &mut ri,
                retrive_next_token: &mut nt,
                retrive_next_sibling: &mut ns,
            },
        )?;
        Ok(Built {
            mask,
            positions,
            next_token: nt,
            next_sibling: ns,
        })
    }

    #[test]
    fn builds_links_positions_and_mask() {
        // topk 2: candidates 0, 1 under the root; 2..5 are children of parent_list[1] and
        // parent_list[2] (candidates 0 and 1).
        let pl = Array2::from_shape_vec((1, 3), vec![-1, 0, 1]).unwrap();
        let sel = Array2::from_shape_vec((1, 3), vec![0, 1, 4]).unwrap();
        let r = build(&pl, &sel, &[7], 2).unwrap();
        assert_eq!(r.positions, [7, 8, 8, 9]);
        assert_eq!(r.next_token, [1, -1, 3, -1]);
        assert_eq!(r.next_sibling, [-1, 2, -1, -1]);
        let row3: Vec<bool> = r.mask[12..16].to_vec();
        assert_eq!(row3, [true, false, true, true]);
    }

    /// Random trees (parents first) and their ancestor words.
    fn random_tree(n: usize, seed: u64) -> (Vec<usize>, Vec<u64>) {
        let mut parent = vec![0; n];
        let mut anc = vec![1u64; n];
        for i in 1..n {
            parent[i] = (crate::rng::hash(seed, 0, i as u64, 0) % i as u64) as usize;
            anc[i] = anc[parent[i]] | 1 << i;
        }
        (parent, anc)
    }

    /// The writers from ancestor words that this CPU runs; names those it does not.
    fn word_writers() -> Vec<RowWriter> {
        let (run, skip): (Vec<_>, Vec<_>) = RowWriter::ALL[1..]
            .iter()
            .partition(|writer| writer.supported());
        if !skip.is_empty() {
            eprintln!("skipped on this CPU: {skip:?} (the copy path is tested everywhere)");
        }
        run
    }

    #[test]
    fn rows_from_ancestor_words_equal_copied_rows() {
        for writer in word_writers() {
            for n in [1, 2, 7, 8, 31, 32, 33, 63, 64] {
                for prefix in [0, 1, 5, 64] {
                    let (parent, anc) = random_tree(n, n as u64 * 31 + prefix as u64);
                    let cols = prefix + n;
                    // Stale bytes everywhere: each writer must overwrite the whole row.
                    let mut want = vec![true; n * cols];
                    let mut got = vec![true; n * cols];
                    copy_rows(&mut want, cols, prefix, &parent);
                    fill_rows(&mut got, cols, prefix, writer, &parent, &anc);
                    assert_eq!(got, want, "{writer:?} n={n} prefix={prefix}");
                }
            }
        }
    }

    #[test]
    fn batch_mask_from_words_equals_copied_rows_at_every_alignment() {
        for writer in word_writers() {
            for n in [1, 7, 33, 63, 64] {
                for requests in [1, 3] {
                    let trees: Vec<_> = (0..requests)
                        .map(|r| random_tree(n, (n * 7 + r) as u64))
                        .collect();
                    let words: Vec<u64> = trees.iter().flat_map(|t| t.1.clone()).collect();
                    let len = words.len() * n;
                    let mut want = vec![true; len];
                    for (seg, (parent, _)) in want.chunks_mut(n * n).zip(&trees) {
                        copy_rows(seg, n, 0, parent);
                    }
                    // Every start within a cache line, with stale bytes on both sides that
                    // must survive: no store may pass either end of `out`.
                    let mut buf = vec![true; len + 128];
                    for start in 0..64 {
                        buf.fill(true);
                        let out = &mut buf[start..start + len];
                        spread_rows(out, n, &words, writer);
                        let at = format!("{writer:?} n={n} requests={requests} start={start}");
                        assert_eq!(out, &want[..], "{at}");
                        let around = buf[..start].iter().chain(&buf[start + len..]);
                        assert!(around.into_iter().all(|&x| x), "{at}");
                    }
                }
            }
        }
    }

    #[test]
    fn packed_rows_must_fit_their_word() {
        let pl = Array2::from_shape_vec((1, 1), vec![-1]).unwrap();
        let sel = Array2::from_shape_vec((1, 8), (0..8).collect()).unwrap();
        let (mut m, mut pos, mut ri, mut nt, mut ns) =
            (vec![0u8; 9], vec![0; 9], vec![0; 9], vec![0; 9], vec![0; 9]);
        let out = BuildOut {
            tree_mask: MaskOut::Packed8(&mut m),
            positions: &mut pos,
            retrive_index: &mut ri,
            retrive_next_token: &mut nt,
            retrive_next_sibling: &mut ns,
        };
        let e = build_tree(pl.view(), sel.view(), &[0], 8, 1, 9, out).unwrap_err();
        assert!(e.to_string().contains("8-bit"), "{e}");
    }

    /// A random SGLang draft: `(parent_list, selected_index)` for `bs` requests of `n` nodes
    /// (`topk`, `steps`), each slot's parent a candidate of the step before, the selection
    /// ancestor-closed and sorted.
    fn random_draft(
        seed: u64,
        bs: usize,
        (topk, steps, n): (usize, usize, usize),
    ) -> (Array2<i64>, Array2<i64>) {
        let pool = pool_size(topk, steps);
        let slots = 1 + (steps - 1) * topk;
        let draw = |b: usize, g: usize, k: u64| crate::rng::hash(seed, b as u64, g as u64, k);
        let mut pl = Array2::from_elem((bs, slots), -1i64);
        let mut sel = Array2::zeros((bs, n - 1));
        for b in 0..bs {
            // Slot s >= 1 expands a candidate of draft step `step`: one of `lo..hi`.
            for s in 1..slots {
                let step = (s - 1) / topk + 1;
                let lo = if step == 1 {
                    0
                } else {
                    pool_size(topk, step - 1)
                };
                let hi = pool_size(topk, step);
                pl[(b, s)] = (lo + draw(b, s, 0) as usize % (hi - lo)) as i64;
            }
            let mut chosen = vec![false; pool];
            let mut picked = Vec::new();
            // Rounds over the pool until n - 1 are picked, each candidate with some chance
            // once its parent is in (every candidate is reachable from the root).
            for round in 1u64.. {
                for g in 0..pool {
                    let slot = g / topk;
                    let parent_in = slot == 0 || chosen[pl[(b, slot)] as usize];
                    let lucky = draw(b, g, round) % 3 == 0;
                    if picked.len() < n - 1 && !chosen[g] && parent_in && lucky {
                        chosen[g] = true;
                        picked.push(g as i64);
                    }
                }
                if picked.len() == n - 1 {
                    break;
                }
            }
            picked.sort_unstable();
            for (j, &g) in picked.iter().enumerate() {
                sel[(b, j)] = g;
            }
        }
        (pl, sel)
    }

    #[test]
    fn rows_copied_from_parents_equal_rows_from_words() {
        // Rows of up to 64 nodes come from ancestor words on CPUs with AVX2 or AVX-512BW, and
        // are copied from parents elsewhere (and past 64 nodes). Every writer this CPU runs
        // must write the copies' masks, in both dense modes (the Python tests hold the
        // fastest one to the reference).
        let seq = [3usize, 0, 11];
        let writers = word_writers();
        for (seed, shape) in [
            (1, (2, 4, 9)),
            (2, (4, 3, 33)),
            (3, (8, 4, 64)),
            (4, (3, 6, 40)),
        ] {
            let (pl, sel) = random_draft(seed, seq.len(), shape);
            let n = shape.2;
            for full in [false, true] {
                let len = if full {
                    full_mask_len(&seq, n).unwrap()
                } else {
                    seq.len() * n * n
                };
                // Each writer's mask and lists (the word writers' links keep no parents, and
                // rebuild repeated parents' lists without them).
                let masks: Vec<(Vec<bool>, Vec<i64>)> = std::iter::once(RowWriter::Copy)
                    .chain(writers.iter().copied())
                    .map(|writer| {
                        let mut mask = vec![false; len];
                        let mut lists = vec![0i64; 4 * seq.len() * n];
                        let mut parts = lists.chunks_mut(seq.len() * n);
                        let mut next = || parts.next().unwrap();
                        let out = BuildOut {
                            tree_mask: if full {
                                MaskOut::Full(&mut mask)
                            } else {
                                MaskOut::Qlen(&mut mask)
                            },
                            positions: next(),
                            retrive_index: next(),
                            retrive_next_token: next(),
                            retrive_next_sibling: next(),
                        };
                        build_tree_rows(pl.view(), sel.view(), &seq, shape, out, writer).unwrap();
                        (mask, lists)
                    })
                    .collect();
                for (built, writer) in masks[1..].iter().zip(&writers) {
                    assert_eq!(
                        built, &masks[0],
                        "{writer:?} seed={seed} shape={shape:?} full={full}"
                    );
                }
                assert!(masks[0].0.iter().any(|&x| x));
            }
        }
    }

    #[test]
    fn root_tokens_come_before_each_requests_drafts() {
        let roots = ndarray::arr1(&[7i64, 8]);
        let wide = Array2::from_shape_vec((2, 6), (0..12).collect()).unwrap();
        // Every other column: rows that are not contiguous.
        let drafts = wide.slice(ndarray::s![.., ..;2]);
        let mut out = vec![0i64; 8];
        root_then_drafts(roots.view(), drafts, &mut out).unwrap();
        assert_eq!(out, [7, 0, 2, 4, 8, 6, 8, 10]);
        let err = root_then_drafts(roots.slice(ndarray::s![..1]), drafts, &mut out);
        assert!(err.unwrap_err().to_string().contains("verified_id"));
        let err = root_then_drafts(roots.view(), drafts, &mut out[..7]);
        assert!(err.unwrap_err().to_string().contains("8 entries"));
    }

    #[test]
    fn rejects_an_invalid_eagle_tree_by_name() {
        let pl = Array2::from_shape_vec((1, 3), vec![-1, 0, 1]).unwrap();
        // Candidate 4's parent (candidate 1) is not selected.
        let sel = Array2::from_shape_vec((1, 2), vec![0, 4]).unwrap();
        let e = build(&pl, &sel, &[0], 2).unwrap_err();
        assert!(e.to_string().contains("request 0, node 2"), "{e}");
        let sel = Array2::from_shape_vec((1, 2), vec![1, 0]).unwrap();
        assert!(build(&pl, &sel, &[0], 2).is_err());
        let sel = Array2::from_shape_vec((1, 2), vec![0, 99]).unwrap();
        assert!(build(&pl, &sel, &[0], 2).is_err());
    }

    #[test]
    fn greedy_walk_matches_sglang_contract() {
        // Tree: 0 -> {1, 2}, 2 -> {3}; tokens 1:5, 2:7, 3:9.
        let cand = Array2::from_shape_vec((1, 4), vec![0, 5, 7, 9]).unwrap();
        let ri = Array2::from_shape_vec((1, 4), vec![0, 1, 2, 3]).unwrap();
        let nt = Array2::from_shape_vec((1, 4), vec![1, -1, 3, -1]).unwrap();
        let ns = Array2::from_shape_vec((1, 4), vec![-1, 2, -1, -1]).unwrap();
        let target = [7i64, 0, 9, 4];
        let mut pred = vec![0; 4];
        // SGLang's buffer starts at -1; the walk writes the path and leaves the rest.
        let mut idx = vec![-1; 4];
        let mut num = vec![0; 1];
        verify_tree_greedy(
            GreedyIn {
                candidates: cand.view(),
                retrive_index: ri.view(),
                retrive_next_token: nt.view(),
                retrive_next_sibling: ns.view(),
                target_predict: ArrayView1::from(&target),
            },
            &mut pred,
            &mut idx,
            &mut num,
        )
        .unwrap();
        assert_eq!(pred, [7, 0, 9, 4]);
        assert_eq!(idx, [0, 2, 3, -1]);
        assert_eq!(num, [2]);
    }
}
