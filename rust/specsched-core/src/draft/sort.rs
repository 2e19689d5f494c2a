//! Suffixes of a token sequence sorted by their first `depth` tokens, for indexing a long
//! sequence in one pass (see [`super::suffix`]).
//!
//! Prefix doubling (Manber-Myers) with radix passes: after the round for `h`, every suffix's
//! rank orders it by its first `2h` tokens (the end of the sequence sorts before any token),
//! so `ceil(log2(depth))` rounds order the suffixes by their first `depth` tokens; suffixes
//! with equal truncated strings end up adjacent, in no particular order among themselves.
//! Each round is one stable counting sort: the order by the second half of the key is read
//! off the previous round's order. Cost: O(n log depth) time, 4 arrays of n `u32`.

use super::prefetch;

/// How far ahead the passes over suffixes in sorted order prefetch (their reads are random).
const AHEAD: usize = 8;

/// The suffix array of `tokens` truncated at `depth` (`sa[k]`: the start of the `k`-th
/// smallest truncated suffix) and `lcp[k]`: the common prefix of suffixes `sa[k - 1]` and
/// `sa[k]`, at most `depth` (`lcp[0] = 0`). Needs `tokens.len() < u32::MAX`.
pub fn truncated_suffix_array(tokens: &[u32], depth: usize) -> (Vec<u32>, Vec<u32>) {
    let n = tokens.len();
    if n == 0 {
        return (Vec::new(), Vec::new());
    }
    let (mut sa, mut rank) = first_token_order(tokens);
    let mut distinct = rank[sa[n - 1] as usize] as usize;
    let mut tmp = vec![0u32; n];
    let mut count = vec![0u32; n + 2];
    let mut h = 1;
    while h < depth && distinct < n {
        // Order by the second half (rank of i + h, 0 past the end): suffixes with no second
        // half first (shorter first), then the previous order shifted back by h.
        let mut k = 0;
        for i in n.saturating_sub(h)..n {
            tmp[k] = i as u32;
            k += 1;
        }
        for &j in &sa {
            if j as usize >= h {
                tmp[k] = j - h as u32;
                k += 1;
            }
        }
        // Stable counting sort of that order by the first half.
        count.iter_mut().for_each(|c| *c = 0);
        for &r in &rank {
            count[r as usize] += 1;
        }
        let mut sum = 0;
        for c in count.iter_mut() {
            let here = *c;
            *c = sum;
            sum += here;
        }
        for (k, &i) in tmp.iter().enumerate() {
            // The ranks are read in suffix order, far apart: start loading a few ahead.
            if let Some(&a) = tmp.get(k + AHEAD) {
                prefetch(&rank[a as usize]);
            }
            let r = rank[i as usize] as usize;
            sa[count[r] as usize] = i;
            count[r] += 1;
        }
        // New ranks (from 1): equal (first, second) pairs share one. Each suffix's pair is
        // read once and compared with the previous suffix's.
        let key = |i: u32| {
            let second = rank.get(i as usize + h).copied().unwrap_or(0);
            (rank[i as usize], second)
        };
        let mut prev = key(sa[0]);
        tmp[sa[0] as usize] = 1;
        let mut r = 1;
        for (k, &b) in sa.iter().enumerate().skip(1) {
            if let Some(&a) = sa.get(k + AHEAD) {
                prefetch(&rank[a as usize]);
                if let Some(x) = rank.get(a as usize + h) {
                    prefetch(x);
                }
            }
            let here = key(b);
            if here != prev {
                r += 1;
                prev = here;
            }
            tmp[b as usize] = r;
        }
        std::mem::swap(&mut rank, &mut tmp);
        distinct = r as usize;

        h *= 2;
    }
    let mut lcp = vec![0u32; n];
    for k in 1..n {
        if let Some(&a) = sa.get(k + AHEAD) {
            prefetch(&tokens[a as usize]);
        }
        let (a, b) = (&tokens[sa[k - 1] as usize..], &tokens[sa[k] as usize..]);
        lcp[k] = common_prefix(a, b, depth) as u32;
    }
    (sa, lcp)
}

/// Length of the common prefix of `a` and `b`, at most `cap`: blocks of 8 tokens compared
/// at once (neighbours in the order often agree on all `cap` tokens).
fn common_prefix(a: &[u32], b: &[u32], cap: usize) -> usize {
    const BLOCK: usize = 8;
    let cap = cap.min(a.len()).min(b.len());
    let (a, b) = (&a[..cap], &b[..cap]);
    let mut l = 0;
    for (x, y) in a.chunks_exact(BLOCK).zip(b.chunks_exact(BLOCK)) {
        // Fixed-size arrays: one vector compare, not a `memcmp` call.
        let x: [u32; BLOCK] = x.try_into().expect("a block");
        let y: [u32; BLOCK] = y.try_into().expect("a block");
        if x != y {
            break;
        }
        l += BLOCK;
    }
    while l < cap && a[l] == b[l] {
        l += 1;
    }
    l
}

/// Suffixes ordered by their first token, and each suffix's rank (1 + the number of smaller
/// distinct tokens).
fn first_token_order(tokens: &[u32]) -> (Vec<u32>, Vec<u32>) {
    let n = tokens.len();
    let max = tokens.iter().copied().max().unwrap_or(0) as usize;
    let mut sa: Vec<u32> = Vec::with_capacity(n);
    let mut rank = vec![0u32; n];
    if max < 4 * n + 1024 {
        // Token ids are few enough to bucket directly.
        let mut count = vec![0u32; max + 2];
        for &t in tokens {
            count[t as usize + 1] += 1;
        }
        let mut id = vec![0u32; max + 1];
        let mut r = 0;
        for t in 0..=max {
            if count[t + 1] > 0 {
                r += 1;
                id[t] = r;
            }
            count[t + 1] += count[t];
        }
        sa.resize(n, 0);
        for (i, &t) in tokens.iter().enumerate() {
            sa[count[t as usize] as usize] = i as u32;
            count[t as usize] += 1;
        }
        for (r, &t) in rank.iter_mut().zip(tokens) {
            *r = id[t as usize];
        }
    } else {
        sa.extend(0..n as u32);
        sa.sort_unstable_by_key(|&i| tokens[i as usize]);
        let mut r = 0;
        for k in 0..n {
            if k == 0 || tokens[sa[k] as usize] != tokens[sa[k - 1] as usize] {
                r += 1;
            }
            rank[sa[k] as usize] = r;
        }
    }
    (sa, rank)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::draft::test_rng as rng;

    #[test]
    fn sorted_by_truncated_suffix_with_exact_lcp() {
        let mut x = 1u64;
        for round in 0..400 {
            let n = (rng(&mut x) % 60) as usize;
            let depth = 1 + (rng(&mut x) % 9) as usize;
            // Small alphabets (long repeats), and sparse large ids (the sorting fallback).
            let alpha = 1 + rng(&mut x) % 4;
            let big = round % 3 == 0;
            let toks: Vec<u32> = (0..n)
                .map(|_| {
                    let t = (rng(&mut x) % alpha) as u32;
                    if big {
                        t * 1_000_003 + 7
                    } else {
                        t
                    }
                })
                .collect();
            let (sa, lcp) = truncated_suffix_array(&toks, depth);
            let mut seen = sa.clone();
            seen.sort_unstable();
            assert!(seen.iter().copied().eq(0..n as u32), "a permutation");
            let trunc = |i: u32| &toks[i as usize..(i as usize + depth).min(n)];
            for k in 1..n {
                assert!(trunc(sa[k - 1]) <= trunc(sa[k]), "round {round} k {k}");
                let (a, b) = (trunc(sa[k - 1]), trunc(sa[k]));
                let want = a.iter().zip(b).take_while(|(p, q)| p == q).count();
                assert_eq!(lcp[k] as usize, want, "round {round} k {k}");
            }
        }
    }
}
