//! Suffixes of a token sequence sorted by their first `depth` tokens, for indexing a long
//! sequence in one pass (see [`super::suffix`]).
//!
//! The full suffix array (SA-IS, induced sorting: linear time) orders the suffixes by all
//! their tokens, which orders them by their first `depth` tokens too; the end of the sequence
//! sorts before any token. The common prefixes of neighbours, capped at `depth`, come from
//! Kärkkäinen's Φ method: walking the suffixes in text order, each one's common prefix with
//! its predecessor is at least the previous suffix's minus one, so every token is compared
//! O(1) times on average. Cost: O(n) time, a few arrays of n `u32`.
//!
//! Prefix doubling (`log2(depth)` rounds of a counting sort) was the first version; on source
//! bytes SA-IS and Φ take about half its time, most of it the rounds' random reads.

use super::prefetch;

/// How far ahead the passes over suffixes in sorted order prefetch (their reads are random).
const AHEAD: usize = 8;

/// Marks an empty slot of the suffix array while it is induced.
const EMPTY: u32 = u32::MAX;

/// The suffix array of `tokens` (`sa[k]`: the start of the `k`-th smallest suffix; an order
/// by the first `depth` tokens, too) and `lcp[k]`: the common prefix of suffixes `sa[k - 1]`
/// and `sa[k]`, at most `depth` (`lcp[0] = 0`). Needs `tokens.len() < 2^31`.
pub fn truncated_suffix_array(tokens: &[u32], depth: usize) -> (Vec<u32>, Vec<u32>) {
    let n = tokens.len();
    if n == 0 {
        return (Vec::new(), Vec::new());
    }
    let (text, sigma) = dense_ids(tokens);
    let sa = sa_is(text, sigma);
    let lcp = capped_lcp(tokens, &sa, depth);
    (sa, lcp)
}

/// The tokens as ids `0..sigma` in the same order (SA-IS buckets by id), and `sigma`.
fn dense_ids(tokens: &[u32]) -> (Vec<u32>, usize) {
    let n = tokens.len();
    let max = tokens.iter().copied().max().unwrap_or(0) as usize;
    if max < 4 * n + 1024 {
        // Token ids are few enough to map through a table.
        let mut id = vec![0u32; max + 1];
        for &t in tokens {
            id[t as usize] = 1;
        }
        let mut sigma = 0;
        for x in id.iter_mut() {
            let seen = *x;
            *x = sigma;
            sigma += seen;
        }
        (
            tokens.iter().map(|&t| id[t as usize]).collect(),
            sigma as usize,
        )
    } else {
        let mut distinct = tokens.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let text = tokens
            .iter()
            .map(|t| distinct.binary_search(t).expect("a token of the text") as u32)
            .collect();
        (text, distinct.len())
    }
}

/// Set on the id of an S-type position (ids are `< 2^31`): the induced passes read a
/// position's id and type with one random access.
const S_TYPE: u32 = 1 << 31;

/// Suffix array of `s` (ids `< sigma <= 2^31`) by induced sorting (Nong, Zhang and Chan,
/// 2009), with a virtual sentinel after the last id that is smaller than every id. Takes `s`
/// to mark each position's type on its id in place.
fn sa_is(mut s: Vec<u32>, sigma: usize) -> Vec<u32> {
    let n = s.len();
    if n <= 2 {
        let mut sa: Vec<u32> = (0..n as u32).collect();
        sa.sort_unstable_by(|&a, &b| s[a as usize..].cmp(&s[b as usize..]));
        return sa;
    }
    // Suffix i is S-type when it is smaller than suffix i + 1, L-type when larger; the last
    // is L-type (the sentinel after it is smaller). An LMS position is an S-type suffix
    // whose left neighbour is L-type.
    let mut next_s = false;
    for i in (0..n - 1).rev() {
        let (c, d) = (s[i], s[i + 1] & !S_TYPE);
        next_s = c < d || (c == d && next_s);
        if next_s {
            s[i] |= S_TYPE;
        }
    }
    let s = s;
    let is_lms = |i: usize| i > 0 && s[i] & S_TYPE != 0 && s[i - 1] & S_TYPE == 0;
    // Bucket of id c: sa[start[c]..start[c + 1]], L-type suffixes first, S-type last.
    let mut start = vec![0u32; sigma + 1];
    for &c in &s {
        start[(c & !S_TYPE) as usize + 1] += 1;
    }
    for c in 0..sigma {
        start[c + 1] += start[c];
    }
    let mut sa = vec![EMPTY; n];
    let lms: Vec<u32> = (1..n).filter(|&i| is_lms(i)).map(|i| i as u32).collect();
    // Sorting the LMS substrings (each from one LMS position to the next) needs the LMS
    // positions in any order; the induced order lists them sorted by substring.
    induce(&s, &start, &lms, &mut sa);
    // Picked out of the order through a bitmap (n / 8 bytes, cache-resident), not by reading
    // each suffix's types (random reads over the 4n-byte text).
    let mut lms_bits = vec![0u64; n / 64 + 1];
    for &j in &lms {
        lms_bits[j as usize / 64] |= 1 << (j % 64);
    }
    let mut sorted: Vec<u32> = Vec::with_capacity(lms.len());
    sorted.extend(
        sa.iter()
            .copied()
            .filter(|&j| lms_bits[j as usize / 64] >> (j % 64) & 1 != 0),
    );
    drop(lms_bits);
    // Name the substrings: equal neighbours in that order share a name. LMS positions are at
    // least 2 apart, so arrays over `j / 2` hold one slot per LMS position j.
    let half = n / 2 + 1;
    let mut next_lms = vec![n as u32; half];
    for w in lms.windows(2) {
        next_lms[w[0] as usize / 2] = w[1];
    }
    let mut name_of = vec![0u32; half];
    let mut names = 0u32;
    let mut prev: Option<(usize, usize)> = None;
    for &j in &sorted {
        let j = j as usize;
        let e = next_lms[j / 2] as usize;
        // A substring that reaches the sentinel is unique; others are equal when their ids
        // and types are.
        let same =
            prev.is_some_and(|(p, pe)| pe < n && e < n && pe - p == e - j && s[p..=pe] == s[j..=e]);
        if !same {
            names += 1;
        }
        name_of[j / 2] = names;
        prev = Some((j, e));
    }
    drop(next_lms);
    let sorted_lms = if (names as usize) < lms.len() {
        // Some substrings repeat: sort the LMS suffixes by sorting the string of their names.
        let reduced: Vec<u32> = lms.iter().map(|&j| name_of[j as usize / 2] - 1).collect();
        drop(name_of);
        sa_is(reduced, names as usize)
            .into_iter()
            .map(|r| lms[r as usize])
            .collect()
    } else {
        sorted
    };
    induce(&s, &start, &sorted_lms, &mut sa);
    sa
}

/// Induced sorting over type-marked ids: the LMS suffixes `lms` (in the order they should
/// keep) at the ends of their buckets, then the L-type suffixes left to right, then the
/// S-type right to left.
fn induce(s: &[u32], start: &[u32], lms: &[u32], sa: &mut [u32]) {
    let n = s.len();
    let id = |i: u32| (s[i as usize] & !S_TYPE) as usize;
    sa.fill(EMPTY);
    let mut end: Vec<u32> = start[1..].to_vec();
    for &j in lms.iter().rev() {
        let c = id(j);
        end[c] -= 1;
        sa[end[c] as usize] = j;
    }
    let mut head: Vec<u32> = start[..start.len() - 1].to_vec();
    // The last suffix is L-type and follows the sentinel, which sorts first.
    let c = id(n as u32 - 1);
    sa[head[c] as usize] = n as u32 - 1;
    head[c] += 1;
    for k in 0..n {
        if let Some(&a) = sa.get(k + AHEAD) {
            if a != EMPTY && a > 0 {
                prefetch(&s[a as usize - 1]);
            }
        }
        let j = sa[k];
        if j != EMPTY && j > 0 {
            let x = s[j as usize - 1];
            if x & S_TYPE == 0 {
                let c = x as usize;
                sa[head[c] as usize] = j - 1;
                head[c] += 1;
            }
        }
    }
    let mut end: Vec<u32> = start[1..].to_vec();
    for k in (0..n).rev() {
        if k >= AHEAD {
            let a = sa[k - AHEAD];
            if a != EMPTY && a > 0 {
                prefetch(&s[a as usize - 1]);
            }
        }
        let j = sa[k];
        if j != EMPTY && j > 0 {
            let x = s[j as usize - 1];
            if x & S_TYPE != 0 {
                let c = (x & !S_TYPE) as usize;
                end[c] -= 1;
                sa[end[c] as usize] = j - 1;
            }
        }
    }
}

/// `lcp[k]`: the common prefix of suffixes `sa[k - 1]` and `sa[k]`, at most `depth`, by the Φ
/// method (Kärkkäinen, Manzini and Puglisi, 2009). In text order, suffix i + 1's predecessor
/// shares at least what suffix i shares with its own, minus one: the comparison resumes there.
fn capped_lcp(tokens: &[u32], sa: &[u32], depth: usize) -> Vec<u32> {
    let n = tokens.len();
    // phi[i]: the suffix before suffix i in the order (none for the first).
    let mut phi = vec![EMPTY; n];
    for k in 1..n {
        phi[sa[k] as usize] = sa[k - 1];
    }
    // Overwritten in place with each suffix's common prefix with its predecessor.
    let mut h = 0usize;
    for i in 0..n {
        let j = phi[i];
        if j == EMPTY {
            phi[i] = 0;
            h = 0;
            continue;
        }
        let j = j as usize;
        let cap = depth.min(n - i).min(n - j);
        while h < cap && tokens[i + h] == tokens[j + h] {
            h += 1;
        }
        phi[i] = h as u32;
        h = h.saturating_sub(1);
    }
    let mut lcp = vec![0u32; n];
    for k in 1..n {
        if let Some(&a) = sa.get(k + AHEAD) {
            prefetch(&phi[a as usize]);
        }
        lcp[k] = phi[sa[k] as usize];
    }
    lcp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::draft::test_rng as rng;

    #[test]
    fn induced_sorting_equals_sorting_the_suffixes() {
        let mut x = 7u64;
        for round in 0..1500 {
            let n = (rng(&mut x) % 400) as usize;
            // Tiny alphabets and periodic texts recurse several levels deep; a large one does
            // not recurse at all.
            let alpha = [1, 2, 3, 5, 300][round % 5];
            let period = 1 + (rng(&mut x) % 12) as usize;
            let base: Vec<u32> = (0..period).map(|_| (rng(&mut x) % alpha) as u32).collect();
            let s: Vec<u32> = (0..n)
                .map(|i| {
                    if round % 3 == 0 {
                        base[i % period]
                    } else {
                        (rng(&mut x) % alpha) as u32
                    }
                })
                .collect();
            let sigma = s.iter().map(|&c| c as usize + 1).max().unwrap_or(0);
            let mut want: Vec<u32> = (0..n as u32).collect();
            want.sort_by(|&a, &b| s[a as usize..].cmp(&s[b as usize..]));
            assert_eq!(sa_is(s.clone(), sigma), want, "round {round}: {s:?}");
        }
    }

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
