//! Longest accepted path: the walk every lossless verification rule ends in.
//!
//! Stage one decides, per node `v`, the token `y[v]` the target emits after `v`; stage two walks
//! from the root: the first child of `v` (in increasing node index) whose token equals `y[v]` is
//! accepted and the walk moves to it, otherwise it stops and `y[v]` is the bonus token. The
//! choice is a callback, so greedy-from-logits reduces only the rows the walk visits, and a
//! precomputed per-node choice (device argmax, target tokens) costs one lookup. A walk is
//! O(depth · branching); a batch walks its trees independently, in parallel when the work is
//! large enough to pay for the thread hand-off.
//!
//! Sampled verification ([`Sampled`]) decides per node with one of the [`Rule`]s: sample-and-
//! match (the walk above with a sampled choice), multi-round rejection for drafts sampled from
//! `q` (a decision per node, [`walk_steps`]; residuals computed only at rejections), and
//! Medusa's lossy typical acceptance (a depth-first search for the deepest accepted path).
//! Draws are keyed by (seed, request, node, draw), so results do not depend on scheduling;
//! with per-request seeds ([`Seeds::PerRequest`]) not on the batch's composition either.

use ndarray::{s, ArrayView1, ArrayView2};
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::rng;
use crate::select::{
    sample_weights, with_scratch, LogitsView, ProbsView, RowIssue, SamplingParams,
};
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
    // One token per node: accept the first child holding it, else it is the bonus. A
    // negative choice matches no draft, even one whose token is negative (`sim.replay` marks
    // the end of a known continuation with -1).
    walk_steps(
        tree,
        |v| {
            let y = choose(v)?;
            Ok(
                match tree.children(v).find(|&c| y >= 0 && tree.tokens[c] == y) {
                    Some(c) => Step::Accept(c),
                    None => Step::Stop(y),
                },
            )
        },
        accepted,
        emitted,
    )
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

    /// A result rebuilt from its parts (unpickling): `accepted_nodes` must be a path a walk
    /// of a tree of `num_nodes` nodes can take (the root, then strictly increasing nodes:
    /// parents come before their children), with one token per node.
    pub fn from_parts(
        accepted_nodes: ArrayView1<'_, i64>,
        tokens: ArrayView1<'_, i64>,
        num_nodes: i64,
    ) -> Result<Self> {
        let num_nodes = usize::try_from(num_nodes)
            .ok()
            .filter(|&n| (1..=crate::tree::MAX_NODES).contains(&n))
            .ok_or_else(|| {
                Error::value(
                    "num_nodes",
                    format!(
                        "{num_nodes}: a verified tree has 1 to {} nodes",
                        crate::tree::MAX_NODES
                    ),
                )
            })?;
        let accepted_nodes = path_nodes(accepted_nodes, num_nodes, "")?;
        if tokens.len() != accepted_nodes.len() {
            return Err(Error::value(
                "tokens",
                format!(
                    "expected {} entries (one per accepted node), got {}",
                    accepted_nodes.len(),
                    tokens.len()
                ),
            ));
        }
        Ok(Verified {
            accepted_nodes,
            tokens: tokens.to_vec(),
            num_nodes,
        })
    }
}

/// `path` (`0, a1, ..., ak`) as node indices, checked to be a walk's path in a tree of
/// `num_nodes >= 1` nodes; `row` names the batch row in errors ("" for a single result).
fn path_nodes(path: ArrayView1<'_, i64>, num_nodes: usize, row: &str) -> Result<Vec<i32>> {
    let arg = "accepted_nodes";
    if path.first() != Some(&0) {
        return Err(Error::value(
            arg,
            format!("{row}a path starts at the root (node 0), got {path}"),
        ));
    }
    let mut nodes = Vec::with_capacity(path.len());
    let mut prev = -1i64;
    for (j, &node) in path.iter().enumerate() {
        // Node indices are below `num_nodes <= MAX_NODES`, so they fit in i32.
        if node <= prev || node >= num_nodes as i64 {
            return Err(Error::value(
                arg,
                format!(
                    "{row}entry {j} is {node}: a path's nodes increase (parents come before \
                     their children) and stay below the tree's {num_nodes} nodes"
                ),
            ));
        }
        prev = node;
        nodes.push(node as i32);
    }
    Ok(nodes)
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

    /// A batch result rebuilt from its parts (unpickling): row `b` of `accepted_nodes` and
    /// `tokens` (`[B, width]`) holds a path of `num_accepted[b] + 1` entries of tree `b`
    /// (`offsets[b]..offsets[b + 1]`, as [`Verified::from_parts`] checks one), then -1s.
    pub fn from_parts(
        num_accepted: ArrayView1<'_, i64>,
        accepted_nodes: ArrayView2<'_, i64>,
        tokens: ArrayView2<'_, i64>,
        offsets: ArrayView1<'_, i64>,
    ) -> Result<Self> {
        let b = num_accepted.len();
        let (rows, width) = accepted_nodes.dim();
        if rows != b || width == 0 {
            return Err(Error::value(
                "accepted_nodes",
                format!("expected shape ({b}, width >= 1), got ({rows}, {width})"),
            ));
        }
        if tokens.dim() != (b, width) {
            return Err(Error::value(
                "tokens",
                format!("expected shape ({b}, {width}), got {:?}", tokens.dim()),
            ));
        }
        if offsets.len() != b + 1 || offsets[0] != 0 {
            return Err(Error::value(
                "offsets",
                format!("expected {} entries starting at 0, got {offsets}", b + 1),
            ));
        }
        // The batch's global node indices must fit i32 (SGLang's layouts), as a TreeBatch's do.
        let total = offsets[b];
        if total < 0 || total > crate::tree::MAX_BATCH_NODES as i64 {
            return Err(Error::value(
                "offsets",
                format!(
                    "{total} nodes in all, more than a batch's {}",
                    crate::tree::MAX_BATCH_NODES
                ),
            ));
        }
        let mut out = BatchVerified {
            num_accepted: Vec::with_capacity(b),
            accepted_nodes: vec![-1; b * width],
            tokens: vec![-1; b * width],
            width,
            offsets: Vec::with_capacity(b + 1),
        };
        out.offsets.push(0);
        for r in 0..b {
            let row = format!("row {r}: ");
            let (start, end) = (offsets[r], offsets[r + 1]);
            // `start` is 0 or the previous row's checked end, so `end - start` cannot overflow.
            if end <= start || end - start > crate::tree::MAX_NODES as i64 {
                return Err(Error::value(
                    "offsets",
                    format!(
                        "offsets[{r}..={}] = {start}, {end}: each tree has at least its \
                         root, and at most {} nodes",
                        r + 1,
                        crate::tree::MAX_NODES
                    ),
                ));
            }
            let k = num_accepted[r];
            if !(0..width as i64).contains(&k) {
                return Err(Error::value(
                    "num_accepted",
                    format!("num_accepted[{r}] = {k}, expected 0..{width} (the row's width)"),
                ));
            }
            let len = k as usize + 1;
            let (nodes, toks) = (accepted_nodes.row(r), tokens.row(r));
            let path = path_nodes(nodes.slice(s![..len]), (end - start) as usize, &row)?;
            for (arg, padded) in [("accepted_nodes", nodes), ("tokens", toks)] {
                if padded.iter().skip(len).any(|&x| x != -1) {
                    return Err(Error::value(
                        arg,
                        format!("{row}entries past the path ({len}) must be -1 (padding)"),
                    ));
                }
            }
            let at = r * width;
            out.accepted_nodes[at..at + len].copy_from_slice(&path);
            for (d, &t) in out.tokens[at..at + len].iter_mut().zip(toks) {
                *d = t;
            }
            out.num_accepted.push(k as i32);
            out.offsets.push(end as usize);
        }
        Ok(out)
    }

    /// Accepted node rows (with padding) of request `b`.
    pub fn accepted_row(&self, b: usize) -> &[i32] {
        &self.accepted_nodes[b * self.width..(b + 1) * self.width]
    }

    /// The result as if each row's walk had stopped after its first `keep[b]` tokens (a path
    /// cut at EOS): its first `keep[b]` accepted nodes are kept, the last of the kept tokens
    /// becomes the row's bonus (`num_accepted = keep[b] - 1`) and the rest is padding. Each
    /// `keep[b]` is in `1..=num_accepted[b] + 1`; a KV commit of the cut result keeps exactly
    /// the tokens before the row's last emitted one, as an autoregressive run would.
    pub fn truncate(&self, keep: &[i64]) -> Result<BatchVerified> {
        let b = self.num_trees();
        if keep.len() != b {
            return Err(Error::value(
                "keep",
                format!("expected {b} entries (one per request), got {}", keep.len()),
            ));
        }
        let mut out = self.clone();
        for (r, &n) in keep.iter().enumerate() {
            let k = i64::from(self.num_accepted[r]);
            if !(1..=k + 1).contains(&n) {
                return Err(Error::value(
                    "keep",
                    format!(
                        "keep[{r}] = {n}, expected 1..={} (the row's path and bonus)",
                        k + 1
                    ),
                ));
            }
            let row = r * self.width;
            // `n <= k + 1 <= width`: in the row.
            let n = n as usize;
            out.accepted_nodes[row + n..row + self.width].fill(-1);
            out.tokens[row + n..row + self.width].fill(-1);
            out.num_accepted[r] = n as i32 - 1;
        }
        Ok(out)
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
    verify_batch_with(
        batch,
        |_, tree, base, acc, tok| walk(tree, |v| choose(base + v), acc, tok),
        row_cost,
    )
}

/// Verifies every tree of `batch` with `walker(b, tree, base, accepted, emitted) -> k`, which
/// walks request `b` (its first node is global index `base`) and writes its row like [`walk`].
pub fn verify_batch_with<W>(batch: &TreeBatch, walker: W, row_cost: usize) -> Result<BatchVerified>
where
    W: Fn(usize, TreeRef<'_>, usize, &mut [i32], &mut [i64]) -> Result<usize> + Sync,
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
        let k = walker(i, batch.tree(i), offsets[i], acc, tok)?;
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
/// `nan_rows[g]` / `no_finite_rows[g]`, when given, mark nodes whose target output held a NaN
/// or no finite logit: the walk fails if it reaches one, with the host path's message (the
/// device reduction cannot know which rows the walk will visit). A negative choice matches no
/// draft: the walk stops there with it as the bonus (`sim.replay` marks the end of a known
/// continuation with -1).
pub fn choice_from_tokens<'a, I: IndexLike>(
    target: ArrayView1<'a, I>,
    nan_rows: Option<ArrayView1<'a, bool>>,
    no_finite_rows: Option<ndarray::ArrayView1<'a, bool>>,
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
    for (name, rows) in [("nan_rows", &nan_rows), ("no_finite_rows", &no_finite_rows)] {
        if let Some(rows) = rows.filter(|r| r.len() != num_nodes) {
            return Err(Error::value(
                name,
                format!(
                    "has {} entries, expected one per tree node ({num_nodes})",
                    rows.len()
                ),
            ));
        }
    }
    let flagged =
        |rows: &Option<ndarray::ArrayView1<'a, bool>>, g: usize| rows.is_some_and(|r| r[g]);
    Ok(move |g: usize| {
        if flagged(&nan_rows, g) {
            return Err(row_error(g, RowIssue::Nan));
        }
        if flagged(&no_finite_rows, g) {
            return Err(row_error(g, RowIssue::NoFiniteLogit));
        }
        Ok(target[g].to_i64())
    })
}

/// The error for a row the walk reads that defines no choice.
pub fn row_error(row: usize, issue: RowIssue) -> Error {
    let why = match issue {
        RowIssue::Nan => "contains NaN; the target's output is invalid",
        RowIssue::NoFiniteLogit => "has no finite logit; it defines no distribution",
    };
    Error::value("logits", format!("row {row} {why}"))
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

// ------------------------------------------------------------------------------------------
// Sampled verification: sample-and-match, multi-round rejection (SpecInfer / Sequoia) and
// typical acceptance, each deciding per node lazily, only where the walk goes.
// ------------------------------------------------------------------------------------------

/// One decision of a walk at node `v`: accept a child (tree-local), or stop with a bonus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Accept(usize),
    Stop(i64),
}

/// Walks one tree with a per-node decision; writes `accepted` / `emitted` like [`walk`].
pub fn walk_steps<F>(
    tree: TreeRef<'_>,
    mut decide: F,
    accepted: &mut [i32],
    emitted: &mut [i64],
) -> Result<usize>
where
    F: FnMut(usize) -> Result<Step>,
{
    debug_assert!(accepted.len() > tree.max_depth as usize && emitted.len() == accepted.len());
    accepted[0] = 0;
    let mut v = 0usize;
    let mut k = 0usize;
    loop {
        match decide(v)? {
            Step::Accept(c) => {
                emitted[k] = tree.tokens[c];
                k += 1;
                accepted[k] = c as i32;
                v = c;
            }
            Step::Stop(y) => {
                emitted[k] = y;
                return Ok(k);
            }
        }
    }
}

/// Verifies one tree with `walker(tree, accepted, emitted) -> k`.
pub fn verify_tree_with<W>(tree: TreeRef<'_>, walker: W) -> Result<Verified>
where
    W: FnOnce(TreeRef<'_>, &mut [i32], &mut [i64]) -> Result<usize>,
{
    let width = tree.max_depth as usize + 1;
    let mut accepted = vec![0i32; width];
    let mut emitted = vec![0i64; width];
    let k = walker(tree, &mut accepted, &mut emitted)?;
    accepted.truncate(k + 1);
    emitted.truncate(k + 1);
    Ok(Verified {
        accepted_nodes: accepted,
        tokens: emitted,
        num_nodes: tree.num_nodes(),
    })
}

/// How a sampled verification decides at each node (DESIGN §4).
#[derive(Debug, Clone)]
pub enum Rule<'a> {
    /// Deterministic drafts: sample `y[v]` from the processed target, accept the first child
    /// whose token is `y[v]`. Lossless; acceptance at `v` is the target mass on its children.
    Match,
    /// Drafts sampled from `q` (row `v` of `draft_probs` drew `v`'s children). For each child
    /// `x` in index order: accept w.p. `min(1, p(x) / q(x))`; on rejection
    /// `p <- norm(max(p - q, 0))` and, without replacement, `q <- norm(q with q(x) = 0)`; if
    /// every child is rejected the bonus is drawn from the final `p`. Lossless (SpecInfer,
    /// arXiv 2305.09781; Sequoia / EAGLE-1 without replacement).
    Rejection {
        draft_probs: ProbsView<'a>,
        without_replacement: bool,
    },
    /// Medusa's typical acceptance: LOSSY. A child `x` of `v` is accepted iff
    /// `p(x) > min(posterior_threshold, posterior_alpha * exp(-H(p)))`, `H(p) = -Σ p ln(p + 1e-5)`
    /// as Medusa computes it; the deepest accepted path wins (ties to the lowest node
    /// indices) and its stop node's bonus is a draw from `p`.
    Typical {
        posterior_threshold: f64,
        posterior_alpha: f64,
    },
}

/// Node keys of the counter-based draws: draw 0 is a node's target sample (bonus), draw
/// `j >= 1` the acceptance coin of its j-th child.
const DRAW_SAMPLE: u64 = 0;

/// Seeds of the counter-based draws.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seeds {
    /// One seed for the batch: request `b`'s node `v` draws from `(seed, b, v, draw)`, so a
    /// request's draws depend on its slot in the batch.
    Batch(u64),
    /// One seed per request (vLLM's and SGLang's per-request seeds): request `b` draws from
    /// `(seeds[b], 0, v, draw)`, whatever its slot or the other requests; under seed `s` a
    /// request draws what a lone tree verified with the batch seed `s` draws.
    PerRequest(Vec<u64>),
}

impl From<u64> for Seeds {
    fn from(seed: u64) -> Self {
        Seeds::Batch(seed)
    }
}

impl Seeds {
    /// `(seed, request)` keys of request `b`'s draws.
    #[inline]
    fn key(&self, b: usize) -> (u64, u64) {
        match self {
            Seeds::Batch(seed) => (*seed, b as u64),
            Seeds::PerRequest(seeds) => (seeds[b], 0),
        }
    }
}

/// A sampled verification: the target logits, per-request processing, the seeds and the
/// rule. Request `b`'s node `v` draws from `rng::uniform` keyed by [`Seeds`]; a single tree
/// is request 0. Greedy requests (temperature 0) take the argmax walk under every rule.
pub struct Sampled<'a> {
    logits: LogitsView<'a>,
    params: Vec<SamplingParams>,
    seeds: Seeds,
    rule: Rule<'a>,
}

impl<'a> Sampled<'a> {
    /// Checks the inputs against the trees `(base, tree)` (global index of the first node):
    /// logits rows, one parameter set per tree, and for the rejection rule `draft_probs` of
    /// the logits' shape, every drafted token inside its vocabulary with a positive draft
    /// probability at its parent, and (without replacement) no repeated sibling tokens.
    pub fn new<'t>(
        logits: LogitsView<'a>,
        params: Vec<SamplingParams>,
        seeds: impl Into<Seeds>,
        rule: Rule<'a>,
        trees: impl ExactSizeIterator<Item = (usize, TreeRef<'t>)>,
        num_nodes: usize,
    ) -> Result<Self> {
        logits.check(num_nodes)?;
        let seeds = seeds.into();
        if let Seeds::PerRequest(v) = &seeds {
            if v.len() != trees.len() {
                return Err(Error::value(
                    "seed",
                    format!(
                        "has {} per-request seeds, expected one per request ({})",
                        v.len(),
                        trees.len()
                    ),
                ));
            }
        }
        if params.len() != trees.len() {
            return Err(Error::value(
                "temperature",
                format!(
                    "has {} parameter sets, expected one per request ({})",
                    params.len(),
                    trees.len()
                ),
            ));
        }
        match &rule {
            Rule::Match => {}
            Rule::Typical {
                posterior_threshold,
                posterior_alpha,
            } => {
                if !(posterior_threshold.is_finite() && *posterior_threshold >= 0.0) {
                    return Err(Error::value(
                        "posterior_threshold",
                        format!("is {posterior_threshold}; expected a finite value >= 0"),
                    ));
                }
                if !(posterior_alpha.is_finite() && *posterior_alpha >= 0.0) {
                    return Err(Error::value(
                        "posterior_alpha",
                        format!("is {posterior_alpha}; expected a finite value >= 0"),
                    ));
                }
            }
            Rule::Rejection {
                draft_probs,
                without_replacement,
            } => {
                let (rows, vocab) = logits.shape();
                if draft_probs.shape() != (rows, vocab) {
                    return Err(Error::value(
                        "draft_probs",
                        format!(
                            "has shape {:?}, expected the logits' shape {:?}",
                            draft_probs.shape(),
                            (rows, vocab)
                        ),
                    ));
                }
                for (base, tree) in trees {
                    check_drafted(tree, base, draft_probs, *without_replacement)?;
                }
            }
        }
        Ok(Sampled {
            logits,
            params,
            seeds,
            rule,
        })
    }

    /// Rough cost of one decision, for the batch's serial/parallel choice.
    pub fn row_cost(&self) -> usize {
        self.logits.shape().1.saturating_mul(8)
    }

    /// Walks request `b` (tree-local `tree`, first node at global `base`).
    pub fn walk(
        &self,
        b: usize,
        tree: TreeRef<'_>,
        base: usize,
        accepted: &mut [i32],
        emitted: &mut [i64],
    ) -> Result<usize> {
        let params = &self.params[b];
        if params.is_greedy() {
            return walk(tree, |v| self.logits.argmax(base + v), accepted, emitted);
        }
        let (seed, request) = self.seeds.key(b);
        let u = |v: usize, draw: u64| rng::uniform(seed, request, v as u64, draw);
        match &self.rule {
            Rule::Match => walk(
                tree,
                |v| self.logits.choose(base + v, params, u(v, DRAW_SAMPLE)),
                accepted,
                emitted,
            ),
            Rule::Rejection {
                draft_probs,
                without_replacement,
            } => walk_steps(
                tree,
                |v| {
                    self.rejection_step(
                        tree,
                        v,
                        base,
                        params,
                        draft_probs,
                        *without_replacement,
                        &u,
                    )
                },
                accepted,
                emitted,
            ),
            Rule::Typical {
                posterior_threshold,
                posterior_alpha,
            } => self.walk_typical(
                tree,
                base,
                params,
                (*posterior_threshold, *posterior_alpha),
                &u,
                accepted,
                emitted,
            ),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn rejection_step(
        &self,
        tree: TreeRef<'_>,
        v: usize,
        base: usize,
        params: &SamplingParams,
        q: &ProbsView<'_>,
        without_replacement: bool,
        u: &impl Fn(usize, u64) -> f64,
    ) -> Result<Step> {
        let g = base + v;
        if tree.first_child[v] < 0 {
            return Ok(Step::Stop(self.logits.choose(
                g,
                params,
                u(v, DRAW_SAMPLE),
            )?));
        }
        with_scratch(|s| {
            let total = self.logits.process(g, params, s)?;
            s.w.iter_mut().for_each(|p| *p /= total);
            let mut q_row = std::mem::take(&mut s.q);
            q.load_row(g, &mut q_row)?;
            let mut result = None;
            for (j, c) in tree.children(v).enumerate() {
                let x = tree.tokens[c] as usize; // in range: checked by `check_drafted`
                let qx = q_row[x];
                if qx <= 0.0 {
                    // Only reachable through float underflow of a renormalized row.
                    return Err(zero_draft_prob(g, base + c, x, qx));
                }
                if u(v, j as u64 + 1) * qx < s.w[x] {
                    result = Some(Step::Accept(c));
                    break;
                }
                residual(&mut s.w, &q_row);
                if without_replacement {
                    q_row[x] = 0.0;
                    let mass: f64 = q_row.iter().sum();
                    if mass > 0.0 {
                        q_row.iter_mut().for_each(|y| *y /= mass);
                    }
                }
            }
            s.q = q_row;
            match result {
                Some(step) => Ok(step),
                None => Ok(Step::Stop(
                    sample_weights(&s.w, 1.0, u(v, DRAW_SAMPLE)) as i64
                )),
            }
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn walk_typical(
        &self,
        tree: TreeRef<'_>,
        base: usize,
        params: &SamplingParams,
        (threshold, alpha): (f64, f64),
        u: &impl Fn(usize, u64) -> f64,
        accepted: &mut [i32],
        emitted: &mut [i64],
    ) -> Result<usize> {
        // Depth-first over accepted edges, children in index order: the first node reached at
        // a new maximum depth ends the lexicographically lowest deepest path.
        let mut stack = vec![0usize];
        let mut best = (0usize, 0usize); // (depth, node)
        let mut bonus: Vec<(usize, i64)> = Vec::new();
        while let Some(v) = stack.pop() {
            let depth = tree.depths[v] as usize;
            let y = with_scratch(|s| -> Result<i64> {
                let total = self.logits.process(base + v, params, s)?;
                let y = sample_weights(&s.w, total, u(v, DRAW_SAMPLE)) as i64;
                let mut entropy = 0.0;
                for w in s.w.iter_mut() {
                    *w /= total;
                    if *w > 0.0 {
                        entropy -= *w * (*w + 1e-5).ln();
                    }
                }
                let cut = threshold.min(alpha * (-entropy).exp());
                let first = stack.len();
                for c in tree.children(v) {
                    let x = tree.tokens[c];
                    if x >= 0 && (x as usize) < s.w.len() && s.w[x as usize] > cut {
                        stack.push(c);
                    }
                }
                stack[first..].reverse();
                Ok(y)
            })?;
            bonus.push((v, y));
            if depth > best.0 {
                best = (depth, v);
            }
        }
        let (k, stop) = best;
        let mut v = stop;
        for j in (0..=k).rev() {
            accepted[j] = v as i32;
            if j > 0 {
                emitted[j - 1] = tree.tokens[v];
                v = tree.parents[v] as usize;
            }
        }
        emitted[k] = bonus
            .iter()
            .find(|&&(n, _)| n == stop)
            .map(|&(_, y)| y)
            .unwrap_or(-1);
        Ok(k)
    }
}

/// `p <- norm(max(p - q, 0))`; when nothing is left (p == q up to rounding, so the rejection
/// had probability ~0) `p` is kept.
fn residual(p: &mut [f64], q: &[f64]) {
    let mass: f64 = p.iter().zip(q).map(|(&a, &b)| (a - b).max(0.0)).sum();
    if mass > 0.0 {
        p.iter_mut()
            .zip(q)
            .for_each(|(a, &b)| *a = (*a - b).max(0.0) / mass);
    }
}

fn zero_draft_prob(row: usize, node: usize, token: usize, prob: f64) -> Error {
    Error::value(
        "draft_probs",
        format!(
            "row {row} gives token {token} of node {node} probability {prob}; \
             the draft could not have drawn it"
        ),
    )
}

/// Every drafted token of `tree` could have been drawn from its parent's draft row.
fn check_drafted(
    tree: TreeRef<'_>,
    base: usize,
    q: &ProbsView<'_>,
    without_replacement: bool,
) -> Result<()> {
    let vocab = q.shape().1;
    for c in 1..tree.num_nodes() {
        let x = tree.tokens[c];
        if x < 0 || x as usize >= vocab {
            return Err(Error::value(
                "draft_probs",
                format!(
                    "node {} has token {x}, outside the draft's vocabulary of {vocab}",
                    base + c
                ),
            ));
        }
        let parent = base + tree.parents[c] as usize;
        let qx = q.at(parent, x as usize);
        if qx.is_nan() || qx <= 0.0 {
            return Err(zero_draft_prob(parent, base + c, x as usize, qx));
        }
    }
    if without_replacement {
        for v in 0..tree.num_nodes() {
            for c in tree.children(v) {
                if let Some(d) = tree
                    .children(v)
                    .take_while(|&d| d < c)
                    .find(|&d| tree.tokens[d] == tree.tokens[c])
                {
                    return Err(Error::value(
                        "tokens",
                        format!(
                            "nodes {} and {} are siblings with the same token {}; drafts drawn \
                             without replacement cannot repeat a token",
                            base + d,
                            base + c,
                            tree.tokens[c]
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Sampled verification of one tree (request 0).
pub fn verify_tree_sampled(tree: TreeRef<'_>, sampled: &Sampled<'_>) -> Result<Verified> {
    verify_tree_with(tree, |t, acc, tok| sampled.walk(0, t, 0, acc, tok))
}

/// Sampled verification of a batch; requests are walked independently (and in parallel when
/// the work pays for it): the draws are keyed by request and node, so the result is the same.
pub fn verify_batch_sampled(batch: &TreeBatch, sampled: &Sampled<'_>) -> Result<BatchVerified> {
    verify_batch_with(
        batch,
        |b, tree, base, acc, tok| sampled.walk(b, tree, base, acc, tok),
        sampled.row_cost(),
    )
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
        let f = choice_from_tokens(ArrayView1::from(&target), None, None, 4).unwrap();
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
        let f = choice_from_tokens(ArrayView1::from(&target), None, None, 5).unwrap();
        let r = verify_batch(&b, f, 1).unwrap();
        let invalid = [false, false, false, true, false];
        let g = choice_from_tokens(
            ArrayView1::from(&target),
            Some(ArrayView1::from(&invalid)),
            None,
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
        assert!(choice_from_tokens(ArrayView1::from(&target), None, None, 4).is_err());
        // Cut after EOS: row 1 keeps its root and first draft, whose token ends the row.
        let cut = r.truncate(&[1, 2]).unwrap();
        assert_eq!(cut.num_accepted, [0, 1]);
        assert_eq!(cut.accepted_nodes, [0, -1, -1, 0, 1, -1]);
        assert_eq!(cut.tokens, [4, -1, -1, 5, 6, -1]);
        assert_eq!(r.truncate(&[1, 3]).unwrap(), r);
        for bad in [&[1i64, 4][..], &[0, 1], &[1]] {
            assert!(r.truncate(bad).unwrap_err().to_string().contains("keep"));
        }
    }
    /// Index drawn from `q` with uniform `u` (inverse CDF).
    fn draw(q: &[f64], u: f64) -> usize {
        crate::select::sample_weights(q, q.iter().sum(), u)
    }

    #[test]
    fn rejection_rules_emit_the_target_distribution() {
        // One level: two children drawn from q (with or without replacement); the first
        // emitted token must follow the processed target p exactly.
        let n = 60_000usize;
        let logits_row = [0.2f64, 1.0, -0.5, 0.4];
        let q_row = [0.5f64, 0.1, 0.3, 0.1];
        let t = 0.9;
        let z: Vec<f64> = logits_row.iter().map(|l| ((l - 1.0) / t).exp()).collect();
        let p: Vec<f64> = z.iter().map(|x| x / z.iter().sum::<f64>()).collect();
        for without in [false, true] {
            let mut parents = Vec::new();
            let mut tokens = Vec::new();
            for b in 0..n {
                let x = draw(&q_row, rng::uniform(77, b as u64, 0, 0));
                let mut q2 = q_row;
                if without {
                    q2[x] = 0.0;
                }
                let y = draw(&q2, rng::uniform(77, b as u64, 1, 0));
                parents.extend([-1i32, 0, 0]);
                tokens.extend([0i64, x as i64, y as i64]);
            }
            let offsets: Vec<i64> = (0..=n as i64).map(|b| 3 * b).collect();
            let batch = TreeBatch::from_views(
                ArrayView1::from(&parents),
                ArrayView1::from(&tokens),
                ArrayView1::from(&offsets),
            )
            .unwrap();
            let logits: Vec<f64> = logits_row.repeat(3 * n);
            let q: Vec<f64> = q_row.repeat(3 * n);
            let lv = ndarray::ArrayView2::from_shape((3 * n, 4), &logits).unwrap();
            let qv = ndarray::ArrayView2::from_shape((3 * n, 4), &q).unwrap();
            let params = vec![SamplingParams::new(t, 0, 1.0, 0).unwrap(); n];
            let rule = Rule::Rejection {
                draft_probs: ProbsView::F64(qv),
                without_replacement: without,
            };
            let trees = batch.offsets()[..n].iter().copied().zip(batch.trees());
            let sampled = Sampled::new(LogitsView::F64(lv), params, 5, rule, trees, 3 * n).unwrap();
            let r = verify_batch_sampled(&batch, &sampled).unwrap();
            let mut freq = [0.0f64; 4];
            for b in 0..n {
                freq[r.tokens[b * r.width] as usize] += 1.0 / n as f64;
            }
            for i in 0..4 {
                assert!(
                    (freq[i] - p[i]).abs() < 0.01,
                    "{without}: {freq:?} vs {p:?}"
                );
            }
        }
    }

    #[test]
    fn typical_takes_the_deepest_path_lowest_indices_first() {
        // 0 -> {1, 2}; 1 -> {3}; 2 -> {4}; every draft token is the row's favourite, so every
        // child is accepted: two paths of depth 2, the lower indices (0, 1, 3) win.
        let t = Tree::new(&[-1, 0, 0, 1, 2], &[0, 1, 1, 2, 2]).unwrap();
        let mut logits = vec![0.0f32; 5 * 3];
        for (row, tok) in [(0usize, 1usize), (1, 2), (2, 2), (3, 0), (4, 0)] {
            logits[row * 3 + tok] = 8.0;
        }
        let lv = ndarray::ArrayView2::from_shape((5, 3), &logits).unwrap();
        let rule = Rule::Typical {
            posterior_threshold: 0.09,
            posterior_alpha: 0.3,
        };
        let params = vec![SamplingParams::new(1.0, 0, 1.0, 0).unwrap()];
        let s = Sampled::new(
            LogitsView::F32(lv),
            params,
            1,
            rule,
            std::iter::once((0, t.view())),
            5,
        )
        .unwrap();
        let r = verify_tree_sampled(t.view(), &s).unwrap();
        assert_eq!(r.accepted_nodes, [0, 1, 3]);
        assert_eq!(&r.tokens[..2], &[1, 2]);
    }
}
