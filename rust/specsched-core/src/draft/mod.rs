//! Model-free tree drafters: proposals computed from tokens already seen, no draft model.
//!
//! - [`ngram`]: vLLM's prompt-lookup proposer (a chain), the baseline every user knows.
//! - [`suffix`]: a SuffixDecoding-class drafter: depth-bounded, path-compressed suffix trees
//!   with occurrence counts over each request's context and over past responses, proposing
//!   count-weighted trees best-first.
//!
//! Token ids are integers in `0..=MAX_TOKEN_ID`; they are stored as `u32` internally.

pub mod ngram;
mod sort;
pub mod suffix;

use crate::error::{Error, Result};

/// Largest token id the drafters accept (`2^31 - 1`, so int32 token arrays always fit).
pub const MAX_TOKEN_ID: i64 = i32::MAX as i64;

/// Most tokens a drafter takes in one array (`2^31 - 1`): the suffix drafter's positions are
/// `u32` with a bit to spare, and no context comes near it. Bindings check an array's length
/// against it before copying it (a broadcast view can claim any length at no cost).
pub const MAX_CONTEXT_TOKENS: usize = i32::MAX as usize;

/// Checks every token of `tokens` against `0..=MAX_TOKEN_ID` and converts it to `u32`.
pub fn check_tokens(arg: &'static str, tokens: &[i64]) -> Result<Vec<u32>> {
    if let Some(msg) = bad_token(arg, tokens) {
        return Err(Error::value(arg, msg));
    }
    Ok(tokens.iter().map(|&t| t as u32).collect())
}

/// Why `tokens` (named `arg`) are not token ids: its first entry outside `0..=MAX_TOKEN_ID`.
pub fn bad_token(arg: &str, tokens: &[i64]) -> Option<String> {
    let (i, t) = tokens
        .iter()
        .enumerate()
        .find(|(_, t)| !(0..=MAX_TOKEN_ID).contains(*t))?;
    Some(format!(
        "{arg}[{i}] = {t}, expected 0 <= token <= {MAX_TOKEN_ID}"
    ))
}

/// Starts loading `x`'s cache line (a hint: no effect on any result).
#[inline(always)]
pub(crate) fn prefetch<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch has no architectural effect (it cannot fault and reads nothing the
    // program observes), and the pointer comes from a live reference; SSE is part of the
    // x86_64 baseline.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
            (x as *const T).cast::<i8>(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// The drafters' tests' generator (an LCG's high bits: cheap, reproducible, good enough to
/// draw token streams).
#[cfg(test)]
pub(crate) fn test_rng(x: &mut u64) -> u64 {
    *x = x
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *x >> 33
}
