//! Acceptance models, expected accepted length, and a Monte-Carlo simulator of verification.
//!
//! An [`Acceptance`] model gives, for every draft node `v`, the probability `q[v]` that the
//! target picks `v` given that `v`'s parent was accepted. The target picks *at most one* child
//! per node (its token matches the first child that carries it), so the `q` of a node's children
//! sum to at most 1; the rest is the probability the walk stops there. The expected number of
//! tokens a step emits is then `1 + Σ_{v≠root} P(path to v accepted)` with `P(v) = Π q` along
//! the path, and for a chain of `γ` drafts under an i.i.d. `α` it is `(1 − α^(γ+1)) / (1 − α)`.
//!
//! [`simulate`] samples, step by step, which child the target picks at each node the walk
//! visits and runs the real [`verify::walk`] over the tree's shape; it records the accepted
//! length in a histogram. Steps are split in fixed chunks, each with its own seeded generator,
//! and the integer histograms are summed, so a result depends on `(tree, model, steps, seed)`
//! only, never on the thread count. Cost: O(steps · depth · branching), parallel over chunks.
//! [`best_tree`] builds the tree that maximizes the expected length under a budget: the
//! max-heap of FIELD_NOTES §3 when acceptance never grows with rank, Sequoia's exact DP
//! otherwise.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use ndarray::ArrayView1;
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::topology::sequoia;
use crate::tree::{Tree, TreeRef, MAX_NODES};
use crate::verify;

/// How likely the target is to accept a drafted child, given its parent was accepted.
#[derive(Debug, Clone, PartialEq)]
pub enum Acceptance {
    /// Every drafted child independently matches the target with probability `α`; the first
    /// match in sibling order wins, so the child of rank `r` (0-based) is accepted with
    /// probability `α (1 − α)^r`. On a chain this is the classic per-token `α`.
    Iid(f64),
    /// As [`Acceptance::Iid`] with `α` depending on the child's depth: entry `d − 1` is the
    /// acceptance of children at depth `d`. Must cover the tree's depth.
    PerDepth(Vec<f64>),
    /// Sequoia's per-rank vector: entry `r` is the probability that the target picks the child
    /// of rank `r`; `Σ ≤ 1`, ranks past the end are never picked.
    PerRank(Vec<f64>),
    /// Measured acceptance by depth and rank (what acceptance statistics collect): row `d − 1`
    /// holds the per-rank probabilities at depth `d`, each row summing to at most 1. Must
    /// cover the tree's depth; ranks past a row's end are never picked.
    Table(Vec<Vec<f64>>),
}

fn check_prob(arg: &'static str, what: String, p: f64) -> Result<()> {
    if p.is_finite() && (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(Error::value(
            arg,
            format!("{what} = {p}, expected a probability in [0, 1]"),
        ))
    }
}

impl Acceptance {
    /// Validates the model: probabilities in `[0, 1]`, a non-empty vector, per-rank sum ≤ 1.
    pub fn validate(&self) -> Result<()> {
        match self {
            Acceptance::Iid(a) => check_prob("alpha", "alpha".into(), *a),
            Acceptance::PerDepth(v) | Acceptance::PerRank(v) => {
                let name = self.kind();
                if v.is_empty() {
                    return Err(Error::value(
                        "acceptance",
                        format!("the {name} vector is empty"),
                    ));
                }
                for (i, &p) in v.iter().enumerate() {
                    check_prob("acceptance", format!("{name}[{i}]"), p)?;
                }
                if let Acceptance::PerRank(_) = self {
                    let s: f64 = v.iter().sum();
                    // The target picks one token: the rank probabilities are disjoint events.
                    if s > 1.0 + 1e-9 {
                        return Err(Error::value(
                            "acceptance",
                            format!("per_rank sums to {s}, but the target picks at most one child (sum <= 1)"),
                        ));
                    }
                }
                Ok(())
            }
            Acceptance::Table(rows) => {
                if rows.is_empty() {
                    return Err(Error::value("acceptance", "the table has no rows"));
                }
                for (d, row) in rows.iter().enumerate() {
                    for (r, &p) in row.iter().enumerate() {
                        check_prob("acceptance", format!("table[{d}][{r}]"), p)?;
                    }
                    let s: f64 = row.iter().sum();
                    if s > 1.0 + 1e-9 {
                        return Err(Error::value(
                            "acceptance",
                            format!("table row {d} (depth {}) sums to {s}, but the target picks at most one child (sum <= 1)", d + 1),
                        ));
                    }
                }
                Ok(())
            }
        }
    }

    /// Deepest depth the model covers (`None`: any depth).
    pub fn depth_limit(&self) -> Option<usize> {
        match self {
            Acceptance::PerDepth(v) => Some(v.len()),
            Acceptance::Table(rows) => Some(rows.len()),
            _ => None,
        }
    }

    /// `"iid"`, `"per_depth"`, `"per_rank"` or `"table"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Acceptance::Iid(_) => "iid",
            Acceptance::PerDepth(_) => "per_depth",
            Acceptance::PerRank(_) => "per_rank",
            Acceptance::Table(_) => "table",
        }
    }

    /// Probability that the child of sibling rank `rank` (0-based) at depth `depth` (>= 1) is
    /// the one the target picks, given its parent was accepted. `None` when a per-depth vector
    /// does not reach `depth`.
    pub fn child_prob(&self, depth: usize, rank: usize) -> Option<f64> {
        let geometric = |a: f64| a * (1.0 - a).powi(rank.min(i32::MAX as usize) as i32);
        match self {
            Acceptance::Iid(a) => Some(geometric(*a)),
            Acceptance::PerDepth(v) => v.get(depth.checked_sub(1)?).map(|&a| geometric(a)),
            Acceptance::PerRank(v) => Some(v.get(rank).copied().unwrap_or(0.0)),
            Acceptance::Table(rows) => rows
                .get(depth.checked_sub(1)?)
                .map(|row| row.get(rank).copied().unwrap_or(0.0)),
        }
    }
}

/// Expected tokens per target call of a chain of `gamma` drafts with per-token acceptance
/// `alpha` (bonus included): `(1 − α^(γ+1)) / (1 − α)`, and `γ + 1` at `α = 1`.
pub fn chain_expected_tokens(alpha: f64, gamma: usize) -> Result<f64> {
    check_prob("alpha", "alpha".into(), alpha)?;
    // `gamma + 1` checked: it wrapped to 0 at usize::MAX, which read 0 expected tokens.
    let n = gamma
        .checked_add(1)
        .ok_or_else(|| Error::value("gamma", format!("{gamma}: gamma + 1 overflows")))?;
    if alpha == 1.0 {
        return Ok(n as f64);
    }
    // `powi` (exact repeated squaring) where the exponent fits it, `powf` past that.
    let power = i32::try_from(n).map_or_else(|_| alpha.powf(n as f64), |g| alpha.powi(g));
    Ok((1.0 - power) / (1.0 - alpha))
}

/// `q[v]`: probability the target picks node `v` given its parent was accepted (`q[0] = 1`).
pub fn conditional_probs(tree: TreeRef<'_>, model: &Acceptance) -> Result<Vec<f64>> {
    model.validate()?;
    if let Some(limit) = model.depth_limit() {
        if limit < tree.max_depth as usize {
            return Err(Error::value(
                "acceptance",
                format!(
                    "the {} model covers {limit} depths but the tree is {} deep (one entry per depth is needed)",
                    model.kind(),
                    tree.max_depth
                ),
            ));
        }
    }
    // Depth coverage was checked above, so the lookup cannot miss.
    Ok(conditional_by(tree, |depth, rank| {
        model.child_prob(depth, rank).unwrap_or(0.0)
    }))
}

/// `q[v]` from a lookup `prob(depth of v, sibling rank of v)` (`q[0] = 1`): the one place every
/// acceptance model (and Sequoia's per-rank vector) turns into per-node probabilities.
pub fn conditional_by(tree: TreeRef<'_>, prob: impl Fn(usize, usize) -> f64) -> Vec<f64> {
    let mut q = vec![0.0; tree.num_nodes()];
    q[0] = 1.0;
    for v in 0..tree.num_nodes() {
        for (rank, c) in tree.children(v).enumerate() {
            q[c] = prob(tree.depths[c] as usize, rank);
        }
    }
    q
}

/// Products of `q` along every root path, in place.
pub fn path_products(tree: TreeRef<'_>, mut q: Vec<f64>) -> Vec<f64> {
    // Parents come before children, so one forward pass multiplies along every path.
    for v in 1..q.len() {
        q[v] *= q[tree.parents[v] as usize];
    }
    q
}

/// `P(path to v accepted)` for every node (`1` at the root): the product of `q` along the path.
pub fn path_probs(tree: TreeRef<'_>, model: &Acceptance) -> Result<Vec<f64>> {
    Ok(path_products(tree, conditional_probs(tree, model)?))
}

/// Expected tokens per step (accepted drafts plus the bonus): `1 + Σ_{v≠root} P(v)`.
pub fn expected_tokens(tree: TreeRef<'_>, model: &Acceptance) -> Result<f64> {
    Ok(path_probs(tree, model)?.iter().sum())
}

/// A candidate node of [`best_tree`]: value, then insertion order for a deterministic tie-break.
struct Candidate {
    value: f64,
    seq: usize,
    parent: usize,
    depth: usize,
    rank: usize,
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Candidate {}
impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        // Max-heap on value; among equal values the earlier candidate (shallower) first.
        self.value
            .total_cmp(&other.value)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

/// The tree of at most `budget` nodes (root included), depth `<= max_depth` and at most
/// `max_children` children per node that maximizes [`expected_tokens`] under `model`. When
/// acceptance never grows with rank (always for `Iid`/`PerDepth`) nodes are taken best-first
/// by path probability (FIELD_NOTES §3; a node's next sibling and first child become
/// candidates only once it is taken, so sibling order is rank order); otherwise a rank may be
/// worth more than the one before it, which best-first cannot take without that sibling, and
/// the exact Sequoia DP over the model's rows answers (its size limits apply). Nodes of
/// probability 0 are never added, so the tree may be smaller than the budget. Tokens are the
/// nodes' sibling ranks (root 0), as `Tree.from_choices` gives them.
pub fn best_tree(
    model: &Acceptance,
    budget: usize,
    max_depth: usize,
    max_children: usize,
) -> Result<Tree> {
    model.validate()?;
    if budget == 0 || budget > MAX_NODES {
        return Err(Error::value(
            "budget",
            format!("{budget}, expected 1 <= budget <= {MAX_NODES} (nodes, root included)"),
        ));
    }
    if max_children == 0 {
        return Err(Error::value("max_children", "must be at least 1"));
    }
    let depth = max_depth.min(budget - 1);
    if let Some(limit) = model.depth_limit() {
        if limit < depth {
            return Err(Error::value(
                "acceptance",
                format!(
                    "the {} model covers {limit} depths but the tree may be {depth} deep",
                    model.kind(),
                ),
            ));
        }
    }
    if let Some(rows) = rank_rows_if_not_monotone(model, depth, max_children) {
        let plan = sequoia::optimal_tree_by_depth(&rows, budget, depth)?;
        return crate::topology::from_choices(&plan.choices, None::<ArrayView1<'_, i64>>);
    }
    best_first_tree(model, budget, depth, max_children)
}

/// The per-rank rows of depths `1..=depth` (each cut to `max_children` ranks) when some row
/// grows with rank there, `None` when best-first is exact. `Iid` and `PerDepth` give each rank
/// a geometric share, which never grows.
fn rank_rows_if_not_monotone(
    model: &Acceptance,
    depth: usize,
    max_children: usize,
) -> Option<Vec<Vec<f64>>> {
    let cut = |row: &[f64]| row[..row.len().min(max_children)].to_vec();
    match model {
        Acceptance::Iid(_) | Acceptance::PerDepth(_) => None,
        Acceptance::PerRank(p) => {
            (!sequoia::is_non_increasing(&cut(p))).then(|| vec![cut(p); depth])
        }
        Acceptance::Table(rows) => {
            let rows: Vec<Vec<f64>> = rows[..depth].iter().map(|r| cut(r)).collect();
            (!rows.iter().all(|r| sequoia::is_non_increasing(r))).then_some(rows)
        }
    }
}

/// [`best_tree`] best-first by path probability (exact when acceptance never grows with rank).
fn best_first_tree(
    model: &Acceptance,
    budget: usize,
    max_depth: usize,
    max_children: usize,
) -> Result<Tree> {
    let mut parents = vec![-1i32];
    let mut tokens = vec![0i64];
    let mut value = vec![1.0f64];
    let mut heap = BinaryHeap::new();
    let mut seq = 0usize;
    let mut push =
        |heap: &mut BinaryHeap<Candidate>, parent: usize, pv: f64, depth: usize, rank: usize| {
            if depth > max_depth || rank >= max_children {
                return;
            }
            let v = pv * model.child_prob(depth, rank).unwrap_or(0.0);
            if v > 0.0 {
                heap.push(Candidate {
                    value: v,
                    seq,
                    parent,
                    depth,
                    rank,
                });
                seq += 1;
            }
        };
    push(&mut heap, 0, 1.0, 1, 0);
    while parents.len() < budget {
        let Some(c) = heap.pop() else { break };
        let id = parents.len();
        parents.push(c.parent as i32);
        tokens.push(c.rank as i64);
        value.push(c.value);
        push(&mut heap, c.parent, value[c.parent], c.depth, c.rank + 1);
        push(&mut heap, id, c.value, c.depth + 1, 0);
    }
    Tree::new(&parents, &tokens)
}

/// Accepted-length counts of a simulation: `histogram[k]` steps accepted `k` draft tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimStats {
    pub steps: u64,
    pub histogram: Vec<u64>,
}

impl SimStats {
    /// Mean accepted draft tokens per step (bonus excluded).
    pub fn mean_accepted(&self) -> f64 {
        let s: f64 = self
            .histogram
            .iter()
            .enumerate()
            .map(|(k, &n)| k as f64 * n as f64)
            .sum();
        s / self.steps as f64
    }

    /// Sample variance of the accepted length (the bonus shifts it, so tokens share it).
    pub fn variance(&self) -> f64 {
        if self.steps < 2 {
            return 0.0;
        }
        let m = self.mean_accepted();
        let ss: f64 = self
            .histogram
            .iter()
            .enumerate()
            .map(|(k, &n)| n as f64 * (k as f64 - m).powi(2))
            .sum();
        ss / (self.steps - 1) as f64
    }
}

/// xoshiro256++ (Blackman & Vigna), seeded through splitmix64: small, fast, and good enough for
/// Monte Carlo; one independent stream per chunk.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

/// One splitmix64 step: advances `state` and returns a well-mixed output.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(crate::rng::GOLDEN);
    crate::rng::mix(*state)
}

impl Rng {
    /// The generator of stream `stream` under `seed`.
    pub fn new(seed: u64, stream: u64) -> Rng {
        let mut st = seed;
        let base = splitmix64(&mut st);
        let mut st = base ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03);
        Rng {
            s: [
                splitmix64(&mut st),
                splitmix64(&mut st),
                splitmix64(&mut st),
                splitmix64(&mut st),
            ],
        }
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let out = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        out
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Steps per chunk: each chunk has its own stream, so results do not depend on the scheduling.
/// Large enough that a chunk (~1 ms) dwarfs rayon's hand-off.
pub const SIM_CHUNK: u64 = 1 << 14;

/// Most worker threads `simulate` starts for one call.
pub const MAX_THREADS: usize = 1024;

/// Monte-Carlo verification of `tree` under `model`: `steps` independent steps, each sampling
/// at every visited node which child (if any) the target picks and running the real walk. Only
/// the tree's shape matters: its tokens are replaced by node ids, so siblings are distinct
/// candidates. `threads` pins the worker count (`None`: rayon's global pool); the result is
/// the same for every thread count.
pub fn simulate(
    tree: TreeRef<'_>,
    model: &Acceptance,
    steps: u64,
    seed: u64,
    threads: Option<usize>,
) -> Result<SimStats> {
    if steps == 0 {
        return Err(Error::value("steps", "must be at least 1"));
    }
    let q = conditional_probs(tree, model)?;
    let ids: Vec<i64> = (0..tree.num_nodes() as i64).collect();
    let shape = Tree::new(tree.parents, &ids)?;
    let shape = shape.view();
    let width = tree.max_depth as usize + 1;
    let chunks = steps.div_ceil(SIM_CHUNK);
    let run_chunk = |chunk: u64| -> Result<Vec<u64>> {
        let mut rng = Rng::new(seed, chunk);
        let mut hist = vec![0u64; width];
        let mut accepted = vec![0i32; width];
        let mut emitted = vec![0i64; width];
        let n = SIM_CHUNK.min(steps - chunk * SIM_CHUNK);
        for _ in 0..n {
            let choose = |v: usize| -> Result<i64> {
                let u = rng.next_f64();
                let mut acc = 0.0;
                for c in shape.children(v) {
                    acc += q[c];
                    if u < acc {
                        return Ok(c as i64);
                    }
                }
                // No child matches: the target emits some other token (the bonus).
                Ok(-1)
            };
            let k = verify::walk(shape, choose, &mut accepted, &mut emitted)?;
            hist[k] += 1;
        }
        Ok(hist)
    };
    let merge = |a: Result<Vec<u64>>, b: Result<Vec<u64>>| -> Result<Vec<u64>> {
        let (mut a, b) = (a?, b?);
        a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
        Ok(a)
    };
    let all = || {
        (0..chunks)
            .into_par_iter()
            .map(run_chunk)
            .reduce(|| Ok(vec![0u64; width]), merge)
    };
    let histogram = match threads {
        None => all()?,
        Some(0) => return Err(Error::value("threads", "must be at least 1")),
        Some(n) if n > MAX_THREADS => {
            // Each is an OS thread started for this call: 3,000 took 15 s to start and join.
            return Err(Error::value(
                "threads",
                format!("{n}: at most {MAX_THREADS} (each is an OS thread started per call)"),
            ));
        }
        Some(n) => rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .map_err(|e| Error::value("threads", format!("cannot start {n} threads: {e}")))?
            .install(all)?,
    };
    Ok(SimStats { steps, histogram })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn chain_formula_matches_hand_values() {
        // α = 0.85, γ = 4: (1 − 0.85^5) / 0.15.
        let e = chain_expected_tokens(0.85, 4).unwrap();
        assert!(close(e, (1.0 - 0.443_705_312_5) / 0.15), "{e}");
        assert!(close(chain_expected_tokens(0.5, 1).unwrap(), 1.5));
        assert!(close(chain_expected_tokens(1.0, 3).unwrap(), 4.0));
        assert!(close(chain_expected_tokens(0.0, 3).unwrap(), 1.0));
        assert!(chain_expected_tokens(1.5, 3).is_err());
        assert!(chain_expected_tokens(f64::NAN, 3).is_err());
        // gamma + 1 past usize: an error, not a wrapped 0 tokens.
        assert!(chain_expected_tokens(0.5, usize::MAX).is_err());
        assert!(chain_expected_tokens(1.0, usize::MAX).is_err());
        // Past i32 (powi's exponent): gamma + 1 at alpha 1, the geometric limit below it.
        assert_eq!(
            chain_expected_tokens(1.0, 1 << 40).unwrap(),
            (1u64 << 40) as f64 + 1.0
        );
        assert!(close(chain_expected_tokens(0.5, 1 << 40).unwrap(), 2.0));
    }

    #[test]
    fn tree_expectation_sums_path_probabilities() {
        let chain = Tree::new(&[-1, 0, 1, 2, 3], &[0; 5]).unwrap();
        let e = expected_tokens(chain.view(), &Acceptance::Iid(0.85)).unwrap();
        assert!(close(e, chain_expected_tokens(0.85, 4).unwrap()));
        // Root with two children, the first with one child. Per rank [0.6, 0.3]:
        // 1 + 0.6 + 0.3 + 0.6 * 0.6 = 2.26.
        let t = Tree::new(&[-1, 0, 0, 1], &[0; 4]).unwrap();
        let e = expected_tokens(t.view(), &Acceptance::PerRank(vec![0.6, 0.3])).unwrap();
        assert!(close(e, 2.26), "{e}");
        // Iid 0.5: ranks 0.5, 0.25; 1 + 0.5 + 0.25 + 0.25 = 2.0.
        let e = expected_tokens(t.view(), &Acceptance::Iid(0.5)).unwrap();
        assert!(close(e, 2.0), "{e}");
        // Per depth [0.5, 0.9]: 1 + 0.5 + 0.25 + 0.5 * 0.9 = 2.2.
        let e = expected_tokens(t.view(), &Acceptance::PerDepth(vec![0.5, 0.9])).unwrap();
        assert!(close(e, 2.2), "{e}");
        let err = expected_tokens(t.view(), &Acceptance::PerDepth(vec![0.5])).unwrap_err();
        assert!(err.to_string().contains("2 deep"), "{err}");
        // Table [[0.6, 0.3], [0.5]]: 1 + 0.6 + 0.3 + 0.6 * 0.5 = 2.2.
        let m = Acceptance::Table(vec![vec![0.6, 0.3], vec![0.5]]);
        assert!(close(expected_tokens(t.view(), &m).unwrap(), 2.2));
        assert!(Acceptance::Table(vec![vec![0.6, 0.5]]).validate().is_err());
    }

    #[test]
    fn models_are_validated() {
        assert!(Acceptance::PerRank(vec![0.7, 0.4]).validate().is_err());
        assert!(Acceptance::PerRank(vec![]).validate().is_err());
        assert!(Acceptance::PerDepth(vec![0.5, -0.1]).validate().is_err());
        let e = Acceptance::Iid(2.0).validate().unwrap_err();
        assert_eq!(e.arg(), "alpha");
    }

    #[test]
    fn best_tree_is_a_chain_when_only_rank_zero_counts_and_beats_it_otherwise() {
        let t = best_tree(&Acceptance::PerRank(vec![0.8]), 6, 10, 4).unwrap();
        assert_eq!(t.parents(), [-1, 0, 1, 2, 3, 4]);
        let m = Acceptance::Iid(0.6);
        let t = best_tree(&m, 8, 10, 4).unwrap();
        assert_eq!(t.num_nodes(), 8);
        let chain = Tree::new(&[-1, 0, 1, 2, 3, 4, 5, 6], &[0; 8]).unwrap();
        let (et, ec) = (
            expected_tokens(t.view(), &m).unwrap(),
            expected_tokens(chain.view(), &m).unwrap(),
        );
        assert!(et > ec + 0.1, "tree {et} chain {ec}");
        // Limits hold.
        let t = best_tree(&Acceptance::Iid(0.3), 30, 2, 3).unwrap();
        assert!(t.max_depth() <= 2 && t.num_nodes() <= 1 + 3 + 9);
        assert!(best_tree(&m, 0, 3, 3).is_err());
    }

    #[test]
    fn simulation_is_reproducible_and_thread_count_free() {
        let t = best_tree(&Acceptance::Iid(0.7), 16, 6, 3).unwrap();
        let m = Acceptance::Iid(0.7);
        let a = simulate(t.view(), &m, 100_000, 7, Some(1)).unwrap();
        let b = simulate(t.view(), &m, 100_000, 7, Some(3)).unwrap();
        let c = simulate(t.view(), &m, 100_000, 8, Some(2)).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.histogram.iter().sum::<u64>(), 100_000);
        let exact = expected_tokens(t.view(), &m).unwrap() - 1.0;
        let se = (a.variance() / a.steps as f64).sqrt();
        assert!(
            (a.mean_accepted() - exact).abs() < 4.0 * se,
            "{a:?} vs {exact}"
        );
    }

    #[test]
    fn simulation_of_a_chain_is_geometric() {
        // k accepted out of γ = 3 at α = 0.5: P(k) = 0.5^(k+1) for k < 3, 0.125 for k = 3.
        let chain = Tree::new(&[-1, 0, 1, 2], &[9, 9, 9, 9]).unwrap();
        let s = simulate(chain.view(), &Acceptance::Iid(0.5), 400_000, 1, None).unwrap();
        for (k, want) in [0.5, 0.25, 0.125, 0.125].iter().enumerate() {
            let got = s.histogram[k] as f64 / s.steps as f64;
            assert!((got - want).abs() < 0.005, "P({k}) = {got}, want {want}");
        }
        assert!(simulate(chain.view(), &Acceptance::Iid(0.5), 0, 1, None).is_err());
    }

    #[test]
    fn rng_is_uniform_enough() {
        let mut r = Rng::new(42, 0);
        let n = 200_000;
        let mean: f64 = (0..n).map(|_| r.next_f64()).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.005, "{mean}");
        assert_ne!(Rng::new(42, 0).next_u64(), Rng::new(42, 1).next_u64());
    }
}
