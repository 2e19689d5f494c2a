//! Online acceptance statistics per (depth, sibling rank), fed with verified trees.
//!
//! For every node `v` the verify walk reached, each of its children of rank `r` (position among
//! siblings) was a *trial* for (depth of the child, `r`), and the accepted child (if any) a
//! *hit*. The target's choice at `v` does not depend on how many children `v` has, so
//! `hits / trials` estimates Sequoia's positional acceptance `p[r]` (see [`crate::topology::sequoia`])
//! without bias, per depth or pooled over depths; Wilson intervals give its uncertainty.
//! Cost: O(path length · children) per verified tree.

use ndarray::ArrayView2;

use crate::error::{Error, Result};
use crate::tree::{TreeBatch, TreeRef};
use crate::verify::BatchVerified;

/// Counts, grown on demand: `[depth - 1][rank]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AcceptanceStats {
    trials: Vec<Vec<u64>>,
    hits: Vec<Vec<u64>>,
    steps: u64,
    accepted: u64,
}

/// Largest count kept: callers read the counts as int64.
const COUNT_LIMIT: u64 = i64::MAX as u64;

impl AcceptanceStats {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one verified tree: `accepted` = `0, a1, ..., ak` (root first) and `emitted`
    /// its tokens (`a1`'s, ..., `ak`'s, then the bonus), which must be the tree's own: a result
    /// of another tree whose path happens to exist here is refused, not counted. `which` names
    /// the request in errors (`"request 3"`), or is empty for a single result.
    pub fn observe(
        &mut self,
        tree: TreeRef<'_>,
        accepted: &[i32],
        emitted: &[i64],
        which: &str,
    ) -> Result<()> {
        let which = if which.is_empty() {
            String::new()
        } else {
            format!("{which}: ")
        };
        if accepted.first() != Some(&0) {
            return Err(Error::value(
                "result",
                format!("{which}the accepted path must start at the root (node 0)"),
            ));
        }
        let n = tree.num_nodes();
        // Validate the whole path before counting, so a bad result leaves the stats untouched.
        for j in 1..accepted.len() {
            let (v, c) = (accepted[j - 1], accepted[j]);
            if c < 0 || c as usize >= n || tree.parents[c as usize] != v {
                return Err(Error::value(
                    "result",
                    format!(
                        "{which}accepted node {c} (step {j}) is not a child of node {v} in this \
                         tree; pass the tree that was verified"
                    ),
                ));
            }
            if emitted.get(j - 1) != Some(&tree.tokens[c as usize]) {
                return Err(Error::value(
                    "result",
                    format!(
                        "{which}accepted node {c} (step {j}) holds token {} in this tree, but \
                         the result emitted {}; pass the tree that was verified",
                        tree.tokens[c as usize],
                        emitted
                            .get(j - 1)
                            .map_or("nothing".to_string(), i64::to_string)
                    ),
                ));
            }
        }
        // Counts stay within int64, as `merge` keeps them: a step adds one trial at most to
        // each cell, so no cell passes `steps`, and `steps` and `accepted` are checked here.
        let drafts = (accepted.len() - 1) as u64;
        if self.steps >= COUNT_LIMIT || self.accepted > COUNT_LIMIT - drafts {
            return Err(Error::value(
                "result",
                format!("{which}the counts would pass 2**63 - 1"),
            ));
        }
        for (j, &v) in accepted.iter().enumerate() {
            let next = accepted.get(j + 1).copied();
            let d = tree.depths[v as usize] as usize; // child depth - 1
            for (r, c) in tree.children(v as usize).enumerate() {
                self.grow(d, r);
                self.trials[d][r] += 1;
                if Some(c as i32) == next {
                    self.hits[d][r] += 1;
                }
            }
        }
        self.steps += 1;
        self.accepted += drafts;
        Ok(())
    }

    /// Records every request of a verified batch, or nothing if any request does not match
    /// the batch it claims to come from.
    pub fn observe_batch(&mut self, batch: &TreeBatch, r: &BatchVerified) -> Result<()> {
        if r.offsets != batch.offsets() {
            return Err(Error::value(
                "result",
                "was verified on a batch with different tree sizes",
            ));
        }
        // Count into a copy and commit at the end, so an error changes nothing.
        let mut next = self.clone();
        for i in 0..batch.num_trees() {
            let k = r.num_accepted[i] as usize;
            let row = &r.accepted_row(i)[..k + 1];
            let emitted = &r.tokens[i * r.width..i * r.width + k + 1];
            next.observe(batch.tree(i), row, emitted, &format!("request {i}"))?;
        }
        *self = next;
        Ok(())
    }

    fn grow(&mut self, d: usize, r: usize) {
        if self.trials.len() <= d {
            self.trials.resize(d + 1, Vec::new());
            self.hits.resize(d + 1, Vec::new());
        }
        if self.trials[d].len() <= r {
            self.trials[d].resize(r + 1, 0);
            self.hits[d].resize(r + 1, 0);
        }
    }

    /// An accumulator holding the counts another one reads back (`trials` and `hits`
    /// `[depths, ranks]`, `steps`, `accepted`): a worker's statistics shipped to another process, or
    /// kept across a restart. Counts that no sequence of verified trees produces are refused,
    /// naming the first that is off: each in `[0, 2**63 - 1]`, hits within trials within the
    /// trees that reached the depth (every tree at the root, as many as had a hit one level
    /// up below it), no more hits at a depth than trees reached it, and `accepted` the hits'
    /// total. Rank totals over depths then stay within `steps + accepted`, so they fit.
    pub fn from_counts(
        trials: ArrayView2<'_, i64>,
        hits: ArrayView2<'_, i64>,
        steps: i64,
        accepted: i64,
    ) -> Result<Self> {
        if hits.dim() != trials.dim() {
            return Err(Error::value(
                "hits",
                format!(
                    "expected shape {:?} (as trials), got {:?}",
                    trials.shape(),
                    hits.shape()
                ),
            ));
        }
        let (depths, ranks) = trials.dim();
        let count = |name: &'static str, x: i64| {
            u64::try_from(x).map_err(|_| Error::value(name, format!("{x}: expected >= 0")))
        };
        let steps = count("steps", steps)?;
        let accepted = count("accepted", accepted)?;
        // Trees whose accepted path reached each depth: every tree at the root, then as many
        // as had a hit one level up. A node's children are tried only there.
        let (mut out, mut reached, mut total) = (Self::new(), u128::from(steps), 0u128);
        for d in 0..depths {
            let mut at_depth = 0u128;
            for r in 0..ranks {
                let (t, h) = (trials[(d, r)], hits[(d, r)]);
                if t < 0 || t as u128 > reached {
                    return Err(Error::value(
                        "trials",
                        format!(
                            "trials[{d}, {r}] = {t}: expected a count in [0, {reached}], the \
                             trees that reached depth {d}"
                        ),
                    ));
                }
                if h < 0 || h > t {
                    return Err(Error::value(
                        "hits",
                        format!("hits[{d}, {r}] = {h}: expected a count in [0, trials = {t}]"),
                    ));
                }
                at_depth += h as u128;
            }
            if at_depth > reached {
                return Err(Error::value(
                    "hits",
                    format!(
                        "depth {d} has {at_depth} hits, more than the {reached} trees that \
                         reached it"
                    ),
                ));
            }
            reached = at_depth;
            total += at_depth;
            out.trials
                .push(trials.row(d).iter().map(|&x| x as u64).collect());
            out.hits
                .push(hits.row(d).iter().map(|&x| x as u64).collect());
        }
        if total != u128::from(accepted) {
            return Err(Error::value(
                "accepted",
                format!("{accepted}, but the hits add up to {total}"),
            ));
        }
        out.steps = steps;
        out.accepted = accepted;
        Ok(out)
    }

    /// Accepted draft tokens over every recorded tree (bonus excluded).
    pub fn accepted(&self) -> u64 {
        self.accepted
    }

    /// `(depths, ranks)` of the count tables.
    pub fn shape(&self) -> (usize, usize) {
        let ranks = self.trials.iter().map(Vec::len).max().unwrap_or(0);
        (self.trials.len(), ranks)
    }

    fn dense(&self, t: &[Vec<u64>]) -> Vec<u64> {
        let (d, r) = self.shape();
        let mut out = vec![0u64; d * r];
        for (i, row) in t.iter().enumerate() {
            out[i * r..i * r + row.len()].copy_from_slice(row);
        }
        out
    }

    /// Trials `[depths, ranks]`, row-major.
    pub fn trials(&self) -> Vec<u64> {
        self.dense(&self.trials)
    }

    /// Hits `[depths, ranks]`, row-major.
    pub fn hits(&self) -> Vec<u64> {
        self.dense(&self.hits)
    }

    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Mean accepted draft tokens per verified tree (bonus excluded).
    pub fn mean_accepted(&self) -> f64 {
        if self.steps == 0 {
            0.0
        } else {
            self.accepted as f64 / self.steps as f64
        }
    }

    /// Pooled `(hits, trials)` per rank.
    pub fn pooled(&self) -> (Vec<u64>, Vec<u64>) {
        let (_, r) = self.shape();
        let (mut h, mut t) = (vec![0u64; r], vec![0u64; r]);
        for (th, tt) in self.hits.iter().zip(&self.trials) {
            for i in 0..tt.len() {
                h[i] += th[i];
                t[i] += tt[i];
            }
        }
        (h, t)
    }

    /// Fitted `p[r]` pooled over depths (0 for a rank never tried).
    pub fn accept_probs(&self) -> Vec<f64> {
        let (h, t) = self.pooled();
        h.iter()
            .zip(&t)
            .map(|(&h, &t)| if t == 0 { 0.0 } else { h as f64 / t as f64 })
            .collect()
    }

    /// Wilson score interval of each pooled `p[r]` at normal quantile `z` (`[0, 1]` for a rank
    /// never tried).
    pub fn confidence_interval(&self, z: f64) -> Result<(Vec<f64>, Vec<f64>)> {
        if !z.is_finite() || z <= 0.0 {
            return Err(Error::value("z", format!("{z}: expected a finite z > 0")));
        }
        let (h, t) = self.pooled();
        let mut lo = Vec::with_capacity(h.len());
        let mut hi = Vec::with_capacity(h.len());
        for (&h, &t) in h.iter().zip(&t) {
            let (a, b) = wilson(h, t, z);
            lo.push(a);
            hi.push(b);
        }
        Ok((lo, hi))
    }

    /// Adds another accumulator's counts (e.g. from another worker). Counts stay within
    /// int64, as callers read them: a merge past that is refused and changes nothing.
    pub fn merge(&mut self, other: &AcceptanceStats) -> Result<()> {
        let fits = |a: u64, b: u64| a.checked_add(b).is_some_and(|sum| sum <= COUNT_LIMIT);
        let count = |m: &[Vec<u64>], d: usize, r: usize| {
            m.get(d).and_then(|row| row.get(r)).copied().unwrap_or(0)
        };
        let cells_fit = other.trials.iter().enumerate().all(|(d, row)| {
            row.iter().enumerate().all(|(r, &x)| {
                fits(count(&self.trials, d, r), x)
                    && fits(count(&self.hits, d, r), other.hits[d][r])
            })
        });
        if !cells_fit || !fits(self.steps, other.steps) || !fits(self.accepted, other.accepted) {
            return Err(Error::value(
                "other",
                "the merged counts would pass 2**63 - 1",
            ));
        }
        for (d, row) in other.trials.iter().enumerate() {
            for (r, &x) in row.iter().enumerate() {
                self.grow(d, r);
                self.trials[d][r] += x;
                self.hits[d][r] += other.hits[d][r];
            }
        }
        self.steps += other.steps;
        self.accepted += other.accepted;
        Ok(())
    }
}

/// Wilson score interval for `h` successes in `t` trials.
pub fn wilson(h: u64, t: u64, z: f64) -> (f64, f64) {
    if t == 0 {
        return (0.0, 1.0);
    }
    let n = t as f64;
    let p = h as f64 / n;
    let z2 = z * z;
    if !z2.is_finite() {
        // The interval's limit as z grows (inf / inf below would be NaN).
        return (0.0, 1.0);
    }
    let denom = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denom;
    let half = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denom;
    // The interval contains p exactly: at h = 0 (or h = t) `centre - half` (or `+`) cancels
    // to within an ulp of p, which would leave p itself outside.
    ((centre - half).clamp(0.0, p), (centre + half).clamp(p, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Tree;

    #[test]
    fn wilson_interval_contains_the_estimate_at_every_count() {
        for t in 1..=300u64 {
            for z in [0.5, 1.0, 1.96, 2.576, 4.0, 10.0] {
                for h in 0..=t {
                    let p = h as f64 / t as f64;
                    let (lo, hi) = wilson(h, t, z);
                    assert!(
                        (0.0..=p).contains(&lo) && (p..=1.0).contains(&hi),
                        "{h}/{t} z={z}"
                    );
                }
                assert_eq!(wilson(0, t, z).0, 0.0);
                assert_eq!(wilson(t, t, z).1, 1.0);
            }
        }
    }

    #[test]
    fn counts_trials_and_hits_along_the_path() {
        // 0 -> {1, 2}; 2 -> {3, 4}
        let t = Tree::new(&[-1, 0, 0, 2, 2], &[0, 1, 2, 3, 4]).unwrap();
        let mut s = AcceptanceStats::new();
        s.observe(t.view(), &[0, 2, 4], &[2, 4, 9], "").unwrap();
        s.observe(t.view(), &[0], &[7], "").unwrap();
        assert_eq!(s.shape(), (2, 2));
        assert_eq!(s.trials(), [2, 2, 1, 1]);
        assert_eq!(s.hits(), [0, 1, 0, 1]);
        assert_eq!(s.accept_probs(), [0.0, 2.0 / 3.0]);
        assert_eq!(s.mean_accepted(), 1.0);
        let (lo, hi) = s.confidence_interval(1.96).unwrap();
        assert!(lo[1] < 2.0 / 3.0 && 2.0 / 3.0 < hi[1]);
        assert!(s.observe(t.view(), &[0, 3], &[3, 1], "").is_err());
        // The path exists here, but its tokens are another tree's.
        assert!(s.observe(t.view(), &[0, 2], &[5, 1], "").is_err());
        assert_eq!(s.steps(), 2);
    }
}
