//! The target's choice per node, read from CPU logits in place.
//!
//! Greedy choice is the argmax of a row, ties to the lowest token id; a NaN in a row that is
//! read is an error, never a silent pick. Rows are reduced only when the verify walk visits
//! them, so a batch with `T` nodes and vocabulary `V` reads about `B·(k+1)·V` values instead of
//! `T·V`. The kernel keeps eight running maxima (so the compiler vectorises it) over blocks of
//! the row, remembers the first block that raised the maximum, and rescans only that block for
//! the first index holding the maximum.

use half::{bf16, f16};
use ndarray::{ArrayView1, ArrayView2, Axis};

use crate::error::{Error, Result};

/// The type a logit is compared in: f32 for every 16- or 32-bit format, f64 for f64.
pub trait Wide: Copy + PartialOrd + Send + Sync {
    const NEG_INF: Self;
    fn is_nan(self) -> bool;
}

impl Wide for f32 {
    const NEG_INF: f32 = f32::NEG_INFINITY;
    #[inline]
    fn is_nan(self) -> bool {
        self.is_nan()
    }
}

impl Wide for f64 {
    const NEG_INF: f64 = f64::NEG_INFINITY;
    #[inline]
    fn is_nan(self) -> bool {
        self.is_nan()
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
}
