//! Shared pieces of the fuzz targets: a byte reader that never fails (missing bytes read as
//! zero, so every input decodes to something) and the naive models the targets check the core
//! against. The models are written from DESIGN.md's definitions, as simply as possible.

use specsched_core::Tree;

/// Reads small values from the fuzzer's bytes; past the end it yields zeros.
pub struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes { data, pos: 0 }
    }
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }
    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    pub fn i32(&mut self) -> i32 {
        i32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(std::array::from_fn(|_| self.u8()))
    }
    /// A value in `0..n` (`n >= 1`).
    pub fn below(&mut self, n: usize) -> usize {
        self.u16() as usize % n.max(1)
    }
    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }
}

/// A valid tree of `1..=max_n` nodes: each node's parent is an earlier node, tokens from a
/// small alphabet (so verification walks actually match).
pub fn arb_tree(b: &mut Bytes<'_>, max_n: usize, alphabet: i64) -> Tree {
    let n = 1 + b.below(max_n);
    let mut parents = vec![-1i32];
    for i in 1..n {
        // Bias towards recent parents, so chains (deep trees) are as common as stars.
        let back = b.below(i) % if b.bool() { 2 } else { i };
        parents.push((i - 1 - back) as i32);
    }
    let tokens: Vec<i64> = (0..n).map(|_| b.u8() as i64 % alphabet).collect();
    Tree::new(&parents, &tokens).expect("arb_tree builds a valid tree")
}

/// Depth of every node by following parents to the root (no use of the core's depths).
pub fn model_depths(parents: &[i32]) -> Vec<usize> {
    (0..parents.len())
        .map(|i| {
            let mut d = 0;
            let mut v = i as i32;
            while parents[v as usize] >= 0 {
                v = parents[v as usize];
                d += 1;
            }
            d
        })
        .collect()
}

/// `anc[i][j]` iff `j` is `i` or an ancestor of `i`.
pub fn model_ancestors(parents: &[i32]) -> Vec<Vec<bool>> {
    let n = parents.len();
    let mut anc = vec![vec![false; n]; n];
    for (i, row) in anc.iter_mut().enumerate() {
        let mut v = i as i32;
        while v >= 0 {
            row[v as usize] = true;
            v = parents[v as usize];
        }
    }
    anc
}

/// Children of `v` in increasing index, by scanning parents.
pub fn model_children(parents: &[i32], v: usize) -> Vec<usize> {
    (0..parents.len())
        .filter(|&c| parents[c] == v as i32)
        .collect()
}

/// The greedy walk of DESIGN §4 with a per-node choice, done naively.
pub fn model_walk(parents: &[i32], tokens: &[i64], choice: &[i64]) -> (Vec<i32>, Vec<i64>) {
    let mut accepted = vec![0i32];
    let mut emitted = vec![];
    let mut v = 0usize;
    loop {
        let y = choice[v];
        emitted.push(y);
        match model_children(parents, v)
            .into_iter()
            .find(|&c| y >= 0 && tokens[c] == y)
        {
            Some(c) => {
                accepted.push(c as i32);
                v = c;
            }
            None => return (accepted, emitted),
        }
    }
}
