//! KV compaction: plans for random verified trees and batches, applied by `StridedMut` to
//! caches of random shape, element size, axis order, gaps and negative strides. Invariants:
//! the result equals the gather model (`new[p + j] = old[p + a_j]` for the accepted path of
//! every active request, every other element unchanged, so nothing outside
//! `prefix..prefix + N` is written), the bytes around and between the elements are never
//! touched, and a cache too short for the plan is refused with the buffer unchanged. The
//! overlap test of several caches (`overlapping_pair`) agrees with the naive pairwise one.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ndarray::ArrayView1;
use specsched_core::kv::{
    batch_compaction_plan, compaction_plan, overlapping_pair, Move, StridedMut,
};
use specsched_core::verify::{choice_from_tokens, verify_batch};
use specsched_core::{Tree, TreeBatch};
use specsched_fuzz::{arb_tree, Bytes};

const GUARD: usize = 16;

/// All multi-indices of `shape`, row-major.
fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![vec![]];
    for &n in shape {
        out = out
            .into_iter()
            .flat_map(|p| {
                (0..n).map(move |i| {
                    let mut q = p.clone();
                    q.push(i);
                    q
                })
            })
            .collect();
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes::new(data);
    let nreq = 1 + b.below(3);
    let batched = b.bool();
    let nreq = if batched { nreq } else { 1 };
    let trees: Vec<Tree> = (0..nreq).map(|_| arb_tree(&mut b, 10, 3)).collect();
    let refs: Vec<&Tree> = trees.iter().collect();
    let batch = TreeBatch::from_trees(&refs).unwrap();
    let choice: Vec<i64> = (0..batch.num_nodes()).map(|_| b.below(3) as i64).collect();
    let f = choice_from_tokens(ArrayView1::from(&choice[..]), None, None, choice.len()).unwrap();
    let rb = verify_batch(&batch, &f, 1).unwrap();
    let prefix: Vec<i64> = (0..nreq).map(|_| b.below(4) as i64).collect();
    // Requests not active (finished, padding) move nothing.
    let active: Option<Vec<bool>> =
        (batched && b.bool()).then(|| (0..nreq).map(|_| b.bool()).collect());
    let moves: Vec<Move> = if batched {
        batch_compaction_plan(&rb, &prefix, active.as_deref()).unwrap()
    } else {
        compaction_plan(&rb.get(0), prefix[0]).unwrap()
    };
    // Plan model: src = p + a_j, dst = p + j for a_j != j, request-major, in path order.
    let mut want_moves = vec![];
    for r in (0..nreq).filter(|&r| active.as_ref().is_none_or(|a| a[r])) {
        let v = rb.get(r);
        for (j, &a) in v.accepted_nodes.iter().enumerate() {
            if a as usize != j {
                let p = prefix[r] as usize;
                want_moves.push(Move {
                    req: if batched { r } else { 0 },
                    src: p + a as usize,
                    dst: p + j,
                });
            }
        }
    }
    assert_eq!(moves, want_moves);
    if batched {
        assert!(batch_compaction_plan(&rb, &prefix[1..], None).is_err());
        assert!(batch_compaction_plan(&rb, &prefix, Some(&vec![true; nreq + 1])).is_err());
    }

    // The cache: ndim 1..=4 with a sequence axis and (batched) a request axis.
    let ndim = 1 + usize::from(batched) + b.below(3);
    let seq_dim = b.below(ndim);
    let batch_dim = if batched {
        Some((seq_dim + 1 + b.below(ndim - 1)) % ndim)
    } else {
        None
    };
    let need = (0..nreq)
        .map(|r| prefix[r] as usize + trees[r].num_nodes())
        .max()
        .unwrap();
    let short = b.u8() % 16 == 0 && need > 1;
    let mut shape: Vec<usize> = (0..ndim).map(|_| 1 + b.below(3)).collect();
    shape[seq_dim] = if short { need - 1 } else { need + b.below(2) };
    if let Some(bd) = batch_dim {
        shape[bd] = nreq;
    }
    let itemsize = [1, 2, 4, 8][b.below(4)];
    // Memory order: a permutation of the axes, innermost last; optional gaps and flips.
    let mut perm: Vec<usize> = (0..ndim).collect();
    for i in (1..ndim).rev() {
        perm.swap(i, b.below(i + 1));
    }
    let mut strides = vec![0isize; ndim];
    let mut size = itemsize;
    for &d in perm.iter().rev() {
        let gap = if b.u8() % 4 == 0 { itemsize } else { 0 };
        strides[d] = size as isize;
        size = size * shape[d] + gap;
    }
    let mut base = 0isize;
    for d in 0..ndim {
        if b.u8() % 4 == 0 {
            base += strides[d] * (shape[d] as isize - 1);
            strides[d] = -strides[d];
        }
    }
    let mut buf: Vec<u8> = (0..size + 2 * GUARD).map(|i| (i * 131 + 7) as u8).collect();
    let before = buf.clone();
    let offset = |idx: &[usize]| -> usize {
        let o = base
            + idx
                .iter()
                .zip(&strides)
                .map(|(&i, &s)| i as isize * s)
                .sum::<isize>();
        GUARD + o as usize
    };
    // SAFETY: shape/strides/base describe elements inside `buf` (checked by construction:
    // every offset lies in GUARD..GUARD + size), and nothing else touches `buf` meanwhile.
    let mut cache = unsafe {
        StridedMut::new(
            buf.as_mut_ptr().add(GUARD).offset(base),
            shape.clone(),
            strides.clone(),
            itemsize,
        )
    }
    .expect("a non-overlapping layout is accepted");
    let r = cache.apply(seq_dim, batch_dim, &moves);
    if short
        && !moves
            .iter()
            .all(|m| m.src < shape[seq_dim] && m.dst < shape[seq_dim])
    {
        assert!(r.is_err());
        assert_eq!(buf, before, "a refused plan writes nothing");
        return;
    }
    r.unwrap();
    // Gather model over logical elements.
    let mut want = before.clone();
    for idx in indices(&shape) {
        let req = batch_dim.map_or(0, |d| idx[d]);
        let s = idx[seq_dim];
        let p = prefix[req] as usize;
        let acc = &rb.get(req).accepted_nodes;
        let moved = active.as_ref().is_none_or(|a| a[req]);
        if moved && s >= p && s - p < acc.len() {
            let mut src = idx.clone();
            src[seq_dim] = p + acc[s - p] as usize;
            let (o, so) = (offset(&idx), offset(&src));
            want[o..o + itemsize].copy_from_slice(&before[so..so + itemsize]);
        }
    }
    assert_eq!(
        buf, want,
        "compaction equals the gather; nothing else is written"
    );

    // Several caches in one call: the overlap test against the naive pairwise one.
    let spans: Vec<(usize, usize)> = (0..b.below(6))
        .map(|_| {
            let start = b.below(64);
            (start, start + b.below(16))
        })
        .collect();
    let overlaps = |i: usize, j: usize| {
        let ((s0, e0), (s1, e1)) = (spans[i], spans[j]);
        s0 < e0 && s1 < e1 && s0.max(s1) < e0.min(e1)
    };
    let any = (0..spans.len()).any(|i| (0..i).any(|j| overlaps(i, j)));
    match overlapping_pair(&spans) {
        Some((i, j)) => assert!(i < j && overlaps(i, j), "{spans:?}: ({i}, {j})"),
        None => assert!(!any, "{spans:?}: an overlap was missed"),
    }
});
