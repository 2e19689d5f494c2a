//! Model-free tree drafters: proposals computed from tokens already seen, no draft model.
//!
//! - [`ngram`]: vLLM's prompt-lookup proposer (a chain), the baseline every user knows.
//! - [`suffix`]: a SuffixDecoding-class drafter: depth-bounded, path-compressed suffix trees
//!   with occurrence counts over each request's context and over past responses, proposing
//!   count-weighted trees best-first.
//!
//! Token ids are integers in `0..=MAX_TOKEN_ID`; they are stored as `u32` internally.

pub mod ngram;
pub mod suffix;

use crate::error::{Error, Result};

/// Largest token id the drafters accept (`2^31 - 1`, so int32 token arrays always fit).
pub const MAX_TOKEN_ID: i64 = i32::MAX as i64;

/// Checks every token of `tokens` against `0..=MAX_TOKEN_ID` and converts it to `u32`.
pub fn check_tokens(arg: &'static str, tokens: &[i64]) -> Result<Vec<u32>> {
    tokens
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            if (0..=MAX_TOKEN_ID).contains(&t) {
                Ok(t as u32)
            } else {
                Err(Error::value(
                    arg,
                    format!("{arg}[{i}] = {t}, expected 0 <= token <= {MAX_TOKEN_ID}"),
                ))
            }
        })
        .collect()
}
