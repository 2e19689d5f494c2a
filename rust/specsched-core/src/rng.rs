//! Counter-based randomness: a uniform number is a pure function of `(seed, request, node,
//! draw)`, so a sampled verification never depends on thread count, batch composition or call
//! order, and the same seed reproduces the same tokens on any machine.
//!
//! The key is hashed with the splitmix64 finaliser (Steele, Lea & Flood, "Fast splittable
//! pseudorandom number generators", 2014): `h = mix(seed + G)`, then for each counter `c` in
//! `request, node, draw`: `h = mix(h ^ (c + G))`, `G = 0x9e3779b97f4a7c15`, all arithmetic
//! wrapping mod 2^64. The top 53 bits give `u = (h >> 11 + 0.5) / 2^53`, strictly inside (0, 1).
//! `specsched.reference.rng_uniform` and the torch device path compute the same function.

/// The splitmix64 increment (2^64 / golden ratio).
pub const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The splitmix64 finaliser: a bijection of u64 with full avalanche.
#[inline]
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The 64-bit hash of a draw's key.
#[inline]
pub fn hash(seed: u64, request: u64, node: u64, draw: u64) -> u64 {
    let mut h = mix(seed.wrapping_add(GOLDEN));
    for c in [request, node, draw] {
        h = mix(h ^ c.wrapping_add(GOLDEN));
    }
    h
}

/// A uniform number in the open interval (0, 1), a pure function of its key.
#[inline]
pub fn uniform(seed: u64, request: u64, node: u64, draw: u64) -> f64 {
    ((hash(seed, request, node, draw) >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_and_range() {
        // splitmix64's published first output for state 0 (mix of 0 + G).
        assert_eq!(mix(GOLDEN), 0xe220_a839_7b1d_cdaf);
        let mut sum = 0.0;
        let n = 100_000u64;
        for i in 0..n {
            let u = uniform(7, i % 13, i, i % 3);
            assert!(u > 0.0 && u < 1.0);
            sum += u;
        }
        let mean = sum / n as f64;
        assert!((mean - 0.5).abs() < 0.005, "{mean}");
        assert_ne!(uniform(1, 0, 0, 0), uniform(2, 0, 0, 0));
        assert_ne!(uniform(1, 0, 1, 0), uniform(1, 1, 0, 0));
        assert_eq!(uniform(9, 3, 4, 5), uniform(9, 3, 4, 5));
        // The same value `specsched.reference.rng_uniform(9, 3, 4, 5)` computes.
        assert_eq!(uniform(9, 3, 4, 5), 0.746020428803285);
    }
}
