//! The target's choice per node, read from CPU logits in place.
//!
//! Greedy choice is the argmax of a row, ties to the lowest token id; a NaN in a row that is
//! read is an error, never a silent pick. Rows are reduced only when the verify walk visits
//! them, so a batch with `T` nodes and vocabulary `V` reads about `B·(k+1)·V` values instead of
//! `T·V`. The kernel keeps eight running maxima (so the compiler vectorises it) over blocks of
//! the row, remembers the first block that raised the maximum, and rescans only that block for
//! the first index holding the maximum.
//!
//! Sampled choice processes a row as HF transformers and vLLM do (temperature, then top-k,
//! then top-p; tie rules on [`SamplingParams`]) into unnormalized float64 weights in per-thread
//! scratch buffers, and draws one token by inverse CDF from a counter-based uniform
//! ([`crate::rng`]). Cost per visited row: a few linear passes (widen + max, `exp`, and one
//! threshold pass each for top-k and top-p); only the top-p bucket where the mass crosses `p`
//! is sorted.

use half::{bf16, f16};
use ndarray::{ArrayView1, ArrayView2, Axis};

use crate::error::{Error, Result};

/// The type a logit is compared in: f32 for every 16- or 32-bit format, f64 for f64.
pub trait Wide: Copy + PartialOrd + Send + Sync {
    const NEG_INF: Self;
    fn is_nan(self) -> bool;
    fn to_f64(self) -> f64;
}

impl Wide for f32 {
    const NEG_INF: f32 = f32::NEG_INFINITY;
    #[inline]
    fn is_nan(self) -> bool {
        self.is_nan()
    }
    #[inline]
    fn to_f64(self) -> f64 {
        self as f64
    }
}

impl Wide for f64 {
    const NEG_INF: f64 = f64::NEG_INFINITY;
    #[inline]
    fn is_nan(self) -> bool {
        self.is_nan()
    }
    #[inline]
    fn to_f64(self) -> f64 {
        self
    }
}

/// A logits element type. Widening is exact (f16 and bf16 embed in f32), so the argmax of the
/// widened row is the argmax of the row.
pub trait Logit: Copy + Send + Sync {
    type Wide: Wide;
    fn widen(self) -> Self::Wide;
    /// The slice itself when no widening is needed (f32, f64): the kernel then reads in place.
    fn as_wide(slice: &[Self]) -> Option<&[Self::Wide]>;
}

impl Logit for f32 {
    type Wide = f32;
    #[inline]
    fn widen(self) -> f32 {
        self
    }
    fn as_wide(slice: &[f32]) -> Option<&[f32]> {
        Some(slice)
    }
}

impl Logit for f64 {
    type Wide = f64;
    #[inline]
    fn widen(self) -> f64 {
        self
    }
    fn as_wide(slice: &[f64]) -> Option<&[f64]> {
        Some(slice)
    }
}

impl Logit for f16 {
    type Wide = f32;
    #[inline]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn as_wide(_: &[f16]) -> Option<&[f32]> {
        None
    }
}

impl Logit for bf16 {
    type Wide = f32;
    #[inline]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn as_wide(_: &[bf16]) -> Option<&[f32]> {
        None
    }
}

const LANES: usize = 8;
const BLOCK: usize = 1024;

/// Maximum of a block and whether it holds a NaN.
#[inline]
fn block_max<W: Wide>(xs: &[W]) -> (W, bool) {
    let mut lanes = [W::NEG_INF; LANES];
    let mut nan = false;
    let chunks = xs.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            lanes[l] = if c[l] > lanes[l] { c[l] } else { lanes[l] };
            nan |= c[l].is_nan();
        }
    }
    for &x in rest {
        lanes[0] = if x > lanes[0] { x } else { lanes[0] };
        nan |= x.is_nan();
    }
    let mut m = lanes[0];
    for &l in &lanes[1..] {
        if l > m {
            m = l;
        }
    }
    (m, nan)
}

/// Running state of the blocked argmax.
struct Argmax<W> {
    best: W,
    best_block: Option<usize>,
}

impl<W: Wide> Argmax<W> {
    /// Folds block `b`; `Err(())` on NaN.
    #[inline]
    fn fold(&mut self, b: usize, xs: &[W]) -> std::result::Result<(), ()> {
        let (m, nan) = block_max(xs);
        if nan {
            return Err(());
        }
        // Strictly greater: an equal maximum in a later block loses the tie.
        if self.best_block.is_none() || m > self.best {
            self.best = m;
            self.best_block = Some(b);
        }
        Ok(())
    }
}

/// Argmax of one row, ties to the lowest index. `None` if the row holds a NaN; the row must
/// not be empty.
pub fn argmax<T: Logit>(row: ArrayView1<'_, T>) -> Option<usize> {
    debug_assert!(!row.is_empty());
    let mut state = Argmax {
        best: <T::Wide as Wide>::NEG_INF,
        best_block: None,
    };
    if let Some(wide) = row.as_slice().and_then(T::as_wide) {
        for (b, block) in wide.chunks(BLOCK).enumerate() {
            state.fold(b, block).ok()?;
        }
        let b = state.best_block?;
        let block = &wide[b * BLOCK..((b + 1) * BLOCK).min(wide.len())];
        let i = block.iter().position(|&x| x == state.best)?;
        return Some(b * BLOCK + i);
    }
    // Strided or narrow rows: widen a block at a time into a stack buffer.
    let mut buf = [<T::Wide as Wide>::NEG_INF; BLOCK];
    let n = row.len();
    for b in 0..n.div_ceil(BLOCK) {
        let len = widen_block(&row, b, &mut buf);
        state.fold(b, &buf[..len]).ok()?;
    }
    let b = state.best_block?;
    let len = widen_block(&row, b, &mut buf);
    let i = buf[..len].iter().position(|&x| x == state.best)?;
    Some(b * BLOCK + i)
}

#[inline]
fn widen_block<T: Logit>(row: &ArrayView1<'_, T>, b: usize, buf: &mut [T::Wide; BLOCK]) -> usize {
    let start = b * BLOCK;
    let end = (start + BLOCK).min(row.len());
    for (dst, i) in buf.iter_mut().zip(start..end) {
        *dst = row[i].widen();
    }
    end - start
}

/// CPU logits `[rows, V]` of any supported dtype and any strides.
#[derive(Debug, Clone)]
pub enum LogitsView<'a> {
    F32(ArrayView2<'a, f32>),
    F64(ArrayView2<'a, f64>),
    F16(ArrayView2<'a, f16>),
    BF16(ArrayView2<'a, bf16>),
}

impl LogitsView<'_> {
    pub fn shape(&self) -> (usize, usize) {
        let s = match self {
            LogitsView::F32(a) => a.dim(),
            LogitsView::F64(a) => a.dim(),
            LogitsView::F16(a) => a.dim(),
            LogitsView::BF16(a) => a.dim(),
        };
        (s.0, s.1)
    }

    /// Checks that the logits have `rows` rows and a non-empty vocabulary.
    pub fn check(&self, rows: usize) -> Result<()> {
        let (r, v) = self.shape();
        if r != rows {
            return Err(Error::value(
                "logits",
                format!("has {r} rows, expected one per tree node ({rows})"),
            ));
        }
        if v == 0 {
            return Err(Error::value(
                "logits",
                "has an empty vocabulary axis (0 columns)",
            ));
        }
        Ok(())
    }

    /// Greedy choice for `row`: argmax, ties to the lowest id, NaN an error naming the row.
    pub fn argmax(&self, row: usize) -> Result<i64> {
        let r = match self {
            LogitsView::F32(a) => argmax(a.index_axis(Axis(0), row)),
            LogitsView::F64(a) => argmax(a.index_axis(Axis(0), row)),
            LogitsView::F16(a) => argmax(a.index_axis(Axis(0), row)),
            LogitsView::BF16(a) => argmax(a.index_axis(Axis(0), row)),
        };
        r.map(|i| i as i64)
            .ok_or_else(|| crate::verify::nan_row(row))
    }

    /// The processed distribution of `row` (see [`process_row`]) in `s.w`; returns its mass.
    pub fn process(&self, row: usize, params: &SamplingParams, s: &mut Scratch) -> Result<f64> {
        let r = match self {
            LogitsView::F32(a) => process_row(a.index_axis(Axis(0), row), params, s),
            LogitsView::F64(a) => process_row(a.index_axis(Axis(0), row), params, s),
            LogitsView::F16(a) => process_row(a.index_axis(Axis(0), row), params, s),
            LogitsView::BF16(a) => process_row(a.index_axis(Axis(0), row), params, s),
        };
        r.map_err(|issue| match issue {
            RowIssue::Nan => crate::verify::nan_row(row),
            RowIssue::NoFiniteLogit => Error::value(
                "logits",
                format!("row {row} has no finite logit; it defines no distribution"),
            ),
        })
    }

    /// The target's token at `row`: the argmax when `params` is greedy, else a draw from the
    /// processed distribution with uniform `u`.
    pub fn choose(&self, row: usize, params: &SamplingParams, u: f64) -> Result<i64> {
        if params.is_greedy() {
            return self.argmax(row);
        }
        with_scratch(|s| {
            let total = self.process(row, params, s)?;
            Ok(sample_weights(&s.w, total, u) as i64)
        })
    }
}

// ------------------------------------------------------------------------------------------
// Sampling: target processing (temperature → top-k → top-p) and one draw per row.
// ------------------------------------------------------------------------------------------

/// Row sums of `draft_probs` may differ from 1 by at most this much (rows are then divided by
/// their sum): float32 softmax outputs over 150k tokens sum to 1 within ~1e-5.
pub const DRAFT_SUM_TOL: f64 = 1e-3;

/// How one request turns its target logits into a distribution: temperature, then top-k, then
/// top-p, as HF transformers' warpers and vLLM's sampler apply them.
///
/// - `temperature == 0`: greedy (argmax, ties to the lowest id); top-k/top-p are then moot.
/// - temperature: `z_i = (l_i - max l) / T`.
/// - top-k (`0` = off, `k >= V` keeps all): keep every token whose `z` is at least the k-th
///   largest `z` counted with multiplicity; ties at the k-th value are all kept (HF's
///   `TopKLogitsWarper` and vLLM's `apply_top_k_top_p` both compare with the k-th value).
/// - top-p (`1` = off): on the top-k-renormalized distribution, sort descending by `z` with
///   ties to the lower token id; token `i` is kept iff the probability mass of the tokens
///   before it is `< p` (the smallest prefix whose mass reaches `p`; at least one token).
/// - `+inf` logits: the row's mass is spread evenly over its `+inf` entries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    pub temperature: f64,
    pub top_k: usize,
    pub top_p: f64,
}

impl SamplingParams {
    pub const GREEDY: SamplingParams = SamplingParams {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
    };

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Validated parameters; `index` names the request in messages.
    pub fn new(temperature: f64, top_k: i64, top_p: f64, index: usize) -> Result<Self> {
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(Error::value(
                "temperature",
                format!("entry {index} is {temperature}; expected a finite value >= 0"),
            ));
        }
        if top_k < 0 {
            return Err(Error::value(
                "top_k",
                format!("entry {index} is {top_k}; expected >= 0 (0 or None = no top-k)"),
            ));
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(Error::value(
                "top_p",
                format!("entry {index} is {top_p}; expected a value in (0, 1]"),
            ));
        }
        Ok(SamplingParams {
            temperature,
            top_k: usize::try_from(top_k).unwrap_or(usize::MAX),
            top_p,
        })
    }

    /// One parameter set per request from arrays of length 1 (broadcast) or `num_requests`.
    pub fn per_request(
        temperature: &[f64],
        top_k: &[i64],
        top_p: &[f64],
        num_requests: usize,
    ) -> Result<Vec<SamplingParams>> {
        let len_ok = |arg: &'static str, n: usize| {
            if n == 1 || n == num_requests {
                Ok(())
            } else {
                Err(Error::value(
                    arg,
                    format!("has {n} entries; expected 1 or one per request ({num_requests})"),
                ))
            }
        };
        len_ok("temperature", temperature.len())?;
        len_ok("top_k", top_k.len())?;
        len_ok("top_p", top_p.len())?;
        let pick = |n: usize, b: usize| if n == 1 { 0 } else { b };
        (0..num_requests)
            .map(|b| {
                SamplingParams::new(
                    temperature[pick(temperature.len(), b)],
                    top_k[pick(top_k.len(), b)],
                    top_p[pick(top_p.len(), b)],
                    b,
                )
            })
            .collect()
    }
}

/// Per-thread buffers of the row kernels, reused across rows (a 128k-token row needs ~2 MiB).
#[derive(Default)]
pub struct Scratch {
    /// Processed logits `z` (removed tokens `-inf`).
    pub z: Vec<f64>,
    /// Processed weights `exp(z)`, 0 for removed tokens; normalized in place by some rules.
    pub w: Vec<f64>,
    /// A draft row (normalized), for the rejection rules.
    pub q: Vec<f64>,
    cand: Vec<(f64, u32)>,
    mass: Vec<f64>,
    heap: std::collections::BinaryHeap<std::cmp::Reverse<TotalF64>>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// Runs `f` with this thread's scratch buffers.
pub fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|s| f(&mut s.borrow_mut()))
}

#[derive(Clone, Copy, PartialEq)]
struct TotalF64(f64);
impl Eq for TotalF64 {}
impl PartialOrd for TotalF64 {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for TotalF64 {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Why a row has no distribution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowIssue {
    Nan,
    NoFiniteLogit,
}

/// Widens `row` into `s.z` and returns its maximum, or the issue.
fn load_row<T: Logit>(
    row: ArrayView1<'_, T>,
    s: &mut Scratch,
) -> std::result::Result<f64, RowIssue> {
    s.z.clear();
    match row.as_slice() {
        Some(xs) => s.z.extend(xs.iter().map(|&x| x.widen().to_f64())),
        None => s.z.extend(row.iter().map(|&x| x.widen().to_f64())),
    }
    let mut m = f64::NEG_INFINITY;
    let mut nan = false;
    for &x in &s.z {
        nan |= x.is_nan();
        m = if x > m { x } else { m };
    }
    if nan {
        return Err(RowIssue::Nan);
    }
    if m == f64::NEG_INFINITY {
        return Err(RowIssue::NoFiniteLogit);
    }
    if m == f64::INFINITY {
        for z in s.z.iter_mut() {
            *z = if *z == f64::INFINITY {
                0.0
            } else {
                f64::NEG_INFINITY
            };
        }
        m = 0.0;
    }
    Ok(m)
}

/// The processed distribution of `row` under `params` (not greedy) as unnormalized weights
/// `s.w` (0 for removed tokens); returns their sum `Z > 0`.
///
/// Cost: one pass to widen and find the maximum, one for `exp`, plus one threshold pass for
/// top-k (a k-entry min-heap) and one for top-p (a histogram of the weights by binary
/// exponent finds the bucket where the sorted mass crosses `p`; only the tokens of the buckets
/// above it are sorted).
pub fn process_row<T: Logit>(
    row: ArrayView1<'_, T>,
    params: &SamplingParams,
    s: &mut Scratch,
) -> std::result::Result<f64, RowIssue> {
    debug_assert!(!params.is_greedy());
    let m = load_row(row, s)?;
    let t = params.temperature;
    let v = s.z.len();
    for z in s.z.iter_mut() {
        *z = (*z - m) / t;
    }
    if params.top_k > 0 && params.top_k < v {
        let k = params.top_k;
        s.heap.clear();
        for &z in &s.z {
            if s.heap.len() < k {
                s.heap.push(std::cmp::Reverse(TotalF64(z)));
            } else if z > s.heap.peek().map_or(f64::NEG_INFINITY, |r| r.0 .0) {
                s.heap.pop();
                s.heap.push(std::cmp::Reverse(TotalF64(z)));
            }
        }
        let tau = s.heap.peek().map_or(f64::NEG_INFINITY, |r| r.0 .0);
        for z in s.z.iter_mut() {
            if *z < tau {
                *z = f64::NEG_INFINITY;
            }
        }
    }
    s.w.clear();
    s.w.extend(s.z.iter().map(|&z| z.exp()));
    let mut total = 0.0;
    for &w in &s.w {
        total += w;
    }
    if params.top_p < 1.0 {
        total = top_p(s, params.top_p, total);
    }
    Ok(total)
}

/// Buckets of the top-p pass: `z` (<= 0) in steps of 1/16 nat, everything below -256 pooled.
const TOP_P_BUCKETS: usize = 4096;
const TOP_P_SCALE: f64 = 16.0;

/// Applies top-p to `s.w` / `s.z` (see [`SamplingParams`]) and returns the kept mass.
///
/// A histogram of the mass by `z` bucket finds the bucket where the descending cumulative mass
/// reaches `p`: every token of a higher bucket is kept, every token of a lower one removed,
/// and only the tokens of the crossing bucket are sorted (z desc, ties to the lower id).
fn top_p(s: &mut Scratch, p: f64, total: f64) -> f64 {
    let bucket = |z: f64| ((-z * TOP_P_SCALE) as usize).min(TOP_P_BUCKETS - 1);
    s.mass.clear();
    s.mass.resize(TOP_P_BUCKETS, 0.0);
    for (&w, &z) in s.w.iter().zip(&s.z) {
        if w > 0.0 {
            s.mass[bucket(z)] += w;
        }
    }
    let target = p * total;
    let mut before = 0.0; // mass of the buckets above the crossing one
    let mut cross = 0;
    for (b, &m) in s.mass.iter().enumerate() {
        if m > 0.0 {
            cross = b;
            if before + m >= target {
                break;
            }
            before += m;
        }
    }
    s.cand.clear();
    for (i, (&w, &z)) in s.w.iter().zip(&s.z).enumerate() {
        if w > 0.0 && bucket(z) == cross {
            s.cand.push((z, i as u32));
        }
    }
    s.cand
        .sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut cut = s.cand[0];
    for &(z, i) in &s.cand {
        if before >= target {
            break;
        }
        cut = (z, i);
        before += s.w[i as usize];
    }
    // Keep the higher buckets and the crossing bucket's tokens ranked at or above `cut`.
    let mut kept = 0.0;
    for (i, (w, z)) in s.w.iter_mut().zip(s.z.iter_mut()).enumerate() {
        let b = bucket(*z);
        let keep = *w > 0.0
            && (b < cross || (b == cross && (*z > cut.0 || (*z == cut.0 && i as u32 <= cut.1))));
        if keep {
            kept += *w;
        } else {
            *w = 0.0;
            *z = f64::NEG_INFINITY;
        }
    }
    kept
}

/// Inverse-CDF draw from weights `w` (sum `total`) with uniform `u`: the first token, in id
/// order, whose cumulative weight exceeds `u · total` (the last positive one if rounding
/// leaves the sum short).
pub fn sample_weights(w: &[f64], total: f64, u: f64) -> usize {
    let target = u * total;
    let mut cum = 0.0;
    let mut last = 0;
    for (i, &x) in w.iter().enumerate() {
        if x > 0.0 {
            cum += x;
            last = i;
            if cum > target {
                return i;
            }
        }
    }
    last
}

/// Draft probabilities `[rows, V]`: row `v` is the distribution `q` the draft drew `v`'s
/// children from.
#[derive(Debug, Clone)]
pub enum ProbsView<'a> {
    F32(ArrayView2<'a, f32>),
    F64(ArrayView2<'a, f64>),
}

impl ProbsView<'_> {
    pub fn shape(&self) -> (usize, usize) {
        match self {
            ProbsView::F32(a) => a.dim(),
            ProbsView::F64(a) => a.dim(),
        }
    }

    /// The raw entry `(row, token)`.
    pub fn at(&self, row: usize, token: usize) -> f64 {
        match self {
            ProbsView::F32(a) => a[(row, token)] as f64,
            ProbsView::F64(a) => a[(row, token)],
        }
    }

    /// Loads row `row` into `out`, checked (finite, >= 0, sum within [`DRAFT_SUM_TOL`] of 1)
    /// and divided by its sum.
    pub fn load_row(&self, row: usize, out: &mut Vec<f64>) -> Result<()> {
        out.clear();
        match self {
            ProbsView::F32(a) => out.extend(a.row(row).iter().map(|&x| x as f64)),
            ProbsView::F64(a) => out.extend(a.row(row).iter().copied()),
        }
        let mut sum = 0.0;
        for (i, &x) in out.iter().enumerate() {
            if !(x.is_finite() && x >= 0.0) {
                return Err(Error::value(
                    "draft_probs",
                    format!("row {row} has entry {x} at token {i}; expected finite values >= 0"),
                ));
            }
            sum += x;
        }
        if (sum - 1.0).abs() > DRAFT_SUM_TOL {
            return Err(Error::value(
                "draft_probs",
                format!("row {row} sums to {sum}; expected 1 within {DRAFT_SUM_TOL}"),
            ));
        }
        out.iter_mut().for_each(|x| *x /= sum);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;

    #[test]
    fn ties_go_to_the_lowest_id_across_blocks() {
        let mut row = vec![0.0f32; 3 * BLOCK + 5];
        row[BLOCK + 7] = 2.0;
        row[2 * BLOCK + 1] = 2.0;
        assert_eq!(argmax(ArrayView1::from(&row)), Some(BLOCK + 7));
        row[3] = 2.0;
        assert_eq!(argmax(ArrayView1::from(&row)), Some(3));
        let all_neg_inf = vec![f32::NEG_INFINITY; 10];
        assert_eq!(argmax(ArrayView1::from(&all_neg_inf)), Some(0));
    }

    #[test]
    fn nan_is_reported() {
        let mut row = vec![1.0f32; 2000];
        row[1999] = f32::NAN;
        assert_eq!(argmax(ArrayView1::from(&row)), None);
    }

    #[test]
    fn strided_and_half_rows_agree_with_f32() {
        let data: Vec<f32> = (0..3000)
            .map(|i| ((i * 7919) % 1013) as f32 * 0.5)
            .collect();
        let a = Array2::from_shape_vec((2, 1500), data.clone()).unwrap();
        let t = a.t(); // columns are strided rows now
        let want = argmax(t.index_axis(Axis(0), 3).to_owned().view());
        assert_eq!(argmax(t.index_axis(Axis(0), 3)), want);
        let h: Vec<f16> = data.iter().map(|&x| f16::from_f32(x)).collect();
        let hb: Vec<bf16> = data.iter().map(|&x| bf16::from_f32(x)).collect();
        let exact = argmax(ArrayView1::from(&data[..1500]));
        assert_eq!(argmax(ArrayView1::from(&h[..1500])), exact);
        // bf16 rounds these values (ties appear): compare with its own widened row.
        let hb_wide: Vec<f32> = hb[..1500].iter().map(|x| x.to_f32()).collect();
        assert_eq!(
            argmax(ArrayView1::from(&hb[..1500])),
            argmax(ArrayView1::from(&hb_wide))
        );
    }
    fn probs(row: &[f64], t: f64, k: usize, p: f64) -> Vec<f64> {
        let params = SamplingParams {
            temperature: t,
            top_k: k,
            top_p: p,
        };
        let mut s = Scratch::default();
        let total = process_row(ArrayView1::from(row), &params, &mut s).unwrap();
        s.w.iter().map(|w| w / total).collect()
    }

    #[test]
    fn processing_order_and_ties() {
        // top-k keeps every tie at the k-th value
        let p = probs(&[1.0, 1.0, 1.0, 0.0], 1.0, 2, 1.0);
        assert!(p[..3].iter().all(|&x| (x - 1.0 / 3.0).abs() < 1e-12) && p[3] == 0.0);
        // top-p: keep iff the mass before is < p; ties ranked by lower id
        assert_eq!(probs(&[0.0; 4], 1.0, 0, 0.5), [0.5, 0.5, 0.0, 0.0]);
        assert_eq!(probs(&[5.0, 0.0, 0.0], 1.0, 0, 1e-9), [1.0, 0.0, 0.0]);
        // temperature sharpens before the cut
        let p = probs(&[0.0, 3f64.ln()], 0.5, 0, 1.0);
        assert!((p[1] - 0.9).abs() < 1e-12);
        assert_eq!(
            probs(&[f64::INFINITY, 0.0, f64::INFINITY], 1.0, 0, 1.0),
            [0.5, 0.0, 0.5]
        );
        let mut s = Scratch::default();
        let params = SamplingParams::new(1.0, 0, 1.0, 0).unwrap();
        let nan = [0.0, f64::NAN];
        assert_eq!(
            process_row(ArrayView1::from(&nan[..]), &params, &mut s),
            Err(RowIssue::Nan)
        );
        let none = [f64::NEG_INFINITY; 2];
        assert_eq!(
            process_row(ArrayView1::from(&none[..]), &params, &mut s),
            Err(RowIssue::NoFiniteLogit)
        );
        assert!(SamplingParams::new(-1.0, 0, 1.0, 0).is_err());
        assert!(SamplingParams::new(1.0, -1, 1.0, 0).is_err());
        assert!(SamplingParams::new(1.0, 0, 0.0, 0).is_err());
        assert!(SamplingParams::per_request(&[1.0, 1.0], &[0], &[1.0], 3).is_err());
    }

    #[test]
    fn top_p_buckets_agree_with_a_full_sort() {
        for case in 0..200u64 {
            let v = 1 + (case as usize * 37) % 900;
            let row: Vec<f64> = (0..v)
                .map(|i| {
                    let u = crate::rng::uniform(case, 0, i as u64, 0);
                    // coarse values make ties common; some rows span many buckets
                    ((u * 40.0).floor() / 4.0) * if case % 2 == 0 { 1.0 } else { 0.1 }
                })
                .collect();
            let p = 0.05 + 0.9 * crate::rng::uniform(case, 1, 0, 0);
            let t = 0.3 + crate::rng::uniform(case, 2, 0, 0);
            let got = probs(&row, t, 0, p);
            // Full sort: z descending, ties to the lower id; keep iff mass before < p.
            let full = probs(&row, t, 0, 1.0);
            let mut order: Vec<usize> = (0..v).collect();
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            let mut before = 0.0;
            let mut keep = vec![false; v];
            for &i in &order {
                keep[i] = before < p;
                before += full[i];
            }
            for i in 0..v {
                assert_eq!(got[i] > 0.0, keep[i], "case {case} token {i}");
            }
        }
    }

    #[test]
    fn inverse_cdf_draws() {
        let w = [0.25, 0.0, 0.75];
        assert_eq!(sample_weights(&w, 1.0, 0.24), 0);
        assert_eq!(sample_weights(&w, 1.0, 0.25), 2);
        assert_eq!(sample_weights(&w, 1.0, 0.999_999), 2);
        assert_eq!(sample_weights(&[0.0, 2.0, 0.0], 2.0, 1.0), 1);
    }
}
