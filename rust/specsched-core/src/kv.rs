//! KV cache after verification.
//!
//! The verify pass wrote node `i`'s KV at sequence position `prefix + i`; after accepting
//! `0, a1, ..., ak` the kept entries must sit at `prefix + 0..=k`. The plan lists the moves
//! `prefix + a_j -> prefix + j` with `a_j != j`. Since `a_j >= j` and the `a_j` increase,
//! applying the moves in order never overwrites a source still to be read, so compaction is
//! in place with no temporary copy. [`StridedMut`] applies a plan to any strided buffer (any
//! dtype, any layout with a sequence axis and optionally a batch axis), copying the largest
//! contiguous run of the remaining axes with one `memcpy`. The paged form ([`commit_slots`])
//! moves nothing: it splits slot ids into kept (path order) and freed.

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::tree::IndexLike;
use crate::verify::{BatchVerified, Verified};

/// One sequence move of request `req` (0 for a single tree).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    pub req: usize,
    pub src: usize,
    pub dst: usize,
}

/// A prefix length for a tree of `num_nodes`: non-negative, and every position the tree
/// occupies (`prefix + node`) must be a valid int64.
fn check_prefix(
    arg: &'static str,
    index: Option<usize>,
    p: i64,
    num_nodes: usize,
) -> Result<usize> {
    let last = num_nodes.saturating_sub(1) as i64;
    if p >= 0 && p.checked_add(last).is_some() {
        return Ok(p as usize);
    }
    // Named only on the way out: formatting on every call cost a string allocation per
    // request of every compaction.
    let name = match index {
        Some(i) => format!("prefix_lens[{i}] = {p}"),
        None => format!("prefix_lens = {p}"),
    };
    Err(if p < 0 {
        Error::value(arg, format!("{name}, must be >= 0"))
    } else {
        Error::value(
            arg,
            format!("{name}: positions up to prefix + {last} do not fit in int64"),
        )
    })
}

/// Moves for one verified tree at `prefix`.
pub fn compaction_plan(r: &Verified, prefix: i64) -> Result<Vec<Move>> {
    let prefix = check_prefix("prefix_lens", None, prefix, r.num_nodes)?;
    Ok(plan_row(&r.accepted_nodes, prefix, 0).collect())
}

fn plan_row(accepted: &[i32], prefix: usize, req: usize) -> impl Iterator<Item = Move> + '_ {
    accepted
        .iter()
        .enumerate()
        .take_while(|(_, &a)| a >= 0)
        .filter(|(j, &a)| a as usize != *j)
        .map(move |(j, &a)| Move {
            req,
            src: prefix + a as usize,
            dst: prefix + j,
        })
}

/// Moves for a verified batch, request-major; `prefix` has one entry per request. A request
/// with `active[b] == false` (finished, or a padding row of a fixed-size batch) moves nothing.
pub fn batch_compaction_plan(
    r: &BatchVerified,
    prefix: &[i64],
    active: Option<&[bool]>,
) -> Result<Vec<Move>> {
    for (arg, len) in [
        ("prefix_lens", Some(prefix.len())),
        ("active", active.map(<[bool]>::len)),
    ] {
        if let Some(len) = len.filter(|&l| l != r.num_trees()) {
            return Err(Error::value(
                arg,
                format!(
                    "has {len} entries, expected one per request ({})",
                    r.num_trees()
                ),
            ));
        }
    }
    let mut moves = Vec::new();
    for (b, &p) in prefix.iter().enumerate() {
        let p = check_prefix("prefix_lens", Some(b), p, r.offsets[b + 1] - r.offsets[b])?;
        if active.is_none_or(|a| a[b]) {
            moves.extend(plan_row(r.accepted_row(b), p, b));
        }
    }
    Ok(moves)
}

/// Committed length after compacting one tree at `prefix` (checked by [`compaction_plan`]):
/// the prefix, the accepted drafts and the root's slot, now holding the path's first token.
pub fn committed_length(r: &Verified, prefix: i64) -> Result<i64> {
    grown("prefix_lens", None, prefix, r.accepted_nodes.len())
}

/// [`committed_length`] of every request of a batch (`prefix` and `active` checked by
/// [`batch_compaction_plan`]); a request that is not active keeps its prefix.
pub fn batch_committed_lengths(
    r: &BatchVerified,
    prefix: &[i64],
    active: Option<&[bool]>,
) -> Result<Vec<i64>> {
    prefix
        .iter()
        .zip(&r.num_accepted)
        .enumerate()
        .map(|(b, (&p, &k))| {
            let kept = if active.is_none_or(|a| a[b]) {
                k as usize + 1
            } else {
                0
            };
            grown("prefix_lens", Some(b), p, kept)
        })
        .collect()
}

fn grown(arg: &'static str, req: Option<usize>, prefix: i64, kept: usize) -> Result<i64> {
    i64::try_from(kept)
        .ok()
        .and_then(|k| prefix.checked_add(k))
        .ok_or_else(|| {
            let at = req.map_or(String::new(), |b| format!("[{b}]"));
            Error::value(
                arg,
                format!("prefix_lens{at} = {prefix}: the committed length overflows int64"),
            )
        })
}

/// The sequence and batch axes exist and differ.
fn check_axes(ndim: usize, seq_dim: usize, batch_dim: Option<usize>) -> Result<()> {
    if seq_dim >= ndim {
        return Err(Error::value(
            "seq_dim",
            format!("is {seq_dim}, but the cache has {ndim} dimensions"),
        ));
    }
    match batch_dim {
        Some(bd) if bd >= ndim => Err(Error::value(
            "batch_dim",
            format!("is {bd}, but the cache has {ndim} dimensions"),
        )),
        Some(bd) if bd == seq_dim => Err(Error::value("batch_dim", "must differ from seq_dim")),
        _ => Ok(()),
    }
}

/// Checks a cache shape against the requests a plan serves: the batch axis (if any) has one
/// row per request and the sequence axis holds `prefix + num_nodes` for every request.
/// `extents[b] = (prefix_b, num_nodes_b)`.
pub fn check_cache_shape(
    shape: &[usize],
    seq_dim: usize,
    batch_dim: Option<usize>,
    extents: &[(usize, usize)],
) -> Result<()> {
    check_axes(shape.len(), seq_dim, batch_dim)?;
    if let Some(bd) = batch_dim {
        if shape[bd] != extents.len() {
            return Err(Error::value(
                "cache",
                format!(
                    "batch axis {bd} has length {}, expected one row per request ({})",
                    shape[bd],
                    extents.len()
                ),
            ));
        }
    }
    for (b, &(p, n)) in extents.iter().enumerate() {
        if p + n > shape[seq_dim] {
            return Err(Error::value(
                "cache",
                format!(
                    "sequence axis {seq_dim} has length {}, too short for request {b}: prefix {p} + {n} tree nodes",
                    shape[seq_dim]
                ),
            ));
        }
    }
    Ok(())
}

/// Compactions moving fewer bytes run on the calling thread.
const PARALLEL_MIN_BYTES: usize = 1 << 20;

/// The addresses `[start, end)` that a strided buffer at `addr` spans (`strides` in bytes,
/// possibly negative); empty (`start == end`) when the buffer has no element. Pure arithmetic
/// on the description: the buffer is never read, so this also serves device memory.
pub fn byte_span(
    addr: usize,
    shape: &[usize],
    strides: &[isize],
    itemsize: usize,
) -> (usize, usize) {
    if shape.contains(&0) {
        return (addr, addr);
    }
    // A description whose reach does not fit the address space (only a hostile one: a real
    // buffer cannot) spans everything, so it overlaps whatever it is compared with.
    let everything = (0, usize::MAX);
    let (mut low, mut high) = (0isize, 0isize);
    for (&n, &s) in shape.iter().zip(strides) {
        let Some(reach) = isize::try_from(n - 1).ok().and_then(|m| m.checked_mul(s)) else {
            return everything;
        };
        let side = if reach < 0 { &mut low } else { &mut high };
        let Some(sum) = side.checked_add(reach) else {
            return everything;
        };
        *side = sum;
    }
    let start = addr.checked_add_signed(low);
    let end = addr
        .checked_add_signed(high)
        .and_then(|e| e.checked_add(itemsize));
    match (start, end) {
        (Some(start), Some(end)) => (start, end),
        _ => everything,
    }
}

/// The first pair of entries (by index) whose spans overlap, if any: two views of one buffer
/// given as two caches would each get every move, so a chained plan would read entries it
/// already overwrote. Address ranges, as `numpy.may_share_memory` compares them: two
/// interleaved views that touch no common element are refused too.
pub fn overlapping_pair(spans: &[(usize, usize)]) -> Option<(usize, usize)> {
    let mut order: Vec<usize> = (0..spans.len())
        .filter(|&i| spans[i].0 < spans[i].1)
        .collect();
    order.sort_unstable_by_key(|&i| spans[i].0);
    // The entry reaching furthest so far: any later start before its end overlaps it.
    let mut reach: Option<usize> = None;
    for &i in &order {
        if let Some(r) = reach {
            if spans[i].0 < spans[r].1 {
                return Some((r.min(i), r.max(i)));
            }
        }
        if reach.is_none_or(|r| spans[i].1 > spans[r].1) {
            reach = Some(i);
        }
    }
    None
}

/// Refuses buffers (host or device memory, by description) that may share memory
/// ([`byte_span`], [`overlapping_pair`]), naming the first pair.
pub fn check_disjoint(parts: &[RawParts]) -> Result<()> {
    if parts.len() < 2 {
        return Ok(());
    }
    let spans: Vec<(usize, usize)> = parts
        .iter()
        .map(|p| byte_span(p.ptr as usize, &p.shape, &p.strides, p.itemsize))
        .collect();
    match overlapping_pair(&spans) {
        None => Ok(()),
        Some((i, j)) => Err(Error::value(
            "cache",
            format!(
                "entries {i} and {j} may share memory (their address ranges overlap); pass each buffer once"
            ),
        )),
    }
}

/// Why a self-overlapping buffer is refused.
pub const SELF_OVERLAP: &str = "has overlapping memory (a broadcast or self-overlapping view); \
                                pass a buffer that owns its elements";

/// Whether two indices of a strided layout (`strides` in bytes) share memory: a broadcast
/// (zero stride) or an overlapping view. Pure arithmetic on the description, so it serves
/// device memory too.
pub fn is_self_overlapping(shape: &[usize], strides: &[isize], itemsize: usize) -> bool {
    if shape.contains(&0) {
        return false;
    }
    // `(|stride|, length)` of the axes that step, innermost last as numpy lays them out.
    let axes = || {
        shape
            .iter()
            .zip(strides)
            .filter(|(&n, _)| n > 1)
            .map(|(&n, &s)| (s.unsigned_abs(), n))
    };
    // Strides ascending from the last axis (a C-ordered buffer or a view of one, every cache
    // a decode loop passes) need no sort and no vector.
    let disjoint = if axes().rev().map(|(s, _)| s).is_sorted() {
        steps_past_inner_axes(axes().rev(), itemsize)
    } else {
        let mut sorted: Vec<(usize, usize)> = axes().collect();
        sorted.sort_unstable();
        steps_past_inner_axes(sorted.into_iter(), itemsize)
    };
    !disjoint
}

/// Whether each axis of `axes` (`(|stride|, length)` by ascending stride) steps past every
/// byte the axes before it span from one element (`itemsize` bytes): then no two indices
/// share memory.
fn steps_past_inner_axes(axes: impl Iterator<Item = (usize, usize)>, itemsize: usize) -> bool {
    let mut span = itemsize; // bytes covered by the inner axes
    for (stride, n) in axes {
        if stride < span {
            return false;
        }
        // A reach past the address space (a hostile description) is not a layout.
        let Some(next) = stride.checked_mul(n - 1).and_then(|r| span.checked_add(r)) else {
            return false;
        };
        span = next;
    }
    true
}

/// The buffer pointer, shared by the threads of one compaction.
#[derive(Clone, Copy)]
struct SharedPtr(*mut u8);

// SAFETY: threads of one `apply` call write disjoint outer blocks (distinct indices of a
// layout checked to be non-overlapping), so sharing the base pointer races on nothing.
unsafe impl Send for SharedPtr {}
unsafe impl Sync for SharedPtr {}

impl SharedPtr {
    // A method (not field access) so closures capture the whole Sync wrapper.
    #[inline]
    fn get(self) -> *mut u8 {
        self.0
    }
}

/// The raw description of a strided buffer: address, shape, byte strides, element size.
pub struct RawParts {
    pub ptr: *mut u8,
    pub shape: Vec<usize>,
    pub strides: Vec<isize>,
    pub itemsize: usize,
}

/// A writable strided buffer of any element type, described by raw parts.
pub struct StridedMut {
    ptr: *mut u8,
    shape: Vec<usize>,
    /// Byte strides, possibly negative.
    strides: Vec<isize>,
    itemsize: usize,
}

// SAFETY: a StridedMut is the exclusive handle to its buffer for its lifetime (see `new`);
// moving it to another thread moves that exclusivity with it.
unsafe impl Send for StridedMut {}

impl StridedMut {
    /// # Safety
    /// `ptr`, `shape`, `strides` (bytes) and `itemsize` must describe memory that is valid for
    /// reads and writes at every index within `shape`, and nothing else may access it while the
    /// returned value is alive.
    pub unsafe fn new(
        ptr: *mut u8,
        shape: Vec<usize>,
        strides: Vec<isize>,
        itemsize: usize,
    ) -> Result<StridedMut> {
        if shape.len() != strides.len() {
            return Err(Error::value("cache", "shape and strides differ in length"));
        }
        let buf = StridedMut {
            ptr,
            shape,
            strides,
            itemsize,
        };
        buf.check_no_self_overlap()?;
        Ok(buf)
    }

    /// One handle per description, refused when any two may share memory
    /// ([`check_disjoint`]): [`Self::new`]'s exclusivity forbids it, and a plan applied to both
    /// would move an entry twice.
    ///
    /// # Safety
    /// Each description must satisfy [`Self::new`]'s requirements on its own.
    pub unsafe fn new_disjoint(parts: Vec<RawParts>) -> Result<Vec<StridedMut>> {
        check_disjoint(&parts)?;
        parts
            .into_iter()
            // SAFETY: each description is valid (the caller's promise) and no two overlap
            // (checked above), so each handle is the only one to its memory.
            .map(|p| unsafe { StridedMut::new(p.ptr, p.shape, p.strides, p.itemsize) })
            .collect()
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Refuses buffers in which two indices share memory (broadcast or overlapping views):
    /// a move into one would silently change another.
    fn check_no_self_overlap(&self) -> Result<()> {
        if is_self_overlapping(&self.shape, &self.strides, self.itemsize) {
            Err(Error::value("cache", SELF_OVERLAP))
        } else {
            Ok(())
        }
    }

    /// The axes below `end` other than the sequence and batch axes, outermost first: a move
    /// copies one position of one request across all of them.
    fn other_axes(
        seq_dim: usize,
        batch_dim: Option<usize>,
        end: usize,
    ) -> impl DoubleEndedIterator<Item = usize> + Clone {
        (0..end).filter(move |&d| d != seq_dim && Some(d) != batch_dim)
    }

    /// Bytes `moves` copy in this buffer: for each move that is not onto itself, one position
    /// of one request, every other index.
    fn moved_bytes(&self, seq_dim: usize, batch_dim: Option<usize>, moves: &[Move]) -> usize {
        let per_position: usize = Self::other_axes(seq_dim, batch_dim, self.shape.len())
            .map(|d| self.shape[d])
            .product();
        let copies = moves.iter().filter(|m| m.src != m.dst).count();
        copies * per_position * self.itemsize
    }

    /// Checks that `moves` fit this buffer along `seq_dim` and `batch_dim`.
    fn check_moves(&self, seq_dim: usize, batch_dim: Option<usize>, moves: &[Move]) -> Result<()> {
        check_axes(self.shape.len(), seq_dim, batch_dim)?;
        let seq_len = self.shape[seq_dim];
        let batch_len = batch_dim.map_or(1, |d| self.shape[d]);
        for m in moves {
            if m.src >= seq_len || m.dst >= seq_len {
                return Err(Error::value(
                    "cache",
                    format!(
                        "sequence axis {seq_dim} has length {seq_len}, too short for a move from position {} to {}",
                        m.src, m.dst
                    ),
                ));
            }
            if m.req >= batch_len {
                return Err(Error::value(
                    "cache",
                    format!(
                        "batch axis has length {batch_len}, but request {} is moved",
                        m.req
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Applies `moves` in order along `seq_dim`; `batch_dim` selects the request axis.
    pub fn apply(
        &mut self,
        seq_dim: usize,
        batch_dim: Option<usize>,
        moves: &[Move],
    ) -> Result<()> {
        // Check every move before writing anything, so a bad plan leaves the cache untouched.
        self.check_moves(seq_dim, batch_dim, moves)?;
        // A move onto itself is a no-op (plans never list one, but `moves` is any caller's);
        // dropping it keeps every copy below between disjoint ranges. A plan with nothing to
        // move (the accepted path already in place) allocates and touches nothing.
        if moves.iter().all(|m| m.src == m.dst) {
            return Ok(());
        }
        let (shape, strides) = (&self.shape[..], &self.strides[..]);
        let other = Self::other_axes(seq_dim, batch_dim, shape.len());
        if other.clone().any(|d| shape[d] == 0) {
            return Ok(());
        }
        // The other axes, innermost first: those contiguous with the element merge into one
        // memcpy chunk; the rest, below `outer_end`, number the outer blocks.
        let (mut chunk, mut outer_end) = (self.itemsize, shape.len());
        for d in other.clone().rev() {
            if strides[d] != chunk as isize {
                break;
            }
            chunk *= shape[d];
            outer_end = d;
        }
        let outer_axes = || Self::other_axes(seq_dim, batch_dim, outer_end);
        let outer: usize = outer_axes().map(|d| shape[d]).product();
        // Byte offset of outer block `o` (row-major over the outer axes).
        let outer_offset = |mut o: usize| {
            let mut off = 0isize;
            for d in outer_axes().rev() {
                off += (o % shape[d]) as isize * strides[d];
                o /= shape[d];
            }
            off
        };
        // Byte offsets of every move's source and destination within one outer block.
        let (seq_stride, batch_stride) = (strides[seq_dim], batch_dim.map_or(0, |d| strides[d]));
        let pairs: Vec<(isize, isize)> = moves
            .iter()
            .filter(|m| m.src != m.dst)
            .map(|m| {
                let base = m.req as isize * batch_stride;
                (
                    base + m.src as isize * seq_stride,
                    base + m.dst as isize * seq_stride,
                )
            })
            .collect();
        // Block-major: all moves of one (layer, head, ...) block back to back, so its pages are
        // hot; the moves keep their order inside a block, which is all the plan's safety needs.
        let ptr = SharedPtr(self.ptr);
        let run = |blocks: std::ops::Range<usize>| {
            for o in blocks {
                let off = outer_offset(o);
                for &(src, dst) in &pairs {
                    // SAFETY: every index is within `shape` (moves checked above, `o < outer`),
                    // so both ranges lie inside the buffer `new` was promised; src and dst
                    // differ in the sequence index of a non-overlapping layout, so the
                    // `chunk`-byte ranges are disjoint.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            ptr.get().offset(src + off),
                            ptr.get().offset(dst + off),
                            chunk,
                        );
                    }
                }
            }
        };
        if outer > 1 && self.moved_bytes(seq_dim, batch_dim, moves) >= PARALLEL_MIN_BYTES {
            let pieces = (rayon::current_num_threads() * 4).min(outer);
            let per = outer.div_ceil(pieces);
            (0..pieces)
                .into_par_iter()
                .for_each(|i| run(i * per..((i + 1) * per).min(outer)));
        } else {
            run(0..outer);
        }
        Ok(())
    }
}

/// Applies `moves` to each of `buffers` (one plan for a model's layers, keys and values). Every
/// buffer is checked first, so a refused call writes nothing. Buffers that move at least
/// `PARALLEL_MIN_BYTES` together are spread over the thread pool, one buffer a task.
pub fn apply_all(
    buffers: &mut [StridedMut],
    seq_dim: usize,
    batch_dim: Option<usize>,
    moves: &[Move],
) -> Result<()> {
    // Every buffer before any is written. `apply` checks its own again (a pass over the moves,
    // not the bytes), so the safety argument of its copies stays in one function.
    for buffer in buffers.iter() {
        buffer.check_moves(seq_dim, batch_dim, moves)?;
    }
    let bytes: usize = buffers
        .iter()
        .map(|b| b.moved_bytes(seq_dim, batch_dim, moves))
        .sum();
    if buffers.len() > 1 && bytes >= PARALLEL_MIN_BYTES {
        buffers
            .par_iter_mut()
            .try_for_each(|b| b.apply(seq_dim, batch_dim, moves))
    } else {
        buffers
            .iter_mut()
            .try_for_each(|b| b.apply(seq_dim, batch_dim, moves))
    }
}

/// Paged form for one tree: `(kept, freed)` slot ids — the accepted nodes' slots in path order,
/// and every other node's slot in node order.
pub fn commit_slots<I: IndexLike>(
    slots: ndarray::ArrayView1<'_, I>,
    r: &Verified,
) -> Result<(Vec<i64>, Vec<i64>)> {
    if slots.len() != r.num_nodes {
        return Err(Error::value(
            "slots",
            format!(
                "has {} entries, expected one per tree node ({})",
                slots.len(),
                r.num_nodes
            ),
        ));
    }
    Ok(split_slots(slots, 0, r.num_nodes, &r.accepted_nodes))
}

fn split_slots<I: IndexLike>(
    slots: ndarray::ArrayView1<'_, I>,
    base: usize,
    n: usize,
    accepted: &[i32],
) -> (Vec<i64>, Vec<i64>) {
    let mut keep = vec![false; n];
    let mut kept = Vec::with_capacity(accepted.len());
    for &a in accepted.iter().take_while(|&&a| a >= 0) {
        keep[a as usize] = true;
        kept.push(slots[base + a as usize].to_i64());
    }
    let freed = (0..n)
        .filter(|&i| !keep[i])
        .map(|i| slots[base + i].to_i64())
        .collect();
    (kept, freed)
}

/// Paged form for a batch: kept `[B, width]` (-1 padded, row-major) and freed (flat,
/// request-major).
pub fn batch_commit_slots<I: IndexLike>(
    slots: ndarray::ArrayView1<'_, I>,
    r: &BatchVerified,
) -> Result<(Vec<i64>, Vec<i64>)> {
    let total = *r.offsets.last().unwrap_or(&0);
    if slots.len() != total {
        return Err(Error::value(
            "slots",
            format!(
                "has {} entries, expected one per tree node ({total})",
                slots.len()
            ),
        ));
    }
    let mut kept = vec![-1i64; r.num_trees() * r.width];
    let mut freed = Vec::with_capacity(total);
    for b in 0..r.num_trees() {
        let (base, end) = (r.offsets[b], r.offsets[b + 1]);
        let (k, f) = split_slots(slots, base, end - base, r.accepted_row(b));
        kept[b * r.width..b * r.width + k.len()].copy_from_slice(&k);
        freed.extend(f);
    }
    Ok((kept, freed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::ArrayView1;

    fn verified(nodes: &[i32], n: usize) -> Verified {
        Verified {
            accepted_nodes: nodes.to_vec(),
            tokens: vec![0; nodes.len()],
            num_nodes: n,
        }
    }

    #[test]
    fn plan_skips_nodes_already_in_place() {
        let r = verified(&[0, 1, 4, 6], 8);
        let plan = compaction_plan(&r, 10).unwrap();
        assert_eq!(
            plan,
            [
                Move {
                    req: 0,
                    src: 14,
                    dst: 12
                },
                Move {
                    req: 0,
                    src: 16,
                    dst: 13
                }
            ]
        );
        assert!(compaction_plan(&r, -1).is_err());
        assert!(compaction_plan(&r, i64::MAX - 3).is_err());
    }

    #[test]
    fn committed_length_counts_the_path_and_root_slot() {
        let r = verified(&[0, 1, 4, 6], 8);
        assert_eq!(committed_length(&r, 10).unwrap(), 14);
        // the plan accepts this prefix (node 7 fits at i64::MAX), the grown length does not
        let edge = i64::MAX - 7;
        assert!(compaction_plan(&r, edge).is_ok());
        assert_eq!(committed_length(&r, edge).unwrap(), i64::MAX - 3);
        // a fully accepted tree there: every node fits, the length past them does not
        let full = verified(&[0, 1, 2, 3, 4, 5, 6, 7], 8);
        assert!(compaction_plan(&full, edge).is_ok());
        assert!(committed_length(&full, edge).is_err());
    }

    /// A request that is not active (finished, or padding) moves nothing and keeps its
    /// prefix; the others are planned as without `active`.
    #[test]
    fn inactive_requests_move_nothing_and_keep_their_prefix() {
        // Two trees of 8 nodes: request 0 accepts 0, 2 (a move), request 1 accepts 0, 5.
        let r = BatchVerified {
            num_accepted: vec![1, 1],
            accepted_nodes: vec![0, 2, -1, 0, 5, -1],
            tokens: vec![0; 6],
            width: 3,
            offsets: vec![0, 8, 16],
        };
        let prefix = [4, 10];
        let all = batch_compaction_plan(&r, &prefix, None).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(
            batch_compaction_plan(&r, &prefix, Some(&[true, true])).unwrap(),
            all
        );
        let some = batch_compaction_plan(&r, &prefix, Some(&[false, true])).unwrap();
        assert_eq!(
            some,
            [Move {
                req: 1,
                src: 15,
                dst: 11
            }]
        );
        assert_eq!(
            batch_committed_lengths(&r, &prefix, Some(&[false, true])).unwrap(),
            [4, 12]
        );
        assert_eq!(batch_committed_lengths(&r, &prefix, None).unwrap(), [6, 12]);
        let e = batch_compaction_plan(&r, &prefix, Some(&[true])).unwrap_err();
        assert!(e.to_string().contains("active"), "{e}");
        // An inactive request's prefix is still checked: the cache must hold its tree.
        assert!(batch_compaction_plan(&r, &[-1, 10], Some(&[false, true])).is_err());
    }

    #[test]
    fn strided_moves_on_a_seq_middle_layout() {
        // [2, 6, 3] with seq_dim = 1, f32 elements.
        let mut data: Vec<f32> = (0..36).map(|x| x as f32).collect();
        let moves = [
            Move {
                req: 0,
                src: 4,
                dst: 1,
            },
            Move {
                req: 0,
                src: 5,
                dst: 2,
            },
        ];
        // SAFETY: the parts describe `data` exactly and nothing else touches it meanwhile.
        let mut buf = unsafe {
            StridedMut::new(
                data.as_mut_ptr() as *mut u8,
                vec![2, 6, 3],
                vec![72, 12, 4],
                4,
            )
        }
        .unwrap();
        buf.apply(1, None, &moves).unwrap();
        for outer in 0..2 {
            for c in 0..3 {
                let at = |s: usize| data[outer * 18 + s * 3 + c];
                assert_eq!(at(1), (outer * 18 + 4 * 3 + c) as f32);
                assert_eq!(at(2), (outer * 18 + 5 * 3 + c) as f32);
                assert_eq!(at(0), (outer * 18 + c) as f32);
            }
        }
    }

    #[test]
    fn a_move_onto_itself_changes_nothing() {
        let mut data: [u8; 8] = std::array::from_fn(|i| i as u8);
        let mut buf =
            unsafe { StridedMut::new(data.as_mut_ptr(), vec![4, 2], vec![2, 1], 1) }.unwrap();
        let same = |p| Move {
            req: 0,
            src: p,
            dst: p,
        };
        buf.apply(0, None, &[same(1), same(3)]).unwrap();
        assert_eq!(data, [0, 1, 2, 3, 4, 5, 6, 7]);
    }

    #[test]
    fn refuses_overlap_and_out_of_range() {
        let mut data = [0u8; 8];
        // Broadcast: stride 0 over 4 elements.
        let r = unsafe { StridedMut::new(data.as_mut_ptr(), vec![4, 2], vec![0, 1], 1) };
        assert!(r.is_err());
        let mut buf =
            unsafe { StridedMut::new(data.as_mut_ptr(), vec![4, 2], vec![2, 1], 1) }.unwrap();
        let before = data;
        assert!(buf
            .apply(
                0,
                None,
                &[Move {
                    req: 0,
                    src: 4,
                    dst: 0
                }]
            )
            .is_err());
        assert_eq!(data, before);
    }

    /// Every layout of up to three axes of lengths 1..=3 over a few strides (negative, zero,
    /// interleaved, in every axis order): the unsorted fast path of `check_no_self_overlap`
    /// answers as sorting the axes does, and a layout it accepts has no two elements sharing a
    /// byte.
    #[test]
    fn self_overlap_check_needs_no_sort_in_axis_order_and_is_sound() {
        let sorted_check = |shape: &[usize], strides: &[isize], itemsize: usize| {
            let mut axes: Vec<(usize, usize)> = shape
                .iter()
                .zip(strides)
                .filter(|(&n, _)| n > 1)
                .map(|(&n, &s)| (s.unsigned_abs(), n))
                .collect();
            axes.sort_unstable();
            shape.contains(&0) || steps_past_inner_axes(axes.into_iter(), itemsize)
        };
        let strides_pool = [-24isize, -8, -4, 0, 4, 8, 12, 16, 24, 48];
        let mut layouts = 0;
        for ndim in 1..=3usize {
            for lens in 0..3usize.pow(ndim as u32) {
                let shape: Vec<usize> = (0..ndim)
                    .map(|d| lens / 3usize.pow(d as u32) % 3 + 1)
                    .collect();
                for pick in 0..strides_pool.len().pow(ndim as u32) {
                    let strides: Vec<isize> = (0..ndim)
                        .map(|d| {
                            strides_pool
                                [pick / strides_pool.len().pow(d as u32) % strides_pool.len()]
                        })
                        .collect();
                    let mut data = [0u8; 1];
                    // SAFETY: `new` only checks the description; nothing is read or written
                    // through the pointer (the handle is dropped unused).
                    let made = unsafe {
                        StridedMut::new(data.as_mut_ptr(), shape.clone(), strides.clone(), 4)
                    };
                    assert_eq!(
                        made.is_ok(),
                        sorted_check(&shape, &strides, 4),
                        "{shape:?} {strides:?}"
                    );
                    if made.is_ok() {
                        let mut starts = Vec::new();
                        for flat in 0..shape.iter().product::<usize>() {
                            let (mut rest, mut at) = (flat, 0isize);
                            for d in (0..ndim).rev() {
                                at += (rest % shape[d]) as isize * strides[d];
                                rest /= shape[d];
                            }
                            starts.push(at);
                        }
                        starts.sort_unstable();
                        assert!(
                            starts.windows(2).all(|w| w[1] - w[0] >= 4),
                            "{shape:?} {strides:?}"
                        );
                    }
                    layouts += 1;
                }
            }
        }
        assert_eq!(layouts, 3 * 10 + 9 * 100 + 27 * 1000);
    }

    #[test]
    fn spans_cover_negative_strides_and_overlaps_are_found() {
        assert_eq!(byte_span(1000, &[3, 4], &[16, 4], 4), (1000, 1048));
        // x[::-1]: starts at the last element, reaches back to the first.
        assert_eq!(byte_span(1044, &[12], &[-4], 4), (1000, 1048));
        assert_eq!(byte_span(1000, &[0, 4], &[16, 4], 4), (1000, 1000));
        // Reaches past the address space span everything (and so overlap anything).
        assert_eq!(byte_span(4096, &[3, 1 << 62], &[8, 4], 4), (0, usize::MAX));
        assert_eq!(byte_span(usize::MAX - 8, &[4], &[8], 8), (0, usize::MAX));
        assert!(is_self_overlapping(&[3, 1 << 62], &[8, 4], 4));
        assert!(is_self_overlapping(&[3, (1 << 61) + 1], &[8, 8], 8));
        assert_eq!(overlapping_pair(&[(0, 10), (10, 20), (30, 40)]), None);
        assert_eq!(
            overlapping_pair(&[(30, 40), (0, 10), (5, 12)]),
            Some((1, 2))
        );
        // A long first entry overlaps one that starts after a short one in between.
        assert_eq!(
            overlapping_pair(&[(0, 100), (10, 20), (50, 60)]),
            Some((0, 1))
        );
        assert_eq!(overlapping_pair(&[(10, 20), (0, 100)]), Some((0, 1)));
        // Empty spans overlap nothing, wherever they sit.
        assert_eq!(overlapping_pair(&[(0, 100), (50, 50)]), None);
    }

    #[test]
    fn one_plan_moves_every_buffer_and_aliases_are_refused() {
        let moves = [Move {
            req: 0,
            src: 3,
            dst: 1,
        }];
        let mut a: [u8; 8] = std::array::from_fn(|i| i as u8);
        let mut b: [u8; 12] = std::array::from_fn(|i| 100 + i as u8);
        // SAFETY: each description covers its own array exactly; nothing else touches them.
        let mut bufs = unsafe {
            vec![
                StridedMut::new(a.as_mut_ptr(), vec![4, 2], vec![2, 1], 1).unwrap(),
                StridedMut::new(b.as_mut_ptr(), vec![4, 3], vec![3, 1], 1).unwrap(),
            ]
        };
        apply_all(&mut bufs, 0, None, &moves).unwrap();
        assert_eq!(a, [0, 1, 6, 7, 4, 5, 6, 7]);
        assert_eq!(b[3..6], [109, 110, 111]);
        // A buffer too short for a move: refused before any buffer is written.
        let (a0, b0) = (a, b);
        let far = [Move {
            req: 0,
            src: 3,
            dst: 0,
        }];
        let mut short = [7u8; 6];
        // SAFETY: as above, for `a`, `b` and `short`.
        let mut bufs = unsafe {
            vec![
                StridedMut::new(a.as_mut_ptr(), vec![4, 2], vec![2, 1], 1).unwrap(),
                StridedMut::new(short.as_mut_ptr(), vec![3, 2], vec![2, 1], 1).unwrap(),
            ]
        };
        assert!(apply_all(&mut bufs, 0, None, &far).is_err());
        assert_eq!((a, short), (a0, [7u8; 6]));
        // Two views of one array: refused by index before any handle exists.
        let base = b.as_mut_ptr();
        let view = |offset: usize, rows: usize| RawParts {
            // SAFETY: within `b` (offset + rows * 3 <= 12).
            ptr: unsafe { base.add(offset) },
            shape: vec![rows, 3],
            strides: vec![3, 1],
            itemsize: 1,
        };
        // SAFETY: each description covers part of `b`; the call must refuse the pair.
        let err = unsafe { StridedMut::new_disjoint(vec![view(0, 4), view(3, 2)]) }
            .err()
            .unwrap();
        assert!(err.to_string().contains("entries 0 and 1"), "{err}");
        // SAFETY: as above; these two halves do not overlap.
        let halves = unsafe { StridedMut::new_disjoint(vec![view(6, 2), view(0, 2)]) };
        assert_eq!(halves.map(|h| h.len()).ok(), Some(2));
        assert_eq!(b, b0);
    }

    #[test]
    fn many_large_buffers_move_in_parallel_as_each_would_alone() {
        // Two buffers of 64 positions x 20 KiB: 30 moves each, 1.2 MiB together.
        let (positions, row) = (64usize, 20 << 10);
        let moves: Vec<Move> = (0..30)
            .map(|j| Move {
                req: 0,
                src: 2 * j + 1,
                dst: j,
            })
            .collect();
        let fill = |seed: usize| -> Vec<u8> {
            (0..positions * row)
                .map(|i| (i / row * 31 + i % 251 + seed) as u8)
                .collect()
        };
        let (mut x, mut y) = (fill(1), fill(2));
        let (mut x_alone, mut y_alone) = (x.clone(), y.clone());
        let handle = |v: &mut Vec<u8>| {
            // SAFETY: the description covers `v` exactly; nothing else touches it meanwhile.
            unsafe {
                StridedMut::new(
                    v.as_mut_ptr(),
                    vec![positions, row],
                    vec![row as isize, 1],
                    1,
                )
            }
            .unwrap()
        };
        let mut both = vec![handle(&mut x), handle(&mut y)];
        assert!(
            both.iter()
                .map(|b| b.moved_bytes(0, None, &moves))
                .sum::<usize>()
                >= PARALLEL_MIN_BYTES
        );
        apply_all(&mut both, 0, None, &moves).unwrap();
        handle(&mut x_alone).apply(0, None, &moves).unwrap();
        handle(&mut y_alone).apply(0, None, &moves).unwrap();
        assert!(x == x_alone && y == y_alone);
        assert_ne!(x, fill(1));
    }

    #[test]
    fn slots_split_into_kept_and_freed() {
        let r = verified(&[0, 2, 3], 5);
        let slots = [10i64, 11, 12, 13, 14];
        let (kept, freed) = commit_slots(ArrayView1::from(&slots), &r).unwrap();
        assert_eq!(kept, [10, 12, 13]);
        assert_eq!(freed, [11, 14]);
    }
}
