//! vLLM's n-gram (prompt-lookup) proposer, batched.
//!
//! Semantics (vLLM v1 `NgramProposer`): for a context `c` of length `L`, every earlier start
//! `s` in `0..L-1` gets the length `l(s)`, the largest `l <= min(max_n, L-1-s)` with
//! `c[s..s+l] == c[L-l..L]` (the window starting at `s` equals the last `l` tokens). The best
//! start maximizes `l(s)`, ties going to the earliest `s`. If that length is at least `min_n`,
//! the proposal is `c[s+l .. min(s+l+k', L)]` with `k' = min(k, max_model_len - L)`; otherwise
//! nothing. Cost: one prefix-function pass over the reversed context, O(L) time, O(min(max_n, L))
//! memory
//! (the same Knuth-Morris-Pratt formulation vLLM compiles with numba).

use rayon::prelude::*;

use crate::error::{Error, Result};

/// Parameters of the n-gram proposer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramConfig {
    pub min_n: usize,
    pub max_n: usize,
    pub k: usize,
    pub max_model_len: usize,
}

impl NgramConfig {
    pub fn new(min_n: i64, max_n: i64, k: i64, max_model_len: i64) -> Result<Self> {
        if min_n < 1 {
            return Err(Error::value("min_n", format!("must be >= 1, got {min_n}")));
        }
        if max_n < min_n {
            return Err(Error::value(
                "max_n",
                format!("must be >= min_n = {min_n}, got {max_n}"),
            ));
        }
        if k < 1 {
            return Err(Error::value("k", format!("must be >= 1, got {k}")));
        }
        if max_model_len < 1 {
            return Err(Error::value(
                "max_model_len",
                format!("must be >= 1, got {max_model_len}"),
            ));
        }
        Ok(NgramConfig {
            min_n: min_n as usize,
            max_n: max_n as usize,
            k: k as usize,
            max_model_len: max_model_len as usize,
        })
    }

    /// The proposed continuation of `context`, as a sub-slice of it (possibly empty).
    pub fn propose<'a, T: PartialEq>(&self, context: &'a [T]) -> &'a [T] {
        let total = context.len();
        if total < self.min_n || total >= self.max_model_len {
            return &context[total..];
        }
        let k = self.k.min(self.max_model_len - total);
        // r[i] = context[total - 1 - i]: the reversed context, read in place.
        let r = |i: usize| &context[total - 1 - i];
        // A match is at most `total - 1` long: a larger max_n changes nothing, and sizing the
        // table by it alone would let `max_n = 2**40` allocate terabytes.
        let max_n = self.max_n.min(total);
        let mut lps = vec![0usize; max_n];
        let (mut longest, mut position, mut prev) = (0usize, 0usize, 0usize);
        let mut i = 1;
        while i < total {
            if r(prev) == r(i) {
                prev += 1;
                // `>=`: a later i in reversed order is an earlier start in the context.
                if prev >= longest {
                    longest = prev;
                    position = i;
                }
                if i < max_n {
                    lps[i] = prev;
                }
                if prev == max_n {
                    prev = lps[max_n - 1];
                }
                i += 1;
            } else if prev != 0 {
                prev = lps[prev - 1];
            } else {
                i += 1;
            }
        }
        if longest < self.min_n {
            return &context[total..];
        }
        let start = total - 1 - position + longest;
        &context[start..(start + k).min(total)]
    }

    /// Proposals for many contexts, in parallel.
    pub fn propose_batch<'a, T: PartialEq + Sync>(&self, contexts: &[&'a [T]]) -> Vec<&'a [T]> {
        contexts.par_iter().map(|c| self.propose(c)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, by brute force.
    fn naive(c: &[i64], cfg: &NgramConfig) -> Vec<i64> {
        let total = c.len();
        if total < cfg.min_n || total >= cfg.max_model_len {
            return vec![];
        }
        let (mut best, mut best_s) = (0, 0);
        for s in (0..total - 1).rev() {
            let l = (1..=cfg.max_n.min(total - 1 - s))
                .rev()
                .find(|&l| c[s..s + l] == c[total - l..])
                .unwrap_or(0);
            if l >= best && l > 0 {
                best = l;
                best_s = s;
            }
        }
        if best < cfg.min_n {
            return vec![];
        }
        let k = cfg.k.min(cfg.max_model_len - total);
        let start = best_s + best;
        c[start..(start + k).min(total)].to_vec()
    }

    #[test]
    fn matches_definition_on_small_alphabets() {
        let mut x: u64 = 7;
        for _ in 0..3000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let len = (x >> 33) as usize % 24;
            let alpha = 1 + (x >> 20) as i64 % 3;
            let c: Vec<i64> = (0..len)
                .map(|i| {
                    let y = (x >> (i % 40)).wrapping_mul(i as u64 + 3);
                    (y >> 7) as i64 % alpha
                })
                .collect();
            let cfg = NgramConfig::new(1 + (x % 2) as i64, 2 + (x >> 5) as i64 % 4, 3, 64).unwrap();
            assert_eq!(cfg.propose(&c), naive(&c, &cfg).as_slice(), "{c:?} {cfg:?}");
        }
    }

    #[test]
    fn proposes_what_followed_the_match() {
        let cfg = NgramConfig::new(2, 3, 4, 1000).unwrap();
        let c = [1, 2, 3, 4, 5, 9, 2, 3];
        assert_eq!(cfg.propose(&c), &[4, 5, 9, 2]);
        assert!(cfg.propose(&[1, 2, 3]).is_empty());
    }
}
