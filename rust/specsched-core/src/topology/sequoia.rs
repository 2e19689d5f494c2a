//! Sequoia-optimal static trees (arXiv 2402.12374) under a positional acceptance model.
//!
//! `p[r]` (0-based rank `r`) is the probability that, once a node is reached, the target
//! accepts its rank-`r` child (a node's children are its draft's top-`c` tokens, ranks
//! `0..c`, so the events are disjoint). A node's value is the product of `p` along its path;
//! the expected tokens per step (bonus included) is `1 + Σ_{v≠root} value(v)`.
//! [`optimal_tree`] maximizes it over trees of at most `budget` nodes (root included) and depth
//! at most `max_depth`: the exact DP `T_l[m] = 1 + max_b G_{l,b}[m-1]`,
//! `G_{l,b}[m] = max_y G_{l,b-1}[m-y] + p[b]·T_{l-1}[y]` in O(D · R · n²), or, when `p` is
//! non-increasing, the greedy max-heap over `value` in O(n log n) (both optimal there, since
//! value never increases from parent to child or from rank r to r+1).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::error::{Error, Result};
use crate::sim;
use crate::tree::{TreeRef, MAX_NODES};

/// An optimal tree as choice paths (sibling ranks from the root, root implicit), in the order
/// vLLM sorts them, with its expected tokens per step.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub choices: Vec<Vec<i64>>,
    pub expected: f64,
}

/// Checks `p` (each in [0, 1], not NaN, at least one entry).
pub fn check_probs(p: &[f64]) -> Result<()> {
    if p.is_empty() {
        return Err(Error::value(
            "accept_probs",
            "needs at least one entry (the rank-0 acceptance)",
        ));
    }
    for (r, &x) in p.iter().enumerate() {
        if !(0.0..=1.0).contains(&x) {
            return Err(Error::value(
                "accept_probs",
                format!("accept_probs[{r}] = {x}, expected a probability in [0, 1]"),
            ));
        }
    }
    Ok(())
}

fn check_budget(budget: usize) -> Result<()> {
    if budget < 1 {
        return Err(Error::value(
            "budget",
            "must be >= 1 (the root counts as one node)",
        ));
    }
    if budget > MAX_NODES {
        return Err(Error::value(
            "budget",
            format!("{budget} nodes, more than the supported maximum of {MAX_NODES}"),
        ));
    }
    Ok(())
}

/// The most entries the exact DP's tables may hold: 2^27 values (1 GiB of `f64`).
pub const MAX_DP_ENTRIES: usize = 1 << 27;

/// The most split evaluations the exact DP may run: `depth · ranks · n²` up to 2^36 (budget
/// 1,024 at full depth over 64 ranks, ~13 s on one core, is the largest such call). The
/// tables only grow as `depth · ranks · n`, so a limit on them alone admitted calls that run
/// for hours (depth 300, 2 ranks, 65,536 nodes) with the GIL released and no way to stop them.
pub const MAX_DP_WORK: u128 = 1 << 36;

/// The most path entries (the sum of the nodes' depths) a plan may spell out: 2^24, what
/// [`MAX_DP_WORK`] already bounds a DP plan to (`depth · n²` covers `(depth · n)^1.5`).
pub const MAX_PLAN_ENTRIES: usize = 1 << 24;

/// Refuses a DP over `n` nodes, depth `depth` and `ranks` ranks whose tables would pass
/// [`MAX_DP_ENTRIES`] or whose run would pass [`MAX_DP_WORK`], before anything is allocated.
fn check_dp_size(ranks: usize, n: usize, depth: usize) -> Result<()> {
    check_dp_size_or(
        ranks,
        n,
        depth,
        "pass a smaller max_depth or budget, or a non-increasing accept_probs (the O(n log n) \
         heap)",
    )
}

/// [`check_dp_size`] with the caller's remedy in the message.
fn check_dp_size_or(ranks: usize, n: usize, depth: usize, remedy: &str) -> Result<()> {
    let ranks = ranks.min(n.saturating_sub(1));
    let entries = (depth + 1)
        .checked_mul(ranks + 1)
        .and_then(|x| x.checked_mul(n + 1));
    let work = depth as u128 * ranks as u128 * (n as u128 * n as u128);
    match entries {
        Some(e) if e <= MAX_DP_ENTRIES && work <= MAX_DP_WORK => Ok(()),
        _ => Err(Error::value(
            "budget",
            format!(
                "the exact DP for {n} nodes at depth <= {depth} over {ranks} ranks needs more \
                 than {MAX_DP_ENTRIES} table entries or {MAX_DP_WORK} steps: {remedy}"
            ),
        )),
    }
}

fn resolve_depth(budget: usize, max_depth: Option<usize>) -> Result<usize> {
    match max_depth {
        Some(0) => Err(Error::value("max_depth", "must be >= 1")),
        Some(d) => Ok(d.min(budget.saturating_sub(1)).max(1)),
        None => Ok(budget.saturating_sub(1).max(1)),
    }
}

/// True when `p` never increases with rank (the heap is then exact).
pub fn is_non_increasing(p: &[f64]) -> bool {
    p.windows(2).all(|w| w[1] <= w[0])
}

/// `1 + Σ_{v≠root} Π p[rank]` over `tree`, rank = position among siblings in node order;
/// ranks past the end of `p` have probability 0.
pub fn expected_accept_length(tree: TreeRef<'_>, p: &[f64]) -> Result<f64> {
    check_probs(p)?;
    // The simulator's path products under a rank-only lookup; only the validation differs
    // (Sequoia's vectors need not sum to 1, the simulator's per-rank model must).
    let q = sim::conditional_by(tree, |_, r| p.get(r).copied().unwrap_or(0.0));
    Ok(sim::path_products(tree, q).iter().sum())
}

/// Acceptance by rank of a subtree root's children, by the levels left below that root.
enum Levels {
    /// One vector at every level (Sequoia's positional model): the tables then hold the
    /// optimum for every depth limit up to the DP's own.
    Same(Vec<f64>),
    /// `rows[l - 1]` for a root with `l` levels below it: a model that depends on depth, for
    /// which only the DP's own depth limit is meaningful.
    ByLevel(Vec<Vec<f64>>),
}

impl Levels {
    fn at(&self, l: usize) -> &[f64] {
        match self {
            Levels::Same(p) => p,
            Levels::ByLevel(rows) => &rows[l - 1],
        }
    }
}

/// The DP tables for sizes `0..=n` and depth limits `0..=depth`.
pub struct Dp {
    n: usize,
    levels: Levels,
    /// `t[l][m]`: best value with at most `m` nodes (root included) and depth <= l.
    t: Vec<Vec<f64>>,
    /// `kids[l][m]`: children of the root in that optimum (0 = leaf).
    kids: Vec<Vec<u32>>,
    /// `g[l][b][m]`: best value of ranks `1..=b` sharing at most `m` nodes (each >= 1), with
    /// subtrees of depth <= l - 1. Splits are recovered from it only along the chosen tree.
    g: Vec<Vec<Vec<f64>>>,
}

/// `max_k a[k] + pb * b[k]`, in four independent lanes so it vectorizes.
#[inline]
fn max_split(a: &[f64], b: &[f64], pb: f64) -> f64 {
    let len = a.len().min(b.len());
    let (a, b) = (&a[..len], &b[..len]);
    let mut acc = [f64::NEG_INFINITY; 4];
    let mut ca = a.chunks_exact(4);
    let mut cb = b.chunks_exact(4);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..4 {
            let v = x[l] + pb * y[l];
            acc[l] = if v > acc[l] { v } else { acc[l] };
        }
    }
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        let v = x + pb * y;
        acc[0] = if v > acc[0] { v } else { acc[0] };
    }
    acc[0].max(acc[1]).max(acc[2].max(acc[3]))
}

impl Dp {
    /// Runs the DP for every size up to `n` and depth limit up to `depth`.
    pub fn new(p: &[f64], n: usize, depth: usize) -> Dp {
        Dp::run(Levels::Same(p.to_vec()), n, depth)
    }

    fn run(levels: Levels, n: usize, depth: usize) -> Dp {
        let mut t = vec![vec![0f64; n + 1]; depth + 1];
        let mut kids = vec![vec![0u32; n + 1]; depth + 1];
        let mut g = vec![Vec::new(); depth + 1];
        t[0][1..].fill(1.0);
        // rev[k] = G_{b-1}[n - k]: G_{b-1}[m - y] for y = 1.. is rev[n - m + y..], ascending,
        // like T_{l-1}[y], so the split maximum reads both forwards.
        let mut rev = vec![0f64; n + 1];
        for l in 1..=depth {
            let p = levels.at(l);
            // Ranks beyond n - 1 can never hold a node.
            let ranks = p.len().min(n.saturating_sub(1));
            let mut best = vec![0f64; n + 1];
            let mut best_b = vec![0u32; n + 1];
            g[l].reserve_exact(ranks + 1);
            g[l].push(vec![0f64; n + 1]); // G_0 = 0: no ranks, no nodes used
            for b in 1..=ranks {
                let pb = p[b - 1];
                let prev = &g[l][b - 1];
                for k in 0..=n {
                    rev[k] = prev[n - k];
                }
                let below = &t[l - 1];
                let mut cur = vec![f64::NEG_INFINITY; n + 1];
                // Ranks 1..b each hold >= 1 node (m >= b); rank b takes y in 1..=m-b+1.
                for m in b..n {
                    let hi = m - b + 1;
                    let v = max_split(&rev[n - m + 1..=n - m + hi], &below[1..=hi], pb);
                    cur[m] = v;
                    if v > best[m] {
                        best[m] = v;
                        best_b[m] = b as u32;
                    }
                }
                g[l].push(cur);
            }
            for m in 1..=n {
                t[l][m] = 1.0 + best[m - 1];
                kids[l][m] = best_b[m - 1];
            }
        }
        Dp {
            n,
            levels,
            t,
            kids,
            g,
        }
    }

    /// Best expected length with at most `m` nodes and depth <= `l`.
    pub fn value(&self, m: usize, l: usize) -> f64 {
        self.t[l][m]
    }

    /// Nodes given to rank `b` in `G_{l,b}[m]`: the first split reaching the stored maximum.
    fn split(&self, l: usize, b: usize, m: usize) -> usize {
        let (prev, below, pb) = (&self.g[l][b - 1], &self.t[l - 1], self.levels.at(l)[b - 1]);
        let target = self.g[l][b][m];
        let mut best = (f64::NEG_INFINITY, 1);
        for y in 1..=m - (b - 1) {
            let v = prev[m - y] + pb * below[y];
            if v > best.0 {
                best = (v, y);
            }
            if v == target {
                return y;
            }
        }
        best.1
    }

    /// The optimal tree for (`m`, `l`) as choice paths.
    pub fn plan(&self, m: usize, l: usize) -> Plan {
        debug_assert!(m <= self.n);
        let mut choices = Vec::new();
        let mut stack = vec![(Vec::<i64>::new(), m, l)];
        while let Some((path, m, l)) = stack.pop() {
            if l == 0 || m <= 1 {
                continue;
            }
            let b = self.kids[l][m] as usize;
            // Walk ranks b..1 back through the splits of G_{l,b}[m-1].
            let mut rest = m - 1;
            for r in (1..=b).rev() {
                let y = self.split(l, r, rest);
                rest -= y;
                let mut child = path.clone();
                child.push(r as i64 - 1);
                choices.push(child.clone());
                stack.push((child, y, l - 1));
            }
        }
        choices.sort_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
        Plan {
            choices,
            expected: self.t[l][m],
        }
    }
}

/// The exact DP for any `p`.
pub fn optimal_tree_dp(p: &[f64], budget: usize, max_depth: Option<usize>) -> Result<Plan> {
    check_probs(p)?;
    check_budget(budget)?;
    let depth = resolve_depth(budget, max_depth)?;
    check_dp_size(p.len(), budget, depth)?;
    Ok(Dp::new(p, budget, depth).plan(budget, depth))
}

/// The exact optimum of at most `budget` nodes and depth <= `depth` when acceptance depends
/// on depth: `rows[d - 1]` is the acceptance by rank of the children at depth `d` (`rows`
/// covers `1..=depth`; ranks past a row's end are never accepted). Rows are probabilities
/// (the caller's model is validated).
pub(crate) fn optimal_tree_by_depth(
    rows: &[Vec<f64>],
    budget: usize,
    depth: usize,
) -> Result<Plan> {
    check_budget(budget)?;
    let depth = depth.min(budget - 1);
    debug_assert!(rows.len() >= depth);
    let ranks = rows[..depth].iter().map(Vec::len).max().unwrap_or(0);
    check_dp_size_or(
        ranks,
        budget,
        depth,
        "pass a smaller max_depth, topk or budget (this model's acceptance grows with rank \
         somewhere, so the tree comes from the exact DP, not best-first)",
    )?;
    // A root with l levels below it sits at depth `depth - l`: its children use that row.
    let levels = (1..=depth).map(|l| rows[depth - l].clone()).collect();
    Ok(Dp::run(Levels::ByLevel(levels), budget, depth).plan(budget, depth))
}

/// A heap entry: a node not yet in the tree, `rank` under the chosen node `parent`.
#[derive(PartialEq)]
struct Cand {
    value: f64,
    depth: u32,
    seq: u32,
    parent: u32,
    rank: u32,
}

impl Eq for Cand {}

impl Ord for Cand {
    fn cmp(&self, o: &Self) -> Ordering {
        // Max-heap: higher value, then shallower, then earlier pushed.
        self.value
            .partial_cmp(&o.value)
            .unwrap_or(Ordering::Equal)
            .then(o.depth.cmp(&self.depth))
            .then(o.seq.cmp(&self.seq))
    }
}

impl PartialOrd for Cand {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// The greedy heap, exact when `p` is non-increasing (an error otherwise). Every chosen node
/// offers its first child and its next sibling; both are worth at most the node itself.
/// Chosen nodes live in an arena (`parent`, `rank`, `value`); paths are spelled out at the end.
pub fn optimal_tree_heap(p: &[f64], budget: usize, max_depth: Option<usize>) -> Result<Plan> {
    check_probs(p)?;
    check_budget(budget)?;
    if !is_non_increasing(p) {
        return Err(Error::value(
            "accept_probs",
            "the greedy heap is exact only for a non-increasing vector; use the DP",
        ));
    }
    let depth = resolve_depth(budget, max_depth)? as u32;
    // Arena of chosen nodes; node 0 is the root.
    let mut parent = Vec::with_capacity(budget);
    let mut rank = Vec::with_capacity(budget);
    let mut value = Vec::with_capacity(budget);
    let mut level = Vec::with_capacity(budget);
    parent.push(u32::MAX);
    rank.push(0u32);
    value.push(1.0f64);
    level.push(0u32);
    let mut heap = BinaryHeap::with_capacity(2 * budget);
    let mut seq = 0u32;
    heap.push(Cand {
        value: p[0],
        depth: 1,
        seq,
        parent: 0,
        rank: 0,
    });
    let mut expected = 1.0;
    while value.len() < budget {
        let Some(c) = heap.pop() else { break };
        if c.value <= 0.0 {
            break;
        }
        expected += c.value;
        let me = value.len() as u32;
        parent.push(c.parent);
        rank.push(c.rank);
        value.push(c.value);
        level.push(c.depth);
        if (c.rank as usize) + 1 < p.len() {
            seq += 1;
            heap.push(Cand {
                value: value[c.parent as usize] * p[c.rank as usize + 1],
                depth: c.depth,
                seq,
                parent: c.parent,
                rank: c.rank + 1,
            });
        }
        if c.depth < depth {
            seq += 1;
            heap.push(Cand {
                value: c.value * p[0],
                depth: c.depth + 1,
                seq,
                parent: me,
                rank: 0,
            });
        }
    }
    // The plan spells each node's whole path: its size is the sum of the depths, up to
    // budget x depth (a 65,536-node chain's would be 2.1e9 entries, ~35 GB). Refused past
    // what the DP's work limit lets its plans reach (their depth x nodes is under 2^24 there).
    let entries: usize = level.iter().skip(1).map(|&l| l as usize).sum();
    if entries > MAX_PLAN_ENTRIES {
        return Err(Error::value(
            "budget",
            format!(
                "the plan of {budget} nodes spells {entries} path entries (each node's depth), \
                 more than {MAX_PLAN_ENTRIES}: pass a smaller max_depth or budget"
            ),
        ));
    }
    let mut choices: Vec<Vec<i64>> = Vec::with_capacity(value.len() - 1);
    for (v, &lv) in level.iter().enumerate().skip(1) {
        let mut path = vec![0i64; lv as usize];
        let mut u = v;
        for slot in path.iter_mut().rev() {
            *slot = rank[u] as i64;
            u = parent[u] as usize;
        }
        choices.push(path);
    }
    choices.sort_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
    Ok(Plan { choices, expected })
}

/// The heap when `p` is non-increasing, the DP otherwise.
pub fn optimal_tree(p: &[f64], budget: usize, max_depth: Option<usize>) -> Result<Plan> {
    check_probs(p)?;
    if is_non_increasing(p) {
        optimal_tree_heap(p, budget, max_depth)
    } else {
        optimal_tree_dp(p, budget, max_depth)
    }
}

/// Relative difference under which two costs tie in [`choose_tree`]: the DP sums the same
/// products along different paths, so equal trees' values can differ in the last bit (6.45
/// against 6.449999999999999), and the tie rule (smaller budget, then shallower) must see
/// them as equal.
pub const TIE_TOLERANCE: f64 = 1e-12;

/// A hardware-aware choice of tree.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub plan: Plan,
    pub budget: usize,
    pub depth: usize,
    /// `(depth · t_draft + t_verify(budget)) / expected`: time per emitted token.
    pub time_per_token: f64,
}

/// Picks the `(budget, depth)` minimizing `(depth · t_draft + t_verify(budget)) / E[len]` over
/// the measured verify costs `t_verify` (`(budget, seconds)` pairs) and depths `1..=max_depth`
/// (depth 0 for budget 1, which drafts nothing),
/// from one DP run. Ties (costs within [`TIE_TOLERANCE`]) go to the smaller budget, then the
/// shallower depth.
pub fn choose_tree(
    p: &[f64],
    t_draft: f64,
    t_verify: &[(usize, f64)],
    max_depth: usize,
) -> Result<Choice> {
    check_probs(p)?;
    if !t_draft.is_finite() || t_draft < 0.0 {
        return Err(Error::value(
            "t_draft",
            format!("{t_draft}: expected a finite time >= 0"),
        ));
    }
    if max_depth < 1 {
        return Err(Error::value("max_depth", "must be >= 1"));
    }
    if t_verify.is_empty() {
        return Err(Error::value(
            "t_verify",
            "needs at least one (budget, time) entry",
        ));
    }
    for &(n, t) in t_verify {
        check_budget(n).map_err(|e| Error::value("t_verify", format!("key {n}: {e}")))?;
        if !t.is_finite() || t <= 0.0 {
            return Err(Error::value(
                "t_verify",
                format!("t_verify[{n}] = {t}: expected a finite time > 0"),
            ));
        }
    }
    let n_max = t_verify.iter().map(|&(n, _)| n).max().unwrap_or(1);
    let depth = max_depth.min(n_max.saturating_sub(1)).max(1);
    check_dp_size(p.len(), n_max, depth)
        .map_err(|e| Error::value("t_verify", format!("largest budget {n_max}: {e}")))?;
    let dp = Dp::new(p, n_max, depth);
    let mut keys: Vec<(usize, f64)> = t_verify.to_vec();
    keys.sort_by_key(|k| k.0);
    let mut best: Option<(f64, usize, usize)> = None;
    for &(n, tv) in &keys {
        // A one-node tree drafts nothing: depth 0, no draft step to pay for.
        let depths = if n == 1 { 0..=0 } else { 1..=depth };
        for d in depths {
            let cost = (d as f64 * t_draft + tv) / dp.value(n, d);
            if best.is_none_or(|(c, _, _)| cost < c - TIE_TOLERANCE * c.abs()) {
                best = Some((cost, n, d));
            }
        }
    }
    let (cost, n, d) = best.unwrap_or((f64::INFINITY, 1, 1));
    Ok(Choice {
        plan: dp.plan(n, d),
        budget: n,
        depth: d,
        time_per_token: cost,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::from_choices;
    use ndarray::ArrayView1;

    fn value_of(plan: &Plan, p: &[f64]) -> f64 {
        let t = from_choices(&plan.choices, None::<ArrayView1<'_, i64>>).unwrap();
        expected_accept_length(t.view(), p).unwrap()
    }

    #[test]
    fn heap_and_dp_agree_on_monotone_vectors() {
        let p = [0.6, 0.2, 0.1, 0.05];
        for budget in 1..40 {
            for depth in [1, 2, 3, 8] {
                let a = optimal_tree_heap(&p, budget, Some(depth)).unwrap();
                let b = optimal_tree_dp(&p, budget, Some(depth)).unwrap();
                assert!((a.expected - b.expected).abs() < 1e-9, "{budget} {depth}");
                assert!((value_of(&a, &p) - a.expected).abs() < 1e-9);
                assert!((value_of(&b, &p) - b.expected).abs() < 1e-9);
                assert!(a.choices.len() < budget && b.choices.len() < budget);
            }
        }
    }

    #[test]
    fn dp_handles_non_monotone_vectors() {
        // A chain of rank-0 children is worth 0.1 each, a rank-1 child 0.8.
        let p = [0.1, 0.8];
        let plan = optimal_tree_dp(&p, 3, Some(1)).unwrap();
        assert_eq!(plan.choices, vec![vec![0], vec![1]]);
        assert!((plan.expected - 1.9).abs() < 1e-12);
        assert!(optimal_tree_heap(&p, 3, None).is_err());
    }

    #[test]
    fn choose_tree_trades_draft_time_against_length() {
        let p = [0.9];
        // Free drafting: the deepest tree wins.
        let c = choose_tree(&p, 0.0, &[(4, 1.0)], 3).unwrap();
        assert_eq!(c.depth, 3);
        // Expensive drafting: no draft at all is cheapest per token.
        let c = choose_tree(&p, 100.0, &[(1, 1.0), (4, 1.0)], 3).unwrap();
        assert_eq!(c.budget, 1);
        assert!(choose_tree(&p, -1.0, &[(4, 1.0)], 3).is_err());
        assert!(choose_tree(&[1.5], 0.0, &[(4, 1.0)], 3).is_err());
    }
}
