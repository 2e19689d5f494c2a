//! What a target forward pass needs from a tree: attention masks in every layout serving
//! engines use, positions, root-to-leaf paths and SGLang's first-child / next-sibling lists.
//!
//! Every mask row is its parent's row plus the node itself (parents precede children), so a
//! dense `[N, W]` mask costs one row copy per node — O(N·W) writes, no ancestor walks. All
//! kernels write into caller-provided buffers, which the bindings allocate as the numpy arrays
//! they return; the batched forms run trees in parallel once the output is large enough to
//! amortise the thread hand-off.

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::tree::{per_tree_sizes, TreeBatch, TreeRef};

/// Outputs smaller than this (elements) are filled on the calling thread.
const PARALLEL_MIN_ELEMENTS: usize = 1 << 18;

fn check_len(arg: &'static str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(Error::value(
            arg,
            format!("has {got} elements, expected {want}"),
        ));
    }
    Ok(())
}

/// Largest output accepted, in elements: anything larger cannot be allocated anyway, and
/// refusing it up front turns an absurd `prefix_len` into a clear error instead of an
/// overflow.
pub const MAX_OUTPUT_ELEMENTS: usize = 1 << 40;

/// `rows * cols`, refused (naming `arg`) when it overflows or exceeds [`MAX_OUTPUT_ELEMENTS`].
pub fn output_len(arg: &'static str, rows: usize, cols: usize) -> Result<usize> {
    rows.checked_mul(cols)
        .filter(|&n| n <= MAX_OUTPUT_ELEMENTS)
        .ok_or_else(|| {
            Error::value(
                arg,
                format!(
                    "the output would have {rows} x {cols} elements, more than can be allocated"
                ),
            )
        })
}

/// Number of 32-bit words per packed-mask row for `n` nodes.
#[inline]
pub fn packed_words(n: usize) -> usize {
    n.div_ceil(32)
}

/// Fills `out` (`N` rows of `row_width >= prefix + N`) with the ancestor mask: `yes` on the
/// prefix columns and on the columns of the node and its ancestors, `no` elsewhere (including
/// any padding columns past `prefix + N`).
pub fn fill_ancestor_rows<T: Copy>(
    tree: TreeRef<'_>,
    prefix: usize,
    row_width: usize,
    yes: T,
    no: T,
    out: &mut [T],
) -> Result<()> {
    let n = tree.num_nodes();
    if row_width < prefix + n {
        return Err(Error::value(
            "out",
            format!(
                "row width {row_width} is less than prefix_len + N = {}",
                prefix + n
            ),
        ));
    }
    check_len("out", out.len(), n * row_width)?;
    for i in 0..n {
        let row = i * row_width;
        if i == 0 {
            out[row..row + prefix].fill(yes);
            out[row + prefix..row + row_width].fill(no);
        } else {
            // Parent rows are complete (parent < i): copy the whole row, then add the node.
            let p = tree.parents[i] as usize * row_width;
            out.copy_within(p..p + row_width, row);
        }
        out[row + prefix + i] = yes;
    }
    Ok(())
}

/// Packed ancestor mask: `words_per_row >= ceil(N/32)` u32 words per row, bit `j % 32` of word
/// `j / 32` set iff `j` is the node or an ancestor (little-endian bit order, as TensorRT-LLM
/// and SGLang's QLEN_ONLY_BITPACKING use).
pub fn fill_packed_mask(tree: TreeRef<'_>, words_per_row: usize, out: &mut [u32]) -> Result<()> {
    let n = tree.num_nodes();
    if words_per_row < packed_words(n) {
        return Err(Error::value(
            "out",
            format!("{words_per_row} words per row cannot hold {n} nodes"),
        ));
    }
    check_len("out", out.len(), n * words_per_row)?;
    for i in 0..n {
        let row = i * words_per_row;
        if i == 0 {
            out[row..row + words_per_row].fill(0);
        } else {
            let p = tree.parents[i] as usize * words_per_row;
            out.copy_within(p..p + words_per_row, row);
        }
        out[row + i / 32] |= 1u32 << (i % 32);
    }
    Ok(())
}

/// `prefix + depth` per node; refused if a position would not fit in int64.
pub fn fill_positions(tree: TreeRef<'_>, prefix: i64, out: &mut [i64]) -> Result<()> {
    check_len("out", out.len(), tree.num_nodes())?;
    if prefix < 0 || prefix.checked_add(tree.max_depth as i64).is_none() {
        return Err(Error::value(
            "prefix_len",
            format!(
                "{prefix} + tree depth {} is not a valid int64 position",
                tree.max_depth
            ),
        ));
    }
    for (o, &d) in out.iter_mut().zip(tree.depths) {
        *o = prefix + d as i64;
    }
    Ok(())
}

/// Root-to-leaf node paths, one row of `width >= max_depth + 1` per leaf (leaves in increasing
/// node index), `-1` padded. `out` holds `rows >= num_leaves` rows; extra rows are all `-1`.
pub fn fill_paths(tree: TreeRef<'_>, width: usize, out: &mut [i32]) -> Result<()> {
    if width < tree.max_depth as usize + 1 {
        return Err(Error::value(
            "out",
            format!(
                "row width {width} is less than max_depth + 1 = {}",
                tree.max_depth + 1
            ),
        ));
    }
    if !out.len().is_multiple_of(width.max(1)) || out.len() / width.max(1) < tree.num_leaves {
        return Err(Error::value(
            "out",
            format!("cannot hold {} paths of width {width}", tree.num_leaves),
        ));
    }
    out.fill(-1);
    let leaves = (0..tree.num_nodes()).filter(|&v| tree.first_child[v] < 0);
    for (row, leaf) in out.chunks_exact_mut(width).zip(leaves) {
        let mut v = leaf as i32;
        while v >= 0 {
            row[tree.depths[v as usize] as usize] = v;
            v = tree.parents[v as usize];
        }
    }
    Ok(())
}

/// SGLang's `retrive_next_token` (first child) and `retrive_next_sibling`, tree-local, -1 = none.
pub fn fill_sglang_links(
    tree: TreeRef<'_>,
    next_token: &mut [i64],
    next_sibling: &mut [i64],
) -> Result<()> {
    check_len("next_token", next_token.len(), tree.num_nodes())?;
    check_len("next_sibling", next_sibling.len(), tree.num_nodes())?;
    for (o, &c) in next_token.iter_mut().zip(tree.first_child) {
        *o = c as i64;
    }
    for (o, &s) in next_sibling.iter_mut().zip(tree.next_sibling) {
        *o = s as i64;
    }
    Ok(())
}

/// Per-request prefix lengths: one value for all, or one per tree; all non-negative.
#[derive(Debug, Clone, Copy)]
pub enum PrefixLens<'a> {
    All(i64),
    PerTree(&'a [i64]),
}

impl PrefixLens<'_> {
    /// Checks the count and signs; returns the per-tree lengths.
    pub fn resolve(&self, num_trees: usize) -> Result<Vec<usize>> {
        match *self {
            PrefixLens::All(p) => {
                if p < 0 {
                    return Err(Error::value(
                        "prefix_lens",
                        format!("must be >= 0, got {p}"),
                    ));
                }
                Ok(vec![p as usize; num_trees])
            }
            PrefixLens::PerTree(v) => per_tree_sizes(v, num_trees, "prefix_lens"),
        }
    }
}

/// Splits `out` into consecutive mutable segments at the boundaries `indptr` (len B+1).
fn segments_mut<'a, T>(mut out: &'a mut [T], indptr: &[usize]) -> Vec<&'a mut [T]> {
    let mut segs = Vec::with_capacity(indptr.len().saturating_sub(1));
    for w in indptr.windows(2) {
        let (head, tail) = std::mem::take(&mut out).split_at_mut(w[1] - w[0]);
        segs.push(head);
        out = tail;
    }
    segs
}

/// Runs `f(tree, b, segment)` for every tree, on the thread pool when the output is large.
fn for_each_tree<T: Send, F>(batch: &TreeBatch, out: &mut [T], indptr: &[usize], f: F) -> Result<()>
where
    F: Fn(TreeRef<'_>, usize, &mut [T]) -> Result<()> + Sync,
{
    let total = out.len();
    check_len("out", total, *indptr.last().unwrap_or(&0))?;
    let segs = segments_mut(out, indptr);
    if total >= PARALLEL_MIN_ELEMENTS && batch.num_trees() > 1 {
        segs.into_par_iter()
            .enumerate()
            .try_for_each(|(b, seg)| f(batch.tree(b), b, seg))
    } else {
        segs.into_iter()
            .enumerate()
            .try_for_each(|(b, seg)| f(batch.tree(b), b, seg))
    }
}

fn cumulative(sizes: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut indptr = vec![0usize];
    let mut acc = 0usize;
    for s in sizes {
        acc += s;
        indptr.push(acc);
    }
    indptr
}

/// Cumulative segment sizes, each and their sum checked against [`MAX_OUTPUT_ELEMENTS`].
fn checked_cumulative(
    arg: &'static str,
    sizes: impl Iterator<Item = Result<usize>>,
) -> Result<Vec<usize>> {
    let mut indptr = vec![0usize];
    let mut acc = 0usize;
    for s in sizes {
        acc = acc
            .checked_add(s?)
            .filter(|&n| n <= MAX_OUTPUT_ELEMENTS)
            .ok_or_else(|| {
                Error::value(arg, "the batched output would be too large to allocate")
            })?;
        indptr.push(acc);
    }
    Ok(indptr)
}

/// FlashInfer ragged custom-mask offsets: cumulative `N_b * (prefix_b + N_b)`.
pub fn ragged_mask_indptr(batch: &TreeBatch, prefix: &[usize]) -> Result<Vec<usize>> {
    checked_cumulative(
        "prefix_lens",
        (0..batch.num_trees()).map(|b| {
            let n = batch.tree_size(b);
            output_len("prefix_lens", n, prefix[b] + n)
        }),
    )
}

/// FlashInfer's ragged custom mask (or bias): request by request, the `[N_b, prefix_b + N_b]`
/// ancestor mask flattened row-major.
pub fn fill_ragged_mask<T: Copy + Send + Sync>(
    batch: &TreeBatch,
    prefix: &[usize],
    yes: T,
    no: T,
    out: &mut [T],
) -> Result<()> {
    let indptr = ragged_mask_indptr(batch, prefix)?;
    for_each_tree(batch, out, &indptr, |t, b, seg| {
        fill_ancestor_rows(t, prefix[b], prefix[b] + t.num_nodes(), yes, no, seg)
    })
}

/// Byte offsets of `segment_packbits(mask, indptr, bitorder="little")`: each request's segment
/// is packed on its own into `ceil(len / 8)` bytes.
pub fn packed_ragged_indptr(batch: &TreeBatch, prefix: &[usize]) -> Result<Vec<usize>> {
    checked_cumulative(
        "prefix_lens",
        (0..batch.num_trees()).map(|b| {
            let n = batch.tree_size(b);
            Ok(output_len("prefix_lens", n, prefix[b] + n)?.div_ceil(8))
        }),
    )
}

/// Little-endian bit writer over a zeroed byte segment.
struct BitWriter<'a> {
    bytes: &'a mut [u8],
    pos: usize,
}

impl BitWriter<'_> {
    #[inline]
    fn push(&mut self, bit: bool) {
        if bit {
            self.bytes[self.pos / 8] |= 1 << (self.pos % 8);
        }
        self.pos += 1;
    }

    /// `count` set bits; whole bytes are written at once (the prefix columns are long runs).
    fn push_ones(&mut self, mut count: usize) {
        while count > 0 && !self.pos.is_multiple_of(8) {
            self.push(true);
            count -= 1;
        }
        let whole = count / 8;
        let start = self.pos / 8;
        self.bytes[start..start + whole].fill(0xFF);
        self.pos += whole * 8;
        for _ in 0..count % 8 {
            self.push(true);
        }
    }
}

/// The bit-packed ragged mask (FlashInfer `packed_custom_mask`).
pub fn fill_packed_ragged_mask(batch: &TreeBatch, prefix: &[usize], out: &mut [u8]) -> Result<()> {
    let indptr = packed_ragged_indptr(batch, prefix)?;
    for_each_tree(batch, out, &indptr, |t, b, seg| {
        seg.fill(0);
        let n = t.num_nodes();
        let mut words = vec![0u32; n * packed_words(n)];
        fill_packed_mask(t, packed_words(n), &mut words)?;
        let mut w = BitWriter { bytes: seg, pos: 0 };
        for row in words.chunks_exact(packed_words(n)) {
            w.push_ones(prefix[b]);
            for j in 0..n {
                w.push(row[j / 32] >> (j % 32) & 1 == 1);
            }
        }
        Ok(())
    })
}

/// `N` of the QLEN mask `[B, N, N]`: the size every tree of `batch` must share (checked
/// before a caller sizes an output by it).
pub fn qlen_tree_size(batch: &TreeBatch) -> Result<usize> {
    let n = batch.tree_size(0);
    if let Some(b) = (0..batch.num_trees()).find(|&b| batch.tree_size(b) != n) {
        return Err(Error::value(
            "batch",
            format!(
                "the QLEN mask needs equal tree sizes, but tree 0 has {n} nodes and tree {b} has {}",
                batch.tree_size(b)
            ),
        ));
    }
    Ok(n)
}

/// SGLang's QLEN_ONLY mask `[B, N, N]`; every tree must have the same size.
pub fn fill_qlen_mask(batch: &TreeBatch, out: &mut [bool]) -> Result<()> {
    let n = qlen_tree_size(batch)?;
    let indptr = cumulative((0..batch.num_trees()).map(|_| n * n));
    for_each_tree(batch, out, &indptr, |t, _, seg| {
        fill_ancestor_rows(t, 0, n, true, false, seg)
    })
}

/// `[B, Nmax, Nmax]` tree-only mask, False outside each tree's own `N_b x N_b` block.
pub fn fill_padded_mask(batch: &TreeBatch, out: &mut [bool]) -> Result<()> {
    let m = batch.max_nodes();
    let indptr = cumulative((0..batch.num_trees()).map(|_| m * m));
    for_each_tree(batch, out, &indptr, |t, _, seg| {
        let n = t.num_nodes();
        fill_ancestor_rows(t, 0, m, true, false, &mut seg[..n * m])?;
        seg[n * m..].fill(false);
        Ok(())
    })
}

/// Outputs of [`fill_padded_layout`]: `[B, Nmax]` tokens and positions, the `[B, Nmax, Nmax]`
/// mask, and `[T]` rows and columns, all row-major.
pub struct PaddedOut<'a> {
    pub tokens: &'a mut [i64],
    pub positions: &'a mut [i64],
    pub mask: &'a mut [bool],
    pub rows: &'a mut [i64],
    pub cols: &'a mut [i64],
}

/// The ragged batch as the `[B, Nmax]` batch a model runs: tree b's nodes in slots `0..N_b` of
/// row b (tokens, positions `prefix_b + depth`, the ancestor mask of [`fill_padded_mask`]); a
/// padding slot holds token 0 and position `prefix_b` and attends to itself alone, so no mask
/// row is empty (a softmax over no keys is NaN). `rows[t]`, `cols[t]`: the slot of flat node
/// `t`, to gather per-slot outputs back into tree order.
pub fn fill_padded_layout(batch: &TreeBatch, prefix: &[usize], out: PaddedOut<'_>) -> Result<()> {
    let (b, m) = (batch.num_trees(), batch.max_nodes());
    check_len("prefix_lens", prefix.len(), b)?;
    check_len("tokens", out.tokens.len(), b * m)?;
    check_len("positions", out.positions.len(), b * m)?;
    check_len("rows", out.rows.len(), batch.num_nodes())?;
    check_len("cols", out.cols.len(), batch.num_nodes())?;
    fill_padded_mask(batch, out.mask)?;
    let slots = out.tokens.chunks_exact_mut(m.max(1));
    let places = out.positions.chunks_exact_mut(m.max(1));
    for (tree, ((tokens, positions), &pre)) in slots.zip(places).zip(prefix).enumerate() {
        let t = batch.tree(tree);
        let n = t.num_nodes();
        // The tree's positions as `Tree.positions` writes them; a refusal names this batch's
        // argument and row.
        let pre = batch_prefix(tree, pre, t)?;
        fill_positions(t, pre, &mut positions[..n])?;
        positions[n..].fill(pre);
        tokens[..n].copy_from_slice(t.tokens);
        tokens[n..].fill(0);
        let padding = &mut out.mask[tree * m * m..(tree + 1) * m * m];
        for j in n..m {
            padding[j * m + j] = true;
        }
        let start = batch.offsets()[tree];
        for (local, (row, col)) in out.rows[start..start + n]
            .iter_mut()
            .zip(&mut out.cols[start..start + n])
            .enumerate()
        {
            (*row, *col) = (tree as i64, local as i64);
        }
    }
    Ok(())
}

/// Packed mask of every node over its own tree: `[T, ceil(Nmax/32)]` u32.
pub fn fill_batch_packed_mask(batch: &TreeBatch, out: &mut [u32]) -> Result<()> {
    let w = packed_words(batch.max_nodes());
    let indptr: Vec<usize> = batch.offsets().iter().map(|&o| o * w).collect();
    for_each_tree(batch, out, &indptr, |t, _, seg| fill_packed_mask(t, w, seg))
}

/// Tree `b`'s prefix as an int64 root position, refused (naming the batch's argument and row)
/// when its deepest node's position would not fit in int64.
fn batch_prefix(b: usize, prefix: usize, tree: TreeRef<'_>) -> Result<i64> {
    i64::try_from(prefix)
        .ok()
        .filter(|p| p.checked_add(tree.max_depth as i64).is_some())
        .ok_or_else(|| {
            Error::value(
                "prefix_lens",
                format!(
                    "prefix_lens[{b}] = {prefix} + tree depth {} is not a valid int64 position",
                    tree.max_depth
                ),
            )
        })
}

/// Positions `prefix_b + depth` for every node, `[T]`. Every row is checked before any is
/// written, so a refused call leaves `out` as it was.
pub fn fill_batch_positions(batch: &TreeBatch, prefix: &[usize], out: &mut [i64]) -> Result<()> {
    check_len("prefix_lens", prefix.len(), batch.num_trees())?;
    let roots = batch
        .trees()
        .zip(prefix)
        .enumerate()
        .map(|(b, (t, &p))| batch_prefix(b, p, t))
        .collect::<Result<Vec<i64>>>()?;
    for_each_tree(batch, out, batch.offsets(), |t, b, seg| {
        fill_positions(t, roots[b], seg)
    })
}

/// Largest leaf count of the batch (rows of the padded paths tensor).
pub fn max_leaves(batch: &TreeBatch) -> usize {
    batch.trees().map(|t| t.num_leaves).max().unwrap_or(0)
}

/// Paths of every tree, `[B, Lmax, Dmax + 1]`, tree-local node indices, -1 padded.
pub fn fill_batch_paths(batch: &TreeBatch, out: &mut [i32]) -> Result<()> {
    let width = batch.max_depth() as usize + 1;
    let rows = max_leaves(batch);
    let indptr = cumulative((0..batch.num_trees()).map(|_| rows * width));
    for_each_tree(batch, out, &indptr, |t, _, seg| fill_paths(t, width, seg))
}

/// SGLang links for every node, `[T]` each, tree-local.
pub fn fill_batch_sglang_links(
    batch: &TreeBatch,
    next_token: &mut [i64],
    next_sibling: &mut [i64],
) -> Result<()> {
    check_len("next_token", next_token.len(), batch.num_nodes())?;
    check_len("next_sibling", next_sibling.len(), batch.num_nodes())?;
    let tok = segments_mut(next_token, batch.offsets());
    let sib = segments_mut(next_sibling, batch.offsets());
    for (b, (t, s)) in tok.into_iter().zip(sib).enumerate() {
        fill_sglang_links(batch.tree(b), t, s)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Tree;
    use ndarray::ArrayView1;

    fn sample() -> Tree {
        // 0 -> {1, 2}; 1 -> {3, 4}
        Tree::new(&[-1, 0, 0, 1, 1], &[0, 1, 2, 3, 4]).unwrap()
    }

    #[test]
    fn dense_mask_with_prefix() {
        let t = sample();
        let mut out = vec![false; 5 * 7];
        fill_ancestor_rows(t.view(), 2, 7, true, false, &mut out).unwrap();
        let rows: Vec<String> = out
            .chunks(7)
            .map(|r| r.iter().map(|&b| if b { '1' } else { '0' }).collect())
            .collect();
        assert_eq!(
            rows,
            ["1110000", "1111000", "1110100", "1111010", "1111001"]
        );
    }

    #[test]
    fn packed_paths_links() {
        let t = sample();
        let mut words = vec![0u32; 5];
        fill_packed_mask(t.view(), 1, &mut words).unwrap();
        assert_eq!(words, [0b1, 0b11, 0b101, 0b1011, 0b10011]);
        let mut paths = vec![0i32; 3 * 3];
        fill_paths(t.view(), 3, &mut paths).unwrap();
        assert_eq!(paths, [0, 2, -1, 0, 1, 3, 0, 1, 4]);
        let (mut nt, mut ns) = (vec![0i64; 5], vec![0i64; 5]);
        fill_sglang_links(t.view(), &mut nt, &mut ns).unwrap();
        assert_eq!(nt, [1, 3, -1, -1, -1]);
        assert_eq!(ns, [-1, 2, -1, 4, -1]);
    }

    #[test]
    fn packed_mask_crosses_word_boundaries() {
        let tokens: Vec<i64> = (0..70).collect();
        let t = crate::topology::chain(ArrayView1::from(&tokens)).unwrap();
        let mut words = vec![0u32; 70 * 3];
        fill_packed_mask(t.view(), 3, &mut words).unwrap();
        assert_eq!(&words[69 * 3..], &[u32::MAX, u32::MAX, 0b111111]);
    }

    #[test]
    fn padded_layout_pads_each_row_and_maps_nodes_back() {
        // Tree 0: 0 -> 1 (tokens 7, 8); tree 1: 0 -> {1, 2} (tokens 4, 5, 6).
        let p = [-1i32, 0, -1, 0, 0];
        let tok = [7i64, 8, 4, 5, 6];
        let b = TreeBatch::from_views(
            ArrayView1::from(&p),
            ArrayView1::from(&tok),
            ArrayView1::from(&[0i64, 2, 5]),
        )
        .unwrap();
        let (mut tokens, mut positions, mut mask) = (vec![-9; 6], vec![-9; 6], vec![true; 18]);
        let (mut rows, mut cols) = (vec![-9; 5], vec![-9; 5]);
        let out = PaddedOut {
            tokens: &mut tokens,
            positions: &mut positions,
            mask: &mut mask,
            rows: &mut rows,
            cols: &mut cols,
        };
        fill_padded_layout(&b, &[10, 3], out).unwrap();
        assert_eq!(tokens, [7, 8, 0, 4, 5, 6]);
        assert_eq!(positions, [10, 11, 10, 3, 4, 4]);
        let bits: Vec<u8> = mask.iter().map(|&x| x as u8).collect();
        // Tree 0's padding slot 2 sees itself alone.
        assert_eq!(&bits[..9], &[1, 0, 0, 1, 1, 0, 0, 0, 1]);
        assert_eq!(&bits[9..], &[1, 0, 0, 1, 1, 0, 1, 0, 1]);
        assert_eq!(rows, [0, 0, 1, 1, 1]);
        assert_eq!(cols, [0, 1, 0, 1, 2]);
        let short = PaddedOut {
            tokens: &mut tokens[..5],
            positions: &mut positions,
            mask: &mut mask,
            rows: &mut rows,
            cols: &mut cols,
        };
        let e = fill_padded_layout(&b, &[10, 3], short).unwrap_err();
        assert!(e.to_string().contains("tokens"), "{e}");
    }

    #[test]
    fn ragged_layouts() {
        let p = [-1i32, 0, -1, 0, 1];
        let tok = [0i64; 5];
        let b = TreeBatch::from_views(
            ArrayView1::from(&p),
            ArrayView1::from(&tok),
            ArrayView1::from(&[0i64, 2, 5]),
        )
        .unwrap();
        let prefix = PrefixLens::PerTree(&[1, 3]).resolve(2).unwrap();
        let indptr = ragged_mask_indptr(&b, &prefix).unwrap();
        assert_eq!(indptr, [0, 6, 24]);
        let mut mask = vec![false; 24];
        fill_ragged_mask(&b, &prefix, true, false, &mut mask).unwrap();
        let packed_ptr = packed_ragged_indptr(&b, &prefix).unwrap();
        assert_eq!(packed_ptr, [0, 1, 4]);
        let mut packed = vec![0u8; 4];
        fill_packed_ragged_mask(&b, &prefix, &mut packed).unwrap();
        for seg in 0..2 {
            let bits = &mask[indptr[seg]..indptr[seg + 1]];
            for (k, &bit) in bits.iter().enumerate() {
                let byte = packed[packed_ptr[seg] + k / 8];
                assert_eq!(byte >> (k % 8) & 1 == 1, bit);
            }
        }
        let mut padded = vec![true; 2 * 9];
        fill_padded_mask(&b, &mut padded).unwrap();
        assert_eq!(
            &padded[..9],
            &[true, false, false, true, true, false, false, false, false]
        );
        assert!(fill_qlen_mask(&b, &mut [false; 18]).is_err());
        assert!(PrefixLens::All(-1).resolve(2).is_err());
        let huge = PrefixLens::All(i64::MAX - 1).resolve(2).unwrap();
        assert!(ragged_mask_indptr(&b, &huge).is_err());
        assert!(packed_ragged_indptr(&b, &huge).is_err());
        assert!(fill_positions(b.tree(0), i64::MAX, &mut [0; 2]).is_err());
        assert!(PrefixLens::PerTree(&[1]).resolve(2).is_err());
    }
}
