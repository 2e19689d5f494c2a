//! EAGLE-2/3 dynamic draft trees for a batch, all bookkeeping in one place.
//!
//! Per request, [`DynamicTreeBuilder::start`] records the root's top-`K` children (the first
//! frontier, depth 1); every [`DynamicTreeBuilder::expand`] takes the draft's top-`K` for each
//! of the `K` frontier nodes (`[B, K, K]`), scores the `K²` children by cumulative log
//! probability, and keeps the best `K` (ties to the lower pool index) as the next frontier.
//! Each step returns what the next draft forward needs: the frontier's tokens, the index of
//! each frontier node's parent in the previous frontier (to gather hidden states), the
//! draft-side mask over every token fed so far (`[B, K, level·K]`: ancestors and self) and
//! positions. [`DynamicTreeBuilder::build`] reranks the whole pool (`K + (level-1)·K²`
//! candidates) with the top-N rule of [`crate::topology`] into a batch of `budget`-node trees.
//! Pool layout per request, as SGLang's: step 0 is `0..K`, step `s >= 1` is
//! `K + (s-1)·K² + j·K + c` for frontier slot `j`, rank `c`. Cost per step O(B · K² log K)
//! (up to `K = 16`, O(B · K³) at worst: the frontier is kept sorted by insertion, most
//! children rejected by one compare).
//!
//! Each step also tells whether further levels can still change the built tree
//! ([`DynamicTreeBuilder::settled`]): a candidate enters it only by beating its request's
//! `(budget-1)`-th best so far, and no descendant of the frontier can once the frontier's best
//! scores no better than the `(budget-1)`-th best frontier node drafted (frontier nodes are
//! candidates). Each request keeps its best `budget - 1` frontier scores sorted as the levels
//! come, so the test is a compare per frontier node once they can fill the tree.
//!
//! A request that is no longer running (`active[r] == false` at `start`: it finished, but
//! the draft forward still runs over the whole batch) is drafted like the others, builds to
//! its root alone and never keeps the builder from settling, so a decode loop neither cuts
//! its tree afterwards nor drafts extra levels for it.
//!
//! `start` / `expand` return fresh [`Step`]s; `start_into` / `expand_into` write the same
//! values into the caller's buffers ([`StepOut`]), so a decode loop can keep one set of
//! buffers (shared with its tensors) for the whole batch and allocate nothing per level.

use ndarray::{ArrayView1, ArrayView2, ArrayView3};

use crate::error::{Error, Result};
use crate::topology::{score_key, score_of_key, select_top_scores, RankKey, ScoreLike};
use crate::tree::{depth_first_order, IndexLike, TreeBatch, MAX_NODES};

/// What the next draft forward needs, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// `[B, K]` frontier tokens (the draft's next input ids).
    pub tokens: Vec<i64>,
    /// `[B, K]` slot of each frontier node's parent in the previous frontier (0 at start).
    pub parent_index: Vec<i64>,
    /// `[B, K, level·K]`: frontier node `j` may attend to fed token `t` (ancestor or self).
    pub mask: Vec<bool>,
    /// `[B, K]`: prefix length + depth.
    pub positions: Vec<i64>,
    /// Columns of `mask` (`level · K`).
    pub width: usize,
}

/// Where a step goes: row-major `[B, K]` tokens, parent slots and positions, and the
/// `[B, K, mask_stride]` mask. A row's first `level · K` columns are the mask; the rest of it
/// is written `false`. `M` is `bool`, or `u8` (0 / 1) for memory another owner may have left
/// holding any byte.
pub struct StepOut<'a, M> {
    pub tokens: &'a mut [i64],
    pub parent_index: &'a mut [i64],
    pub positions: &'a mut [i64],
    pub mask: &'a mut [M],
    pub mask_stride: usize,
}

impl Step {
    /// A zeroed step of `b · k` rows whose mask has `width` columns.
    fn zeroed(b: usize, k: usize, width: usize) -> Self {
        Step {
            tokens: vec![0; b * k],
            parent_index: vec![0; b * k],
            mask: vec![false; b * k * width],
            positions: vec![0; b * k],
            width,
        }
    }

    fn out(&mut self) -> StepOut<'_, bool> {
        StepOut {
            tokens: &mut self.tokens,
            parent_index: &mut self.parent_index,
            positions: &mut self.positions,
            mask: &mut self.mask,
            mask_stride: self.width,
        }
    }
}

/// How [`DynamicTreeBuilder::build_in`] numbers each tree's nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeOrder {
    /// Increasing pool index (by draft step, then frontier slot, then rank).
    Pool,
    /// Depth-first preorder, siblings by rank: the draft's best path is nodes `0, 1, 2, ...`,
    /// so when the target accepts it the accepted KV entries are already in place.
    DepthFirst,
}

/// Batched EAGLE-2 drafting state.
#[derive(Debug, Clone)]
pub struct DynamicTreeBuilder {
    batch: usize,
    topk: usize,
    depth: usize,
    budget: usize,
    pool: usize,
    /// Levels drafted so far (0 before `start`).
    level: usize,
    root_tokens: Vec<i64>,
    prefix: Vec<i64>,
    /// Requests running since `start`: the others build to their root alone and do not
    /// hold `settled` back.
    active: Vec<bool>,
    /// `[B, pool]` cumulative log score, token and parent pool index (-1 = root).
    scores: Vec<f64>,
    tokens: Vec<i64>,
    parents: Vec<i32>,
    /// `[depth, B, K]` pool index of every frontier slot of every level drafted so far (the
    /// current frontier is level `level - 1`): `build` takes `K · level` candidates known to
    /// be good from it, whose scores bound the selection's threshold.
    frontier: Vec<u32>,
    /// `[B, K, depth]` path of each frontier node: its ancestor's slot at each level, itself
    /// last (the first `level` entries hold them). Its mask row is one True per level, at
    /// column `level · K + slot`: a level copies `level` slots a row where a stored mask row
    /// would cost `level · K` bytes, and the state a level touches, read back from memory
    /// after each head forward, shrinks by `K`. The buffer the next level's paths are
    /// written to is the second: two allocations per builder, none per level. The paths
    /// follow from `frontier` (a node's parent slot is `(g - step base) / K`), but walking
    /// them up costs a division and a dependent load per level and row where the copy
    /// costs neither (stop 19 measured the walk slower at K = 2).
    paths: Vec<u32>,
    next_paths: Vec<u32>,
    /// Rank keys of one request's children, reused by every `expand_into`: all `K²`, or
    /// (up to `K = 16`) the best `K` so far.
    keys: Vec<RankKey>,
    /// Whether no further level can change what `build` returns ([`Self::settled`]).
    settled: bool,
    /// `[B, budget - 1]`: each request's best frontier [`score_key`]s over every level drafted
    /// so far, ascending (best first), the first `min(K · level, budget - 1)` of each row
    /// held. Kept as each level's frontier is chosen (a few compares: a deeper frontier
    /// mostly scores below the row's worst), so [`Self::frontier_bound`] is one load where a
    /// selection over every frontier would be a sort's worth of code to fetch after each
    /// head forward.
    best_front: Vec<u64>,
}

/// Most entries of a builder's draft mask (`batch · topk · depth · topk`, the in-place
/// buffers' and a returned step's): 256 MiB, far past any serving configuration, refused
/// before anything is allocated.
pub const MAX_MASK_ENTRIES: usize = 1 << 28;

/// Inserts `key` into `best` (at most `k` keys, best first in [`RankKey`] order), dropping
/// the worst when `best` is full: after all `K²` children, the best `k` in rank order.
fn keep_best(best: &mut Vec<RankKey>, k: usize, key: RankKey) {
    if best.len() == k {
        match best.last() {
            Some(worst) if key < *worst => {
                best.pop();
            }
            _ => return,
        }
    }
    // Shifted by hand: `Vec::insert` calls `memmove` for the few keys moved, one more
    // function to fetch after each head forward.
    let mut at = best.len();
    best.push(key);
    while at > 0 && key < best[at - 1] {
        best[at] = best[at - 1];
        at -= 1;
    }
    best[at] = key;
}

/// Records a frontier node's `key` in a row of [`DynamicTreeBuilder::best_front`] (its
/// `row.len()` best keys ascending, of which `held` are filled): kept when it is among the
/// best, the worst dropped when the row is full.
#[inline]
fn record_frontier(row: &mut [u64], held: usize, key: u64) {
    let mut at = held.min(row.len());
    if at == row.len() {
        match row.last() {
            Some(&worst) if key < worst => at -= 1,
            _ => return, // no better than the row's worst (or no row: budget 1)
        }
    }
    // Equal keys are the same bound whichever comes first.
    while at > 0 && row[at - 1] > key {
        row[at] = row[at - 1];
        at -= 1;
    }
    row[at] = key;
}

/// `n` copies of `v`, or a ValueError when the memory cannot be reserved (a failed
/// allocation would abort the process).
fn filled<T: Clone>(n: usize, v: T) -> Result<Vec<T>> {
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| {
        Error::value(
            "batch",
            format!("the builder's state of {n} entries does not fit in memory"),
        )
    })?;
    out.resize(n, v);
    Ok(out)
}

impl DynamicTreeBuilder {
    pub fn new(batch: usize, topk: usize, depth: usize, budget: usize) -> Result<Self> {
        if batch < 1 {
            return Err(Error::value("batch", format!("must be >= 1, got {batch}")));
        }
        if topk < 1 {
            return Err(Error::value("topk", format!("must be >= 1, got {topk}")));
        }
        if depth < 1 {
            return Err(Error::value("depth", format!("must be >= 1, got {depth}")));
        }
        let pool = topk
            .checked_mul(topk)
            .and_then(|k2| k2.checked_mul(depth - 1))
            .and_then(|x| x.checked_add(topk))
            .filter(|&p| p < u32::MAX as usize)
            .ok_or_else(|| Error::value("topk", "topk and depth give a pool too large"))?;
        if pool.saturating_mul(batch) >= 1 << 31 {
            return Err(Error::value(
                "batch",
                format!("{batch} requests of {pool} candidates each: a pool too large"),
            ));
        }
        if !(1..=MAX_NODES).contains(&budget) {
            return Err(Error::value(
                "budget",
                format!("must be in [1, {MAX_NODES}], got {budget}"),
            ));
        }
        if budget - 1 > pool {
            return Err(Error::value(
                "budget",
                format!(
                    "{budget} nodes need {} candidates but topk={topk}, depth={depth} draft only \
                     {pool}",
                    budget - 1
                ),
            ));
        }
        // `batch * pool < 2^31` bounds every product below but the mask's (`topk²` is not
        // bounded by the pool when depth is 1).
        let mask = batch
            .checked_mul(topk)
            .and_then(|x| x.checked_mul(depth))
            .and_then(|x| x.checked_mul(topk))
            .filter(|&m| m <= MAX_MASK_ENTRIES)
            .ok_or_else(|| {
                Error::value(
                    "topk",
                    format!(
                        "batch={batch}, topk={topk}, depth={depth} give a draft mask of more \
                         than {MAX_MASK_ENTRIES} entries"
                    ),
                )
            })?;
        // One slot per level of each frontier path, and every level's frontier: each a
        // `topk`-th of the mask.
        let paths = mask / topk;
        Ok(DynamicTreeBuilder {
            batch,
            topk,
            depth,
            budget,
            pool,
            level: 0,
            root_tokens: filled(batch, 0)?,
            prefix: filled(batch, 0)?,
            active: filled(batch, true)?,
            scores: filled(batch * pool, 0.0)?,
            tokens: filled(batch * pool, 0)?,
            parents: filled(batch * pool, -1)?,
            frontier: filled(paths, 0)?,
            paths: filled(paths, 0)?,
            next_paths: filled(paths, 0)?,
            keys: Vec::with_capacity(topk * topk),
            settled: false,
            best_front: filled(batch * (budget - 1), u64::MAX)?,
        })
    }

    pub fn batch(&self) -> usize {
        self.batch
    }
    pub fn topk(&self) -> usize {
        self.topk
    }
    pub fn depth(&self) -> usize {
        self.depth
    }
    pub fn budget(&self) -> usize {
        self.budget
    }
    /// Levels drafted so far.
    pub fn level(&self) -> usize {
        self.level
    }
    /// Whether drafting further levels can no longer change what [`Self::build`] returns:
    /// every running request has drafted at least `budget - 1` frontier nodes (over all levels) and
    /// its best current frontier node scores no better than the `(budget - 1)`-th best of
    /// them. Every later candidate descends from a current frontier node and scores at most
    /// what it does (log probabilities are `<= 0`), and on a tie ranks after the candidates
    /// drafted before it, so none can enter the top `budget - 1`. A decode loop can stop
    /// drafting there: the same tree, fewer draft forwards. Ranking the frontier nodes
    /// rather than every candidate keeps the test off the `K²` children (and off every level
    /// until `K · level >= budget - 1`); in the demo it stops within 0.05 levels a step of
    /// the test on every candidate. False before `start`; once true, true until the next
    /// `start`.
    pub fn settled(&self) -> bool {
        self.level > 0 && self.settled
    }

    /// [`Self::settled`] from the frontiers drafted so far. Frontier nodes number `K` a
    /// level, so the test runs only once they can fill the tree, and stops at the first
    /// running request that is not settled (a request that is not running builds its root
    /// alone whatever is drafted).
    fn frontier_settled(&self) -> bool {
        let (b, k, need) = (self.batch, self.topk, self.budget - 1);
        if need == 0 || !self.active.contains(&true) {
            return true; // every tree is the root alone
        }
        if k * self.level < need {
            return false;
        }
        let current = &self.frontier[(self.level - 1) * b * k..][..b * k];
        (0..b).filter(|&r| self.active[r]).all(|r| {
            let bound = self.frontier_bound(r);
            let scores = &self.scores[r * self.pool..];
            current[r * k..][..k]
                .iter()
                .all(|&g| score_key(scores[g as usize]) >= bound)
        })
    }

    /// The [`score_key`] of request `r`'s `(budget - 1)`-th best frontier node over every
    /// level drafted so far (needs `K · level >= budget - 1 >= 1`). Frontier nodes are
    /// candidates, so the `(budget - 1)`-th best candidate scores at least this: a candidate
    /// scoring less cannot be in the built tree.
    fn frontier_bound(&self, r: usize) -> u64 {
        let need = self.budget - 1;
        self.best_front[r * need + need - 1]
    }

    /// Candidates drafted so far per request.
    pub fn pool_len(&self) -> usize {
        match self.level {
            0 => 0,
            l => self.topk + (l - 1) * self.topk * self.topk,
        }
    }

    /// `lp` must be a log probability; `at` spells the index, only when it is not.
    fn check_logprob(lp: f64, arg: &'static str, at: impl FnOnce() -> String) -> Result<()> {
        if lp.is_nan() || lp > 0.0 {
            return Err(Error::value(
                arg,
                format!(
                    "{arg}{} = {lp}: log probabilities must be <= 0 and not NaN",
                    at()
                ),
            ));
        }
        Ok(())
    }

    /// Starts a new tree per request (resets any previous state). `active` (`[B]`, None = all)
    /// marks the requests still running; the others build to their root alone.
    pub fn start<R: IndexLike, T: IndexLike, S: ScoreLike>(
        &mut self,
        root_tokens: ArrayView1<'_, R>,
        topk_tokens: ArrayView2<'_, T>,
        topk_logprobs: ArrayView2<'_, S>,
        prefix_lens: &[i64],
        active: Option<&[bool]>,
    ) -> Result<Step> {
        let mut step = Step::zeroed(self.batch, self.topk, self.topk);
        self.start_into(
            root_tokens,
            topk_tokens,
            topk_logprobs,
            prefix_lens,
            active,
            step.out(),
        )?;
        Ok(step)
    }

    /// [`Self::start`], writing the step into `out`. On an error nothing is changed.
    pub fn start_into<R: IndexLike, T: IndexLike, S: ScoreLike, M: From<bool> + Copy>(
        &mut self,
        root_tokens: ArrayView1<'_, R>,
        topk_tokens: ArrayView2<'_, T>,
        topk_logprobs: ArrayView2<'_, S>,
        prefix_lens: &[i64],
        active: Option<&[bool]>,
        out: StepOut<'_, M>,
    ) -> Result<()> {
        let at = |r: usize, c: usize| format!("[{r}, {c}]");
        self.start_into_named(
            root_tokens,
            topk_tokens,
            topk_logprobs,
            prefix_lens,
            active,
            out,
            at,
        )
    }

    /// [`Self::start_into`], a bad log probability named by `at(request, column)`: callers
    /// reading the root's top-k from elsewhere (slot 0 of `[B, K, K]` level buffers) name the
    /// entry where it was written.
    #[allow(clippy::too_many_arguments)]
    pub fn start_into_named<R: IndexLike, T: IndexLike, S: ScoreLike, M: From<bool> + Copy>(
        &mut self,
        root_tokens: ArrayView1<'_, R>,
        topk_tokens: ArrayView2<'_, T>,
        topk_logprobs: ArrayView2<'_, S>,
        prefix_lens: &[i64],
        active: Option<&[bool]>,
        out: StepOut<'_, M>,
        at: impl Fn(usize, usize) -> String,
    ) -> Result<()> {
        let (b, k) = (self.batch, self.topk);
        if root_tokens.len() != b {
            return Err(Error::value(
                "root_tokens",
                format!("expected {b} entries, got {}", root_tokens.len()),
            ));
        }
        for (name, d) in [
            ("topk_tokens", topk_tokens.dim()),
            ("topk_logprobs", topk_logprobs.dim()),
        ] {
            if d != (b, k) {
                return Err(Error::value(
                    name,
                    format!("expected shape ({b}, {k}), got {d:?}"),
                ));
            }
        }
        if prefix_lens.len() != b {
            return Err(Error::value(
                "prefix_lens",
                format!("expected {b} entries, got {}", prefix_lens.len()),
            ));
        }
        // Positions run to prefix + depth: past i64::MAX they would wrap (as the layouts
        // refuse them too).
        let depth = self.depth as i64;
        for (i, &p) in prefix_lens.iter().enumerate() {
            if p < 0 {
                return Err(Error::value(
                    "prefix_lens",
                    format!("prefix_lens[{i}] = {p}, expected >= 0"),
                ));
            }
            if p.checked_add(depth).is_none() {
                return Err(Error::value(
                    "prefix_lens",
                    format!("prefix_lens[{i}] = {p} + depth {depth} is not a valid int64 position"),
                ));
            }
        }
        if let Some(a) = active.filter(|a| a.len() != b) {
            return Err(Error::value(
                "active",
                format!("expected {b} entries, got {}", a.len()),
            ));
        }
        for r in 0..b {
            for c in 0..k {
                let lp = topk_logprobs[(r, c)].to_f64();
                Self::check_logprob(lp, "topk_logprobs", || at(r, c))?;
            }
        }
        self.check_out(&out, 1)?;
        match active {
            Some(a) => self.active.copy_from_slice(a),
            None => self.active.fill(true),
        }
        let need = self.budget - 1;
        for r in 0..b {
            self.root_tokens[r] = root_tokens[r].to_i64();
            self.prefix[r] = prefix_lens[r];
            let base = r * self.pool;
            let best = &mut self.best_front[r * need..][..need];
            for c in 0..k {
                let score = topk_logprobs[(r, c)].to_f64();
                self.scores[base + c] = score;
                self.tokens[base + c] = topk_tokens[(r, c)].to_i64();
                self.parents[base + c] = -1;
                self.frontier[r * k + c] = c as u32;
                record_frontier(best, c, score_key(score));
            }
        }
        self.level = 1;
        self.settled = self.frontier_settled();
        // Each depth-1 node sees only itself among the fed tokens.
        for (i, path) in self.paths.chunks_exact_mut(self.depth).enumerate() {
            path[0] = (i % k) as u32;
        }
        out.parent_index.fill(0);
        self.write_step(out);
        Ok(())
    }

    /// The outputs' lengths for a step to `level` (an internal error: the bindings size them).
    fn check_out<M>(&self, out: &StepOut<'_, M>, level: usize) -> Result<()> {
        let rows = self.batch * self.topk;
        let width = level * self.topk;
        for (name, len) in [
            ("tokens", out.tokens.len()),
            ("parent_index", out.parent_index.len()),
            ("positions", out.positions.len()),
        ] {
            if len != rows {
                return Err(Error::value(
                    name,
                    format!("expected {rows} entries, got {len}"),
                ));
            }
        }
        if out.mask_stride < width || out.mask.len() != rows * out.mask_stride {
            return Err(Error::value(
                "attention_mask",
                format!(
                    "expected {rows} rows of >= {width} columns, got {} entries in rows of {}",
                    out.mask.len(),
                    out.mask_stride
                ),
            ));
        }
        Ok(())
    }

    /// The frontier's tokens, positions and mask rows into `out` (`parent_index` is the
    /// caller's: it is known only while the frontier is chosen).
    fn write_step<M: From<bool> + Copy>(&self, out: StepOut<'_, M>) {
        let (b, k, level) = (self.batch, self.topk, self.level);
        let current = &self.frontier[(level - 1) * b * k..][..b * k];
        let rows = out
            .tokens
            .chunks_exact_mut(k)
            .zip(out.positions.chunks_exact_mut(k));
        for (r, ((tokens, positions), current)) in rows.zip(current.chunks_exact(k)).enumerate() {
            let drafted = &self.tokens[r * self.pool..][..self.pool];
            for (token, &g) in tokens.iter_mut().zip(current) {
                *token = drafted[g as usize];
            }
            positions.fill(self.prefix[r] + level as i64);
        }
        let paths = self.paths.chunks_exact(self.depth);
        for (row, path) in out.mask.chunks_exact_mut(out.mask_stride).zip(paths) {
            row.fill(M::from(false));
            for (l, &slot) in path[..level].iter().enumerate() {
                row[l * k + slot as usize] = M::from(true);
            }
        }
    }

    /// One draft step: the draft's top-`K` (`[B, K, K]`) for each frontier slot.
    pub fn expand<T: IndexLike, S: ScoreLike>(
        &mut self,
        topk_tokens: ArrayView3<'_, T>,
        topk_logprobs: ArrayView3<'_, S>,
    ) -> Result<Step> {
        let mut step = Step::zeroed(self.batch, self.topk, (self.level + 1) * self.topk);
        self.expand_into(topk_tokens, topk_logprobs, step.out())?;
        Ok(step)
    }

    /// [`Self::expand`], writing the step into `out`. On an error nothing is changed.
    pub fn expand_into<T: IndexLike, S: ScoreLike, M: From<bool> + Copy>(
        &mut self,
        topk_tokens: ArrayView3<'_, T>,
        topk_logprobs: ArrayView3<'_, S>,
        out: StepOut<'_, M>,
    ) -> Result<()> {
        let (b, k) = (self.batch, self.topk);
        self.check_expandable()?;
        for (name, d) in [
            ("topk_tokens", topk_tokens.dim()),
            ("topk_logprobs", topk_logprobs.dim()),
        ] {
            if d != (b, k, k) {
                return Err(Error::value(
                    name,
                    format!("expected shape ({b}, {k}, {k}), got {d:?}"),
                ));
            }
        }
        // Borrowed when row-major already (the in-place buffers always are), else copied.
        let (tokens, logprobs) = (
            topk_tokens.as_standard_layout(),
            topk_logprobs.as_standard_layout(),
        );
        match (tokens.as_slice(), logprobs.as_slice()) {
            (Some(t), Some(l)) => self.expand_flat(t, l, out),
            _ => Err(Error::value(
                "expand",
                "internal error: the top-k has no row-major view",
            )),
        }
    }

    /// Whether a level can be drafted now.
    fn check_expandable(&self) -> Result<()> {
        if self.level == 0 {
            return Err(Error::value("expand", "call start() before expand()"));
        }
        if self.level >= self.depth {
            return Err(Error::value(
                "expand",
                format!(
                    "the tree already has depth {} (the builder's depth)",
                    self.depth
                ),
            ));
        }
        Ok(())
    }

    /// [`Self::expand_into`] on the top-k as row-major `[B, K, K]` slices: what the in-place
    /// buffers hold. Right after a head forward every line of code a level runs is fetched
    /// from memory again, so the level is plain slice loops, no more (stop 23: 7% fewer lines
    /// missed a call than with ndarray's indexing). On an error nothing is changed.
    pub fn expand_flat<T: IndexLike, S: ScoreLike, M: From<bool> + Copy>(
        &mut self,
        topk_tokens: &[T],
        topk_logprobs: &[S],
        out: StepOut<'_, M>,
    ) -> Result<()> {
        let (b, k) = (self.batch, self.topk);
        let kk = k * k;
        self.check_expandable()?;
        for (name, len) in [
            ("topk_tokens", topk_tokens.len()),
            ("topk_logprobs", topk_logprobs.len()),
        ] {
            if len != b * kk {
                return Err(Error::value(
                    name,
                    format!("expected {} entries ([{b}, {k}, {k}]), got {len}", b * kk),
                ));
            }
        }
        for (i, &lp) in topk_logprobs.iter().enumerate() {
            Self::check_logprob(lp.to_f64(), "topk_logprobs", || {
                format!("[{}, {}, {}]", i / kk, i / k % k, i % k)
            })?;
        }
        self.check_out(&out, self.level + 1)?;
        let (depth, level, pool, need) = (self.depth, self.level, self.pool, self.budget - 1);
        let base_step = k + (level - 1) * kk;
        let mut keys = std::mem::take(&mut self.keys);
        // Up to 16 children per slot, the frontier is kept sorted as the children come: a
        // few compares each, where the generic select and sort are most of a level's code.
        let few = k <= 16;
        let (current, next_level) = self.frontier[(level - 1) * b * k..].split_at_mut(b * k);
        for r in 0..b {
            let (front, next) = (&current[r * k..][..k], &mut next_level[r * k..][..k]);
            // The frontier's scores lie before this step's block.
            let (before, step_scores) = self.scores[r * pool..][..pool].split_at_mut(base_step);
            let step_scores = &mut step_scores[..kk];
            let step_tokens = &mut self.tokens[r * pool + base_step..][..kk];
            let step_parents = &mut self.parents[r * pool + base_step..][..kk];
            let (tt, lp) = (&topk_tokens[r * kk..][..kk], &topk_logprobs[r * kk..][..kk]);
            keys.clear();
            let mut floor = f64::NEG_INFINITY;
            for (j, &f) in front.iter().enumerate() {
                let fs = before[f as usize];
                for c in 0..k {
                    let i = j * k + c;
                    let s = fs + lp[i].to_f64();
                    step_scores[i] = s;
                    step_tokens[i] = tt[i].to_i64();
                    step_parents[i] = f as i32;
                    // A lower score than the worst kept ranks below it whatever the ties:
                    // most children stop at this one float compare.
                    if s < floor {
                        continue;
                    }
                    // Ranked by step offset `i`: the pool index less a constant.
                    let key = RankKey::new(s, 0, i as u32);
                    if few {
                        keep_best(&mut keys, k, key);
                        if keys.len() == k {
                            floor = keys[k - 1].score();
                        }
                    } else {
                        keys.push(key);
                    }
                }
            }
            // The next frontier in rank order (best first), like the draft's own top-k.
            if !few {
                if k < keys.len() {
                    keys.select_nth_unstable(k - 1);
                }
                keys[..k].sort_unstable();
            }
            let parent_index = &mut out.parent_index[r * k..][..k];
            for (j, key) in keys[..k].iter().enumerate() {
                let i = key.index() as usize;
                let slot = i / k;
                parent_index[j] = slot as i64;
                next[j] = (base_step + i) as u32;
                // The parent's path, then this slot.
                let src = &self.paths[(r * k + slot) * depth..][..level];
                let dst = &mut self.next_paths[(r * k + j) * depth..][..=level];
                dst[..level].copy_from_slice(src);
                dst[level] = j as u32;
            }
            let best = &mut self.best_front[r * need..][..need];
            for (j, key) in keys[..k].iter().enumerate() {
                record_frontier(best, level * k + j, score_key(key.score()));
            }
        }
        self.keys = keys;
        std::mem::swap(&mut self.paths, &mut self.next_paths);
        self.level += 1;
        // Settled stays settled: later frontiers score no more, the bound rises.
        self.settled = self.settled || self.frontier_settled();
        self.write_step(out);
        Ok(())
    }

    /// Reranks every drafted candidate: per request the best `budget - 1` by cumulative score
    /// (then shallower, then pool index) as a tree in pool order. Returns the batch and the
    /// pool index of every draft node (`[B, budget - 1]`). A request that is not running
    /// (`active` at `start`) gets its root alone and a row of -1.
    pub fn build(&self) -> Result<(TreeBatch, Vec<i64>)> {
        self.build_in(NodeOrder::Pool)
    }

    /// [`Self::build`] with each tree's nodes in `order`.
    pub fn build_in(&self, order: NodeOrder) -> Result<(TreeBatch, Vec<i64>)> {
        let mut pool_index = vec![0; self.batch * (self.budget - 1)];
        let batch = self.build_into(order, &mut pool_index)?;
        Ok((batch, pool_index))
    }

    /// [`Self::build_in`] writing the pool indices into `pool_index` (`[B, budget - 1]`
    /// row-major) instead of a new vector: a decode loop's persistent buffer.
    pub fn build_into(&self, order: NodeOrder, pool_index: &mut [i64]) -> Result<TreeBatch> {
        if pool_index.len() != self.batch * (self.budget - 1) {
            return Err(Error::value(
                "pool_index",
                format!(
                    "expected {} entries ([{}, {}]), got {}",
                    self.batch * (self.budget - 1),
                    self.batch,
                    self.budget - 1,
                    pool_index.len()
                ),
            ));
        }
        if self.level == 0 {
            return Err(Error::value("build", "call start() before build()"));
        }
        let m = self.pool_len();
        let n = self.budget;
        if n - 1 > m && self.active.contains(&true) {
            return Err(Error::value(
                "budget",
                format!(
                    "{n} nodes need {} candidates but only {m} were drafted so far",
                    n - 1
                ),
            ));
        }
        let b = self.batch;
        let mut parents = Vec::with_capacity(b * n);
        let mut tokens = Vec::with_capacity(b * n);
        let mut offsets = Vec::with_capacity(b + 1);
        offsets.push(0i64);
        let (mut keys, mut scratch) = (Vec::with_capacity(m), Vec::with_capacity(m));
        let mut chosen = Vec::with_capacity(n - 1);
        let mut node_of = vec![0i32; m];
        // One request's tree in pool order (parents, tokens, pool index of each draft node),
        // then appended in `order`; the preorder's scratch.
        let (mut tree_parents, mut tree_tokens) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let mut tree_index = Vec::with_capacity(n - 1);
        let (mut dfs, mut links, mut new_of) = (Vec::with_capacity(n), Vec::new(), vec![0i32; n]);
        // Every level's frontier holds K candidates; when they number at least n - 1, the
        // (n-1)-th best of them scores no better than the (n-1)-th best of the pool, so only
        // candidates scoring at least as well can be chosen. The selection runs on those (in the
        // demo's 48-node trees 47 to 55 of 904), still in pool order, so ties resolve as before.
        // The bound is kept as the frontiers are drafted (`best_front`), so pruning costs one
        // compare a candidate: it pays at K = 2 too (stop 23, against the same build without
        // it: 0.90x hot at 16 nodes).
        let frontier_len = self.topk * self.level;
        let prune = n > 1 && frontier_len >= n - 1;
        let mut survivors: Vec<u32> = Vec::with_capacity(if prune { m } else { 0 });
        for r in 0..b {
            let row_index = &mut pool_index[r * (n - 1)..(r + 1) * (n - 1)];
            if !self.active[r] {
                parents.push(-1);
                tokens.push(self.root_tokens[r]);
                offsets.push(parents.len() as i64);
                row_index.fill(-1);
                continue;
            }
            let base = r * self.pool;
            let scores = &self.scores[base..base + m];
            keys.clear();
            // Pool index grows with depth, so it breaks ties towards the shallower node.
            if prune {
                // `key <= bound` as a float compare (keys order like scores, -0.0 as 0.0).
                let bound = score_of_key(self.frontier_bound(r));
                survivors.clear();
                for (g, &s) in scores.iter().enumerate() {
                    if s >= bound {
                        keys.push(score_key(s));
                        survivors.push(g as u32);
                    }
                }
            } else {
                keys.extend(scores.iter().map(|&s| score_key(s)));
            }
            select_top_scores(&keys, n - 1, &mut scratch, &mut chosen);
            if prune {
                for g in chosen.iter_mut() {
                    *g = survivors[*g as usize];
                }
            }
            tree_parents.clear();
            tree_tokens.clear();
            tree_index.clear();
            tree_parents.push(-1i32);
            tree_tokens.push(self.root_tokens[r]);
            for (i, &g) in chosen.iter().enumerate() {
                let g = g as usize;
                node_of[g] = i as i32 + 1;
                let p = self.parents[base + g];
                tree_parents.push(if p < 0 { 0 } else { node_of[p as usize] });
                tree_tokens.push(self.tokens[base + g]);
                tree_index.push(g as i64);
            }
            match order {
                NodeOrder::Pool => {
                    parents.extend_from_slice(&tree_parents);
                    tokens.extend_from_slice(&tree_tokens);
                    row_index.copy_from_slice(&tree_index);
                }
                NodeOrder::DepthFirst => {
                    // Siblings are one draft step's candidates of one parent, in rank order,
                    // so the preorder puts the draft's best path first.
                    depth_first_order(&tree_parents, &mut dfs, &mut links);
                    for (new, &old) in dfs.iter().enumerate() {
                        new_of[old as usize] = new as i32;
                    }
                    parents.push(-1);
                    tokens.push(tree_tokens[0]);
                    for (slot, &old) in row_index.iter_mut().zip(&dfs[1..]) {
                        let old = old as usize;
                        parents.push(new_of[tree_parents[old] as usize]);
                        tokens.push(tree_tokens[old]);
                        *slot = tree_index[old - 1];
                    }
                }
            }
            offsets.push(parents.len() as i64);
        }
        TreeBatch::from_views(
            ArrayView1::from(&parents),
            ArrayView1::from(&tokens),
            ArrayView1::from(&offsets),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array2, Array3};

    #[test]
    fn drafts_two_levels_and_reranks() {
        let mut d = DynamicTreeBuilder::new(1, 2, 3, 4).unwrap();
        let roots = [9i64];
        let tok = Array2::from_shape_vec((1, 2), vec![10i64, 11]).unwrap();
        let lp = Array2::from_shape_vec((1, 2), vec![-0.1f64, -1.0]).unwrap();
        let s = d
            .start(ArrayView1::from(&roots), tok.view(), lp.view(), &[5], None)
            .unwrap();
        assert_eq!(s.tokens, [10, 11]);
        assert_eq!(s.positions, [6, 6]);
        assert_eq!(s.mask, [true, false, false, true]);
        // Children of 10: 20 (-0.2), 21 (-3); of 11: 22 (-0.05), 23 (-2).
        let tok = Array3::from_shape_vec((1, 2, 2), vec![20i64, 21, 22, 23]).unwrap();
        let lp = Array3::from_shape_vec((1, 2, 2), vec![-0.2f64, -3.0, -0.05, -2.0]).unwrap();
        let s = d.expand(tok.view(), lp.view()).unwrap();
        // Scores: 20: -0.3, 21: -3.1, 22: -1.05, 23: -3.0 -> frontier [20, 22].
        assert_eq!(s.tokens, [20, 22]);
        assert_eq!(s.parent_index, [0, 1]);
        assert_eq!(s.width, 4);
        assert_eq!(s.mask, [true, false, true, false, false, true, false, true]);
        assert_eq!(s.positions, [7, 7]);
        let (batch, idx) = d.build().unwrap();
        // Best 3: 10 (-0.1), 20 (-0.3), 11 (-1.0); pool indices 0, 1, 2.
        assert_eq!(idx, [0, 1, 2]);
        assert_eq!(batch.parents(), &[-1, 0, 0, 1]);
        assert_eq!(batch.tokens(), &[9, 10, 11, 20]);
        let e = d.expand(tok.view(), lp.view());
        assert!(e.is_ok());
        assert!(d.expand(tok.view(), lp.view()).is_err());
        // Into a caller's buffer: the same tree and indices, or an error naming the buffer.
        for order in [NodeOrder::Pool, NodeOrder::DepthFirst] {
            let (batch, idx) = d.build_in(order).unwrap();
            let mut buf = [-1i64; 3];
            assert_eq!(d.build_into(order, &mut buf).unwrap(), batch);
            assert_eq!(buf.as_slice(), idx.as_slice());
            let err = d.build_into(order, &mut buf[..2]).unwrap_err();
            assert!(err.to_string().contains("pool_index"), "{err}");
        }
    }

    /// Caller buffers for one step: `[B, K]` tokens, parents and positions, a `u8` mask.
    struct Buffers {
        tok: Vec<i64>,
        par: Vec<i64>,
        pos: Vec<i64>,
        mask: Vec<u8>,
        stride: usize,
    }

    impl Buffers {
        /// Filled with junk, as memory a caller reuses may be.
        fn new(rows: usize, stride: usize) -> Self {
            Buffers {
                tok: vec![7; rows],
                par: vec![7; rows],
                pos: vec![7; rows],
                mask: vec![9; rows * stride],
                stride,
            }
        }

        fn out(&mut self) -> StepOut<'_, u8> {
            StepOut {
                tokens: &mut self.tok,
                parent_index: &mut self.par,
                positions: &mut self.pos,
                mask: &mut self.mask,
                mask_stride: self.stride,
            }
        }

        /// Holds `s`: equal values, the mask's first `s.width` columns, then zeros.
        fn assert_holds(&self, s: &Step) {
            assert_eq!(s.tokens, self.tok);
            assert_eq!(s.parent_index, self.par);
            assert_eq!(s.positions, self.pos);
            for (row, got) in s.mask.chunks(s.width).zip(self.mask.chunks(self.stride)) {
                let want: Vec<u8> = row.iter().map(|&x| u8::from(x)).collect();
                assert_eq!(&got[..s.width], &want[..]);
                assert!(got[s.width..].iter().all(|&x| x == 0));
            }
        }
    }

    /// `start_into` / `expand_into` a wide `u8` mask (junk in it) write what `start` / `expand`
    /// of a builder that was never used return, then zeros; a used builder's second tree too.
    #[test]
    fn steps_into_buffers_equal_returned_steps() {
        let (b, k, depth) = (3, 3, 4);
        let mut kept = DynamicTreeBuilder::new(b, k, depth, 10).unwrap();
        let mut buf = Buffers::new(b * k, depth * k);
        let mut seed = 11u64;
        let mut draw = |n: usize| -> Vec<f64> {
            (0..n)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    -((seed >> 40) as f64) / f64::from(1u32 << 22)
                })
                .collect()
        };
        // Two trees on `kept`: the full depth, then two levels from other roots.
        for (tree, levels) in [(0i64, depth), (1, 2)] {
            let mut fresh = DynamicTreeBuilder::new(b, k, depth, 10).unwrap();
            let roots = vec![1 + tree; b];
            let prefix = [4 + tree, 0, 9];
            let t0 = Array2::from_shape_fn((b, k), |(r, c)| tree * 1000 + (r * 10 + c) as i64);
            let l0 = Array2::from_shape_vec((b, k), draw(b * k)).unwrap();
            let roots = ArrayView1::from(&roots);
            let s = fresh
                .start(roots, t0.view(), l0.view(), &prefix, None)
                .unwrap();
            kept.start_into(roots, t0.view(), l0.view(), &prefix, None, buf.out())
                .unwrap();
            buf.assert_holds(&s);
            for level in 1..levels {
                let t = Array3::from_shape_fn((b, k, k), |(r, j, c)| {
                    (level * 100 + r * 10 + j * k + c) as i64
                });
                let l = Array3::from_shape_vec((b, k, k), draw(b * k * k)).unwrap();
                let s = fresh.expand(t.view(), l.view()).unwrap();
                kept.expand_into(t.view(), l.view(), buf.out()).unwrap();
                buf.assert_holds(&s);
            }
            assert_eq!(fresh.build().unwrap(), kept.build().unwrap());
        }
        // Start needs K mask columns; a step to level 2 needs 2K, and is refused before
        // anything changes.
        let mut narrow = Buffers::new(b * k, k);
        let roots = ArrayView1::from(&[0i64; 3]);
        let t0 = Array2::<i64>::zeros((b, k));
        let l0 = Array2::<f64>::zeros((b, k));
        kept.start_into(roots, t0.view(), l0.view(), &[0; 3], None, narrow.out())
            .unwrap();
        let t = Array3::<i64>::zeros((b, k, k));
        let l = Array3::<f64>::zeros((b, k, k));
        let e = kept
            .expand_into(t.view(), l.view(), narrow.out())
            .unwrap_err();
        assert!(e.to_string().contains("attention_mask"), "{e}");
        assert_eq!(kept.level(), 1);
    }

    /// `settled` is its definition at every level, turns true once and stays true, and from
    /// there more levels leave `build`'s trees and pool indices unchanged.
    #[test]
    fn a_settled_builder_builds_the_same_after_more_levels() {
        let (b, k, depth) = (3, 2, 9);
        let mut seed = 5u64;
        let mut draw = |n: usize, steep: f64| -> Vec<f64> {
            (0..n)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    // Some exact ties (quarter steps) among steep drops.
                    -steep * ((seed >> 60) as f64) / 4.0
                })
                .collect()
        };
        let roots = [1i64, 2, 3];
        let t0 = Array2::from_shape_fn((b, k), |(r, c)| (r * 10 + c) as i64);
        let l0 = Array2::from_shape_vec((b, k), draw(b * k, 0.5)).unwrap();
        let steps: Vec<(Array3<i64>, Array3<f64>)> = (1..depth)
            .map(|level| {
                let t = Array3::from_shape_fn((b, k, k), |(r, j, c)| {
                    (level * 100 + r * 10 + j * k + c) as i64
                });
                // The best child of each slot drops little (more for later requests), the
                // other steeply: the best path stays competitive for a few levels.
                let mut l = Array3::from_shape_vec((b, k, k), draw(b * k * k, 1.0)).unwrap();
                for ((r, _, c), x) in l.indexed_iter_mut() {
                    if c == 0 {
                        *x *= 0.05 * (r + 1) as f64;
                    }
                }
                (t, l)
            })
            .collect();
        // The definition: every request's best current frontier score is at most the
        // (budget-1)-th best of all its frontier nodes so far.
        let naive = |d: &DynamicTreeBuilder| {
            let need = d.budget - 1;
            (0..b).all(|r| {
                let scores = &d.scores[r * d.pool..];
                let front = |l: usize| &d.frontier[(l * b + r) * k..][..k];
                let mut fed: Vec<f64> = (0..d.level)
                    .flat_map(|l| front(l).iter().map(|&g| scores[g as usize]))
                    .collect();
                fed.sort_by(|x, y| y.total_cmp(x));
                if need > 0 && fed.len() >= need {
                    // The bound kept level by level is the selection over every frontier.
                    assert_eq!(d.frontier_bound(r), score_key(fed[need - 1]), "request {r}");
                }
                let best = front(d.level - 1)
                    .iter()
                    .map(|&g| scores[g as usize])
                    .fold(f64::NEG_INFINITY, f64::max);
                fed.len() >= need && (need == 0 || best <= fed[need - 1])
            })
        };
        let drafted = |budget: usize, levels: usize| {
            let mut d = DynamicTreeBuilder::new(b, k, depth, budget).unwrap();
            assert!(!d.settled(), "not before start");
            d.start(
                ArrayView1::from(&roots),
                t0.view(),
                l0.view(),
                &[0; 3],
                None,
            )
            .unwrap();
            let mut settled = vec![d.settled()];
            assert_eq!(d.settled(), naive(&d));
            for (t, l) in &steps[..levels - 1] {
                d.expand(t.view(), l.view()).unwrap();
                assert_eq!(d.settled(), naive(&d), "level {}", d.level);
                settled.push(d.settled());
            }
            (d, settled)
        };
        let mut seen = 0;
        for budget in [1, 3, 5, 8] {
            let (full, settled) = drafted(budget, depth);
            let first = settled.iter().position(|&s| s);
            // Monotone: false, then true to the end.
            assert!(settled.iter().skip(first.unwrap_or(depth)).all(|&s| s));
            for levels in first.map_or(depth, |f| f + 1)..depth {
                let (early, _) = drafted(budget, levels);
                for order in [NodeOrder::Pool, NodeOrder::DepthFirst] {
                    assert_eq!(
                        early.build_in(order).unwrap(),
                        full.build_in(order).unwrap()
                    );
                }
                seen += 1;
            }
            if let Some(f) = first {
                let frontier_nodes = k * (f + 1);
                assert!(
                    frontier_nodes >= budget - 1,
                    "settled before budget - 1 of them"
                );
            }
        }
        assert!(seen > 0, "the draws never settled: the test checks nothing");
    }

    /// A request that is not running builds its root alone (pool row -1) and does not keep
    /// the builder drafting; the running requests' trees are what an all-running builder
    /// builds for them, and the next `start` runs every request again by default.
    #[test]
    fn a_request_not_running_builds_its_root_alone() {
        let (b, k, depth, budget) = (3, 2, 6, 6);
        let roots = [1i64, 2, 3];
        let t0 = Array2::from_shape_fn((b, k), |(r, c)| (r * 10 + c) as i64);
        // Request 1 drafts a chain of near-certain tokens, which stays unsettled until it holds
        // budget - 1 nodes (level 5); the others' steep drops settle at level 3.
        let l0 = Array2::from_shape_fn((b, k), |(r, c)| match (r, c) {
            (1, 0) => -0.01,
            (1, _) => -10.0,
            _ => -(c as f64),
        });
        let t = Array3::from_shape_fn((b, k, k), |(r, j, c)| (100 + r * 10 + j * k + c) as i64);
        let l = Array3::from_shape_fn((b, k, k), |(r, _, c)| match (r, c) {
            (1, 0) => -0.001,
            (1, _) => -5.0,
            _ => -5.0 - c as f64,
        });
        let start = |d: &mut DynamicTreeBuilder, active: Option<&[bool]>| {
            d.start(
                ArrayView1::from(&roots),
                t0.view(),
                l0.view(),
                &[0; 3],
                active,
            )
        };
        let run = |active: Option<&[bool]>| {
            let mut d = DynamicTreeBuilder::new(b, k, depth, budget).unwrap();
            start(&mut d, active).unwrap();
            let mut levels = 1;
            while !d.settled() && d.level() < depth {
                d.expand(t.view(), l.view()).unwrap();
                levels += 1;
            }
            (d, levels)
        };
        let (all, all_levels) = run(None);
        let (some, some_levels) = run(Some(&[true, false, true]));
        assert_eq!((some_levels, all_levels), (3, 5));
        for order in [NodeOrder::Pool, NodeOrder::DepthFirst] {
            let (tb, idx) = some.build_in(order).unwrap();
            let (want, want_idx) = all.build_in(order).unwrap();
            assert_eq!(tb.offsets(), &[0, 6, 7, 13]);
            assert_eq!((tb.parents()[6], tb.tokens()[6]), (-1, 2));
            for r in [0, 2] {
                assert_eq!(tb.to_tree(r), want.to_tree(r));
                assert_eq!(idx[r * 5..][..5], want_idx[r * 5..][..5]);
            }
            assert_eq!(idx[5..10], [-1; 5]);
        }
        // Too few candidates for a running request's tree is refused; none running is not.
        let mut d = DynamicTreeBuilder::new(b, k, depth, budget).unwrap();
        start(&mut d, Some(&[false; 3])).unwrap();
        assert!(d.settled());
        assert_eq!(d.build().unwrap().0.offsets(), &[0, 1, 2, 3]);
        let e = start(&mut d, Some(&[true])).unwrap_err();
        assert!(e.to_string().contains("active"), "{e}");
        start(&mut d, None).unwrap();
        assert!(d.build().unwrap_err().to_string().contains("budget"));
    }

    #[test]
    fn refuses_a_mask_too_large_before_allocating() {
        let e = DynamicTreeBuilder::new(1, 1 << 20, 1, 2).unwrap_err();
        assert!(e.to_string().contains("draft mask"), "{e}");
    }

    #[test]
    fn rejects_bad_settings_and_logprobs() {
        assert!(DynamicTreeBuilder::new(1, 0, 3, 2).is_err());
        assert!(DynamicTreeBuilder::new(1, 2, 0, 2).is_err());
        assert!(DynamicTreeBuilder::new(1, 2, 1, 4).is_err());
        let mut d = DynamicTreeBuilder::new(1, 2, 2, 2).unwrap();
        let tok = Array2::from_shape_vec((1, 2), vec![1i64, 2]).unwrap();
        let lp = Array2::from_shape_vec((1, 2), vec![0.5f64, -1.0]).unwrap();
        let e = d
            .start(ArrayView1::from(&[0i64]), tok.view(), lp.view(), &[0], None)
            .unwrap_err();
        assert!(e.to_string().contains("[0, 0]"), "{e}");
    }
}
