//! Every layout of random trees and batches against the ancestor-closure model: dense mask
//! (and its row padding), packed words, positions, paths, SGLang links, and the batched
//! forms (FlashInfer ragged mask and its bit-packed segments, QLEN, padded, the padded model
//! batch, packed rows, positions, paths, links). Wrong-sized outputs must be refused, never written past.
#![no_main]

use libfuzzer_sys::fuzz_target;
use specsched_core::layout::*;
use specsched_core::{Tree, TreeBatch, TreeRef};
use specsched_fuzz::{arb_tree, model_ancestors, model_children, model_depths, Bytes};

/// Root-to-leaf paths of the model, leaves in increasing index, `-1` padded to `width`.
fn model_paths(parents: &[i32], width: usize) -> Vec<Vec<i32>> {
    let anc = model_ancestors(parents);
    let depths = model_depths(parents);
    (0..parents.len())
        .filter(|&v| model_children(parents, v).is_empty())
        .map(|leaf| {
            let mut row = vec![-1i32; width];
            for (j, &a) in anc[leaf].iter().enumerate() {
                if a {
                    row[depths[j]] = j as i32;
                }
            }
            row
        })
        .collect()
}

fn check_tree(t: TreeRef<'_>, prefix: usize, pad: usize) {
    let n = t.num_nodes();
    let anc = model_ancestors(t.parents);
    let depths = model_depths(t.parents);
    // Dense mask with `pad` extra columns; padding must be `no`.
    let w = prefix + n + pad;
    let mut out = vec![7u8; n * w];
    fill_ancestor_rows(t, prefix, w, 1u8, 0u8, &mut out).unwrap();
    for i in 0..n {
        for c in 0..w {
            let want = c < prefix || (c < prefix + n && anc[i][c - prefix]);
            assert_eq!(out[i * w + c] == 1, want, "mask[{i},{c}]");
            assert!(out[i * w + c] <= 1);
        }
    }
    // Too small an output is refused.
    if n * w > 0 {
        assert!(fill_ancestor_rows(t, prefix, w, 1u8, 0u8, &mut out[..n * w - 1]).is_err());
    }
    assert!(fill_ancestor_rows(t, prefix + pad + 1, w, 1u8, 0u8, &mut out).is_err());

    let words = packed_words(n) + pad % 2;
    let mut packed = vec![u32::MAX; n * words];
    fill_packed_mask(t, words, &mut packed).unwrap();
    for i in 0..n {
        for j in 0..words * 32 {
            let bit = packed[i * words + j / 32] >> (j % 32) & 1 == 1;
            assert_eq!(bit, j < n && anc[i][j], "packed[{i}] bit {j}");
        }
    }

    let mut pos = vec![0i64; n];
    fill_positions(t, prefix as i64, &mut pos).unwrap();
    for i in 0..n {
        assert_eq!(pos[i], (prefix + depths[i]) as i64);
    }
    assert!(fill_positions(t, -1 - prefix as i64, &mut pos).is_err());
    assert!(fill_positions(t, i64::MAX, &mut pos).is_err() || t.max_depth == 0);

    let width = t.max_depth as usize + 1;
    let want = model_paths(t.parents, width);
    assert_eq!(want.len(), t.num_leaves);
    let mut paths = vec![9i32; want.len() * width];
    fill_paths(t, width, &mut paths).unwrap();
    let got: Vec<Vec<i32>> = paths.chunks(width).map(<[i32]>::to_vec).collect();
    assert_eq!(got, want);
    if width > 1 {
        assert!(fill_paths(t, width - 1, &mut paths).is_err());
    }

    let (mut nt, mut ns) = (vec![0i64; n], vec![0i64; n]);
    fill_sglang_links(t, &mut nt, &mut ns).unwrap();
    for v in 0..n {
        let kids = model_children(t.parents, v);
        assert_eq!(nt[v], kids.first().map_or(-1, |&c| c as i64));
        if v > 0 {
            let sibs = model_children(t.parents, t.parents[v] as usize);
            let next = sibs.iter().find(|&&s| s > v);
            assert_eq!(ns[v], next.map_or(-1, |&s| s as i64));
        } else {
            assert_eq!(ns[0], -1);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes::new(data);
    let nb = 1 + b.below(4);
    let equal = b.bool();
    let first = arb_tree(&mut b, 40, 4);
    let mut trees = vec![first.clone()];
    for _ in 1..nb {
        let t = arb_tree(&mut b, 40, 4);
        // QLEN needs equal sizes: sometimes make every tree a re-rooted copy of the first size.
        trees.push(if equal { first.clone() } else { t });
    }
    let prefix: Vec<i64> = (0..nb).map(|_| b.below(6) as i64).collect();
    let pad = b.below(3);
    for (t, &p) in trees.iter().zip(&prefix) {
        check_tree(t.view(), p as usize, pad);
    }

    let refs: Vec<&Tree> = trees.iter().collect();
    let batch = TreeBatch::from_trees(&refs).unwrap();
    let pl = PrefixLens::PerTree(&prefix).resolve(nb).unwrap();
    assert!(PrefixLens::PerTree(&prefix[1..]).resolve(nb).is_err());
    assert!(PrefixLens::All(-1).resolve(nb).is_err());

    // Ragged FlashInfer mask: each request's dense mask, flattened and concatenated.
    let indptr = ragged_mask_indptr(&batch, &pl).unwrap();
    let mut ragged = vec![false; *indptr.last().unwrap()];
    fill_ragged_mask(&batch, &pl, true, false, &mut ragged).unwrap();
    let mut packed = vec![0xAAu8; *packed_ragged_indptr(&batch, &pl).unwrap().last().unwrap()];
    fill_packed_ragged_mask(&batch, &pl, &mut packed).unwrap();
    let pindptr = packed_ragged_indptr(&batch, &pl).unwrap();
    for (i, t) in trees.iter().enumerate() {
        let n = t.num_nodes();
        let anc = model_ancestors(t.parents());
        let w = pl[i] + n;
        assert_eq!(indptr[i + 1] - indptr[i], n * w);
        assert_eq!(pindptr[i + 1] - pindptr[i], (n * w).div_ceil(8));
        for r in 0..n {
            for c in 0..w {
                let want = c < pl[i] || anc[r][c - pl[i]];
                let e = r * w + c;
                assert_eq!(ragged[indptr[i] + e], want);
                let bit = packed[pindptr[i] + e / 8] >> (e % 8) & 1 == 1;
                assert_eq!(bit, want, "packed ragged req {i} elem {e}");
            }
        }
        // Bits past the segment's last element are zero.
        for e in n * w..(pindptr[i + 1] - pindptr[i]) * 8 {
            assert_eq!(packed[pindptr[i] + e / 8] >> (e % 8) & 1, 0);
        }
    }
    if !ragged.is_empty() {
        let l = ragged.len();
        assert!(fill_ragged_mask(&batch, &pl, true, false, &mut ragged[..l - 1]).is_err());
    }

    let m = batch.max_nodes();
    let mut padded = vec![true; nb * m * m];
    fill_padded_mask(&batch, &mut padded).unwrap();
    let words = packed_words(m);
    let mut bpacked = vec![0u32; batch.num_nodes() * words];
    fill_batch_packed_mask(&batch, &mut bpacked).unwrap();
    let mut bpos = vec![0i64; batch.num_nodes()];
    fill_batch_positions(&batch, &pl, &mut bpos).unwrap();
    let width = batch.max_depth() as usize + 1;
    let rows = max_leaves(&batch);
    let mut bpaths = vec![0i32; nb * rows * width];
    fill_batch_paths(&batch, &mut bpaths).unwrap();
    let (mut bnt, mut bns) = (vec![0i64; batch.num_nodes()], vec![0i64; batch.num_nodes()]);
    fill_batch_sglang_links(&batch, &mut bnt, &mut bns).unwrap();
    // The padded model batch, over stale contents: every element is written.
    let total = batch.num_nodes();
    let (mut ptok, mut ppos, mut pmask) = (
        vec![-7i64; nb * m],
        vec![-7i64; nb * m],
        vec![true; nb * m * m],
    );
    let (mut prow, mut pcol) = (vec![-7i64; total], vec![-7i64; total]);
    let out = PaddedOut {
        tokens: &mut ptok,
        positions: &mut ppos,
        mask: &mut pmask,
        rows: &mut prow,
        cols: &mut pcol,
    };
    fill_padded_layout(&batch, &pl, out).unwrap();
    let short = PaddedOut {
        tokens: &mut ptok,
        positions: &mut ppos,
        mask: &mut pmask[..nb * m * m - 1],
        rows: &mut prow,
        cols: &mut pcol,
    };
    assert!(fill_padded_layout(&batch, &pl, short).is_err());
    let mut qlen = vec![false; nb * first.num_nodes() * first.num_nodes()];
    let q = fill_qlen_mask(&batch, &mut qlen);
    let same = trees.iter().all(|t| t.num_nodes() == first.num_nodes());
    assert_eq!(q.is_ok(), same);
    for (i, t) in trees.iter().enumerate() {
        let n = t.num_nodes();
        let off = batch.offsets()[i];
        let anc = model_ancestors(t.parents());
        let depths = model_depths(t.parents());
        let mp = model_paths(t.parents(), width);
        for r in 0..m {
            for c in 0..m {
                let want = r < n && c < n && anc[r][c];
                assert_eq!(padded[i * m * m + r * m + c], want);
                // A padding slot attends to itself alone.
                assert_eq!(pmask[i * m * m + r * m + c], want || (r >= n && r == c));
                if same {
                    assert_eq!(qlen[i * n * n + r * n + c], want);
                }
            }
        }
        for r in 0..m {
            let (tok, pos) = if r < n {
                (t.tokens()[r], (pl[i] + depths[r]) as i64)
            } else {
                (0, pl[i] as i64)
            };
            assert_eq!(
                (ptok[i * m + r], ppos[i * m + r]),
                (tok, pos),
                "padded slot {i},{r}"
            );
        }
        for r in 0..n {
            assert_eq!((prow[off + r], pcol[off + r]), (i as i64, r as i64));
            assert_eq!(bpos[off + r], (pl[i] + depths[r]) as i64);
            for j in 0..words * 32 {
                let bit = bpacked[(off + r) * words + j / 32] >> (j % 32) & 1 == 1;
                assert_eq!(bit, j < n && anc[r][j]);
            }
            let kids = model_children(t.parents(), r);
            assert_eq!(bnt[off + r], kids.first().map_or(-1, |&c| c as i64));
        }
        for l in 0..rows {
            let got = &bpaths[(i * rows + l) * width..(i * rows + l + 1) * width];
            match mp.get(l) {
                Some(row) => assert_eq!(got, &row[..]),
                None => assert!(got.iter().all(|&x| x == -1)),
            }
        }
    }
});
