//! SuffixDecoding-class tree drafter: count-weighted suffix trees over each request's context
//! and over past responses.
//!
//! **Semantics.** An index holds token sequences and, for every string `w` of length at most
//! `max_depth`, its occurrence count `count(w)` (start positions `i` of any stored sequence with
//! `seq[i..i+|w|] == w`). To propose for a context `c`, each *match* — a suffix
//! `m = c[L-len..]`, `1 <= len <= max_depth - 1`, that occurs followed by at least one token
//! (`count(m x) > 0` for some `x`) — grows a proposal: candidates best-first by path
//! probability `count(m p) / C` with `C = sum_x count(m x)` (the occurrences of `m` that
//! continue; below the match it is the product of `count(child) / count(parent)`), ties to the
//! candidate discovered first, a node's children being discovered in (count descending, token
//! ascending) order; a candidate is kept only if its path probability is `>= min_prob` and
//! `|m p| <= max_depth`. At most `min(budget, floor(max_spec_factor * len))` draft nodes are
//! taken (`chain` mode follows only each node's first child). The score is the sum of the draft
//! nodes' path probabilities: the expected accepted length under the frequency model. The
//! proposal with the highest score is the index's, ties to the longer match (as
//! ArcticInference chooses: a long match is specific but leaves few levels under the depth
//! bound, a short one leaves room but spreads over more continuations). The per-request index
//! (prompt + generated tokens) and the global index (past responses) each propose; the higher
//! score wins, ties to the request's own index.
//!
//! **Structure, and why.** A depth-bounded suffix tree with full path compression, as in
//! SuffixDecoding: a node is a *chain* of consecutive points (depths `lo..=hi`) that share one
//! occurrence count, so nodes exist only where the tree branches or a count changes. A chain's
//! labels are not stored: the node names a reference occurrence `(sequence, start)` that runs
//! through the whole chain, and the label at depth `e` is that sequence's token `start + e - 1`.
//! A *tail* is a count-1 chain whose end follows its own occurrence (up to `max_depth` or the
//! end of that sequence). A node's children are found by scanning its sibling list, or, once
//! it has had `WIDE_MIN` children (`WIDE_MIN_DEPTH1` for the root's children), by one probe of
//! a linear-probing table keyed by `(node, token)`; the root's children, once the index holds
//! more tokens than the largest token id, by the token directly. Nodes are 28-byte structs in
//! one arena (one or two cache lines per node visited).
//!
//! An occurrence that ends (at the end of its sequence) makes the count drop right below it,
//! so every occurrence ends at the end of a node or inside its own tail. The open sequence
//! keeps its *active suffixes*, the occurrences that end at a node's end (at most
//! `max_depth - 1`); appending token `t` extends each of them by one point below its node `u`:
//! no child for `t` -> the suffix gets its own tail and retires; `u` has only that child and
//! `count(u) = count(child) + 1` (the suffix was the only difference) -> `u` absorbs the point
//! (the child's chain loses its first point, or merges into `u`); the child is a tail -> it
//! becomes a counted one-point node with the tail hung below; a one-point child -> count + 1;
//! otherwise the child is split after its first point. Following a repeat therefore moves node
//! boundaries instead of creating nodes: repeated text costs about one node per branching
//! point. Counts stay exact at every point, so proposals read counts directly and the
//! per-request match is the deepest active suffix (no search). Appending to another sequence
//! seals the open one; appending to a sealed one again re-derives its active suffixes.
//!
//! Eviction walks each occurrence of the removed sequence from the root, decrements the counts
//! it passes, frees nodes that reach 0 and re-points a node whose reference occurrence was
//! removed to its first child's. A node with no child left (its other occurrences all end at
//! its end) keeps reading the removed sequence's tokens: that sequence's token array stays
//! (counted by `memory_bytes`) until no node refers to it. Nodes are not re-merged on eviction.
//! The alternatives weighed: a suffix automaton is smaller on repetitive text but cannot forget
//! (the global index must evict) and needs end-position counts propagated along suffix links;
//! the previous design here, a trie with only count-1 tails compressed, materialized one node
//! per (repeated substring, length): 248 B per token on source code against ~58 B now.
//!
//! **Cost.** Append: O(active) steps per token, active < max_depth (~15 on average on 10^5
//! stdlib source bytes, ~20 on 10^6), each a few node reads (a child lookup is a sibling scan,
//! one table probe, or one array read at the root); the two common steps (a parent absorbing
//! one point, a one-point node counted once more) read and write only the two nodes. This
//! per-active work bounds the append rate on repetitive text: ~2,500 instructions per token
//! (~150 per step) on 10^5 stdlib bytes, plus cache misses on an index far larger than the
//! caches at 10^6: 1.2-1.9 M tokens/s on 10^6 stdlib bytes, 1.9-3.0 M/s on 10^5. On a large
//! vocabulary a token has ~2 steps, and their cache misses (the root's child, the probe below
//! it) are prefetched a few tokens ahead: 3.6-6.3 M/s (median 5.1) on 10^6 random 32k-vocab
//! tokens. (Best of 5 by thread CPU time on 2 shared, loaded cores: ranges over alternated
//! runs.) A long first sequence of an empty index (a request's prompt) skips the per-active
//! work when its first tokens show repetitive text (more than 3 steps per token): its
//! suffixes are sorted (SA-IS, with common prefixes capped at `max_depth`: `super::sort`) and
//! the tree is read off the LCP intervals of that order in one pass, O(n): 6.5-8.8 M/s on
//! 10^5 stdlib bytes and 5.0-7.2 M/s on 10^6 (online: 2-3 and 1.2-1.9).
//! Eviction of a sequence of n tokens: O(n * max_depth) (a wide node's child leaves its list in
//! O(1); a narrow node has at most a few children to scan).
//! Propose: the request's own matches are its active suffixes (no search); the global index's
//! lengths up to the longest that occurs (one walk when the whole context window occurs, a
//! binary search of walks otherwise), each then reached a node at a time (a suffix known to
//! occur takes each chain whole). An expansion is O(budget * children log) per match. The
//! search is cut short exactly: lengths are tried by decreasing score bound (drafts taken,
//! levels left) and stop at the first that cannot win; an expansion stops when the drafts it
//! has left cannot win; and the lengths whose match has the occurrences of one already grown
//! (its *group*: the same count) are settled by it unwalked (see `best_proposal`). On stdlib
//! bytes at max_depth 64: ~1.5-5 us per proposal, as for the longest match alone (a batch of
//! 64 requests' own indexes 1.3-1.4x: more of their matches are tried). It is still a search
//! over every length, and some inputs leave the bounds nothing to cut: when each shorter match
//! scores a little more (a run of one token: every length is its own group, and more
//! occurrences make a surer chain), or the budget far exceeds the levels (every length's
//! bound is its levels). Measured, budget 16: a 4000-token run of one token 25 us at
//! max_depth 64 (57 us with the same run cached in the global index, whose walks then visit
//! a node per token), 2.3 ms at 4096 (56 ms with the global index); a period-2 loop 14 us at
//! 64, 1.2 ms at 4096; budget 1000 at max_depth 64 on a run-length text, 2.1 ms. The longest
//! match alone cost 1-27 us on all of these, and drafted worse (that budget-1000 text:
//! score 22.5 from a 1-token match, against 31.0 from 33 tokens). Other cases: a context
//! that repeats a cached response up to 10 tokens before its end 4.0 us at max_depth 64, 65
//! us at 4096 (longest match: 2.4 and 18 us); a context joining two cached passages 43 us
//! at 4096, where trying lengths down from the longest took 12.6 ms.

use std::cmp::Ordering;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};

use rayon::prelude::*;

use super::{check_tokens, prefetch, sort};
use crate::error::{Error, Result};

const NIL: u32 = u32::MAX;
const ROOT: u32 = 0;
/// In `lo`: the node is a tail (count 1, its chain ends with its occurrence).
const TAIL: u16 = 1 << 15;
/// In `hi`: the node's children are indexed in `lookup` (it has had `WIDE_MIN` children).
const WIDE: u16 = 1 << 15;
const DEPTH: u16 = !(1 << 15);
/// Children at which a node's children enter the hash table; below, a lookup scans siblings.
const WIDE_MIN: usize = 8;
/// `WIDE_MIN` for the root's children (chains starting at depth 1), whose lists are scanned
/// for nearly every token on a large vocabulary: few of them (one per token id), so
/// indexing them early costs little memory.
const WIDE_MIN_DEPTH1: usize = 4;
/// How many tokens ahead an append prefetches the root's child.
const LOOKAHEAD: usize = 4;
/// A first append to an empty index of at least `SORTED_MIN` tokens appends its first `PROBE`
/// online; if that took more than `SORTED_STEPS` extension steps per token, the whole
/// sequence is indexed from its sorted suffixes instead (`SuffixIndex::index_sorted`, about
/// as costly as 6-8 online steps per token, whatever the text). Stdlib source bytes take ~5.5
/// steps per token over their first 2048 (15-20 over 10^5-10^6), random tokens from a 32k
/// vocabulary ~1.
const SORTED_MIN: usize = 8 * PROBE;
const PROBE: usize = 2048;
const SORTED_STEPS: usize = 3;

/// Largest `max_depth` accepted.
pub const MAX_DEPTH_LIMIT: i64 = 4096;

/// Hash of a `(table id, token)` key: a multiplicative mix (the keys are not adversarial:
/// token ids and arena indices; SipHash would dominate the append cost).
#[inline]
fn hkey(tid: u32, token: u32) -> u64 {
    let mut h = ((tid as u64) << 32 | token as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^= h >> 29;
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^ (h >> 32)
}

/// A free slot of `ChildTable` (no table id is `NIL`).
const EMPTY: u64 = u64::MAX;

/// Children of wide nodes, keyed by `(table id, first label)`: open addressing with linear
/// probing over 8-byte slots `(table id << 32) | child`, at most 7/8 full. The key's token is
/// the child's own `token`, so it is not stored: a probe reads a node only when the table id
/// matches. A probe touches one or two adjacent cache lines (a table with separate control
/// bytes touches two places), so an insert writes the line its probe just read, and a probe
/// can be prefetched. Removal shifts the rest of the cluster back (no tombstones).
#[derive(Debug, Clone, Default)]
struct ChildTable {
    /// A power of two in length, or empty.
    slots: Vec<u64>,
    len: usize,
}

impl ChildTable {
    fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes held.
    fn memory_bytes(&self) -> usize {
        self.slots.capacity() * 8
    }

    #[inline]
    fn home(&self, tid: u32, t: u32) -> usize {
        hkey(tid, t) as usize & (self.slots.len() - 1)
    }

    /// Slot index of the child with first label `t` in table `tid`.
    #[inline]
    fn position(&self, nodes: &[Node], tid: u32, t: u32) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(tid, t);
        loop {
            let e = self.slots[i];
            if e == EMPTY {
                return None;
            }
            if (e >> 32) as u32 == tid && nodes[e as u32 as usize].token == t {
                return Some(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// Starts loading the slot where a probe for `(tid, t)` begins.
    #[inline]
    fn prefetch(&self, tid: u32, t: u32) {
        if !self.slots.is_empty() {
            prefetch(&self.slots[self.home(tid, t)]);
        }
    }

    #[inline]
    fn get(&self, nodes: &[Node], tid: u32, t: u32) -> Option<u32> {
        self.position(nodes, tid, t).map(|i| self.slots[i] as u32)
    }

    /// Adds child `c` of table `tid` (not present; its `token` set).
    #[inline]
    fn insert(&mut self, nodes: &[Node], tid: u32, c: u32) {
        if (self.len + 1) * 8 > self.slots.len() * 7 {
            self.resize(nodes, (self.slots.len() * 2).max(16));
        }
        self.place(tid, nodes[c as usize].token, (tid as u64) << 32 | c as u64);
        self.len += 1;
    }

    #[inline]
    fn place(&mut self, tid: u32, t: u32, e: u64) {
        let mask = self.slots.len() - 1;
        let mut i = self.home(tid, t);
        while self.slots[i] != EMPTY {
            i = (i + 1) & mask;
        }
        self.slots[i] = e;
    }

    /// Drops the child with first label `t` (still its `token`) of table `tid`, if present.
    fn remove(&mut self, nodes: &[Node], tid: u32, t: u32) {
        let Some(mut hole) = self.position(nodes, tid, t) else {
            return;
        };
        let mask = self.slots.len() - 1;
        self.slots[hole] = EMPTY;
        self.len -= 1;
        // Backward shift: an entry after the hole moves into it unless its home lies
        // (cyclically) after the hole and at or before the entry itself.
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let e = self.slots[j];
            if e == EMPTY {
                return;
            }
            let home = self.home((e >> 32) as u32, nodes[e as u32 as usize].token);
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.slots[hole] = e;
                self.slots[j] = EMPTY;
                hole = j;
            }
        }
    }

    /// Room for `extra` more entries without growing.
    fn reserve(&mut self, nodes: &[Node], extra: usize) {
        let want = self.len + extra;
        if want * 8 > self.slots.len() * 7 {
            self.resize(nodes, (want * 8).div_ceil(7).next_power_of_two().max(16));
        }
    }

    /// Re-places every entry in `cap` slots. Each entry's hash needs its node's token (a
    /// cache miss on a large index): the nodes a few entries ahead are prefetched, so the
    /// misses overlap.
    fn resize(&mut self, nodes: &[Node], cap: usize) {
        const AHEAD: usize = 16;
        let old = std::mem::replace(&mut self.slots, vec![EMPTY; cap]);
        for (i, &e) in old.iter().enumerate() {
            if let Some(&a) = old.get(i + AHEAD) {
                if let Some(node) = nodes.get(a as u32 as usize) {
                    prefetch(node);
                }
            }
            if e != EMPTY {
                self.place((e >> 32) as u32, nodes[e as u32 as usize].token, e);
            }
        }
    }
}

/// Makes room for `extra` more elements, growing by a quarter rather than doubling (memory is
/// counted by capacity; the copies stay amortized O(1)).
#[inline]
fn reserve<T>(v: &mut Vec<T>, extra: usize) {
    if v.capacity() - v.len() < extra {
        v.reserve_exact(extra.max(v.len() / 4).max(16));
    }
}

#[derive(Debug, Default, Clone)]
struct Seq {
    tokens: Vec<u32>,
    /// (start, node) of the suffixes whose occurrence ends at a node's end (not in a tail),
    /// deepest first; valid only while this is the index's open sequence.
    active: Vec<(u32, u32)>,
    /// Removed, but some node still reads its labels from `tokens` (`refs` of them).
    dead: bool,
    refs: u32,
}

/// A position in the tree: node `node` at depth `depth`, `start(node) <= depth <= end(node)`
/// (the root at depth 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Locus {
    node: u32,
    depth: u32,
}

/// One node: a chain of points (depths `lo..=hi`) sharing one count, 28 bytes in one place
/// (one cache line touched per node visited).
#[derive(Debug, Clone, Copy)]
struct Node {
    /// Occurrence count shared by every point of the chain (1 for a tail; the root's is the
    /// number of indexed tokens).
    count: u32,
    /// Label of the chain's first point.
    token: u32,
    /// First child (`NIL`: none; a tail has none); a wide node's table id (`wide_heads`).
    first_child: u32,
    next_sib: u32,
    /// Previous sibling (`NIL`: the first child) when the parent is wide, so a child leaves a
    /// wide node's list in O(1) (eviction used to scan the root's tens of thousands of
    /// children for each node it freed); unused under a narrow parent, whose few children
    /// are scanned.
    prev_sib: u32,
    /// A reference occurrence `(sequence, start)` through the whole chain: the label of the
    /// point at depth `e` is `tokens(rseq)[rpos + e - 1]`. A tail's is its own occurrence.
    rseq: u32,
    rpos: u32,
    /// Depth of the first point | `TAIL`.
    lo: u16,
    /// Depth of the last point (tails: unused, the end follows the occurrence) | `WIDE`.
    hi: u16,
}

/// What `SuffixIndex::extend_fast` did with an active suffix.
enum Extended {
    /// It now ends at the end of this node.
    At(u32),
    /// It got its own tail (it is no longer active).
    Retired,
    /// Nothing: the general `extend` applies.
    Slow,
}

/// One path-compressed, depth-bounded suffix tree over a set of token sequences.
#[derive(Debug, Clone)]
pub struct SuffixIndex {
    max_depth: u32,
    /// The arena (index 0: the root).
    nodes: Vec<Node>,
    lookup: ChildTable,
    /// First child of each wide node, by table id (a wide node's `first_child` holds its
    /// table id, and `lookup` is keyed by it, so children move between nodes without re-keying).
    wide_heads: Vec<u32>,
    free_tids: Vec<u32>,
    /// The wide root's table id once its children are indexed by token in `root_kids`
    /// (`NIL`: not yet). The root is probed for every appended token; a direct index costs
    /// one array read instead of a hash probe (several cache misses on a large index). It
    /// is set up once the index holds more tokens than the largest token id seen, so it
    /// costs at most 4 bytes per indexed token; children with larger ids stay in `lookup`.
    dense_tid: u32,
    root_kids: Vec<u32>,
    /// Largest token appended so far.
    max_token: u32,
    free_nodes: Vec<u32>,
    seqs: Vec<Option<Seq>>,
    free_seqs: Vec<u32>,
    /// The sequence whose active suffixes are tracked (appending to another one seals it).
    open: Option<u32>,
    num_tokens: usize,
}

/// A proposal: a tree (root = last context token) in node order, parents before children.
#[derive(Debug, Clone, PartialEq)]
pub struct Proposal {
    pub parents: Vec<i32>,
    pub tokens: Vec<i64>,
    /// Path probability of each node (1 for the root).
    pub probs: Vec<f64>,
    pub score: f64,
    pub match_len: usize,
}

impl Proposal {
    /// The root alone, for a proposal from a match of `match_len` tokens to grow.
    fn reset(&mut self, root: u32, match_len: usize) {
        self.parents.clear();
        self.tokens.clear();
        self.probs.clear();
        self.parents.push(-1);
        self.tokens.push(root as i64);
        self.probs.push(1.0);
        self.score = 0.0;
        self.match_len = match_len;
    }

    /// The root alone, with room for `drafts` more nodes.
    fn with_room(root: u32, drafts: usize) -> Self {
        let mut p = Proposal {
            parents: Vec::with_capacity(drafts + 1),
            tokens: Vec::with_capacity(drafts + 1),
            probs: Vec::with_capacity(drafts + 1),
            score: 0.0,
            match_len: 0,
        };
        p.reset(root, 0);
        p
    }
}

/// Options of one proposal.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProposeOptions {
    pub budget: usize,
    pub min_prob: f64,
    pub max_spec_factor: f64,
    pub chain: bool,
}

impl ProposeOptions {
    pub fn new(budget: i64, min_prob: f64, max_spec_factor: f64, chain: bool) -> Result<Self> {
        if budget <= 0 {
            return Err(Error::value(
                "budget",
                format!("must be >= 1, got {budget}"),
            ));
        }
        if !(min_prob > 0.0 && min_prob <= 1.0) {
            return Err(Error::value(
                "min_prob",
                format!("must be in (0, 1], got {min_prob}"),
            ));
        }
        if !(max_spec_factor.is_finite() && max_spec_factor >= 0.0) {
            return Err(Error::value(
                "max_spec_factor",
                format!("must be finite and >= 0, got {max_spec_factor}"),
            ));
        }
        Ok(ProposeOptions {
            budget: budget.min(crate::tree::MAX_NODES as i64 - 1) as usize,
            min_prob,
            max_spec_factor,
            chain,
        })
    }
}

/// A candidate of the best-first search: higher count first, then earlier discovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cand {
    count: u32,
    order: u64,
    locus: Locus,
    parent: i32,
    token: u32,
}

impl Ord for Cand {
    fn cmp(&self, o: &Self) -> Ordering {
        self.count
            .cmp(&o.count)
            .then_with(|| o.order.cmp(&self.order))
    }
}

impl PartialOrd for Cand {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// Buffers of the best-first expansions of one proposal, reused from one match to the next.
#[derive(Default)]
struct Expansion {
    kids: Vec<(u32, u32, Locus)>,
    heap: BinaryHeap<Cand>,
    /// Candidates discovered so far (ties go to the first discovered).
    order: u64,
}

/// The largest `d` in `0..=most` with `holds(d)`, for a `holds` true at 0 and true up to some
/// point only: doubling steps, then a binary search in the last one (O(log d) calls).
fn gallop(most: usize, holds: impl Fn(usize) -> bool) -> usize {
    let (mut good, mut step) = (0, 1);
    let mut bad = loop {
        if good == most {
            return most;
        }
        let probe = (good + step).min(most);
        if !holds(probe) {
            break probe;
        }
        good = probe;
        step *= 2;
    };
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        if holds(mid) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    good
}

/// Children `(count, token, locus)` in the order a proposal discovers them: count descending,
/// token ascending.
fn discovery_order(kids: &mut [(u32, u32, Locus)]) {
    kids.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
}

/// Pushes the children `kids` of draft node `parent` whose path probability (count over
/// `c0`) is at least `min_prob` (only the first in chain mode).
fn push_candidates(
    heap: &mut BinaryHeap<Cand>,
    kids: &[(u32, u32, Locus)],
    parent: i32,
    c0: f64,
    opt: &ProposeOptions,
    order: &mut u64,
) {
    for &(count, token, locus) in kids.iter().filter(|k| k.0 as f64 / c0 >= opt.min_prob) {
        heap.push(Cand {
            count,
            order: *order,
            locus,
            parent,
            token,
        });
        *order += 1;
        if opt.chain {
            break;
        }
    }
}

/// The candidate matches of one proposal, longest first, as
/// [`SuffixIndex::best_proposal`] reads them. A match's *group* are the candidate lengths
/// with its count: they have its occurrences (each of a longer one's ends a shorter one).
trait Candidates {
    /// How many candidate lengths there are.
    fn count(&self) -> usize;
    /// The `i`-th longest.
    fn len_at(&self, i: usize) -> usize;
    /// Its locus (`None`: no match of that length).
    fn locus(&self, i: usize) -> Option<Locus>;
    /// The shortest candidate length in the group of the `i`-th, whose locus is `m`.
    fn floor(&self, i: usize, m: Locus) -> usize;
    /// The longest candidate length in that group.
    fn ceiling(&self, i: usize, m: Locus) -> usize;
    /// The longest candidate length in `lo..=hi` (`lo` is one).
    fn longest_within(&self, lo: usize, hi: usize) -> usize;
}

/// The open sequence's own matches, read off its active suffixes. A group is a run of one
/// count in this order (counts only grow as matches shorten), found by scanning from a member
/// when a settled match first needs it.
struct OwnCandidates<'a> {
    index: &'a SuffixIndex,
    matches: Vec<(usize, Locus)>,
}

impl OwnCandidates<'_> {
    fn count_at(&self, i: usize) -> u32 {
        self.index.node_count(self.matches[i].1.node)
    }
}

impl Candidates for OwnCandidates<'_> {
    fn count(&self) -> usize {
        self.matches.len()
    }

    fn len_at(&self, i: usize) -> usize {
        self.matches[i].0
    }

    fn locus(&self, i: usize) -> Option<Locus> {
        Some(self.matches[i].1)
    }

    fn floor(&self, i: usize, _: Locus) -> usize {
        let c = self.count_at(i);
        let last = (i..self.matches.len())
            .take_while(|&j| self.count_at(j) == c)
            .last()
            .unwrap_or(i);
        self.len_at(last)
    }

    fn ceiling(&self, i: usize, _: Locus) -> usize {
        let c = self.count_at(i);
        let first = (0..=i)
            .rev()
            .take_while(|&j| self.count_at(j) == c)
            .last()
            .unwrap_or(i);
        self.len_at(first)
    }

    fn longest_within(&self, lo: usize, hi: usize) -> usize {
        let first = self.matches.partition_point(|&(n, _)| n > hi);
        self.matches.get(first).map_or(lo, |&(n, _)| n.max(lo))
    }
}

/// The suffixes of a context in an index that does not hold it: every length up to the
/// longest that occurs, reached from the root.
struct ContextCandidates<'a> {
    index: &'a SuffixIndex,
    context: &'a [u32],
    /// The longest suffix length that occurs (a suffix of an occurring string occurs).
    occurring: usize,
}

impl ContextCandidates<'_> {
    fn same_count(&self, m: Locus, len: usize) -> bool {
        self.index
            .descend_occurring(self.context, len)
            .is_some_and(|l| self.index.node_count(l.node) == self.index.node_count(m.node))
    }
}

impl Candidates for ContextCandidates<'_> {
    fn count(&self) -> usize {
        self.occurring
    }

    fn len_at(&self, i: usize) -> usize {
        self.occurring - i
    }

    fn locus(&self, i: usize) -> Option<Locus> {
        let len = self.len_at(i);
        self.index
            .descend_occurring(self.context, len)
            .filter(|&l| self.index.has_continuation(l))
    }

    // Counts fall as the length grows: a galloping search on each side, O(log) walks in the
    // distance to the group's end.
    fn floor(&self, i: usize, m: Locus) -> usize {
        let len = self.len_at(i);
        len - gallop(len - 1, |d| self.same_count(m, len - d))
    }

    fn ceiling(&self, i: usize, m: Locus) -> usize {
        let len = self.len_at(i);
        len + gallop(self.occurring - len, |d| self.same_count(m, len + d))
    }

    fn longest_within(&self, lo: usize, hi: usize) -> usize {
        hi.min(self.occurring).max(lo)
    }
}

/// How an expansion ended.
#[derive(Debug, Clone, Copy, Default)]
struct Grew {
    /// It took every draft it could (false: it gave up, unable to win).
    finished: bool,
    /// Some node it took sits at the index's depth bound, where children are not stored.
    depth_cut: bool,
    /// It ran out of candidates before its limit: every node it took had its children
    /// considered, and none is left.
    exhausted: bool,
    /// Depth below the match of the deepest draft it took.
    deepest: usize,
}

/// The best proposal so far, as another must beat it: a higher score, or the same score from
/// a longer match.
#[derive(Debug, Clone, Copy)]
struct ToBeat {
    score: f64,
    match_len: usize,
}

impl ToBeat {
    fn beaten_by(self, score: f64, match_len: usize) -> bool {
        score > self.score || (score == self.score && match_len > self.match_len)
    }

    /// Whether a proposal from a match of length `match_len` scoring at most `bound` loses.
    fn out_of_reach(self, bound: f64, match_len: usize) -> bool {
        !self.beaten_by(bound, match_len)
    }
}

impl SuffixIndex {
    pub fn new(max_depth: i64) -> Result<Self> {
        if !(1..=MAX_DEPTH_LIMIT).contains(&max_depth) {
            return Err(Error::value(
                "max_depth",
                format!("must be in [1, {MAX_DEPTH_LIMIT}], got {max_depth}"),
            ));
        }
        Ok(SuffixIndex {
            max_depth: max_depth as u32,
            nodes: vec![Node {
                count: 0,
                token: NIL,
                first_child: NIL,
                next_sib: NIL,
                prev_sib: NIL,
                rseq: NIL,
                rpos: 0,
                lo: 0,
                hi: 0,
            }],
            lookup: ChildTable::default(),
            wide_heads: Vec::new(),
            free_tids: Vec::new(),
            dense_tid: NIL,
            root_kids: Vec::new(),
            max_token: 0,
            free_nodes: Vec::new(),
            seqs: Vec::new(),
            free_seqs: Vec::new(),
            open: None,
            num_tokens: 0,
        })
    }

    pub fn max_depth(&self) -> usize {
        self.max_depth as usize
    }

    /// Tokens indexed over all sequences.
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    /// Live tree nodes (root included).
    pub fn num_nodes(&self) -> usize {
        self.nodes.len() - self.free_nodes.len()
    }

    /// Heap bytes held (arena, hash table, sequences), by capacity.
    pub fn memory_bytes(&self) -> usize {
        let arena = self.nodes.capacity() * std::mem::size_of::<Node>()
            + (self.free_nodes.capacity()
                + self.wide_heads.capacity()
                + self.free_tids.capacity()
                + self.root_kids.capacity())
                * 4;
        let table = self.lookup.memory_bytes();
        let seqs: usize = self
            .seqs
            .iter()
            .flatten()
            .map(|s| s.tokens.capacity() * 4 + s.active.capacity() * 8)
            .sum();
        arena + table + seqs + self.seqs.capacity() * std::mem::size_of::<Option<Seq>>()
    }

    pub fn seq_tokens(&self, seq: u32) -> &[u32] {
        &self.seqs[seq as usize]
            .as_ref()
            .expect("live sequence")
            .tokens
    }

    /// Opens an empty sequence and returns its id.
    pub fn add_seq(&mut self) -> u32 {
        let seq = Seq::default();
        match self.free_seqs.pop() {
            Some(id) => {
                self.seqs[id as usize] = Some(seq);
                id
            }
            None => {
                self.seqs.push(Some(seq));
                (self.seqs.len() - 1) as u32
            }
        }
    }

    #[inline]
    fn is_tail(&self, v: u32) -> bool {
        self.nodes[v as usize].lo & TAIL != 0
    }

    #[inline]
    fn is_wide(&self, v: u32) -> bool {
        self.nodes[v as usize].hi & WIDE != 0
    }

    /// Depth of the node's last point.
    #[inline]
    fn end(&self, v: u32) -> u32 {
        let i = v as usize;
        if self.nodes[i].lo & TAIL != 0 {
            let len = self.seq_tokens(self.nodes[i].rseq).len() as u32;
            let e = self.max_depth.min(len - self.nodes[i].rpos);
            debug_assert!((self.nodes[i].lo & DEPTH) as u32 <= e, "empty tail {v}");
            e
        } else {
            (self.nodes[i].hi & DEPTH) as u32
        }
    }

    /// Label of the point at depth `e` of node `v`'s chain.
    #[inline]
    fn label(&self, v: u32, e: u32) -> u32 {
        let i = v as usize;
        self.seq_tokens(self.nodes[i].rseq)[(self.nodes[i].rpos + e - 1) as usize]
    }

    /// Occurrence count of any node (1 for a tail).
    #[inline]
    fn node_count(&self, node: u32) -> u32 {
        self.nodes[node as usize].count
    }

    /// Child with first label `t` in wide table `tid`.
    #[inline]
    fn wget(&self, tid: u32, t: u32) -> Option<u32> {
        if tid == self.dense_tid {
            if let Some(&c) = self.root_kids.get(t as usize) {
                return (c != NIL).then_some(c);
            }
        }
        self.lookup.get(&self.nodes, tid, t)
    }

    /// Indexes child `c` (its `token` set) in wide table `tid`.
    #[inline]
    fn winsert(&mut self, tid: u32, c: u32) {
        let nodes = &self.nodes;
        let t = nodes[c as usize].token;
        if tid == self.dense_tid {
            if let Some(slot) = self.root_kids.get_mut(t as usize) {
                *slot = c;
                return;
            }
        }
        self.lookup.insert(nodes, tid, c);
    }

    /// Drops the child with first label `t` (still its `token`) from wide table `tid`.
    #[inline]
    fn wremove(&mut self, tid: u32, t: u32) {
        if tid == self.dense_tid {
            if let Some(slot) = self.root_kids.get_mut(t as usize) {
                *slot = NIL;
                return;
            }
        }
        self.lookup.remove(&self.nodes, tid, t);
    }

    /// Moves the wide root's children from `lookup` to the direct index `root_kids`
    /// (ids up to the largest seen, fewer than the indexed tokens).
    fn densify_root(&mut self) {
        debug_assert!(self.is_wide(ROOT) && self.dense_tid == NIL);
        let tid = self.nodes[ROOT as usize].first_child;
        let mut kids = vec![NIL; self.max_token as usize + 1];
        let mut c = self.head(ROOT);
        while c != NIL {
            let t = self.nodes[c as usize].token;
            if let Some(slot) = kids.get_mut(t as usize) {
                self.wremove(tid, t);
                *slot = c;
            }
            c = self.nodes[c as usize].next_sib;
        }
        self.root_kids = kids;
        self.dense_tid = tid;
    }

    /// First child of `u` (`NIL`: none).
    #[inline]
    fn head(&self, u: u32) -> u32 {
        let n = &self.nodes[u as usize];
        if n.hi & WIDE != 0 {
            self.wide_heads[n.first_child as usize]
        } else {
            n.first_child
        }
    }

    #[inline]
    fn set_head(&mut self, u: u32, h: u32) {
        let n = &mut self.nodes[u as usize];
        if n.hi & WIDE != 0 {
            self.wide_heads[n.first_child as usize] = h;
        } else {
            n.first_child = h;
        }
    }

    /// Wide node `u` has no child left: it becomes narrow (and childless).
    fn drop_wide(&mut self, u: u32) {
        let n = &mut self.nodes[u as usize];
        if n.hi & WIDE != 0 {
            if n.first_child == self.dense_tid {
                self.dense_tid = NIL;
                self.root_kids = Vec::new();
            }
            self.free_tids.push(n.first_child);
            n.hi &= !WIDE;
            n.first_child = NIL;
        }
    }

    /// Child of `u` whose first label is `t`, and (when `u` is narrow) how many children
    /// were scanned.
    #[inline]
    fn find_child(&self, u: u32, t: u32) -> (Option<u32>, usize) {
        let first = self.nodes[u as usize].first_child;
        if self.is_wide(u) {
            return (self.wget(first, t), 0);
        }
        let mut c = first;
        let mut n = 0;
        while c != NIL {
            if self.nodes[c as usize].token == t {
                return (Some(c), n);
            }
            n += 1;
            c = self.nodes[c as usize].next_sib;
        }
        (None, n)
    }

    /// `find_child` for appends: a child found by scanning moves to the front of the sibling
    /// list, so the continuations followed most are found first (the order of siblings means
    /// nothing else: `children` sorts).
    #[inline]
    fn find_child_mtf(&mut self, u: u32, t: u32) -> (Option<u32>, usize) {
        let first = self.nodes[u as usize].first_child;
        if self.is_wide(u) {
            return (self.wget(first, t), 0);
        }
        let mut prev = NIL;
        let mut c = first;
        let mut n = 0;
        while c != NIL {
            if self.nodes[c as usize].token == t {
                if prev != NIL {
                    self.nodes[prev as usize].next_sib = self.nodes[c as usize].next_sib;
                    self.nodes[c as usize].next_sib = first;
                    self.nodes[u as usize].first_child = c;
                }
                return (Some(c), n);
            }
            n += 1;
            prev = c;
            c = self.nodes[c as usize].next_sib;
        }
        (None, n)
    }

    /// Allocates a node (not linked anywhere).
    #[allow(clippy::too_many_arguments)]
    fn alloc(
        &mut self,
        count: u32,
        token: u32,
        first_child: u32,
        rs: (u32, u32),
        lo: u16,
        hi: u16,
    ) -> u32 {
        self.acquire_ref(rs.0);
        let node = Node {
            count,
            token,
            first_child,
            next_sib: NIL,
            prev_sib: NIL,
            rseq: rs.0,
            rpos: rs.1,
            lo,
            hi,
        };
        match self.free_nodes.pop() {
            Some(id) => {
                self.nodes[id as usize] = node;
                id
            }
            None => {
                reserve(&mut self.nodes, 1);
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    /// A node starts reading labels from sequence `s`.
    #[inline]
    fn acquire_ref(&mut self, s: u32) {
        if let Some(sq) = self.seqs[s as usize].as_mut() {
            if sq.dead {
                sq.refs += 1;
            }
        }
    }

    /// A node stops reading labels from sequence `s`: a removed sequence nobody reads is freed.
    #[inline]
    fn release_ref(&mut self, s: u32) {
        let slot = &mut self.seqs[s as usize];
        if let Some(sq) = slot.as_mut() {
            if sq.dead {
                sq.refs -= 1;
                if sq.refs == 0 {
                    *slot = None;
                    self.free_seqs.push(s);
                }
            }
        }
    }

    /// Frees node `v` (already unlinked), releasing its reference when `release`.
    fn free_node(&mut self, v: u32, release: bool) {
        let i = v as usize;
        if release {
            self.release_ref(self.nodes[i].rseq);
        }
        self.drop_wide(v);
        self.nodes[i].count = 0;
        self.nodes[i].first_child = NIL;
        self.nodes[i].lo = 0;
        self.nodes[i].hi = 0;
        self.free_nodes.push(v);
    }

    /// Links `v` as a child of `u`, which had `kids` children (exact when `u` is narrow).
    fn link_child(&mut self, u: u32, v: u32, kids: usize) {
        let ui = u as usize;
        let old = self.head(u);
        self.nodes[v as usize].next_sib = old;
        self.set_head(u, v);
        if self.is_wide(u) {
            self.nodes[v as usize].prev_sib = NIL;
            if old != NIL {
                self.nodes[old as usize].prev_sib = v;
            }
            let tid = self.nodes[ui].first_child;
            self.winsert(tid, v);
        } else if kids + 1
            >= if self.nodes[ui].lo & DEPTH == 1 {
                WIDE_MIN_DEPTH1
            } else {
                WIDE_MIN
            }
        {
            let tid = match self.free_tids.pop() {
                Some(tid) => {
                    self.wide_heads[tid as usize] = v;
                    tid
                }
                None => {
                    self.wide_heads.push(v);
                    (self.wide_heads.len() - 1) as u32
                }
            };
            self.nodes[ui].first_child = tid;
            self.nodes[ui].hi |= WIDE;
            let (mut prev, mut c) = (NIL, v);
            while c != NIL {
                self.winsert(tid, c);
                self.nodes[c as usize].prev_sib = prev;
                prev = c;
                c = self.nodes[c as usize].next_sib;
            }
        }
    }

    /// Unlinks child `v` from `u`: O(1) under a wide `u` (siblings know their predecessor),
    /// a scan of `u`'s few children otherwise. Eviction only.
    fn unlink_child(&mut self, u: u32, v: u32) {
        let i = v as usize;
        let next = self.nodes[i].next_sib;
        if self.is_wide(u) {
            let tid = self.nodes[u as usize].first_child;
            self.wremove(tid, self.nodes[i].token);
            let prev = self.nodes[i].prev_sib;
            if next != NIL {
                self.nodes[next as usize].prev_sib = prev;
            }
            if prev != NIL {
                self.nodes[prev as usize].next_sib = next;
            } else {
                self.set_head(u, next);
                if next == NIL {
                    self.drop_wide(u);
                }
            }
            return;
        }
        let mut c = self.head(u);
        if c == v {
            self.set_head(u, next);
            if next == NIL {
                self.drop_wide(u);
            }
        } else {
            while self.nodes[c as usize].next_sib != v {
                c = self.nodes[c as usize].next_sib;
            }
            self.nodes[c as usize].next_sib = next;
        }
    }

    /// Child `v` of `u` gets a new first label `t`.
    #[inline]
    fn relabel(&mut self, u: u32, v: u32, t: u32) {
        let i = v as usize;
        if self.is_wide(u) {
            let tid = self.nodes[u as usize].first_child;
            self.wremove(tid, self.nodes[i].token);
            self.nodes[i].token = t;
            self.winsert(tid, v);
        }
        self.nodes[i].token = t;
    }

    /// Tail node for occurrence `(seq, j)` starting at depth `start` under `u`.
    fn new_tail(&mut self, u: u32, kids: usize, (seq, j): (u32, u32), start: u32, t: u32) {
        let v = self.alloc(1, t, NIL, (seq, j), start as u16 | TAIL, 0);
        self.link_child(u, v, kids);
    }

    /// Appends already checked tokens to sequence `seq`.
    pub fn append(&mut self, seq: u32, tokens: &[u32]) {
        if self.num_tokens == 0 && self.num_nodes() == 1 && tokens.len() >= SORTED_MIN {
            // A long first sequence: its first tokens go in online, counting the steps; on
            // repetitive text (many active suffixes per token) the index is rebuilt from
            // the sorted suffixes, which costs the same whatever the text.
            let (probe, rest) = tokens.split_at(PROBE);
            let steps = self.append_run(seq, probe);
            if steps > SORTED_STEPS * PROBE {
                self.clear(seq);
                self.index_sorted(seq, tokens);
            } else {
                self.append_long(seq, rest);
            }
            return;
        }
        self.append_long(seq, tokens);
    }

    fn append_long(&mut self, seq: u32, tokens: &[u32]) {
        // A long append would grow the wide-child table by doubling, and every rehash reads
        // each entry's token from its node. Index an eighth first, then size the table once
        // for the rest at the hashed-children-per-token rate so far.
        const BULK: usize = 1 << 16;
        if tokens.len() >= BULK {
            let (head, rest) = tokens.split_at(tokens.len() / 8);
            self.append_run(seq, head);
            let rate = self.lookup.len() as f64 / self.num_tokens.max(1) as f64;
            self.lookup
                .reserve(&self.nodes, (rate * 1.05 * rest.len() as f64) as usize);
            self.append_run(seq, rest);
        } else {
            self.append_run(seq, tokens);
        }
    }

    /// Forgets every token of an index that holds only `seq` (which stays, empty).
    fn clear(&mut self, seq: u32) {
        let mut empty = SuffixIndex::new(self.max_depth as i64).expect("a valid max_depth");
        let sq = self.seqs[seq as usize].as_mut().expect("live sequence");
        sq.tokens.clear();
        sq.active.clear();
        empty.seqs = std::mem::take(&mut self.seqs);
        empty.free_seqs = std::mem::take(&mut self.free_seqs);
        *self = empty;
    }

    /// Links `children` (in order) under `v`, whose fields are final; if that makes `v` wide,
    /// they go to `wide` instead, to be linked once the wide-child table is sized.
    fn adopt(&mut self, v: u32, children: &[u32], wide: &mut Vec<(u32, u32)>) {
        let min = if self.nodes[v as usize].lo & DEPTH == 1 {
            WIDE_MIN_DEPTH1
        } else {
            WIDE_MIN
        };
        if children.len() >= min {
            wide.extend(children.iter().map(|&c| (v, c)));
        } else {
            for (kids, &c) in children.iter().enumerate() {
                self.link_child(v, c, kids);
            }
        }
    }

    /// Indexes the first tokens of an empty index from its suffixes sorted by their first
    /// `max_depth` tokens: the suffix tree's nodes are the LCP intervals of that order, so
    /// one left-to-right pass with a stack of open intervals builds the same tree the online
    /// appends would (one node per distinct chain, its count the interval's width), with no
    /// per-suffix walk. Then `seq` is the open sequence, its active suffixes derived.
    fn index_sorted(&mut self, seq: u32, tokens: &[u32]) {
        debug_assert!(self.num_tokens == 0 && self.num_nodes() == 1);
        if let Some(o) = self.open.filter(|&o| o != seq) {
            self.seal(o);
        }
        let n = tokens.len();
        let d = self.max_depth;
        let (sa, lcp) = sort::truncated_suffix_array(tokens, d as usize);
        self.seqs[seq as usize]
            .as_mut()
            .expect("live sequence")
            .tokens
            .extend_from_slice(tokens);
        self.num_tokens = n;
        self.max_token = tokens.iter().copied().max().unwrap_or(0);
        self.nodes[ROOT as usize].count = n as u32;
        let len_from = |i: u32| d.min(n as u32 - i);
        // Open intervals on the current path: (lcp, first suffix, node, first pending child).
        // An interval's node is allocated when it opens and filled in when it closes (its
        // width and its parent's lcp, its chain's start, are known then). Its children wait on
        // `pending` and are linked as it closes, while they are likely still in cache; those
        // of a node with enough children for the wide-child table wait in `wide` until the
        // pass ends, so that the table is sized once.
        let mut open: Vec<(u32, u32, u32, u32)> = vec![(0, 0, ROOT, 0)];
        let mut pending: Vec<u32> = Vec::new();
        let mut wide: Vec<(u32, u32)> = Vec::new();
        // A fresh arena: nodes are pushed, with no free list to consult and no reference to
        // count (`seq` is live).
        debug_assert!(self.free_nodes.is_empty());
        // At most one node per interval and one tail per suffix: reserved once (pages are
        // touched only as nodes are written) and shrunk to what was used, which costs less
        // than growing the arena step by step.
        self.nodes.reserve_exact(2 * n + 1);
        let push = |idx: &mut Self, count: u32, token: u32, rpos: u32, lo: u16| {
            idx.nodes.push(Node {
                count,
                token,
                first_child: NIL,
                next_sib: NIL,
                prev_sib: NIL,
                rseq: seq,
                rpos,
                lo,
                hi: 0,
            });
            (idx.nodes.len() - 1) as u32
        };
        let placeholder = |idx: &mut Self| push(idx, 0, 0, 0, 0);
        for k in 0..n {
            // The label read below for a suffix further on (random in `tokens`).
            if let (Some(&a), Some(&l)) = (sa.get(k + 8), lcp.get(k + 8)) {
                if let Some(t) = tokens.get((a + l) as usize) {
                    prefetch(t);
                }
            }
            // lcp with the next suffix (0 after the last: every interval closes).
            let next = lcp.get(k + 1).copied().unwrap_or(0);
            if next > open[open.len() - 1].0 {
                let v = placeholder(self);
                open.push((next, k as u32, v, pending.len() as u32));
            }
            // Suffix k hangs below the deeper of its two neighbours' intervals: a tail for
            // what it has beyond that interval, nothing if it ends there.
            let pl = open[open.len() - 1].0;
            let p = sa[k];
            if len_from(p) > pl {
                let lo = pl + 1;
                let v = push(self, 1, tokens[(p + lo - 1) as usize], p, lo as u16 | TAIL);
                pending.push(v);
            }
            while next < open[open.len() - 1].0 {
                let (l, lb, v, first) = open.pop().expect("the root interval stays open");
                if next > open[open.len() - 1].0 {
                    // A shallower interval starts where this one did: its first child.
                    let w = placeholder(self);
                    open.push((next, lb, w, first));
                }
                let pl = open[open.len() - 1].0;
                let r = sa[lb as usize];
                let lo = pl + 1;
                let node = &mut self.nodes[v as usize];
                node.count = k as u32 + 1 - lb;
                node.token = tokens[(r + lo - 1) as usize];
                node.rpos = r;
                node.lo = lo as u16;
                node.hi = l as u16;
                self.adopt(v, &pending[first as usize..], &mut wide);
                pending.truncate(first as usize);
                pending.push(v);
            }
        }
        self.adopt(ROOT, &pending, &mut wide);
        drop(pending);
        self.nodes.shrink_to_fit();
        self.lookup.reserve(&self.nodes, wide.len());
        let mut kids = 0;
        for (i, &(p, c)) in wide.iter().enumerate() {
            // A wide node's children are consecutive.
            kids = if i > 0 && wide[i - 1].0 == p {
                kids + 1
            } else {
                0
            };
            self.link_child(p, c, kids);
        }
        if self.num_tokens > self.max_token as usize && self.is_wide(ROOT) {
            self.densify_root();
        }
        self.open = Some(seq);
        self.reactivate(seq);
    }

    /// Returns the extension steps taken (active suffixes extended, summed over tokens).
    fn append_run(&mut self, seq: u32, tokens: &[u32]) -> usize {
        if self.open != Some(seq) {
            if let Some(o) = self.open {
                self.seal(o);
            }
            self.reactivate(seq);
            self.open = Some(seq);
        }
        let s = seq as usize;
        let sq = self.seqs[s].as_mut().expect("live sequence");
        reserve(&mut sq.tokens, tokens.len());
        let mut active = std::mem::take(&mut sq.active);
        let maxd = self.max_depth;
        let mut steps = 0;
        for (i, &t) in tokens.iter().enumerate() {
            // Upcoming steps near the root, started early so that their cache misses
            // overlap with this token's work (the index is far larger than the caches): the
            // root's child for the token LOOKAHEAD places ahead, and the child lookup of the
            // step two tokens ahead below the root's child for the token after this one.
            if self.dense_tid != NIL {
                if let Some(&c) = tokens
                    .get(i + LOOKAHEAD)
                    .and_then(|&a| self.root_kids.get(a as usize))
                {
                    if let Some(node) = self.nodes.get(c as usize) {
                        prefetch(node);
                    }
                }
                if let (Some(&a1), Some(&a2)) = (tokens.get(i + 1), tokens.get(i + 2)) {
                    if let Some(node) = self
                        .root_kids
                        .get(a1 as usize)
                        .and_then(|&c| self.nodes.get(c as usize))
                    {
                        if node.hi & WIDE != 0 {
                            self.lookup.prefetch(node.first_child, a2);
                        } else if let Some(first) = self.nodes.get(node.first_child as usize) {
                            prefetch(first);
                        }
                    }
                }
            }
            let n = {
                let sq = self.seqs[s].as_mut().expect("live sequence");
                sq.tokens.push(t);
                (sq.tokens.len() - 1) as u32
            };
            self.num_tokens += 1;
            self.max_token = self.max_token.max(t);
            if self.dense_tid == NIL
                && self.num_tokens > self.max_token as usize
                && self.is_wide(ROOT)
            {
                self.densify_root();
            }
            self.nodes[ROOT as usize].count += 1;
            active.push((n, ROOT));
            steps += active.len();
            let mut kept = 0;
            for r in 0..active.len() {
                let (j, u) = active[r];
                // u ends at depth d; the occurrence j now reaches depth d + 1, labelled t.
                let d = n - j;
                debug_assert_eq!(self.end(u), d);
                let at = match self.extend_fast(seq, j, u, d, t) {
                    Extended::At(at) => at,
                    Extended::Retired => continue,
                    Extended::Slow => match self.extend(seq, (j, u), n, t, &mut active[..kept]) {
                        Some(at) => at,
                        None => continue,
                    },
                };
                if d + 1 < maxd {
                    active[kept] = (j, at);
                    kept += 1;
                }
            }
            active.truncate(kept);
        }
        self.seqs[s].as_mut().expect("live sequence").active = active;
        steps
    }

    /// `extend` for its two common cases, decided and applied on the two nodes alone (no
    /// list, table or arena change): `t`'s child `v` of `u` (first in a narrow `u`'s list, or
    /// found in a wide `u`'s table) gives `u` one more point (the absorb case, `u` narrow, its
    /// labels already read from `seq`, `v` keeping a point), or `v` is a one-point node counted
    /// once more; or a wide `u` has no child for `t` (a new tail). `Slow`: nothing was
    /// changed, `extend` decides.
    #[inline(always)]
    fn extend_fast(&mut self, seq: u32, j: u32, u: u32, d: u32, t: u32) -> Extended {
        let nu = self.nodes[u as usize];
        let wide = nu.hi & WIDE != 0;
        let v = if wide {
            match self.wget(nu.first_child, t) {
                Some(v) => v,
                None => {
                    self.new_tail(u, 0, (seq, j), d + 1, t);
                    return Extended::Retired;
                }
            }
        } else {
            nu.first_child
        };
        let Some(&nv) = self.nodes.get(v as usize) else {
            return Extended::Slow;
        };
        if nv.token != t {
            return Extended::Slow;
        }
        if u != ROOT && nv.next_sib == NIL && nu.count == nv.count + 1 {
            // The absorb case (see `extend`) when `u` is narrow (`v` is its only child).
            if wide || nu.rseq != seq {
                return Extended::Slow;
            }
            let toks = &self.seqs[nv.rseq as usize]
                .as_ref()
                .expect("live sequence")
                .tokens;
            let v_end = if nv.lo & TAIL != 0 {
                self.max_depth.min(toks.len() as u32 - nv.rpos)
            } else {
                (nv.hi & DEPTH) as u32
            };
            if v_end == d + 1 {
                return Extended::Slow;
            }
            // label(v, d + 2)
            let x = toks[(nv.rpos + d + 1) as usize];
            let nu = &mut self.nodes[u as usize];
            nu.rpos = j;
            nu.hi = (d + 1) as u16;
            let nv = &mut self.nodes[v as usize];
            nv.lo = (d + 2) as u16 | (nv.lo & TAIL);
            nv.token = x;
            return Extended::At(u);
        }
        if nv.lo & TAIL == 0 && (nv.hi & DEPTH) as u32 == d + 1 {
            self.nodes[v as usize].count += 1;
            return Extended::At(v);
        }
        Extended::Slow
    }

    /// Extends active suffix `(j, u)` by `t`, the token at position `n`, in every case;
    /// `done`: the suffixes already extended by `t`. Returns the node the suffix now ends
    /// at, or `None` when it got its own tail (it is no longer active).
    fn extend(
        &mut self,
        seq: u32,
        (j, u): (u32, u32),
        n: u32,
        t: u32,
        done: &mut [(u32, u32)],
    ) -> Option<u32> {
        let d = n - j;
        let (found, kids) = self.find_child_mtf(u, t);
        let Some(v) = found else {
            // First occurrence of this string: j's own tail; j retires.
            self.new_tail(u, kids, (seq, j), d + 1, t);
            return None;
        };
        let (ui, vi) = (u as usize, v as usize);
        let at = if u != ROOT
            && self.head(u) == v
            && self.nodes[vi].next_sib == NIL
            && self.nodes[ui].count == self.nodes[vi].count + 1
        {
            // u's count differs from its only child's by j alone: u absorbs the point
            // and reads its labels from j (u's reference may be a removed occurrence
            // that stops at u's end).
            let v_end = self.end(v);
            if self.nodes[ui].rseq != seq {
                self.release_ref(self.nodes[ui].rseq);
                self.nodes[ui].rseq = seq;
            }
            self.nodes[ui].rpos = j;
            if v_end == d + 1 {
                if self.is_wide(u) {
                    let tid = self.nodes[ui].first_child;
                    self.wremove(tid, t);
                    self.drop_wide(u);
                }
                if self.is_tail(v) {
                    self.nodes[ui].first_child = NIL;
                    self.nodes[ui].hi = (d + 1) as u16;
                    self.free_node(v, true);
                } else {
                    // Merge v into u: u takes v's children (and table id) as they are.
                    self.nodes[ui].first_child = self.nodes[vi].first_child;
                    self.nodes[ui].hi = self.nodes[vi].hi;
                    self.release_ref(self.nodes[ui].rseq);
                    self.nodes[ui].rseq = self.nodes[vi].rseq;
                    self.nodes[ui].rpos = self.nodes[vi].rpos;
                    self.nodes[vi].hi = 0;
                    self.free_node(v, false);
                }
            } else {
                self.nodes[ui].hi = (d + 1) as u16 | (self.nodes[ui].hi & WIDE);
                self.nodes[vi].lo = (d + 2) as u16 | (self.nodes[vi].lo & TAIL);
                let x = self.label(v, d + 2);
                self.relabel(u, v, x);
            }
            u
        } else if self.is_tail(v) {
            // A second occurrence: v becomes a counted point, the tail hangs below.
            let tail_end = self.end(v);
            let rs = (self.nodes[vi].rseq, self.nodes[vi].rpos);
            self.nodes[vi].count = 2;
            self.nodes[vi].lo = (d + 1) as u16;
            self.nodes[vi].hi = (d + 1) as u16;
            self.nodes[vi].first_child = NIL;
            if d + 2 <= tail_end {
                let x = self.label(v, d + 2);
                self.new_tail(v, 0, rs, d + 2, x);
            }
            v
        } else if self.end(v) == d + 1 {
            self.nodes[vi].count += 1;
            v
        } else {
            // Split: v keeps the point d + 1, a new node w the rest of the chain.
            let x = self.label(v, d + 2);
            let rs = (self.nodes[vi].rseq, self.nodes[vi].rpos);
            let w = self.alloc(
                self.nodes[vi].count,
                x,
                self.nodes[vi].first_child,
                rs,
                (d + 2) as u16,
                self.nodes[vi].hi,
            );
            // An occurrence already extended this token may end at v's end: it now
            // ends at w's. (`done` is in increasing start order, as the active list.)
            if let Some(jj) = (n + 1).checked_sub(self.end(v)) {
                debug_assert!(done.windows(2).all(|p| p[0].0 < p[1].0));
                if let Ok(k) = done.binary_search_by_key(&jj, |a| a.0) {
                    if done[k].1 == v {
                        done[k].1 = w;
                    }
                }
            }
            self.nodes[vi].hi = (d + 1) as u16;
            self.nodes[vi].first_child = w;
            self.nodes[vi].count += 1;
            v
        };
        Some(at)
    }

    /// Recomputes the active suffixes of `seq` (after appends to another sequence): the
    /// occurrences among its last `max_depth - 1` suffixes that end at a node's end.
    fn reactivate(&mut self, seq: u32) {
        let toks = self.seq_tokens(seq);
        let n = toks.len();
        let mut active = Vec::new();
        for j in n - n.min(self.max_depth as usize - 1)..n {
            let mut l = Locus {
                node: ROOT,
                depth: 0,
            };
            let mut ok = true;
            for &x in &toks[j..] {
                match self.step(l, x) {
                    Some(next) => l = next,
                    None => {
                        ok = false;
                        break;
                    }
                }
            }
            if ok && !self.is_tail(l.node) && l.depth == self.end(l.node) {
                active.push((j as u32, l.node));
            }
        }
        self.seqs[seq as usize]
            .as_mut()
            .expect("live sequence")
            .active = active;
    }

    /// Stops tracking the active suffixes of `seq` (it will not grow any more, or another
    /// sequence is appended to).
    pub fn seal(&mut self, seq: u32) {
        let sq = self.seqs[seq as usize].as_mut().expect("live sequence");
        sq.active = Vec::new();
        if self.open == Some(seq) {
            self.open = None;
        }
    }

    /// Removes sequence `seq` and every occurrence it contributed.
    pub fn remove_seq(&mut self, seq: u32) {
        self.seal(seq);
        let toks = self.seq_tokens(seq).to_vec();
        let d = self.max_depth as usize;
        let mut path: Vec<(u32, u32)> = Vec::with_capacity(d);
        // Nodes that read their labels from `seq` when visited.
        let mut orphans: Vec<u32> = Vec::new();
        for j in 0..toks.len() {
            path.clear();
            self.nodes[ROOT as usize].count -= 1;
            let len = toks.len().min(j + d) - j;
            let mut v = ROOT;
            let mut depth = 0;
            while depth < len {
                let c = self
                    .find_child(v, toks[j + depth])
                    .0
                    .expect("an indexed occurrence is in the tree");
                if self.is_tail(c) {
                    debug_assert_eq!(
                        (self.nodes[c as usize].rseq, self.nodes[c as usize].rpos),
                        (seq, j as u32)
                    );
                    self.unlink_child(v, c);
                    self.free_node(c, true);
                    break;
                }
                self.nodes[c as usize].count -= 1;
                path.push((v, c));
                depth = self.end(c) as usize;
                v = c;
            }
            for &(p, c) in path.iter().rev() {
                let ci = c as usize;
                if self.nodes[ci].count == 0 {
                    debug_assert_eq!(self.head(c), NIL);
                    self.unlink_child(p, c);
                    self.free_node(c, true);
                } else if self.nodes[ci].rseq == seq {
                    // Borrow a child's occurrence (which may itself still be in `seq`, or be
                    // an orphan's): whatever still reads `seq` at the end is counted then.
                    orphans.push(c);
                    let g = self.head(c);
                    if g != NIL {
                        let gs = self.nodes[g as usize].rseq;
                        self.acquire_ref(gs);
                        self.nodes[ci].rseq = gs;
                        self.nodes[ci].rpos = self.nodes[g as usize].rpos;
                    }
                }
            }
        }
        self.num_tokens -= toks.len();
        orphans.sort_unstable();
        orphans.dedup();
        let refs = orphans
            .iter()
            .filter(|&&c| {
                let ci = c as usize;
                self.nodes[ci].count > 0
                    && self.nodes[ci].lo & TAIL == 0
                    && self.nodes[ci].rseq == seq
            })
            .count() as u32;
        if refs > 0 {
            // Some counted nodes end where their other occurrences end: keep the labels.
            let sq = self.seqs[seq as usize].as_mut().expect("live sequence");
            sq.dead = true;
            sq.refs = refs;
            sq.active = Vec::new();
        } else {
            self.seqs[seq as usize] = None;
            self.free_seqs.push(seq);
        }
    }

    #[cfg(test)]
    fn locus_count(&self, l: Locus) -> u32 {
        self.node_count(l.node)
    }

    fn step(&self, l: Locus, x: u32) -> Option<Locus> {
        if l.depth < self.end(l.node) {
            (self.label(l.node, l.depth + 1) == x).then_some(Locus {
                node: l.node,
                depth: l.depth + 1,
            })
        } else if self.is_tail(l.node) || l.depth >= self.max_depth {
            None
        } else {
            self.find_child(l.node, x).0.map(|c| Locus {
                node: c,
                depth: l.depth + 1,
            })
        }
    }

    fn has_continuation(&self, l: Locus) -> bool {
        l.depth < self.end(l.node) || (!self.is_tail(l.node) && self.head(l.node) != NIL)
    }

    /// Children of `l` with count >= `min_count`, as (count, token, locus), in (count
    /// descending, token ascending) order.
    fn children(&self, l: Locus, min_count: u32, out: &mut Vec<(u32, u32, Locus)>) {
        self.children_unsorted(l, min_count, out);
        discovery_order(out);
    }

    /// [`Self::children`] in sibling order.
    fn children_unsorted(&self, l: Locus, min_count: u32, out: &mut Vec<(u32, u32, Locus)>) {
        out.clear();
        if l.depth < self.end(l.node) {
            let cnt = self.node_count(l.node);
            if cnt >= min_count {
                out.push((
                    cnt,
                    self.label(l.node, l.depth + 1),
                    Locus {
                        node: l.node,
                        depth: l.depth + 1,
                    },
                ));
            }
            return;
        }
        if self.is_tail(l.node) {
            return;
        }
        let mut c = self.head(l.node);
        while c != NIL {
            let cnt = self.node_count(c);
            if cnt >= min_count {
                out.push((
                    cnt,
                    self.nodes[c as usize].token,
                    Locus {
                        node: c,
                        depth: l.depth + 1,
                    },
                ));
            }
            c = self.nodes[c as usize].next_sib;
        }
    }

    /// The locus of `context`'s suffix of length `len` (`0..=context.len()`), if it occurs: a
    /// walk from the root.
    fn context_locus(&self, context: &[u32], len: usize) -> Option<Locus> {
        let mut l = Locus {
            node: ROOT,
            depth: 0,
        };
        for &x in &context[context.len() - len..] {
            l = self.step(l, x)?;
        }
        Some(l)
    }

    /// The locus of `context`'s suffix of length `len`, known to occur: down from the root a
    /// node at a time, each chain taken whole (its labels are the suffix's tokens when the
    /// suffix occurs), O(nodes on the path) rather than O(len). `None` only if it does not
    /// occur after all.
    fn descend_occurring(&self, context: &[u32], len: usize) -> Option<Locus> {
        let suffix = &context[context.len() - len..];
        let mut l = Locus {
            node: ROOT,
            depth: 0,
        };
        while (l.depth as usize) < len {
            let child = self.find_child(l.node, suffix[l.depth as usize]).0?;
            l = Locus {
                node: child,
                depth: self.end(child).min(len as u32),
            };
        }
        Some(l)
    }

    /// The locus of `context`'s suffix of length `len` when it occurs followed by a token.
    #[cfg(test)]
    fn context_match(&self, context: &[u32], len: usize) -> Option<Locus> {
        self.context_locus(context, len)
            .filter(|&l| self.has_continuation(l))
    }

    /// The longest suffix of `context`, of at most `max_len` tokens, that occurs: `max_len`
    /// itself when it does (one walk: a context that repeats indexed text), else a galloping
    /// search, since a suffix of an occurring string occurs too (O(log) walks, where trying
    /// each length past the longest would cost a walk of its own).
    fn longest_occurring(&self, context: &[u32], max_len: usize) -> usize {
        if self.context_locus(context, max_len).is_some() {
            return max_len;
        }
        gallop(max_len - 1, |len| {
            self.context_locus(context, len).is_some()
        })
    }

    /// The matches of the open sequence `seq`'s own context, longest first: `(len, locus)` for
    /// each suffix of length `1..=max_len` that occurs followed by a token. No search: the
    /// context's own occurrence of a suffix does not continue, so a suffix that occurs again
    /// has its count drop right below it, at a node's end; it is an active suffix.
    fn own_matches(&self, seq: u32, max_len: usize) -> Vec<(usize, Locus)> {
        let sq = self.seqs[seq as usize].as_ref().expect("live sequence");
        debug_assert_eq!(self.open, Some(seq));
        let n = sq.tokens.len() as u32;
        sq.active
            .iter()
            .map(|&(j, node)| Locus { node, depth: n - j })
            .filter(|l| (1..=max_len).contains(&(l.depth as usize)) && self.has_continuation(*l))
            .map(|l| (l.depth as usize, l))
            .collect()
    }

    /// Longest match considered: `max_depth - 1` (a match leaves at least one level below it).
    fn max_match(&self, context_len: usize) -> usize {
        context_len.min(self.max_depth as usize - 1)
    }

    /// At most this many drafts grow from a match of length `len`.
    fn draft_limit(len: usize, opt: &ProposeOptions) -> usize {
        opt.budget
            .min((opt.max_spec_factor * len as f64).floor() as usize)
    }

    /// An upper bound on the score of the proposal grown from a match of length `len`. It has
    /// at most `draft_limit` drafts of probability <= 1 each: exact in floating point too (a
    /// probability is a count over a larger count, and a sum of k such terms rounds to at most
    /// k). Its paths of one depth share the match's continuing occurrences, so each of the
    /// `max_depth - len` levels below the match adds at most 1: exact for the real sum, so
    /// that bound gets room for the sum's rounding (relative 1e-9, above 2^16 terms' 1.5e-11).
    fn score_bound(&self, len: usize, opt: &ProposeOptions) -> f64 {
        let limit = Self::draft_limit(len, opt);
        let levels = self.max_depth as usize - len;
        if limit <= levels {
            limit as f64
        } else {
            levels as f64 * (1.0 + 1e-9)
        }
    }

    /// The indices of `cands` in decreasing order of their length's [`Self::score_bound`],
    /// ties to the longer, with the bounds. No sort: the bound is the draft limit up to the
    /// length where that passes the levels left (and the limit never falls as the length
    /// grows), the levels past it (which fall), so the lengths up to there go longest first
    /// and those past it shortest first, merged.
    fn by_bound<'a>(
        &'a self,
        cands: &'a impl Candidates,
        opt: &'a ProposeOptions,
    ) -> impl Iterator<Item = (f64, usize)> + 'a {
        // How many of the longest lengths have a limit past their levels (the lengths fall
        // with the index, so the test turns false once).
        let lo = gallop(cands.count(), |k| {
            let len = cands.len_at(k - 1);
            Self::draft_limit(len, opt) > self.max_depth as usize - len
        });
        let bounded = move |i: usize| (self.score_bound(cands.len_at(i), opt), i);
        let mut past = (0..lo).rev().map(bounded).peekable();
        let mut up_to = (lo..cands.count()).map(bounded).peekable();
        std::iter::from_fn(move || match (past.peek(), up_to.peek()) {
            (Some(a), Some(b)) if a.0 < b.0 => up_to.next(),
            (Some(_), _) => past.next(),
            (None, _) => up_to.next(),
        })
    }

    /// The proposal of the best of `cands`: the highest score, ties to the longer match
    /// (ArcticInference's choice over every match length). Lengths are tried in decreasing
    /// order of [`Self::score_bound`] and stop at the first that cannot win; an expansion
    /// stops as soon as it cannot win; and a grown match settles the lengths of its group it
    /// can speak for (below), which are then skipped unwalked. The choice is the exhaustive
    /// one, for fewer walks and expansions.
    fn best_proposal(&self, root: u32, cands: &impl Candidates, opt: &ProposeOptions) -> Proposal {
        // Room for the drafts of the longest match (up to a point: a large budget is a bound,
        // not what the index holds), so the growth does not reallocate as it goes.
        let room = match cands.count() {
            0 => 0,
            _ => Self::draft_limit(cands.len_at(0), opt).min(256),
        };
        let (mut best, mut grown) = (
            Proposal::with_room(root, room),
            Proposal::with_room(root, room),
        );
        let mut to_beat: Option<ToBeat> = None;
        let mut scratch = Expansion::default();
        // A match grown without reaching the depth bound speaks for its group's lengths
        // `floor..=hi`, by `hi`: a shorter member's counts are its own down to that bound, so
        // that member's expansion is the same one taken no further (its limit is no larger)
        // or given up at the same point: it scores no more and loses the tie (`hi` = the
        // match). When the growth also ran out of candidates, a longer member takes the same
        // drafts while its levels hold them (its limit is no smaller), and fewer past that,
        // scoring less: the longest such member is the group's choice (`hi` = the group's
        // longest). Groups are disjoint runs of lengths, so the entry with the least `hi` at
        // or above a length is the only one that can hold it. Each floor is found when a
        // shorter length first asks (usually none does).
        let mut settled: BTreeMap<usize, (Option<usize>, usize, Locus)> = BTreeMap::new();
        for (bound, i) in self.by_bound(cands, opt) {
            let len = cands.len_at(i);
            // In this order a length that cannot win is followed only by lengths that cannot
            // either: a lower bound, or the same bound and a shorter match.
            if to_beat.is_some_and(|b| b.out_of_reach(bound, len)) {
                break;
            }
            if let Some((_, (floor, at, m))) = settled.range_mut(len..).next() {
                if len >= *floor.get_or_insert_with(|| cands.floor(*at, *m)) {
                    continue;
                }
            }
            let Some(m) = cands.locus(i) else { continue };
            let grew = self.expand(root, (m, len), opt, to_beat, &mut scratch, &mut grown);
            let mut chosen = len;
            if !grew.depth_cut {
                let mut hi = len;
                if grew.exhausted {
                    hi = cands.ceiling(i, m);
                    let deepest_fits = self.max_depth as usize - grew.deepest;
                    chosen = cands.longest_within(len, hi.min(deepest_fits));
                    grown.match_len = chosen;
                }
                settled.insert(hi, (None, i, m));
            }
            if grew.finished && to_beat.is_none_or(|b| b.beaten_by(grown.score, chosen)) {
                std::mem::swap(&mut best, &mut grown);
                to_beat = Some(ToBeat {
                    score: best.score,
                    match_len: chosen,
                });
            }
        }
        best
    }

    /// Best-first expansion from the match `m` of length `match_len` into `p`. With `to_beat`,
    /// it gives up (`p` unfinished) once it cannot win: the probabilities it takes never
    /// grow (a child counts no more than its parent), so each draft left adds at most the one
    /// taken now (with room for the sum's rounding, as in [`Self::score_bound`]).
    fn expand(
        &self,
        root: u32,
        (m, match_len): (Locus, usize),
        opt: &ProposeOptions,
        to_beat: Option<ToBeat>,
        scratch: &mut Expansion,
        p: &mut Proposal,
    ) -> Grew {
        p.reset(root, match_len);
        let limit = Self::draft_limit(match_len, opt);
        let Expansion { kids, heap, order } = scratch;
        heap.clear();
        *order = 0;
        // The match's own occurrence at the end of a context has no continuation: normalize
        // by the occurrences that continue, so the children's probabilities sum to 1.
        self.children_unsorted(m, 1, kids);
        let c0 = kids.iter().map(|k| k.0 as f64).sum::<f64>();
        if let Some(b) = to_beat {
            // The first check of the loop below, before the children are sorted: a short
            // match can have hundreds.
            let top = kids.iter().map(|k| k.0).max().unwrap_or(0);
            if b.out_of_reach(limit as f64 * (top as f64 / c0) * (1.0 + 1e-9), match_len) {
                return Grew::default();
            }
        }
        discovery_order(kids);
        if limit > 0 {
            push_candidates(heap, kids, 0, c0, opt, order);
        }
        let mut grew = Grew {
            finished: true,
            ..Grew::default()
        };
        while p.parents.len() <= limit {
            let Some(c) = heap.pop() else {
                grew.exhausted = true;
                break;
            };
            let prob = c.count as f64 / c0;
            if let Some(b) = to_beat {
                let left = (limit + 1 - p.parents.len()) as f64;
                if b.out_of_reach((p.score + left * prob) * (1.0 + 1e-9), match_len) {
                    grew.finished = false;
                    return grew;
                }
            }
            let idx = p.parents.len() as i32;
            p.parents.push(c.parent);
            p.tokens.push(c.token as i64);
            p.probs.push(prob);
            p.score += prob;
            grew.deepest = grew.deepest.max(c.locus.depth as usize - match_len);
            if p.parents.len() <= limit {
                // At the index's depth bound a node has no children stored, whatever follows.
                grew.depth_cut |= c.locus.depth >= self.max_depth;
                self.children(c.locus, 1, kids);
                push_candidates(heap, kids, idx, c0, opt, order);
            }
        }
        grew
    }

    /// Proposal from this index for `context` (a non-empty token list).
    pub fn propose_for(&self, context: &[u32], opt: &ProposeOptions) -> Proposal {
        let root = *context.last().expect("non-empty context");
        // Lengths past the longest that occurs need no walk, and those up to it are known to
        // occur, so each walk takes whole chains.
        let cands = ContextCandidates {
            index: self,
            context,
            occurring: self.longest_occurring(context, self.max_match(context.len())),
        };
        self.best_proposal(root, &cands, opt)
    }

    /// Proposal from this index for sequence `seq`'s own context.
    pub fn propose_own(&self, seq: u32, opt: &ProposeOptions) -> Proposal {
        let toks = self.seq_tokens(seq);
        if self.open != Some(seq) {
            return self.propose_for(toks, opt);
        }
        let root = *toks.last().expect("non-empty context");
        let matches = self.own_matches(seq, self.max_match(toks.len()));
        let cands = OwnCandidates {
            index: self,
            matches,
        };
        self.best_proposal(root, &cands, opt)
    }
}

#[derive(Debug, Clone)]
struct Request {
    index: SuffixIndex,
    prompt_len: usize,
}

/// The drafter: one index per live request, one global index over finished responses.
#[derive(Debug, Clone)]
pub struct SuffixDrafter {
    max_depth: i64,
    max_global_tokens: usize,
    requests: HashMap<i64, Request>,
    global: SuffixIndex,
    /// Cached responses, oldest first: (request id, sequence id in `global`).
    fifo: VecDeque<(i64, u32)>,
    cached: HashMap<i64, u32>,
}

/// Positions and counts are `u32`, and a request context stays within `2^31 - 1` tokens (the
/// documented limit). (Node ids are `u32` too; 2^32 nodes take over 100 GB.)
const MAX_SEQ_TOKENS: usize = super::MAX_CONTEXT_TOKENS;

fn check_len(n: usize) -> Result<()> {
    if n > MAX_SEQ_TOKENS {
        return Err(Error::value(
            "tokens",
            format!("a request's context would hold {n} tokens, more than {MAX_SEQ_TOKENS}"),
        ));
    }
    Ok(())
}

fn unknown(arg: &'static str, id: i64) -> Error {
    Error::value(
        arg,
        format!("unknown request id {id} (never started, or already finished / removed)"),
    )
}

impl SuffixDrafter {
    pub fn new(max_depth: i64, max_global_tokens: i64) -> Result<Self> {
        if !(0..=MAX_SEQ_TOKENS as i64).contains(&max_global_tokens) {
            return Err(Error::value(
                "max_global_tokens",
                format!("must be in [0, {MAX_SEQ_TOKENS}], got {max_global_tokens}"),
            ));
        }
        Ok(SuffixDrafter {
            max_depth,
            max_global_tokens: max_global_tokens as usize,
            requests: HashMap::new(),
            global: SuffixIndex::new(max_depth)?,
            fifo: VecDeque::new(),
            cached: HashMap::new(),
        })
    }

    pub fn max_depth(&self) -> usize {
        self.global.max_depth()
    }

    pub fn max_global_tokens(&self) -> usize {
        self.max_global_tokens
    }

    pub fn has_request(&self, id: i64) -> bool {
        self.requests.contains_key(&id)
    }

    pub fn num_requests(&self) -> usize {
        self.requests.len()
    }

    /// Request ids whose responses are in the global index, oldest first.
    pub fn cached_responses(&self) -> Vec<i64> {
        self.fifo.iter().map(|&(id, _)| id).collect()
    }

    pub fn num_global_tokens(&self) -> usize {
        self.global.num_tokens()
    }

    /// Tokens indexed over every live request and the global index.
    pub fn num_indexed_tokens(&self) -> usize {
        self.global.num_tokens()
            + self
                .requests
                .values()
                .map(|r| r.index.num_tokens())
                .sum::<usize>()
    }

    pub fn memory_bytes(&self) -> usize {
        self.global.memory_bytes()
            + self
                .requests
                .values()
                .map(|r| r.index.memory_bytes())
                .sum::<usize>()
    }

    /// Starts indexing request `id` with its prompt.
    pub fn start_request(&mut self, id: i64, prompt: &[i64]) -> Result<()> {
        let prompt = check_tokens("prompt", prompt)?;
        check_len(prompt.len())?;
        if self.requests.contains_key(&id) {
            return Err(Error::value(
                "request_id",
                format!("request id {id} is already started"),
            ));
        }
        let mut index = SuffixIndex::new(self.max_depth)?;
        let seq = index.add_seq();
        debug_assert_eq!(seq, 0);
        index.append(seq, &prompt);
        self.requests.insert(
            id,
            Request {
                index,
                prompt_len: prompt.len(),
            },
        );
        Ok(())
    }

    /// Appends committed tokens to request `id`.
    pub fn append(&mut self, id: i64, tokens: &[i64]) -> Result<()> {
        let tokens = check_tokens("tokens", tokens)?;
        let r = self
            .requests
            .get_mut(&id)
            .ok_or_else(|| unknown("request_id", id))?;
        check_len(r.index.num_tokens() + tokens.len())?;
        r.index.append(0, &tokens);
        Ok(())
    }

    /// Ends request `id`; its response (the tokens after the prompt) enters the global index
    /// when `cache`, then the oldest responses are evicted while the global index holds more
    /// than `max_global_tokens` tokens (this one included, if it alone is over).
    pub fn finish_request(&mut self, id: i64, cache: bool) -> Result<()> {
        let r = self
            .requests
            .remove(&id)
            .ok_or_else(|| unknown("request_id", id))?;
        let response = &r.index.seq_tokens(0)[r.prompt_len..];
        if cache && !response.is_empty() && self.max_global_tokens > 0 {
            if let Some(old) = self.cached.remove(&id) {
                self.fifo.retain(|&(rid, _)| rid != id);
                self.global.remove_seq(old);
            }
            if response.len() > self.max_global_tokens {
                // It would be evicted at once, after flushing every other response and
                // growing the index to hold it: never cached, the others stay.
                self.release_global_if_empty()?;
                return Ok(());
            }
            let seq = self.global.add_seq();
            self.global.append(seq, response);
            self.global.seal(seq);
            self.fifo.push_back((id, seq));
            self.cached.insert(id, seq);
            while self.global.num_tokens() > self.max_global_tokens {
                let (rid, seq) = self.fifo.pop_front().expect("non-empty while over budget");
                self.cached.remove(&rid);
                self.global.remove_seq(seq);
            }
            self.release_global_if_empty()?;
        }
        Ok(())
    }

    /// An emptied global index gives its memory back: its arena and tables keep their
    /// capacity for reuse while it holds anything, but none is needed once it holds nothing.
    fn release_global_if_empty(&mut self) -> Result<()> {
        if self.cached.is_empty() && self.global.num_tokens() == 0 {
            self.global = SuffixIndex::new(self.global.max_depth() as i64)?;
        }
        Ok(())
    }

    /// Removes request `id`'s response from the global index.
    pub fn remove_response(&mut self, id: i64) -> Result<()> {
        match self.cached.entry(id) {
            Entry::Occupied(e) => {
                let seq = e.remove();
                self.fifo.retain(|&(rid, _)| rid != id);
                self.global.remove_seq(seq);
                self.release_global_if_empty()
            }
            Entry::Vacant(_) => Err(Error::value(
                "request_id",
                format!("no cached response for request id {id}"),
            )),
        }
    }

    /// The live request `id`, with a context to match; errors name `arg` (`request_id` for
    /// one proposal, `request_ids` for a batch).
    fn check_request(&self, id: i64, arg: &'static str) -> Result<&Request> {
        let r = self.requests.get(&id).ok_or_else(|| unknown(arg, id))?;
        if r.index.num_tokens() == 0 {
            return Err(Error::value(
                arg,
                format!("request id {id} has an empty context: nothing to match"),
            ));
        }
        Ok(r)
    }

    fn propose_checked(&self, r: &Request, opt: &ProposeOptions, use_global: bool) -> Proposal {
        let own = r.index.propose_own(0, opt);
        if !use_global || self.global.num_tokens() == 0 {
            return own;
        }
        let glob = self.global.propose_for(r.index.seq_tokens(0), opt);
        if glob.score > own.score {
            glob
        } else {
            own
        }
    }

    pub fn propose(&self, id: i64, opt: &ProposeOptions, use_global: bool) -> Result<Proposal> {
        let r = self.check_request(id, "request_id")?;
        Ok(self.propose_checked(r, opt, use_global))
    }

    /// Proposals for many requests in parallel; `opts[i]` goes with `ids[i]`.
    pub fn propose_batch(
        &self,
        ids: &[i64],
        opts: &[ProposeOptions],
        use_global: bool,
    ) -> Result<Vec<Proposal>> {
        let reqs = ids
            .iter()
            .map(|&id| self.check_request(id, "request_ids"))
            .collect::<Result<Vec<_>>>()?;
        Ok(reqs
            .par_iter()
            .zip(opts.par_iter())
            .map(|(r, o)| self.propose_checked(r, o, use_global))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::draft::test_rng as rng;

    /// count(w) by brute force over `seqs`.
    fn naive_count(seqs: &[Vec<u32>], w: &[u32]) -> u32 {
        seqs.iter()
            .map(|s| {
                (0..s.len())
                    .filter(|&i| i + w.len() <= s.len() && s[i..i + w.len()] == *w)
                    .count() as u32
            })
            .sum()
    }

    /// Every string reachable in the tree carries its brute-force count, for strings drawn
    /// from the sequences themselves, after appends and removals.
    #[test]
    fn counts_match_brute_force() {
        let mut x = 11u64;
        for round in 0..60 {
            let depth = 1 + (rng(&mut x) % 6) as i64;
            let mut idx = SuffixIndex::new(depth).unwrap();
            let mut live: Vec<(u32, Vec<u32>)> = Vec::new();
            for _ in 0..6 {
                if !live.is_empty() && rng(&mut x).is_multiple_of(3) {
                    let k = (rng(&mut x) as usize) % live.len();
                    let (s, _) = live.remove(k);
                    idx.remove_seq(s);
                    continue;
                }
                let s = idx.add_seq();
                let len = rng(&mut x) % 30;
                let alpha = 1 + rng(&mut x) % 3;
                let toks: Vec<u32> = (0..len).map(|_| (rng(&mut x) % alpha) as u32).collect();
                // Appended in pieces: incremental appends equal one append.
                let cut = toks.len() / 2;
                idx.append(s, &toks[..cut]);
                idx.append(s, &toks[cut..]);
                live.push((s, toks));
            }
            let seqs: Vec<Vec<u32>> = live.iter().map(|(_, t)| t.clone()).collect();
            assert_eq!(
                idx.nodes[0].count as usize,
                seqs.iter().map(Vec::len).sum::<usize>()
            );
            for s in &seqs {
                for i in 0..s.len() {
                    let mut l = Locus { node: 0, depth: 0 };
                    for e in 1..=(depth as usize).min(s.len() - i) {
                        l = idx
                            .step(l, s[i + e - 1])
                            .expect("occurring string is found");
                        assert_eq!(
                            idx.locus_count(l),
                            naive_count(&seqs, &s[i..i + e]),
                            "round {round} string {:?}",
                            &s[i..i + e]
                        );
                    }
                }
            }
            for (s, _) in live {
                idx.remove_seq(s);
            }
            assert_eq!(idx.num_nodes(), 1, "removing everything leaves the root");
            assert!(idx.lookup.is_empty());
        }
    }

    /// A long append to a non-empty index (which sizes the wide-child table after its first
    /// eighth) builds the same index as the same tokens appended in pieces; a long first
    /// append (indexed from its sorted suffixes) proposes the same, with no more nodes.
    #[test]
    fn bulk_append_equals_pieces() {
        let mut x = 3u64;
        let toks: Vec<u32> = (0..70_000)
            .map(|_| (rng(&mut x) % 40).min(rng(&mut x) % 40) as u32)
            .collect();
        // The first 100 tokens go in alone (below `SORTED_MIN`: online) in both.
        let (head, rest) = toks.split_at(100);
        let mut a = SuffixIndex::new(16).unwrap();
        let sa = a.add_seq();
        a.append(sa, head);
        a.append(sa, rest);
        let mut b = SuffixIndex::new(16).unwrap();
        let sb = b.add_seq();
        b.append(sb, head);
        for piece in rest.chunks(1000) {
            b.append(sb, piece);
        }
        assert_eq!(a.num_nodes(), b.num_nodes());
        assert_eq!(a.lookup.len(), b.lookup.len());
        let mut c = SuffixIndex::new(16).unwrap();
        let sc = c.add_seq();
        c.append(sc, &toks);
        assert!(c.num_nodes() <= b.num_nodes());
        // This text is repetitive enough for the probe to choose the sorted suffixes.
        let mut direct = SuffixIndex::new(16).unwrap();
        let sd = direct.add_seq();
        direct.index_sorted(sd, &toks);
        assert_eq!(c.num_nodes(), direct.num_nodes());
        let opt = ProposeOptions::new(8, 0.01, 4.0, false).unwrap();
        assert_eq!(a.propose_own(sa, &opt), b.propose_own(sb, &opt));
        assert_eq!(c.propose_own(sc, &opt), b.propose_own(sb, &opt));
        for k in 0..200 {
            let end = 20 + (rng(&mut x) as usize) % (toks.len() - 20);
            let ctx = &toks[end - 20 - k % 3..end];
            assert_eq!(a.propose_for(ctx, &opt), b.propose_for(ctx, &opt));
            assert_eq!(c.propose_for(ctx, &opt), b.propose_for(ctx, &opt));
        }
    }

    #[test]
    fn own_match_equals_search() {
        let mut x = 5u64;
        for _ in 0..200 {
            let depth = 2 + (rng(&mut x) % 6) as i64;
            let mut idx = SuffixIndex::new(depth).unwrap();
            let s = idx.add_seq();
            let len = 1 + rng(&mut x) % 40;
            let toks: Vec<u32> = (0..len).map(|_| (rng(&mut x) % 3) as u32).collect();
            idx.append(s, &toks);
            assert_eq!(own_by_walks(&idx, s), own_by_search(&idx, s), "{toks:?}");
        }
    }

    /// `own_matches` of `seq` (from its active suffixes) as (length, count) pairs.
    pub(super) fn own_by_search(idx: &SuffixIndex, seq: u32) -> Vec<(usize, u32)> {
        let m = idx.max_match(idx.seq_tokens(seq).len());
        idx.own_matches(seq, m)
            .into_iter()
            .map(|(n, l)| (n, idx.locus_count(l)))
            .collect()
    }

    /// The same from one walk per suffix length, longest first.
    pub(super) fn own_by_walks(idx: &SuffixIndex, seq: u32) -> Vec<(usize, u32)> {
        let toks = idx.seq_tokens(seq);
        (1..=idx.max_match(toks.len()))
            .rev()
            .filter_map(|n| idx.context_match(toks, n).map(|l| (n, idx.locus_count(l))))
            .collect()
    }

    /// The choice by its definition: every match length grown in full, the highest score
    /// kept, ties to the longer match.
    fn propose_exhaustive(idx: &SuffixIndex, context: &[u32], opt: &ProposeOptions) -> Proposal {
        let root = *context.last().unwrap();
        let mut best = Proposal::with_room(root, 0);
        let mut scratch = Expansion::default();
        for len in 1..=idx.max_match(context.len()) {
            let Some(m) = idx.context_match(context, len) else {
                continue;
            };
            let mut p = Proposal::with_room(root, 0);
            assert!(
                idx.expand(root, (m, len), opt, None, &mut scratch, &mut p)
                    .finished
            );
            if best.match_len == 0 || p.score >= best.score {
                best = p;
            }
        }
        best
    }

    #[test]
    fn gallop_finds_the_last_that_holds() {
        for most in 0..70 {
            for last in 0..=most {
                let calls = std::cell::Cell::new(0);
                let got = gallop(most, |d| {
                    calls.set(calls.get() + 1);
                    assert!(d <= most && d > 0, "probe {d} of 0..={most}");
                    d <= last
                });
                assert_eq!(got, last, "most {most}");
                assert!(calls.get() <= 2 * (usize::BITS - (last + 1).leading_zeros()) as usize + 1);
            }
        }
    }

    /// `by_bound` is the lengths sorted by (bound descending, length descending): the search
    /// stops at the first length that cannot win on that order alone.
    #[test]
    fn lengths_come_by_bound_then_longer() {
        let mut x = 31u64;
        for _ in 0..300 {
            let depth = 2 + (rng(&mut x) % 80) as i64;
            let idx = SuffixIndex::new(depth).unwrap();
            let budget = 1 + (rng(&mut x) % 100) as i64;
            let factor = [0.0, 0.3, 1.0, 1.7, 4.0][rng(&mut x) as usize % 5];
            let opt = ProposeOptions::new(budget, 0.1, factor, false).unwrap();
            let most = depth as usize - 1;
            let listed: Vec<usize> = (1..=most)
                .rev()
                .filter(|_| !rng(&mut x).is_multiple_of(3))
                .collect();
            let all: Vec<usize> = (1..=most).rev().collect();
            for lens in [all, listed] {
                let root = Locus {
                    node: ROOT,
                    depth: 0,
                };
                let cands = OwnCandidates {
                    index: &idx,
                    matches: lens.iter().map(|&n| (n, root)).collect(),
                };
                let got: Vec<(f64, usize)> = idx
                    .by_bound(&cands, &opt)
                    .map(|(bound, i)| (bound, cands.len_at(i)))
                    .collect();
                let mut want: Vec<(f64, usize)> = lens
                    .iter()
                    .map(|&n| (idx.score_bound(n, &opt), n))
                    .collect();
                want.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
                assert_eq!(got, want, "depth {depth} budget {budget} factor {factor}");
            }
        }
    }

    /// The pruned search (bounds, early stops, skipped same-occurrence matches) chooses what
    /// growing every match in full chooses, from the request's own index and from a search.
    #[test]
    fn best_match_equals_exhaustive_choice() {
        let mut x = 23u64;
        let (mut shorter, mut total) = (0usize, 0usize);
        for round in 0..400 {
            let depth = 2 + (rng(&mut x) % 24) as i64;
            let alpha = 1 + rng(&mut x) % 4;
            let len = 1 + rng(&mut x) as usize % 300;
            let toks: Vec<u32> = (0..len).map(|_| (rng(&mut x) % alpha) as u32).collect();
            let mut idx = SuffixIndex::new(depth).unwrap();
            let s = idx.add_seq();
            idx.append(s, &toks);
            let budget = 1 + (rng(&mut x) % 40) as i64;
            let min_prob = [0.01, 0.1, 0.3, 1.0][rng(&mut x) as usize % 4];
            let factor = [0.0, 0.5, 1.0, 2.0, 40.0][rng(&mut x) as usize % 5];
            let chain = rng(&mut x).is_multiple_of(4);
            let opt = ProposeOptions::new(budget, min_prob, factor, chain).unwrap();
            let want = propose_exhaustive(&idx, &toks, &opt);
            assert_eq!(idx.propose_own(s, &opt), want, "round {round}");
            let cut = 1 + rng(&mut x) as usize % len;
            let ctx: Vec<u32> = toks[..cut]
                .iter()
                .chain(&toks[..rng(&mut x) as usize % len])
                .copied()
                .collect();
            let want_ctx = propose_exhaustive(&idx, &ctx, &opt);
            assert_eq!(idx.propose_for(&ctx, &opt), want_ctx, "round {round}");
            let longest = (1..=idx.max_match(len))
                .rev()
                .find(|&n| idx.context_match(&toks, n).is_some());
            total += 1;
            shorter += usize::from(longest.is_some_and(|n| want.match_len < n));
        }
        // Often the best match is not the longest.
        assert!(shorter > total / 10, "{shorter} of {total}");
    }

    #[test]
    fn proposes_the_repeated_continuation() {
        let mut d = SuffixDrafter::new(8, 1000).unwrap();
        d.start_request(1, &[1, 2, 3, 4, 5, 1, 2, 3]).unwrap();
        let opt = ProposeOptions::new(4, 0.1, 1.0, false).unwrap();
        let p = d.propose(1, &opt, true).unwrap();
        assert_eq!(p.match_len, 3);
        assert_eq!(p.tokens, vec![3, 4, 5, 1]);
        assert_eq!(p.parents, vec![-1, 0, 1, 2]);
        assert!(d.propose(2, &opt, true).is_err());
        assert!(ProposeOptions::new(0, 0.1, 1.0, false).is_err());
        assert!(ProposeOptions::new(1, 0.0, 1.0, false).is_err());
    }
}

#[cfg(test)]
mod child_table_tests {
    use super::*;
    use std::collections::HashMap;

    /// The linear-probing table against a map, with few keys per table (clusters, probes that
    /// wrap around the end, removals that shift entries back across it) and many growths.
    #[test]
    fn child_table_matches_a_map() {
        let mut x = 17u64;
        let mut rng = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            x >> 33
        };
        for round in 0..40 {
            let mut nodes: Vec<Node> = Vec::new();
            let mut table = ChildTable::default();
            let mut model: HashMap<(u32, u32), u32> = HashMap::new();
            let (tids, toks) = (1 + rng() % 6, 1 + rng() % 40);
            for _ in 0..3000 {
                let (tid, t) = ((rng() % tids) as u32, (rng() % toks) as u32);
                match (rng() % 3, model.get(&(tid, t)).copied()) {
                    (0, Some(_)) => {
                        table.remove(&nodes, tid, t);
                        model.remove(&(tid, t));
                    }
                    (_, None) => {
                        let c = nodes.len() as u32;
                        nodes.push(Node {
                            count: 1,
                            token: t,
                            first_child: NIL,
                            next_sib: NIL,
                            prev_sib: NIL,
                            rseq: 0,
                            rpos: 0,
                            lo: 1,
                            hi: 1,
                        });
                        table.insert(&nodes, tid, c);
                        model.insert((tid, t), c);
                    }
                    _ => {}
                }
                assert_eq!(table.len(), model.len(), "round {round}");
            }
            for tid in 0..tids as u32 {
                for t in 0..toks as u32 {
                    assert_eq!(
                        table.get(&nodes, tid, t),
                        model.get(&(tid, t)).copied(),
                        "round {round} ({tid}, {t})"
                    );
                }
            }
            for &(tid, t) in model.keys() {
                table.remove(&nodes, tid, t);
            }
            assert!(table.is_empty());
            assert!(table.slots.iter().all(|&e| e == EMPTY));
        }
    }
}

#[cfg(test)]
mod interleaved_tests {
    use super::tests::{own_by_search, own_by_walks};
    use super::*;
    use crate::draft::test_rng as rng;

    /// Every string of every sequence, walked from the root, carries its brute-force count.
    fn counts_ok(idx: &SuffixIndex, seqs: &[Vec<u32>], depth: usize) -> bool {
        for s in seqs {
            for i in 0..s.len() {
                let mut l = Locus { node: 0, depth: 0 };
                for e in 1..=depth.min(s.len() - i) {
                    let Some(n) = idx.step(l, s[i + e - 1]) else {
                        return false;
                    };
                    l = n;
                    let w = &s[i..i + e];
                    let want: usize = seqs
                        .iter()
                        .map(|q| q.windows(e).filter(|x| *x == w).count())
                        .sum();
                    if idx.locus_count(l) as usize != want {
                        return false;
                    }
                }
            }
        }
        true
    }

    /// Indexing a first sequence from its sorted suffixes builds the tree the online appends
    /// build (same counts and proposals, never more nodes), and both stay equal under
    /// further appends, a second sequence and removals.
    #[test]
    fn sorted_index_equals_online() {
        let mut x = 9u64;
        for round in 0..600 {
            let depth = 1 + (rng(&mut x) % 9) as usize;
            let alpha = match round % 3 {
                0 => 1 + rng(&mut x) % 3,
                1 => 10 + rng(&mut x) % 8,
                _ => 300,
            };
            let draw = |x: &mut u64| (rng(x) % alpha).min(rng(x) % alpha) as u32;
            let len = 1 + rng(&mut x) % 300;
            let toks: Vec<u32> = (0..len).map(|_| draw(&mut x)).collect();
            let mut a = SuffixIndex::new(depth as i64).unwrap();
            let sa = a.add_seq();
            a.index_sorted(sa, &toks);
            let mut b = SuffixIndex::new(depth as i64).unwrap();
            let sb = b.add_seq();
            b.append_run(sb, &toks);
            let mut seqs = vec![toks.clone()];
            let same = |a: &SuffixIndex, b: &SuffixIndex, seqs: &[Vec<u32>], what: &str| {
                // The online appends can leave a node boundary inside an equal-count chain.
                assert!(a.num_nodes() <= b.num_nodes(), "round {round} {what}");
                assert_eq!(a.num_tokens(), b.num_tokens(), "round {round} {what}");
                assert!(counts_ok(a, seqs, depth), "round {round} {what}");
            };
            same(&a, &b, &seqs, "built");
            let opt = ProposeOptions::new(8, 0.01, 4.0, false).unwrap();
            let propose_same = |a: &SuffixIndex, b: &SuffixIndex, x: &mut u64| {
                assert_eq!(
                    a.propose_own(sa, &opt),
                    b.propose_own(sb, &opt),
                    "round {round}"
                );
                for _ in 0..5 {
                    let ctx: Vec<u32> = (0..1 + rng(x) % 6).map(|_| draw(x)).collect();
                    assert_eq!(a.propose_for(&ctx, &opt), b.propose_for(&ctx, &opt));
                }
            };
            propose_same(&a, &b, &mut x);
            // Online appends continue from the derived active suffixes.
            let more: Vec<u32> = (0..rng(&mut x) % 40).map(|_| draw(&mut x)).collect();
            a.append(sa, &more);
            b.append(sb, &more);
            seqs[0].extend(&more);
            same(&a, &b, &seqs, "appended");
            propose_same(&a, &b, &mut x);
            let other: Vec<u32> = (0..rng(&mut x) % 60).map(|_| draw(&mut x)).collect();
            let (oa, ob) = (a.add_seq(), b.add_seq());
            a.append(oa, &other);
            b.append(ob, &other);
            seqs.push(other);
            same(&a, &b, &seqs, "second sequence");
            a.remove_seq(sa);
            b.remove_seq(sb);
            seqs.remove(0);
            assert!(counts_ok(&a, &seqs, depth), "round {round} removed");
            a.remove_seq(oa);
            assert_eq!(a.num_nodes(), 1, "round {round}");
            assert!(a.lookup.is_empty() && a.seqs.iter().all(Option::is_none));
        }
    }

    /// Appends interleaved between sequences, removals in any order, counts checked after
    /// every operation; removing everything frees every node and every sequence.
    #[test]
    fn interleaved_appends_and_removals() {
        let mut x = 7u64;
        let mut wide_entries = 0;
        for round in 0..1500 {
            let depth = 1 + (rng(&mut x) % 7) as usize;
            let mut idx = SuffixIndex::new(depth as i64).unwrap();
            let mut live: Vec<(u32, Vec<u32>)> = Vec::new();
            // Odd rounds: a wider, skewed alphabet and longer sequences, so that nodes get
            // `WIDE_MIN` children and more (hash-indexed children).
            let wide = round % 2 == 1;
            let alpha = if wide {
                10 + rng(&mut x) % 8
            } else {
                1 + rng(&mut x) % 3
            };
            let scale = if wide { 5 } else { 1 };
            let draw = |x: &mut u64| (rng(x) % alpha).min(rng(x) % alpha) as u32;
            let mut ops = vec![format!("depth {depth}")];
            for _ in 0..10 {
                match rng(&mut x) % 4 {
                    0 if !live.is_empty() => {
                        let k = (rng(&mut x) as usize) % live.len();
                        let (s, _) = live.remove(k);
                        ops.push(format!("rm {s}"));
                        idx.remove_seq(s);
                    }
                    1 | 2 if !live.is_empty() => {
                        let k = (rng(&mut x) as usize) % live.len();
                        let len = rng(&mut x) % (6 * scale);
                        let toks: Vec<u32> = (0..len).map(|_| draw(&mut x)).collect();
                        idx.append(live[k].0, &toks);
                        ops.push(format!("app {} {toks:?}", live[k].0));
                        live[k].1.extend(&toks);
                    }
                    _ => {
                        let s = idx.add_seq();
                        let len = rng(&mut x) % (10 * scale);
                        let toks: Vec<u32> = (0..len).map(|_| draw(&mut x)).collect();
                        idx.append(s, &toks);
                        ops.push(format!("new {s} {toks:?}"));
                        live.push((s, toks));
                    }
                }
                for v in 1..idx.nodes.len() {
                    if idx.nodes[v].count > 0 && idx.seqs[idx.nodes[v].rseq as usize].is_none() {
                        panic!(
                            "round {round} node {v} refs freed {} ops {ops:?}",
                            idx.nodes[v].rseq
                        );
                    }
                }
                wide_entries += idx.lookup.len();
                let seqs: Vec<Vec<u32>> = live.iter().map(|(_, t)| t.clone()).collect();
                assert!(counts_ok(&idx, &seqs, depth), "round {round} {ops:?}");
                if let Some(&(s, _)) = live.iter().find(|(s, _)| idx.open == Some(*s)) {
                    assert_eq!(
                        own_by_walks(&idx, s),
                        own_by_search(&idx, s),
                        "round {round}"
                    );
                }
            }
            for (s, _) in live {
                idx.remove_seq(s);
            }
            assert_eq!(idx.num_nodes(), 1, "round {round}");
            assert!(idx.lookup.is_empty());
            assert!(
                idx.seqs.iter().all(Option::is_none),
                "round {round}: a dead sequence is kept"
            );
        }
        assert!(wide_entries > 0, "no wide node was exercised");
    }
}
