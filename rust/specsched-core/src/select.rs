//! The target's choice per node, read from CPU logits in place.
//!
//! Greedy choice is the argmax of a row, ties to the lowest token id; a NaN in a row that is
//! read is an error, never a silent pick. Rows are reduced only when the verify walk visits
//! them, so a batch with `T` nodes and vocabulary `V` reads about `B·(k+1)·V` values instead of
//! `T·V`. The kernel takes the maximum of each block of the row (several running maxima, in
//! AVX2 where the CPU has it), remembers the first block that raised the maximum, and searches
//! only that block for the first index holding it. f16 and bf16 rows are widened a block at a
//! time into a stack buffer first (F16C's conversion for f16).
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
    /// The maximum of `xs` and whether it holds a NaN; `AVX2` picks the AVX2 kernel where
    /// there is one ([`argmax`] passes true after asking the CPU).
    ///
    /// # Safety
    /// With `AVX2 = true` the CPU must support AVX2 and F16C.
    #[inline(always)]
    unsafe fn block_max<const AVX2: bool>(xs: &[Self]) -> (Self, bool) {
        block_max(xs)
    }
    /// The first index of `v` in `xs` (`==`, so never a NaN).
    ///
    /// # Safety
    /// As for [`Self::block_max`].
    #[inline(always)]
    unsafe fn first_index_of<const AVX2: bool>(xs: &[Self], v: Self) -> Option<usize> {
        first_index_of(xs, v)
    }
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
    #[inline(always)]
    unsafe fn block_max<const AVX2: bool>(xs: &[f32]) -> (f32, bool) {
        #[cfg(target_arch = "x86_64")]
        if AVX2 {
            // SAFETY: with AVX2 the CPU has AVX2 (the caller's promise).
            return unsafe { avx2::block_max(xs) };
        }
        block_max(xs)
    }
    #[inline(always)]
    unsafe fn first_index_of<const AVX2: bool>(xs: &[f32], v: f32) -> Option<usize> {
        #[cfg(target_arch = "x86_64")]
        if AVX2 {
            // SAFETY: as for `block_max` above.
            return unsafe { avx2::first_index_of(xs, v) };
        }
        first_index_of(xs, v)
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
    /// Widens `src` into `dst` (equal lengths) with branch-free per-element code, so that the
    /// loop vectorizes; `AVX2` picks F16C's conversion for f16.
    ///
    /// # Safety
    /// As for [`Wide::block_max`].
    #[inline(always)]
    unsafe fn widen_slice<const AVX2: bool>(src: &[Self], dst: &mut [Self::Wide]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s.widen();
        }
    }
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
    #[inline(always)]
    fn widen(self) -> f32 {
        f16_bits_to_f32(self.to_bits())
    }
    fn as_wide(_: &[f16]) -> Option<&[f32]> {
        None
    }
    #[inline(always)]
    unsafe fn widen_slice<const AVX2: bool>(src: &[f16], dst: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if AVX2 {
            // SAFETY: with AVX2 the CPU has AVX2 and F16C (the caller's promise).
            return unsafe { avx2::widen_f16(src, dst) };
        }
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s.widen();
        }
    }
}

impl Logit for bf16 {
    type Wide = f32;
    #[inline(always)]
    fn widen(self) -> f32 {
        // bfloat16 is the high half of a float32: exact, NaN payloads included.
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
    fn as_wide(_: &[bf16]) -> Option<&[f32]> {
        None
    }
}

/// IEEE half-precision bits to the float32 of the same value, exactly (subnormals, infinities
/// and NaN included), in selects rather than branches so that a slice of them vectorizes.
/// `half`'s own conversion asks the CPU for F16C on every element, which keeps a row's loop
/// scalar (~3 ns an element).
#[inline(always)]
fn f16_bits_to_f32(h: u16) -> f32 {
    const EXP_F16: u32 = 0x7c00 << 13; // the half's exponent field, at float32's place
    let magnitude = u32::from(h & 0x7fff) << 13;
    let exp = magnitude & EXP_F16;
    // Rebias the exponent (15 -> 127); infinities and NaN take float32's all-ones exponent.
    let normal = magnitude + ((127 - 15) << 23);
    let special = normal + ((128 - 16) << 23);
    // Subnormals: give them the smallest normal exponent, then subtract its implicit one.
    let subnormal = (f32::from_bits(normal + (1 << 23)) - f32::from_bits(113 << 23)).to_bits();
    let bits = if exp == EXP_F16 {
        special
    } else if exp == 0 {
        subnormal
    } else {
        normal
    };
    f32::from_bits(bits | (u32::from(h & 0x8000) << 16))
}

/// Running maxima of the portable kernel: two SSE2 vectors of f32 (the AVX2 kernel for f32
/// is [`avx2::block_max`]).
const LANES: usize = 8;
/// A row is reduced in blocks: the maximum per block, then a search of the one block that
/// first reached the row's maximum.
const BLOCK: usize = 1024;
/// Elements compared per step of the portable search for the maximum's first index.
const SEARCH_CHUNK: usize = 16;

/// Maximum of a block and whether it holds a NaN.
#[inline(always)]
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

/// The first index of `v` in `xs`: a chunk at a time is tested for any match (compares that
/// vectorize), and only the chunk holding it is searched element by element.
#[inline(always)]
fn first_index_of<W: Wide>(xs: &[W], v: W) -> Option<usize> {
    let mut chunks = xs.chunks_exact(SEARCH_CHUNK);
    let mut base = 0;
    for c in chunks.by_ref() {
        if c.iter().fold(false, |hit, &x| hit | (x == v)) {
            return c.iter().position(|&x| x == v).map(|i| base + i);
        }
        base += SEARCH_CHUNK;
    }
    chunks
        .remainder()
        .iter()
        .position(|&x| x == v)
        .map(|i| base + i)
}

/// The f32 kernels with AVX2 intrinsics: eight lanes a vector and four independent maxima
/// (one accumulator would wait on its own previous `max` at every step).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use half::f16;
    use std::arch::x86_64::{
        _mm256_cmp_ps, _mm256_cvtph_ps, _mm256_loadu_ps, _mm256_max_ps, _mm256_movemask_ps,
        _mm256_or_ps, _mm256_set1_ps, _mm256_setzero_ps, _mm256_storeu_ps, _mm_loadu_si128,
        _CMP_EQ_OQ, _CMP_UNORD_Q,
    };

    const VECTORS: usize = 4;
    const STEP: usize = 8 * VECTORS;

    /// [`super::block_max`] for f32.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn block_max(xs: &[f32]) -> (f32, bool) {
        let mut max = [_mm256_set1_ps(f32::NEG_INFINITY); VECTORS];
        let mut nan = _mm256_setzero_ps();
        let mut chunks = xs.chunks_exact(STEP);
        for c in chunks.by_ref() {
            for (j, m) in max.iter_mut().enumerate() {
                // SAFETY: `c` holds STEP = 8 * VECTORS floats, so the eight at 8 * j are in
                // it; the load needs no alignment.
                let x = unsafe { _mm256_loadu_ps(c.as_ptr().add(8 * j)) };
                // `max(x, m)` is `x > m ? x : m`: a NaN x keeps m, and is flagged below.
                *m = _mm256_max_ps(x, *m);
                nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
            }
        }
        let folded = _mm256_max_ps(_mm256_max_ps(max[0], max[1]), _mm256_max_ps(max[2], max[3]));
        let mut lanes = [0.0f32; 8];
        // SAFETY: `lanes` has room for the eight floats stored.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), folded) };
        let mut best = f32::NEG_INFINITY;
        let mut any_nan = _mm256_movemask_ps(nan) != 0;
        for &x in lanes.iter().chain(chunks.remainder()) {
            if x > best {
                best = x;
            }
            any_nan |= x.is_nan();
        }
        (best, any_nan)
    }

    /// f16 to f32, eight at a time with F16C's conversion (exact, as widening is).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    pub fn widen_f16(src: &[f16], dst: &mut [f32]) {
        let mut src = src.chunks_exact(8);
        let mut dst = dst.chunks_exact_mut(8);
        for (s, d) in src.by_ref().zip(dst.by_ref()) {
            // SAFETY: `s` holds eight halves (16 bytes, read without alignment) and `d` has
            // room for eight floats.
            unsafe {
                let halves = _mm_loadu_si128(s.as_ptr().cast());
                _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(halves));
            }
        }
        for (d, &h) in dst.into_remainder().iter_mut().zip(src.remainder()) {
            *d = super::f16_bits_to_f32(h.to_bits());
        }
    }

    /// [`super::first_index_of`] for f32: eight compares and one mask a step.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn first_index_of(xs: &[f32], v: f32) -> Option<usize> {
        let target = _mm256_set1_ps(v);
        let mut chunks = xs.chunks_exact(8);
        let mut base = 0;
        for c in chunks.by_ref() {
            // SAFETY: `c` holds eight floats; the load needs no alignment.
            let x = unsafe { _mm256_loadu_ps(c.as_ptr()) };
            // Ordered equality: what `==` is on floats (a NaN matches nothing, -0 == 0).
            let hits = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(x, target));
            if hits != 0 {
                return Some(base + hits.trailing_zeros() as usize);
            }
            base += 8;
        }
        chunks
            .remainder()
            .iter()
            .position(|&x| x == v)
            .map(|i| base + i)
    }
}

/// Running state of the blocked argmax.
struct Argmax<W> {
    best: W,
    best_block: Option<usize>,
}

impl<W: Wide> Argmax<W> {
    /// Folds block `b`; `Err(())` on NaN. `AVX2` as in [`argmax_in`].
    #[inline(always)]
    fn fold<const AVX2: bool>(&mut self, b: usize, xs: &[W]) -> std::result::Result<(), ()> {
        // SAFETY: `AVX2` is true only on `argmax_avx2`'s path (see `argmax_in`).
        let (m, nan) = unsafe { W::block_max::<AVX2>(xs) };
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
///
/// The kernel is compiled twice: for the build's baseline (SSE2 on x86-64) and, for x86-64 CPUs
/// that have them, for AVX2 and F16C (f32 maxima and searches and the f16 widening in
/// intrinsics, the bf16 widening auto-vectorized eight lanes wide); the CPU picks at run time.
pub fn argmax<T: Logit>(row: ArrayView1<'_, T>) -> Option<usize> {
    debug_assert!(!row.is_empty());
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: the CPU supports AVX2 and F16C, checked just above; that is the function's
        // only requirement beyond its signature.
        return unsafe { argmax_avx2(row) };
    }
    argmax_in::<T, false>(row)
}

/// [`argmax_in`] compiled for AVX2 and F16C (everything it calls is inlined into it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn argmax_avx2<T: Logit>(row: ArrayView1<'_, T>) -> Option<usize> {
    argmax_in::<T, true>(row)
}

/// `AVX2` is true only when called from [`argmax_avx2`], which runs after the CPU reported AVX2
/// and F16C: the kernels' safety rests on that.
#[inline(always)]
fn argmax_in<T: Logit, const AVX2: bool>(row: ArrayView1<'_, T>) -> Option<usize> {
    let mut state = Argmax {
        best: <T::Wide as Wide>::NEG_INF,
        best_block: None,
    };
    let contiguous = row.as_slice();
    if let Some(wide) = contiguous.and_then(T::as_wide) {
        for (b, block) in wide.chunks(BLOCK).enumerate() {
            state.fold::<AVX2>(b, block).ok()?;
        }
        let b = state.best_block?;
        let block = &wide[b * BLOCK..((b + 1) * BLOCK).min(wide.len())];
        // SAFETY: `AVX2` as above.
        let i = unsafe { T::Wide::first_index_of::<AVX2>(block, state.best) };
        return Some(b * BLOCK + i?);
    }
    // Narrow or strided rows: widen a block at a time into a stack buffer.
    let mut buf = [<T::Wide as Wide>::NEG_INF; BLOCK];
    let n = row.len();
    for b in 0..n.div_ceil(BLOCK) {
        let len = widen_block::<T, AVX2>(&row, contiguous, b, &mut buf);
        state.fold::<AVX2>(b, &buf[..len]).ok()?;
    }
    let b = state.best_block?;
    let len = widen_block::<T, AVX2>(&row, contiguous, b, &mut buf);
    // SAFETY: `AVX2` as above.
    let i = unsafe { T::Wide::first_index_of::<AVX2>(&buf[..len], state.best) };
    Some(b * BLOCK + i?)
}

/// Widens block `b` of `row` (`contiguous`: the row as a slice, if it is one) into `buf`;
/// returns the block's length.
#[inline(always)]
fn widen_block<T: Logit, const AVX2: bool>(
    row: &ArrayView1<'_, T>,
    contiguous: Option<&[T]>,
    b: usize,
    buf: &mut [T::Wide; BLOCK],
) -> usize {
    let start = b * BLOCK;
    let end = (start + BLOCK).min(row.len());
    let len = end - start;
    match contiguous {
        // SAFETY: `AVX2` as in `argmax_in`, this function's only caller.
        Some(xs) => unsafe { T::widen_slice::<AVX2>(&xs[start..end], &mut buf[..len]) },
        None => {
            let src = row.slice(ndarray::s![start..end]);
            for (dst, &x) in buf.iter_mut().zip(src.iter()) {
                *dst = x.widen();
            }
        }
    }
    len
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
            .ok_or_else(|| crate::verify::row_error(row, RowIssue::Nan))
    }

    /// The processed distribution of `row` (see [`process_row`]) in `s.w`; returns its mass.
    pub fn process(&self, row: usize, params: &SamplingParams, s: &mut Scratch) -> Result<f64> {
        let r = match self {
            LogitsView::F32(a) => process_row(a.index_axis(Axis(0), row), params, s),
            LogitsView::F64(a) => process_row(a.index_axis(Axis(0), row), params, s),
            LogitsView::F16(a) => process_row(a.index_axis(Axis(0), row), params, s),
            LogitsView::BF16(a) => process_row(a.index_axis(Axis(0), row), params, s),
        };
        r.map_err(|issue| crate::verify::row_error(row, issue))
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
                format!(
                    "entry {index} is {}; expected a finite value >= 0",
                    crate::error::show_f64(temperature)
                ),
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
                format!(
                    "entry {index} is {}; expected a value in (0, 1]",
                    crate::error::show_f64(top_p)
                ),
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
    // IEEE order, as the keep test below compares: -0.0 and +0.0 are one value, so their
    // tokens tie to the lower id (`total_cmp` ranks +0.0 first and broke that rule). The
    // candidates hold weight, so no z is NaN.
    s.cand.sort_unstable_by(|a, b| {
        b.0.partial_cmp(&a.0)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.1.cmp(&b.1))
    });
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

    /// The naive argmax: first index of the maximum, `None` on NaN.
    fn naive_argmax(row: &[f32]) -> Option<usize> {
        if row.iter().any(|x| x.is_nan()) {
            return None;
        }
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        row.iter().position(|&x| x == m)
    }

    #[test]
    fn f16_widening_is_exact_for_every_bit_pattern() {
        for bits in 0..=u16::MAX {
            let h = f16::from_bits(bits);
            let (got, want) = (h.widen(), h.to_f32());
            if want.is_nan() {
                assert!(got.is_nan(), "{bits:#06x}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{bits:#06x}");
            }
            let b = bf16::from_bits(bits);
            let (got, want) = (b.widen(), b.to_f32());
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()));
        }
        // The slice forms (vectorized; F16C's where the CPU has it) agree with the element
        // form. An odd length leaves a remainder for the scalar tail.
        let src: Vec<f16> = (0..=u16::MAX)
            .chain([0x3c00, 0x7e01, 0x0001])
            .map(f16::from_bits)
            .collect();
        let mut dst = vec![0.0f32; src.len()];
        let same = |dst: &[f32]| {
            src.iter()
                .zip(dst)
                .all(|(h, d)| h.widen().to_bits() == d.to_bits() || (h.is_nan() && d.is_nan()))
        };
        // SAFETY: the portable conversion needs no CPU feature.
        unsafe { f16::widen_slice::<false>(&src, &mut dst) };
        assert!(same(&dst));
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            dst.fill(0.0);
            // SAFETY: the CPU has AVX2 and F16C (checked above).
            unsafe { avx2::widen_f16(&src, &mut dst) };
            assert!(same(&dst));
        }
    }

    #[test]
    fn every_length_position_and_tie_matches_the_naive_argmax() {
        // Lengths around the lane, search-chunk and block sizes; the maximum (and a tie after
        // it, and a NaN) at every kind of position: first, in a lane, in the remainder, last.
        let lengths = [
            1, 2, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 255, 256, 1023, 1024, 1025, 2100,
        ];
        let mut counter = 0u64;
        let mut next = || {
            counter += 1;
            crate::rng::mix(counter) as usize
        };
        for &n in &lengths {
            for trial in 0..24 {
                let mut row: Vec<f32> = (0..n).map(|_| (next() % 1000) as f32).collect();
                let at = next() % n;
                row[at] = 5000.0;
                if trial % 3 == 1 {
                    let tie = next() % n;
                    row[tie] = 5000.0;
                }
                if trial % 8 == 7 {
                    row.iter_mut().for_each(|x| *x = f32::NEG_INFINITY);
                }
                let want = naive_argmax(&row);
                assert_eq!(argmax(ArrayView1::from(&row)), want, "n={n} trial={trial}");
                assert_eq!(
                    argmax_in::<f32, false>(ArrayView1::from(&row)),
                    want,
                    "portable n={n}"
                );
                let wide: Vec<f64> = row.iter().map(|&x| x as f64).collect();
                assert_eq!(argmax(ArrayView1::from(&wide)), want, "f64 n={n}");
                let strided =
                    Array2::from_shape_fn((n, 2), |(i, j)| if j == 0 { row[i] } else { 9e9 });
                assert_eq!(argmax(strided.column(0)), want, "strided n={n}");
                let half: Vec<f16> = row.iter().map(|&x| f16::from_f32(x)).collect();
                let half_wide: Vec<f32> = half.iter().map(|x| x.to_f32()).collect();
                assert_eq!(argmax(ArrayView1::from(&half)), naive_argmax(&half_wide));
                assert_eq!(
                    argmax_in::<f16, false>(ArrayView1::from(&half)),
                    naive_argmax(&half_wide)
                );
                let nan_at = next() % n;
                row[nan_at] = f32::NAN;
                assert_eq!(
                    argmax(ArrayView1::from(&row)),
                    None,
                    "NaN n={n} at {nan_at}"
                );
                assert_eq!(argmax_in::<f32, false>(ArrayView1::from(&row)), None);
                let strided =
                    Array2::from_shape_fn((n, 2), |(i, j)| if j == 0 { row[i] } else { 9e9 });
                assert_eq!(argmax(strided.column(0)), None, "strided NaN n={n}");
            }
        }
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
