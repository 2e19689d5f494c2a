//! Tree builders. Every builder maximizes the sum of path-product acceptance estimates under a
//! node budget (FIELD_NOTES §3): static chains and choice lists and the top-N selection live
//! here; [`dynamic`] drafts EAGLE-2/3 trees step by step, [`sglang`] reproduces SGLang's tree
//! ops, and [`sequoia`] finds the optimal static tree for a per-rank acceptance vector.
//!
//! A choice list (Medusa, EAGLE-1, vLLM `speculative_token_tree`, TensorRT-LLM `*_choices`)
//! names each draft node by its path of sibling ranks from the root, which is implicit. Nodes
//! are ordered as vLLM orders them — root, then by `(len, choice)` — so parents come first and
//! siblings appear in rank order. Cost: O(M log M · D) for M choices of depth D.

pub mod dynamic;
pub mod sequoia;
pub mod sglang;

use std::collections::HashMap;

use ndarray::ArrayView1;

use crate::error::{Error, Result};
use crate::tree::{IndexLike, Tree, MAX_NODES};

/// A chain: node `i`'s parent is `i - 1`; `tokens[0]` is the root.
pub fn chain<I: IndexLike>(tokens: ArrayView1<'_, I>) -> Result<Tree> {
    if tokens.is_empty() {
        return Err(Error::value(
            "tokens",
            "empty chain: a tree has at least the root token",
        ));
    }
    if tokens.len() > MAX_NODES {
        return Err(Error::value(
            "tokens",
            format!(
                "{} nodes, more than the supported maximum of {MAX_NODES}",
                tokens.len()
            ),
        ));
    }
    let parents: Vec<i32> = (0..tokens.len() as i32).map(|i| i - 1).collect();
    Tree::from_views(ArrayView1::from(&parents), tokens)
}

fn fmt_choice(c: &[i64]) -> String {
    let inner: Vec<String> = c.iter().map(|x| x.to_string()).collect();
    if inner.len() == 1 {
        format!("({},)", inner[0])
    } else {
        format!("({})", inner.join(", "))
    }
}

/// How a choice list's nodes are numbered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChoiceOrder {
    /// By path length, then path (Medusa's, EAGLE-1's and vLLM's layout).
    BreadthFirst,
    /// By path: depth-first preorder, siblings by rank, so the all-zero (preferred) path is
    /// nodes `0, 1, 2, ...` and an accepted prefix of it needs no KV moves.
    DepthFirst,
}

/// Node order of a choice list: `order[n]` is the index into `choices` of node `n + 1`.
/// Validates entries (non-empty, non-negative, unique, every proper prefix present) and
/// returns the parent of every node in that order.
pub fn choices_layout(choices: &[Vec<i64>]) -> Result<(Vec<usize>, Vec<i32>)> {
    choices_layout_in(choices, ChoiceOrder::BreadthFirst)
}

/// [`choices_layout`] with the nodes in `layout` order (a path's prefix sorts before it in
/// both, so parents come before children).
pub fn choices_layout_in(
    choices: &[Vec<i64>],
    layout: ChoiceOrder,
) -> Result<(Vec<usize>, Vec<i32>)> {
    if choices.len() + 1 > MAX_NODES {
        return Err(Error::value(
            "choices",
            format!(
                "{} choices, more than the supported maximum of {}",
                choices.len(),
                MAX_NODES - 1
            ),
        ));
    }
    // Checked in the order given, so an error names the first offending entry as the user
    // listed them (the sorted order below would name another).
    let mut first_of: HashMap<&[i64], usize> = HashMap::with_capacity(choices.len());
    for (j, c) in choices.iter().enumerate() {
        if c.is_empty() {
            return Err(Error::value(
                "choices",
                format!("choices[{j}] is empty; the root is implicit and must not be listed"),
            ));
        }
        if let Some(x) = c.iter().find(|&&x| x < 0) {
            return Err(Error::value(
                "choices",
                format!("choices[{j}] = {} has a negative rank {x}", fmt_choice(c)),
            ));
        }
        if let Some(&first) = first_of.get(c.as_slice()) {
            return Err(Error::value(
                "choices",
                format!(
                    "choices[{j}] = {} duplicates choices[{first}]",
                    fmt_choice(c)
                ),
            ));
        }
        first_of.insert(c, j);
    }
    for (j, c) in choices.iter().enumerate() {
        let prefix = &c[..c.len() - 1];
        if !prefix.is_empty() && !first_of.contains_key(prefix) {
            return Err(Error::value(
                "choices",
                format!(
                    "choices[{j}] = {}: its prefix {} is not in choices",
                    fmt_choice(c),
                    fmt_choice(prefix)
                ),
            ));
        }
    }
    let mut order: Vec<usize> = (0..choices.len()).collect();
    order.sort_by(|&a, &b| {
        let (ca, cb) = (&choices[a], &choices[b]);
        match layout {
            ChoiceOrder::BreadthFirst => ca.len().cmp(&cb.len()).then_with(|| ca.cmp(cb)),
            ChoiceOrder::DepthFirst => ca.cmp(cb),
        }
    });
    // A node's prefix sorts before it in both orders, so its node is known when it is placed.
    let mut node_of: HashMap<&[i64], usize> = HashMap::with_capacity(choices.len());
    let mut parents = Vec::with_capacity(choices.len() + 1);
    parents.push(-1i32);
    for (pos, &j) in order.iter().enumerate() {
        let c = choices[j].as_slice();
        let parent = match c.len() {
            1 => 0,
            len => node_of.get(&c[..len - 1]).copied().ok_or_else(|| {
                Error::value("choices", "internal error: a prefix sorted after its path")
            })?,
        };
        parents.push(parent as i32);
        node_of.insert(c, pos + 1);
    }
    Ok((order, parents))
}

/// Builds a tree from a choice list. `tokens`, if given, has `choices.len() + 1` entries:
/// `tokens[0]` for the root and `tokens[1 + j]` for `choices[j]` in the order given. Without
/// tokens, the root gets 0 and every node its sibling rank (the choice's last entry), so a
/// topology-only tree still has distinct siblings.
pub fn from_choices<I: IndexLike>(
    choices: &[Vec<i64>],
    tokens: Option<ArrayView1<'_, I>>,
) -> Result<Tree> {
    from_choices_in(choices, tokens, ChoiceOrder::BreadthFirst)
}

/// [`from_choices`] with the nodes in `layout` order.
pub fn from_choices_in<I: IndexLike>(
    choices: &[Vec<i64>],
    tokens: Option<ArrayView1<'_, I>>,
    layout: ChoiceOrder,
) -> Result<Tree> {
    let (order, parents) = choices_layout_in(choices, layout)?;
    let mut node_tokens = Vec::with_capacity(parents.len());
    match tokens {
        Some(t) => {
            if t.len() != choices.len() + 1 {
                return Err(Error::value(
                    "tokens",
                    format!(
                        "has {} entries, expected len(choices) + 1 = {} (the root's token first)",
                        t.len(),
                        choices.len() + 1
                    ),
                ));
            }
            node_tokens.push(t[0].to_i64());
            node_tokens.extend(order.iter().map(|&j| t[1 + j].to_i64()));
        }
        None => {
            node_tokens.push(0);
            // Entries were checked non-empty above.
            node_tokens.extend(order.iter().map(|&j| choices[j][choices[j].len() - 1]));
        }
    }
    Tree::new(&parents, &node_tokens)
}

/// A float type accepted for scores (`f32` or `f64`).
pub trait ScoreLike: Copy + Send + Sync {
    fn to_f64(self) -> f64;
}

impl ScoreLike for f32 {
    #[inline]
    fn to_f64(self) -> f64 {
        self as f64
    }
}

impl ScoreLike for f64 {
    #[inline]
    fn to_f64(self) -> f64 {
        self
    }
}

/// The selection order of every top-N builder as one integer: higher score first, then
/// shallower, then lower pool index. A child never scores above its parent and is deeper, so
/// the parent always comes strictly before it: every prefix of this order is ancestor-closed,
/// ties included. One u128 compare instead of a float compare and two tie-breaks: selection
/// is most of a dynamic tree's cost at B=64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct RankKey(u128);

impl RankKey {
    /// `score` must not be NaN (every caller checks its scores first).
    #[inline]
    pub fn new(score: f64, depth: u32, index: u32) -> Self {
        RankKey(u128::from(score_key(score)) << 64 | u128::from(depth) << 32 | u128::from(index))
    }

    /// The pool index it was made with.
    #[inline]
    pub fn index(self) -> u32 {
        self.0 as u32
    }

    /// The score it was made with (`-0.0` as `0.0`).
    #[inline]
    pub fn score(self) -> f64 {
        score_of_key((self.0 >> 64) as u64)
    }
}

/// A score as an integer that orders like [`RankKey`]'s first field: smaller = higher score.
/// `score` must not be NaN.
#[inline]
pub fn score_key(score: f64) -> u64 {
    // -0.0 and 0.0 are the same score: adding 0.0 turns -0.0 into 0.0.
    let bits = (score + 0.0).to_bits();
    // IEEE order as unsigned order: negatives have all bits flipped, positives the sign set.
    let ascending = if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    };
    !ascending
}

/// The score a [`score_key`] was made from (`-0.0` as `0.0`).
#[inline]
pub fn score_of_key(key: u64) -> f64 {
    let ascending = !key;
    let bits = if ascending >> 63 == 1 {
        ascending & !(1 << 63)
    } else {
        !ascending
    };
    f64::from_bits(bits)
}

/// The pool indices, in increasing order, of the first `k` candidates in [`RankKey`] order
/// when every candidate has depth 0 (pool index breaks ties): `keys[g]` is candidate `g`'s
/// [`score_key`]. The same selection as [`select_top`], at half the key width and without
/// the final sort: the `k`-th best score is selected (in `scratch`), then one pass in pool
/// order takes every better score and as many of the tied ones as still fit. O(M).
pub fn select_top_scores(keys: &[u64], k: usize, scratch: &mut Vec<u64>, out: &mut Vec<u32>) {
    out.clear();
    if k == 0 {
        return;
    }
    if k >= keys.len() {
        out.extend(0..keys.len() as u32);
        return;
    }
    scratch.clear();
    scratch.extend_from_slice(keys);
    let (better, &mut kth, _) = scratch.select_nth_unstable(k - 1);
    let mut ties = k - better.iter().filter(|&&key| key < kth).count();
    for (g, &key) in keys.iter().enumerate() {
        if key < kth {
            out.push(g as u32);
        } else if key == kth && ties > 0 {
            out.push(g as u32);
            ties -= 1;
        }
    }
}

/// Keeps the first `k` keys of `keys` in [`RankKey`] order and returns their pool indices in
/// increasing order. O(M + k log k).
pub fn select_top(keys: &mut [RankKey], k: usize, out: &mut Vec<u32>) {
    out.clear();
    if k == 0 {
        return;
    }
    if k < keys.len() {
        keys.select_nth_unstable(k - 1);
    }
    out.extend(keys[..k].iter().map(|key| key.index()));
    out.sort_unstable();
}

/// The best `budget - 1` candidates of a pool as a tree.
///
/// Candidate `i` hangs under `parents[i]` (`-1` = the root, otherwise `0 <= parents[i] < i`) and
/// carries `scores[i]`: its cumulative log score when `cumulative`, else the log acceptance
/// estimate of the edge to it (cumulative = sum along the path). Log scores are `<= 0` (`-inf`
/// allowed); a cumulative score may not exceed its parent's. The selection follows
/// [`RankKey`] order, so it is ancestor-closed even with ties. The tree's node `n >= 1` is the
/// `n`-th selected candidate in increasing pool index (parents first); node 0 is the root with
/// `root_token`, and node `n` carries `tokens[g]` of its candidate `g` (without tokens, `g`
/// itself). Returns the tree and the pool index of every draft node. O(M + N log N).
pub fn top_n<P: IndexLike, S: ScoreLike, T: IndexLike>(
    parents: ArrayView1<'_, P>,
    scores: ArrayView1<'_, S>,
    tokens: Option<ArrayView1<'_, T>>,
    root_token: i64,
    budget: usize,
    cumulative: bool,
) -> Result<(Tree, Vec<i64>)> {
    let m = parents.len();
    if scores.len() != m {
        return Err(Error::value(
            "scores",
            format!("has {} entries but parents has {m}", scores.len()),
        ));
    }
    if let Some(t) = tokens.filter(|t| t.len() != m) {
        return Err(Error::value(
            "tokens",
            format!("has {} entries but parents has {m}", t.len()),
        ));
    }
    if budget == 0 {
        return Err(Error::value(
            "budget",
            "must be >= 1 (the root counts as one node)",
        ));
    }
    if budget > MAX_NODES || m >= u32::MAX as usize {
        return Err(Error::value(
            "budget",
            format!("{budget} nodes, more than the supported maximum of {MAX_NODES}"),
        ));
    }
    if budget - 1 > m {
        return Err(Error::value(
            "budget",
            format!(
                "{budget} nodes need {} candidates but the pool has only {m}",
                budget - 1
            ),
        ));
    }
    // (cumulative score, depth) per candidate, for its children's checks and sums. Reserved
    // fallibly: a broadcast view claims any pool size, and an abort is no error message.
    let mut path: Vec<(f64, u32)> = Vec::new();
    let mut keys: Vec<RankKey> = Vec::new();
    let mut node_of: Vec<i32> = Vec::new();
    if path.try_reserve_exact(m).is_err()
        || keys.try_reserve_exact(m).is_err()
        || node_of.try_reserve_exact(m).is_err()
    {
        return Err(Error::value(
            "scores",
            format!("a pool of {m} candidates does not fit in memory"),
        ));
    }
    for i in 0..m {
        let p = parents[i].to_i64();
        if p < -1 || p >= i as i64 {
            return Err(Error::value(
                "parents",
                format!(
                    "parents[{i}] = {p}: expected -1 (the root) or a candidate index in [0, {i}) \
                     (parents come before children)"
                ),
            ));
        }
        let s = scores[i].to_f64();
        if s.is_nan() || s > 0.0 {
            return Err(Error::value(
                "scores",
                format!("scores[{i}] = {s} (candidate {i}): log scores must be <= 0 and not NaN"),
            ));
        }
        let (score, depth) = if p < 0 {
            (s, 1)
        } else {
            let (ps, pd) = path[p as usize];
            if cumulative {
                if s > ps {
                    return Err(Error::value(
                        "scores",
                        format!(
                            "scores[{i}] = {s} (candidate {i}) is above its parent's score \
                             scores[{p}] = {ps}; a cumulative score never increases along a path"
                        ),
                    ));
                }
                (s, pd + 1)
            } else {
                (ps + s, pd + 1)
            }
        };
        path.push((score, depth));
        keys.push(RankKey::new(score, depth, i as u32));
    }
    let mut chosen = Vec::with_capacity(budget - 1);
    select_top(&mut keys, budget - 1, &mut chosen);
    node_of.resize(m, 0);
    let mut tree_parents = Vec::with_capacity(budget);
    let mut tree_tokens = Vec::with_capacity(budget);
    tree_parents.push(-1i32);
    tree_tokens.push(root_token);
    for (n, &g) in chosen.iter().enumerate() {
        let g = g as usize;
        node_of[g] = n as i32 + 1;
        let p = parents[g].to_i64();
        // Ancestor closure (see RankKey) guarantees the parent was selected earlier.
        tree_parents.push(if p < 0 { 0 } else { node_of[p as usize] });
        tree_tokens.push(tokens.map_or(g as i64, |t| t[g].to_i64()));
    }
    let tree = Tree::new(&tree_parents, &tree_tokens)?;
    Ok((tree, chosen.iter().map(|&g| g as i64).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The score-first selection takes exactly `select_top`'s candidates at depth 0:
        /// scores drawn from a few values (many ties at the cut), both zeros and -inf.
        #[test]
        fn selecting_scores_first_equals_selecting_rank_keys(
            picks in proptest::collection::vec(0usize..6, 0..80),
            k in 0usize..90,
        ) {
            let values = [0.0, -0.0, -0.25, -1.0, -7.5, f64::NEG_INFINITY];
            let scores: Vec<f64> = picks.iter().map(|&i| values[i]).collect();
            let mut keys: Vec<RankKey> = scores
                .iter()
                .enumerate()
                .map(|(g, &s)| RankKey::new(s, 0, g as u32))
                .collect();
            let mut want = Vec::new();
            select_top(&mut keys, k.min(scores.len()), &mut want);
            let score_keys: Vec<u64> = scores.iter().map(|&s| score_key(s)).collect();
            let (mut scratch, mut got) = (Vec::new(), Vec::new());
            select_top_scores(&score_keys, k, &mut scratch, &mut got);
            prop_assert_eq!(got, want);
        }

        /// A key gives back its score, which the dynamic builder compares children with.
        #[test]
        fn a_score_key_gives_back_its_score(bits in any::<u64>(), depth in any::<u32>()) {
            let score = f64::from_bits(bits);
            prop_assume!(!score.is_nan());
            let back = RankKey::new(score, depth, 7).score();
            prop_assert_eq!(back.to_bits(), (score + 0.0).to_bits());
        }
    }

    #[test]
    fn rank_key_orders_score_desc_then_depth_then_index() {
        // The order spelled out with float comparisons, as the tuple it encodes.
        let by_tuple = |a: &(f64, u32, u32), b: &(f64, u32, u32)| {
            b.0.partial_cmp(&a.0)
                .unwrap()
                .then(a.1.cmp(&b.1))
                .then(a.2.cmp(&b.2))
        };
        let scores = [
            0.0,
            -0.0,
            -f64::MIN_POSITIVE / 2.0, // subnormal
            -f64::MIN_POSITIVE,
            -1e-300,
            -0.5,
            -1.0,
            -1.0 - f64::EPSILON,
            -f64::MAX,
            f64::NEG_INFINITY,
        ];
        let mut keys = Vec::new();
        for (i, &s) in scores.iter().enumerate() {
            for depth in [0u32, 1, 7, u32::MAX] {
                for index in [0u32, 3, u32::MAX] {
                    keys.push((s, depth, index ^ i as u32));
                }
            }
        }
        for a in &keys {
            for b in &keys {
                let want = by_tuple(a, b);
                let got = RankKey::new(a.0, a.1, a.2).cmp(&RankKey::new(b.0, b.1, b.2));
                assert_eq!(got, want, "{a:?} vs {b:?}");
            }
            assert_eq!(RankKey::new(a.0, a.1, a.2).index(), a.2);
        }
    }

    const NONE: Option<ArrayView1<'static, i64>> = None;

    fn ch(v: &[&[i64]]) -> Vec<Vec<i64>> {
        v.iter().map(|c| c.to_vec()).collect()
    }

    #[test]
    fn orders_like_vllm_and_permutes_tokens() {
        let choices = ch(&[&[0, 0], &[1], &[0]]);
        let tokens = [100i64, 200, 300, 400];
        let t = from_choices(&choices, Some(ArrayView1::from(&tokens))).unwrap();
        // Node order: (0,), (1,), (0, 0)
        assert_eq!(t.parents(), &[-1, 0, 0, 1]);
        assert_eq!(t.tokens(), &[100, 400, 300, 200]);
        let t = from_choices(&choices, None::<ArrayView1<'_, i64>>).unwrap();
        assert_eq!(t.tokens(), &[0, 0, 1, 0]);
    }

    #[test]
    fn rejects_bad_choice_lists() {
        let e = from_choices(&ch(&[&[0], &[1, 0]]), NONE).unwrap_err();
        assert!(e.to_string().contains("choices[1]"), "{e}");
        let e = from_choices(&ch(&[&[0], &[0]]), NONE).unwrap_err();
        assert!(e.to_string().contains("duplicates"), "{e}");
        assert!(from_choices(&ch(&[&[]]), NONE).is_err());
        assert!(from_choices(&ch(&[&[-1]]), NONE).is_err());
        assert_eq!(from_choices(&[], NONE).unwrap().num_nodes(), 1);
        // Depth first: (0,), (0, 0), (0, 1), (1,) -> parents -1, 0, 1, 1, 0.
        let c = ch(&[&[1], &[0, 1], &[0], &[0, 0]]);
        let t = from_choices_in(&c, NONE, ChoiceOrder::DepthFirst).unwrap();
        assert_eq!(t.view().parents, &[-1, 0, 1, 1, 0]);
        assert_eq!(t.view().tokens, &[0, 0, 0, 1, 1]);
        let e = from_choices_in(&ch(&[&[0], &[1, 0]]), NONE, ChoiceOrder::DepthFirst);
        assert!(e.unwrap_err().to_string().contains("prefix"));
    }

    fn top(
        parents: &[i64],
        scores: &[f64],
        budget: usize,
        cumulative: bool,
    ) -> Result<(Tree, Vec<i64>)> {
        let tokens: Vec<i64> = (0..parents.len() as i64).map(|i| 100 + i).collect();
        top_n(
            ArrayView1::from(parents),
            ArrayView1::from(scores),
            Some(ArrayView1::from(&tokens)),
            7,
            budget,
            cumulative,
        )
    }

    #[test]
    fn top_n_keeps_ancestors_on_ties_and_orders_by_pool_index() {
        // 0, 1 under the root; 2 under 1 with the same cumulative score as 0 and 1.
        let (t, idx) = top(&[-1, -1, 1], &[-1.0, -1.0, -1.0], 3, true).unwrap();
        assert_eq!(idx, [0, 1]);
        assert_eq!(t.parents(), &[-1, 0, 0]);
        // Child 2 ties its parent: the parent (shallower) wins the last slot.
        let (t, idx) = top(&[-1, -1, 0], &[-2.0, -0.5, 0.0], 3, false).unwrap();
        assert_eq!(idx, [0, 1]);
        assert_eq!(t.tokens(), &[7, 100, 101]);
        let (t, idx) = top(&[-1, -1, 0], &[-0.5, -2.0, 0.0], 3, false).unwrap();
        assert_eq!(idx, [0, 2]);
        assert_eq!(t.parents(), &[-1, 0, 1]);
    }

    #[test]
    fn top_n_rejects_bad_pools() {
        let e = top(&[-1, -1], &[-1.0, f64::NAN], 2, true).unwrap_err();
        assert!(e.to_string().contains("candidate 1"), "{e}");
        assert!(top(&[-1, -1], &[-1.0, f64::INFINITY], 2, true).is_err());
        assert!(top(&[-1, 1], &[-1.0, -1.0], 2, true).is_err());
        assert!(top(&[-1, 0], &[-1.0, -0.5], 2, true).is_err());
        assert!(top(&[-1, 0], &[-1.0, -0.5], 4, true).is_err());
        assert!(top(&[-1, 0], &[-1.0, -0.5], 0, true).is_err());
        assert_eq!(top(&[-1], &[f64::NEG_INFINITY], 2, true).unwrap().1, [0]);
    }

    #[test]
    fn chain_links_each_node_to_the_previous() {
        let t = chain(ArrayView1::from(&[5i64, 6, 7])).unwrap();
        assert_eq!(t.parents(), &[-1, 0, 1]);
        assert_eq!(t.max_depth(), 2);
        assert!(chain(ArrayView1::<i64>::from(&[])).is_err());
    }
}
