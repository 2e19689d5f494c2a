//! Trees and ragged batches of trees.
//!
//! A tree of `N` nodes is given by `parents` (`parents[0] == -1`, `0 <= parents[i] < i`) and
//! `tokens`; node 0 is the root, the last committed token. Validation computes, once and in
//! O(N), everything later stages read: depths, first-child / next-sibling links (children in
//! increasing node index) and the leaf count. A [`TreeBatch`] stores `B` trees back to back with
//! CSR `offsets`; parents stay tree-local. Every layout and walk works on a borrowed
//! [`TreeRef`], so single trees and batch members share one code path.

use ndarray::ArrayView1;

use crate::error::{Error, Result};

/// Integer element types accepted for index and token arrays.
pub trait IndexLike: Copy + Send + Sync {
    fn to_i64(self) -> i64;
}

impl IndexLike for i32 {
    #[inline]
    fn to_i64(self) -> i64 {
        self as i64
    }
}

impl IndexLike for i64 {
    #[inline]
    fn to_i64(self) -> i64 {
        self
    }
}

impl IndexLike for u32 {
    #[inline]
    fn to_i64(self) -> i64 {
        self as i64
    }
}

/// Largest tree accepted. Node indices are stored as `i32`, and a dense mask of this many
/// nodes is already 2^32 bytes; a larger request is refused before anything is allocated.
pub const MAX_NODES: usize = 1 << 16;

/// Per-node arrays of one or more trees, stored flat.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Nodes {
    parents: Vec<i32>,
    tokens: Vec<i64>,
    depths: Vec<i32>,
    first_child: Vec<i32>,
    next_sibling: Vec<i32>,
}

impl Nodes {
    fn with_capacity(n: usize) -> Self {
        Nodes {
            parents: Vec::with_capacity(n),
            tokens: Vec::with_capacity(n),
            depths: Vec::with_capacity(n),
            first_child: Vec::with_capacity(n),
            next_sibling: Vec::with_capacity(n),
        }
    }

    /// Validates one tree stored at `parents[start..end]` (tree-local parent indices) and
    /// appends it. Returns (max_depth, num_leaves) of that tree.
    fn push_tree<P: IndexLike, T: IndexLike>(
        &mut self,
        parents: &ArrayView1<P>,
        tokens: &ArrayView1<T>,
        start: usize,
        end: usize,
        tree_index: Option<usize>,
    ) -> Result<(u32, usize)> {
        // Contiguous inputs (every decode-loop caller's) are read as plain slices: indexing a
        // view per node costs more than the node's own work. Strided ones are copied first.
        let pushed = match (parents.as_slice(), tokens.as_slice()) {
            (Some(p), Some(t)) => self.push_nodes(&p[start..end], &t[start..end]),
            _ => {
                let range = ndarray::s![start..end];
                let (p, t) = (parents.slice(range).to_vec(), tokens.slice(range).to_vec());
                self.push_nodes(&p, &t)
            }
        };
        pushed.map_err(|(local, p)| {
            let g = start + local;
            let at = match tree_index {
                Some(b) => format!("parents[{g}] (node {local} of tree {b})"),
                None => format!("parents[{g}]"),
            };
            let why = if local == 0 {
                "but the first node is the root and must have parent -1".to_string()
            } else {
                format!("expected 0 <= parent < {local} (parents come before children)")
            };
            Error::value("parents", format!("{at} = {p}, {why}"))
        })
    }

    /// Appends one tree (`parents` tree-local, as long as `tokens`): depths, tokens, and
    /// first-child / next-sibling links. Returns (max_depth, num_leaves), or the first node
    /// whose parent is invalid as `(node, parent)`, with nothing appended.
    fn push_nodes<P: IndexLike, T: IndexLike>(
        &mut self,
        parents: &[P],
        tokens: &[T],
    ) -> std::result::Result<(u32, usize), (usize, i64)> {
        let n = parents.len();
        let tokens = &tokens[..n];
        let base = self.parents.len();
        self.parents.resize(base + n, -1);
        self.depths.resize(base + n, 0);
        self.tokens.resize(base + n, 0);
        let Nodes {
            parents: out_parents,
            tokens: out_tokens,
            depths: out_depths,
            first_child,
            next_sibling,
        } = self;
        // Exact lengths `n`, so a parent index `p < local < n` needs no bounds check.
        let (out_p, out_d, out_t) = (
            &mut out_parents[base..base + n],
            &mut out_depths[base..base + n],
            &mut out_tokens[base..base + n],
        );
        let mut max_depth = 0i32;
        let mut bad = None;
        for local in 0..n {
            let p = parents[local].to_i64();
            if local == 0 {
                if p != -1 {
                    bad = Some((0, p));
                    break;
                }
            } else {
                if p < 0 || p >= local as i64 {
                    bad = Some((local, p));
                    break;
                }
                let d = out_d[p as usize] + 1;
                max_depth = max_depth.max(d);
                out_p[local] = p as i32;
                out_d[local] = d;
            }
            out_t[local] = tokens[local].to_i64();
        }
        if let Some(bad) = bad {
            out_parents.truncate(base);
            out_depths.truncate(base);
            out_tokens.truncate(base);
            return Err(bad);
        }
        // Links: walking nodes in decreasing index and pushing each onto its parent's list
        // leaves every list in increasing index order.
        first_child.resize(base + n, -1);
        next_sibling.resize(base + n, -1);
        let (fc, ns) = (
            &mut first_child[base..base + n],
            &mut next_sibling[base..base + n],
        );
        for local in (1..n).rev() {
            let p = out_p[local] as usize;
            ns[local] = fc[p];
            fc[p] = local as i32;
        }
        let num_leaves = fc.iter().filter(|&&c| c < 0).count();
        Ok((max_depth as u32, num_leaves))
    }
}

/// A borrowed view of one tree: what every layout and the verify walk read.
#[derive(Debug, Clone, Copy)]
pub struct TreeRef<'a> {
    pub parents: &'a [i32],
    pub tokens: &'a [i64],
    pub depths: &'a [i32],
    /// First child (tree-local index) of each node, -1 for a leaf.
    pub first_child: &'a [i32],
    /// Next sibling (tree-local index, higher than this node's), -1 for the last child.
    pub next_sibling: &'a [i32],
    pub max_depth: u32,
    pub num_leaves: usize,
}

impl TreeRef<'_> {
    #[inline]
    pub fn num_nodes(&self) -> usize {
        self.parents.len()
    }

    /// Children of `v` in increasing node index.
    #[inline]
    pub fn children(&self, v: usize) -> Children<'_> {
        Children {
            next: self.first_child[v],
            next_sibling: self.next_sibling,
        }
    }
}

/// The nodes of a tree with valid `parents` (`parents[0] = -1`, `0 <= parents[i] < i`) in
/// depth-first preorder, children in increasing index: each node's preferred (lowest-index)
/// child comes right after it, so the path of preferred children is nodes `0, 1, 2, ...`.
/// Written into `order`; `links` is scratch of `2 · N` entries.
pub fn depth_first_order(parents: &[i32], order: &mut Vec<u32>, links: &mut Vec<i32>) {
    let n = parents.len();
    order.clear();
    if n == 0 {
        return;
    }
    links.clear();
    links.resize(2 * n, -1);
    let (first_child, next_sibling) = links.split_at_mut(n);
    // Walking nodes in decreasing index leaves every child list in increasing index.
    for v in (1..n).rev() {
        let p = parents[v] as usize;
        next_sibling[v] = first_child[p];
        first_child[p] = v as i32;
    }
    // A node's subtree is done when it has no child left; then the walk resumes at the
    // nearest ancestor-or-self with a next sibling. Iterative: trees may be 65536 deep.
    let mut v = 0usize;
    'walk: loop {
        order.push(v as u32);
        if first_child[v] >= 0 {
            v = first_child[v] as usize;
            continue;
        }
        loop {
            if next_sibling[v] >= 0 {
                v = next_sibling[v] as usize;
                continue 'walk;
            }
            if v == 0 {
                break 'walk;
            }
            v = parents[v] as usize;
        }
    }
}

/// Iterator over a node's children, lowest index (the draft's preferred candidate) first.
pub struct Children<'a> {
    next: i32,
    next_sibling: &'a [i32],
}

impl Iterator for Children<'_> {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        if self.next < 0 {
            return None;
        }
        let c = self.next as usize;
        self.next = self.next_sibling[c];
        Some(c)
    }
}

fn check_lengths(n_parents: usize, n_tokens: usize) -> Result<()> {
    if n_parents == 0 {
        return Err(Error::value(
            "parents",
            "empty tree: a tree has at least the root node",
        ));
    }
    if n_tokens != n_parents {
        return Err(Error::value(
            "tokens",
            format!("has {n_tokens} entries but parents has {n_parents}"),
        ));
    }
    Ok(())
}

/// One validated, immutable tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    nodes: Nodes,
    max_depth: u32,
    num_leaves: usize,
}

impl Tree {
    /// Validates `parents` / `tokens` (any strides, any accepted integer type).
    pub fn from_views<P: IndexLike, T: IndexLike>(
        parents: ArrayView1<P>,
        tokens: ArrayView1<T>,
    ) -> Result<Tree> {
        let n = parents.len();
        check_lengths(n, tokens.len())?;
        if n > MAX_NODES {
            return Err(Error::value(
                "parents",
                format!("{n} nodes, more than the supported maximum of {MAX_NODES}"),
            ));
        }
        let mut nodes = Nodes::with_capacity(n);
        let (max_depth, num_leaves) = nodes.push_tree(&parents, &tokens, 0, n, None)?;
        Ok(Tree {
            nodes,
            max_depth,
            num_leaves,
        })
    }

    /// Validates slices (convenience for Rust callers and tests).
    pub fn new(parents: &[i32], tokens: &[i64]) -> Result<Tree> {
        Tree::from_views(ArrayView1::from(parents), ArrayView1::from(tokens))
    }

    pub fn view(&self) -> TreeRef<'_> {
        TreeRef {
            parents: &self.nodes.parents,
            tokens: &self.nodes.tokens,
            depths: &self.nodes.depths,
            first_child: &self.nodes.first_child,
            next_sibling: &self.nodes.next_sibling,
            max_depth: self.max_depth,
            num_leaves: self.num_leaves,
        }
    }

    pub fn num_nodes(&self) -> usize {
        self.nodes.parents.len()
    }
    pub fn parents(&self) -> &[i32] {
        &self.nodes.parents
    }
    pub fn tokens(&self) -> &[i64] {
        &self.nodes.tokens
    }
    pub fn depths(&self) -> &[i32] {
        &self.nodes.depths
    }
    pub fn max_depth(&self) -> u32 {
        self.max_depth
    }
    pub fn num_leaves(&self) -> usize {
        self.num_leaves
    }

    /// The tree without its nodes deeper than `max_depth` (0: the root alone), in the same
    /// order, parents renumbered.
    pub fn limit_depth(&self, max_depth: usize) -> Tree {
        let (mut parents, mut tokens) = (Vec::new(), Vec::new());
        let mut renumbered = vec![0; self.num_nodes()];
        keep_shallow(
            self.view(),
            max_depth,
            &mut renumbered,
            &mut parents,
            &mut tokens,
        );
        Tree::from_views(ArrayView1::from(&parents), ArrayView1::from(&tokens))
            .expect("a depth-limited tree is a tree")
    }
}

/// Appends the nodes of `t` with depth `<= max_depth` to `parents` / `tokens`, renumbered
/// (tree-local; `renumbered`, at least `t`'s size, is scratch). A kept node's parent is
/// shallower, so it is kept, and kept before it.
fn keep_shallow(
    t: TreeRef<'_>,
    max_depth: usize,
    renumbered: &mut [i32],
    parents: &mut Vec<i32>,
    tokens: &mut Vec<i64>,
) {
    let mut kept = 0i32;
    for (i, (&p, &d)) in t.parents.iter().zip(t.depths).enumerate() {
        if d as usize <= max_depth {
            renumbered[i] = kept;
            parents.push(if p < 0 { -1 } else { renumbered[p as usize] });
            tokens.push(t.tokens[i]);
            kept += 1;
        }
    }
}

/// `B` validated trees stored flat with CSR offsets; parents are tree-local.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeBatch {
    nodes: Nodes,
    offsets: Vec<usize>,
    max_depths: Vec<u32>,
    num_leaves: Vec<usize>,
    max_depth: u32,
    max_nodes: usize,
}

/// Largest total node count of a batch (node and global indices must fit in `i32` for the
/// SGLang layouts, and absurd sizes are refused before allocating).
pub const MAX_BATCH_NODES: usize = 1 << 24;

impl TreeBatch {
    /// Validates flat tree-local `parents`, `tokens` and CSR `offsets` (`[B+1]`).
    pub fn from_views<P: IndexLike, T: IndexLike, O: IndexLike>(
        parents: ArrayView1<P>,
        tokens: ArrayView1<T>,
        offsets: ArrayView1<O>,
    ) -> Result<TreeBatch> {
        let total = parents.len();
        if tokens.len() != total {
            return Err(Error::value(
                "tokens",
                format!("has {} entries but parents has {total}", tokens.len()),
            ));
        }
        if total > MAX_BATCH_NODES {
            return Err(Error::value(
                "parents",
                format!("{total} nodes, more than the supported maximum of {MAX_BATCH_NODES}"),
            ));
        }
        let offs = validate_offsets(offsets, total)?;
        let b = offs.len() - 1;
        let mut nodes = Nodes::with_capacity(total);
        let mut max_depths = Vec::with_capacity(b);
        let mut num_leaves = Vec::with_capacity(b);
        let mut max_nodes = 0;
        for i in 0..b {
            let (start, end) = (offs[i], offs[i + 1]);
            if end - start > MAX_NODES {
                return Err(Error::value(
                    "offsets",
                    format!(
                        "tree {i} has {} nodes, more than the supported maximum of {MAX_NODES}",
                        end - start
                    ),
                ));
            }
            let (d, l) = nodes.push_tree(&parents, &tokens, start, end, Some(i))?;
            max_depths.push(d);
            num_leaves.push(l);
            max_nodes = max_nodes.max(end - start);
        }
        let max_depth = max_depths.iter().copied().max().unwrap_or(0);
        Ok(TreeBatch {
            nodes,
            offsets: offs,
            max_depths,
            num_leaves,
            max_depth,
            max_nodes,
        })
    }

    /// Concatenates already validated trees (no re-validation).
    pub fn from_trees(trees: &[&Tree]) -> Result<TreeBatch> {
        if trees.is_empty() {
            return Err(Error::value("trees", "a batch needs at least one tree"));
        }
        let total: usize = trees.iter().map(|t| t.num_nodes()).sum();
        if total > MAX_BATCH_NODES {
            return Err(Error::value(
                "trees",
                format!("{total} nodes, more than the supported maximum of {MAX_BATCH_NODES}"),
            ));
        }
        let mut nodes = Nodes::with_capacity(total);
        let mut offsets = Vec::with_capacity(trees.len() + 1);
        offsets.push(0);
        for t in trees {
            nodes.parents.extend_from_slice(&t.nodes.parents);
            nodes.tokens.extend_from_slice(&t.nodes.tokens);
            nodes.depths.extend_from_slice(&t.nodes.depths);
            nodes.first_child.extend_from_slice(&t.nodes.first_child);
            nodes.next_sibling.extend_from_slice(&t.nodes.next_sibling);
            offsets.push(nodes.parents.len());
        }
        let max_depths: Vec<u32> = trees.iter().map(|t| t.max_depth).collect();
        Ok(TreeBatch {
            nodes,
            offsets,
            max_depth: max_depths.iter().copied().max().unwrap_or(0),
            max_depths,
            num_leaves: trees.iter().map(|t| t.num_leaves).collect(),
            max_nodes: trees.iter().map(|t| t.num_nodes()).max().unwrap_or(0),
        })
    }

    pub fn num_trees(&self) -> usize {
        self.offsets.len() - 1
    }
    pub fn num_nodes(&self) -> usize {
        self.nodes.parents.len()
    }
    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }
    pub fn parents(&self) -> &[i32] {
        &self.nodes.parents
    }
    pub fn tokens(&self) -> &[i64] {
        &self.nodes.tokens
    }
    pub fn depths(&self) -> &[i32] {
        &self.nodes.depths
    }
    /// Deepest tree of the batch (padded outputs have `max_depth + 1` columns).
    pub fn max_depth(&self) -> u32 {
        self.max_depth
    }
    /// Largest tree of the batch.
    pub fn max_nodes(&self) -> usize {
        self.max_nodes
    }
    pub fn tree_size(&self, b: usize) -> usize {
        self.offsets[b + 1] - self.offsets[b]
    }

    /// Tree `b` as a view; panics if `b >= num_trees()` (callers index-check user input).
    pub fn tree(&self, b: usize) -> TreeRef<'_> {
        let (s, e) = (self.offsets[b], self.offsets[b + 1]);
        TreeRef {
            parents: &self.nodes.parents[s..e],
            tokens: &self.nodes.tokens[s..e],
            depths: &self.nodes.depths[s..e],
            first_child: &self.nodes.first_child[s..e],
            next_sibling: &self.nodes.next_sibling[s..e],
            max_depth: self.max_depths[b],
            num_leaves: self.num_leaves[b],
        }
    }

    /// An owned copy of tree `b`.
    pub fn to_tree(&self, b: usize) -> Tree {
        let t = self.tree(b);
        Tree {
            nodes: Nodes {
                parents: t.parents.to_vec(),
                tokens: t.tokens.to_vec(),
                depths: t.depths.to_vec(),
                first_child: t.first_child.to_vec(),
                next_sibling: t.next_sibling.to_vec(),
            },
            max_depth: t.max_depth,
            num_leaves: t.num_leaves,
        }
    }

    pub fn trees(&self) -> impl ExactSizeIterator<Item = TreeRef<'_>> + '_ {
        (0..self.num_trees()).map(move |b| self.tree(b))
    }

    /// The batch without the nodes of tree `b` deeper than `max_depth[b]` (0: its root alone),
    /// in the same order, parents renumbered: e.g. a request with `r` tokens left can use the
    /// drafts at depth `<= r - 1`.
    pub fn limit_depth(&self, max_depth: &[i64]) -> Result<TreeBatch> {
        let max_depth = per_tree_sizes(max_depth, self.num_trees(), "max_depth")?;
        let b = max_depth.len();
        let mut parents = Vec::with_capacity(self.num_nodes());
        let mut tokens = Vec::with_capacity(self.num_nodes());
        let mut offsets = Vec::with_capacity(b + 1);
        offsets.push(0i64);
        let mut renumbered = vec![0; self.max_nodes()];
        for (t, &d) in self.trees().zip(&max_depth) {
            keep_shallow(t, d, &mut renumbered, &mut parents, &mut tokens);
            offsets.push(parents.len() as i64);
        }
        TreeBatch::from_views(
            ArrayView1::from(&parents),
            ArrayView1::from(&tokens),
            ArrayView1::from(&offsets),
        )
    }
}

/// A non-negative size per tree (`prefix_lens`, `max_depth`): checks the count and signs,
/// naming `arg` and the index.
pub fn per_tree_sizes(values: &[i64], num_trees: usize, arg: &'static str) -> Result<Vec<usize>> {
    if values.len() != num_trees {
        return Err(Error::value(
            arg,
            format!(
                "has {} entries, expected one per tree ({num_trees})",
                values.len()
            ),
        ));
    }
    values
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            usize::try_from(x)
                .map_err(|_| Error::value(arg, format!("{arg}[{i}] = {x}, must be >= 0")))
        })
        .collect()
}

/// Checks CSR offsets over `total` nodes: starts at 0, strictly increasing (every tree has a
/// root), ends at `total`.
pub fn validate_offsets<O: IndexLike>(offsets: ArrayView1<O>, total: usize) -> Result<Vec<usize>> {
    if offsets.len() < 2 {
        return Err(Error::value(
            "offsets",
            format!(
                "needs at least 2 entries ([0, num_nodes] for one tree), got {}",
                offsets.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(offsets.len());
    let mut prev = -1i64;
    for (i, &o) in offsets.iter().enumerate() {
        let o = o.to_i64();
        if i == 0 && o != 0 {
            return Err(Error::value(
                "offsets",
                format!("offsets[0] = {o}, expected 0"),
            ));
        }
        if i > 0 && o <= prev {
            return Err(Error::value(
                "offsets",
                format!(
                    "offsets[{i}] = {o} is not greater than offsets[{}] = {prev} (every tree needs at least its root)",
                    i - 1
                ),
            ));
        }
        if o > total as i64 {
            return Err(Error::value(
                "offsets",
                format!("offsets[{i}] = {o} is past the node count {total}"),
            ));
        }
        out.push(o as usize);
        prev = o;
    }
    if prev != total as i64 {
        return Err(Error::value(
            "offsets",
            format!(
                "offsets[{}] = {prev}, expected the node count {total}",
                offsets.len() - 1
            ),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_links_depths_and_leaves() {
        let t = Tree::new(&[-1, 0, 0, 1, 1, 2], &[10, 11, 12, 13, 14, 15]).unwrap();
        let v = t.view();
        assert_eq!(t.depths(), &[0, 1, 1, 2, 2, 2]);
        assert_eq!(v.first_child, &[1, 3, 5, -1, -1, -1]);
        assert_eq!(v.next_sibling, &[-1, 2, -1, 4, -1, -1]);
        assert_eq!(v.children(0).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(t.max_depth(), 2);
        assert_eq!(t.num_leaves(), 3);
    }

    #[test]
    fn depth_first_order_puts_each_first_child_next() {
        let (mut order, mut links) = (Vec::new(), Vec::new());
        // 0 -> {1, 2}, 1 -> {3, 4}, 2 -> {5}, 3 -> {6}
        depth_first_order(&[-1, 0, 0, 1, 1, 2, 3], &mut order, &mut links);
        assert_eq!(order, [0, 1, 3, 6, 4, 2, 5]);
        depth_first_order(&[-1], &mut order, &mut links);
        assert_eq!(order, [0]);
        depth_first_order(&[], &mut order, &mut links);
        assert!(order.is_empty());
        // A chain 65536 deep: no recursion.
        let chain: Vec<i32> = (-1..65535).collect();
        depth_first_order(&chain, &mut order, &mut links);
        assert!(order.iter().enumerate().all(|(i, &v)| v as usize == i));
    }

    #[test]
    fn rejects_bad_parents() {
        assert!(Tree::new(&[], &[]).is_err());
        assert!(Tree::new(&[0], &[1]).is_err());
        let e = Tree::new(&[-1, 0, 2], &[1, 2, 3]).unwrap_err();
        assert!(e.to_string().contains("parents[2] = 2"), "{e}");
        assert!(Tree::new(&[-1, -1], &[1, 2]).is_err());
        assert!(Tree::new(&[-1, 0], &[1]).is_err());
    }

    #[test]
    fn batch_offsets_are_checked() {
        let p = [-1i32, 0, -1, 0, 1];
        let t = [1i64, 2, 3, 4, 5];
        let ok = TreeBatch::from_views(
            ArrayView1::from(&p),
            ArrayView1::from(&t),
            ArrayView1::from(&[0i64, 2, 5]),
        );
        let b = ok.unwrap();
        assert_eq!(b.num_trees(), 2);
        assert_eq!(b.tree(1).depths, &[0, 1, 2]);
        assert_eq!(b.max_depth(), 2);
        for bad in [[1i64, 2, 5], [0, 0, 5], [0, 2, 4], [0, 6, 5]] {
            assert!(TreeBatch::from_views(
                ArrayView1::from(&p),
                ArrayView1::from(&t),
                ArrayView1::from(&bad)
            )
            .is_err());
        }
        // The second tree's first node must be a root.
        let bad_root = TreeBatch::from_views(
            ArrayView1::from(&p),
            ArrayView1::from(&t),
            ArrayView1::from(&[0i64, 1, 5]),
        );
        assert!(bad_root.unwrap_err().to_string().contains("tree 1"));
    }

    #[test]
    fn limit_depth_keeps_shallow_nodes_in_order() {
        // 0 -> 1 -> 3 -> 4, 0 -> 2 -> 5
        let b = TreeBatch::from_trees(&[
            &Tree::new(&[-1, 0, 0, 1, 3, 2], &[10, 11, 12, 13, 14, 15]).unwrap(),
            &Tree::new(&[-1], &[20]).unwrap(),
        ])
        .unwrap();
        let cut = b.limit_depth(&[1, 0]).unwrap();
        assert_eq!(cut.parents(), &[-1, 0, 0, -1]);
        assert_eq!(cut.tokens(), &[10, 11, 12, 20]);
        assert_eq!(cut.offsets(), &[0, 3, 4]);
        let two = b.limit_depth(&[2, 5]).unwrap();
        assert_eq!(two.parents(), &[-1, 0, 0, 1, 2, -1]);
        assert_eq!(two.tokens(), &[10, 11, 12, 13, 15, 20]);
        assert_eq!(b.limit_depth(&[3, 0]).unwrap(), b);
        assert_eq!(b.to_tree(0).limit_depth(0).tokens(), &[10]);
        assert!(b.limit_depth(&[1]).is_err());
        assert!(b
            .limit_depth(&[1, -1])
            .unwrap_err()
            .to_string()
            .contains("max_depth[1]"));
    }
}
