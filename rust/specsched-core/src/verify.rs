//! Longest accepted path: the walk every lossless verification rule ends in.
//!
//! Stage one decides, per node `v`, the token `y[v]` the target emits after `v`; stage two walks
//! from the root: the first child of `v` (in increasing node index) whose token equals `y[v]` is
//! accepted and the walk moves to it, otherwise it stops and `y[v]` is the bonus token. The
//! choice is a callback, so greedy-from-logits reduces only the rows the walk visits, and a
//! precomputed per-node choice (device argmax, target tokens) costs one lookup. A walk is
//! O(depth · branching); a batch walks its trees independently, in parallel when the work is
//! large enough to pay for the thread hand-off.

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::tree::{IndexLike, TreeBatch, TreeRef};

/// Walks one tree. `choose(v)` returns the target's token after tree-local node `v`.
/// Writes `accepted[0..=k]` (root first) and `emitted[0..=k]` (accepted draft tokens, then the
/// bonus), both at least `max_depth + 1` long, and returns `k`.
pub fn walk<F>(
    tree: TreeRef<'_>,
    mut choose: F,
    accepted: &mut [i32],
    emitted: &mut [i64],
) -> Result<usize>
where
    F: FnMut(usize) -> Result<i64>,
{
    debug_assert!(accepted.len() > tree.max_depth as usize && emitted.len() == accepted.len());
    accepted[0] = 0;
    let mut v = 0usize;
    let mut k = 0usize;
    loop {
        let y = choose(v)?;
        emitted[k] = y;
        match tree.children(v).find(|&c| tree.tokens[c] == y) {
            Some(c) => {
                k += 1;
                accepted[k] = c as i32;
                v = c;
            }
            None => return Ok(k),
        }
    }
}

/// Result of verifying one tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// `0, a1, ..., ak`.
    pub accepted_nodes: Vec<i32>,
    /// Accepted draft tokens, then the bonus token (`k + 1` entries).
    pub tokens: Vec<i64>,
    /// Node count of the verified tree (KV plans check caches against it).
    pub num_nodes: usize,
}

impl Verified {
    pub fn num_accepted(&self) -> usize {
        self.accepted_nodes.len() - 1
    }
}

/// Verifies one tree with a per-node choice.
pub fn verify_tree<F>(tree: TreeRef<'_>, choose: F) -> Result<Verified>
where
    F: FnMut(usize) -> Result<i64>,
{
    let width = tree.max_depth as usize + 1;
    let mut accepted = vec![0i32; width];
    let mut emitted = vec![0i64; width];
    let k = walk(tree, choose, &mut accepted, &mut emitted)?;
    accepted.truncate(k + 1);
    emitted.truncate(k + 1);
    Ok(Verified {
        accepted_nodes: accepted,
        tokens: emitted,
        num_nodes: tree.num_nodes(),
    })
}

/// Result of verifying a batch: row-major `[B, width]` arrays padded with -1,
/// `width = max_depth + 1` of the batch; accepted nodes are tree-local.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchVerified {
    pub num_accepted: Vec<i32>,
    pub accepted_nodes: Vec<i32>,
    pub tokens: Vec<i64>,
    pub width: usize,
    /// CSR offsets of the verified batch (`[B+1]`), for global indices and KV checks.
    pub offsets: Vec<usize>,
}

impl BatchVerified {
    pub fn num_trees(&self) -> usize {
        self.num_accepted.len()
    }

    /// Request `b` as a single-tree result.
    pub fn get(&self, b: usize) -> Verified {
        let k = self.num_accepted[b] as usize;
        let row = b * self.width;
        Verified {
            accepted_nodes: self.accepted_nodes[row..row + k + 1].to_vec(),
            tokens: self.tokens[row..row + k + 1].to_vec(),
            num_nodes: self.offsets[b + 1] - self.offsets[b],
        }
    }

    /// Accepted node rows (with padding) of request `b`.
    pub fn accepted_row(&self, b: usize) -> &[i32] {
        &self.accepted_nodes[b * self.width..(b + 1) * self.width]
    }
}

/// One request's output row: accepted nodes, emitted tokens, accepted count.
type RowMut<'a> = ((&'a mut [i32], &'a mut [i64]), &'a mut i32);

/// Below this much work (batch × path width × row cost, an upper bound on what the walk reads)
/// a batch is walked on the calling thread. Measured on 2 cores (serial vs pool at B = 8..4096,
/// N = 64): a walk over target tokens costs ~50 ns per tree,
/// so the pool's hand-off (10-20 µs) never paid below B = 4096; argmax rows of V = 32000 cost
/// ~5 µs each, and the pool only wins once several million logits are to be read.
const PARALLEL_MIN_WORK: usize = 1 << 22;

/// Verifies every tree of `batch`. `choose(g)` takes a *global* (flat) node index; `row_cost`
/// estimates the cost of one choice (1 for a lookup, `V` for an argmax over a row).
pub fn verify_batch<F>(batch: &TreeBatch, choose: F, row_cost: usize) -> Result<BatchVerified>
where
    F: Fn(usize) -> Result<i64> + Sync,
{
    let b = batch.num_trees();
    let width = batch.max_depth() as usize + 1;
    let mut out = BatchVerified {
        num_accepted: vec![0; b],
        accepted_nodes: vec![-1; b * width],
        tokens: vec![-1; b * width],
        width,
        offsets: batch.offsets().to_vec(),
    };
    let offsets = batch.offsets();
    let one = |(i, ((acc, tok), num)): (usize, RowMut<'_>)| {
        let base = offsets[i];
        let k = walk(batch.tree(i), |v| choose(base + v), acc, tok)?;
        *num = k as i32;
        // The walk wrote k + 1 entries; the rest of the row stays -1 padding.
        acc[k + 1..].fill(-1);
        tok[k + 1..].fill(-1);
        Ok::<(), Error>(())
    };
    let work = b.saturating_mul(width).saturating_mul(row_cost.max(1));
    let rows = out
        .accepted_nodes
        .chunks_mut(width)
        .zip(out.tokens.chunks_mut(width))
        .zip(out.num_accepted.iter_mut());
    if b > 1 && work >= PARALLEL_MIN_WORK {
        let rows: Vec<_> = rows.collect();
        rows.into_par_iter().enumerate().try_for_each(one)?;
    } else {
        rows.enumerate().try_for_each(one)?;
    }
    Ok(out)
}

/// A per-node choice array (`[T]`), e.g. the device argmax or the target's sampled tokens.
/// `invalid_rows[g]`, when given, marks nodes whose target output was NaN: the walk fails if
/// it reaches one (the device reduction cannot know which rows the walk will visit).
pub fn choice_from_tokens<'a, I: IndexLike>(
    target: ndarray::ArrayView1<'a, I>,
    invalid_rows: Option<ndarray::ArrayView1<'a, bool>>,
    num_nodes: usize,
) -> Result<impl Fn(usize) -> Result<i64> + Sync + 'a> {
    if target.len() != num_nodes {
        return Err(Error::value(
            "target_tokens",
            format!(
                "has {} entries, expected one per tree node ({num_nodes})",
                target.len()
            ),
        ));
    }
    if let Some(inv) = &invalid_rows {
        if inv.len() != num_nodes {
            return Err(Error::value(
                "nan_rows",
                format!(
                    "has {} entries, expected one per tree node ({num_nodes})",
                    inv.len()
                ),
            ));
        }
    }
    Ok(move |g: usize| match &invalid_rows {
        Some(inv) if inv[g] => Err(nan_row(g)),
        _ => Ok(target[g].to_i64()),
    })
}

/// The error for a NaN in a row the walk reads.
pub fn nan_row(row: usize) -> Error {
    Error::value(
        "logits",
        format!("row {row} contains NaN; the target's output is invalid"),
    )
}

/// SGLang's `verify_tree_greedy` outputs for a verified batch: `predicts [T]` (the target's
/// token at every accepted node, 0 elsewhere), `accept_index [B, width]` (global flat node
/// indices, -1 padded) and `accept_length [B]` (draft tokens accepted, bonus excluded).
pub fn sglang_outputs(r: &BatchVerified) -> Result<(Vec<i32>, Vec<i32>, Vec<i32>)> {
    let total = *r.offsets.last().unwrap_or(&0);
    let mut predicts = vec![0i32; total];
    let mut accept_index = vec![-1i32; r.accepted_nodes.len()];
    for b in 0..r.num_trees() {
        let k = r.num_accepted[b] as usize;
        let row = b * r.width;
        for j in 0..=k {
            let g = r.offsets[b] + r.accepted_nodes[row + j] as usize;
            let tok = r.tokens[row + j];
            predicts[g] = i32::try_from(tok).map_err(|_| {
                Error::value(
                    "tokens",
                    format!("token {tok} of request {b} does not fit SGLang's int32 predicts"),
                )
            })?;
            accept_index[row + j] = g as i32;
        }
    }
    Ok((predicts, accept_index, r.num_accepted.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Tree;
    use ndarray::ArrayView1;

    #[test]
    fn walk_takes_the_first_matching_sibling() {
        // 0 -> {1: tok 5, 2: tok 7}; 2 -> {3: tok 9}
        let t = Tree::new(&[-1, 0, 0, 2], &[1, 5, 7, 9]).unwrap();
        let target = [7i64, 0, 9, 4];
        let f = choice_from_tokens(ArrayView1::from(&target), None, 4).unwrap();
        let r = verify_tree(t.view(), &f).unwrap();
        assert_eq!(r.accepted_nodes, [0, 2, 3]);
        assert_eq!(r.tokens, [7, 9, 4]);
        assert_eq!(r.num_accepted(), 2);
    }

    #[test]
    fn batch_pads_and_reports_sglang_outputs() {
        let p = [-1i32, 0, -1, 0, 1];
        let tok = [0i64, 3, 0, 5, 6];
        let b = TreeBatch::from_views(
            ArrayView1::from(&p),
            ArrayView1::from(&tok),
            ArrayView1::from(&[0i64, 2, 5]),
        )
        .unwrap();
        let target = [4i64, 0, 5, 6, 8];
        let f = choice_from_tokens(ArrayView1::from(&target), None, 5).unwrap();
        let r = verify_batch(&b, f, 1).unwrap();
        let invalid = [false, false, false, true, false];
        let g = choice_from_tokens(
            ArrayView1::from(&target),
            Some(ArrayView1::from(&invalid)),
            5,
        );
        let err = verify_batch(&b, g.unwrap(), 1).unwrap_err();
        assert!(err.to_string().contains("row 3"), "{err}");
        assert_eq!(r.width, 3);
        assert_eq!(r.num_accepted, [0, 2]);
        assert_eq!(r.accepted_nodes, [0, -1, -1, 0, 1, 2]);
        assert_eq!(r.tokens, [4, -1, -1, 5, 6, 8]);
        let (pred, idx, len) = sglang_outputs(&r).unwrap();
        assert_eq!(pred, [4, 0, 5, 6, 8]);
        assert_eq!(idx, [0, -1, -1, 2, 3, 4]);
        assert_eq!(len, [0, 2]);
        assert!(choice_from_tokens(ArrayView1::from(&target), None, 4).is_err());
    }
}
