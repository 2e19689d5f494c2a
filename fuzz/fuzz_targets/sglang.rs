//! The SGLang converters. `organize_draft_results` picks exactly the model's top candidates;
//! `build_tree` accepts a selection exactly when every selected candidate's parent (from
//! `parent_list`) is selected before it, and then its masks (FULL, QLEN, bit-packed),
//! positions, retrive_index and first-child / next-sibling lists equal the ancestor-closure
//! model; `verify_tree_greedy` over those lists equals the model walk (capped at S levels).
//! Arbitrary (cyclic, out-of-range) lists are refused or walked without panicking or hanging.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ndarray::{Array1, Array2};
use specsched_core::topology::sglang::*;
use specsched_fuzz::{model_ancestors, model_depths, model_walk, Bytes};

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes::new(data);
    let topk = 1 + b.below(3);
    let steps = 1 + b.below(3);
    let pool = pool_size(topk, steps);
    let n = 1 + b.below(pool + 1);
    let bs = 1 + b.below(3);

    // organize_draft_results on random scores.
    let scores = Array2::from_shape_fn((bs, pool), |_| match b.u8() {
        0 => f32::NAN,
        x => (x % 5) as f32,
    });
    let toks = Array2::from_shape_fn((bs, pool), |(r, c)| (r * 1000 + c) as i64);
    let (mut ti, mut dt) = (vec![0i64; bs * (n - 1)], vec![0i64; bs * (n - 1)]);
    let r = organize_draft_results(scores.view(), toks.view(), n, &mut ti, &mut dt);
    assert_eq!(r.is_ok(), !scores.iter().any(|x| x.is_nan()));
    if r.is_ok() {
        for row in 0..bs {
            let mut order: Vec<usize> = (0..pool).collect();
            order.sort_by(|&x, &y| {
                scores[(row, y)]
                    .partial_cmp(&scores[(row, x)])
                    .unwrap()
                    .then(x.cmp(&y))
            });
            let mut want: Vec<i64> = order[..n - 1].iter().map(|&g| g as i64).collect();
            want.sort_unstable();
            assert_eq!(&ti[row * (n - 1)..(row + 1) * (n - 1)], &want[..]);
            for (j, &g) in want.iter().enumerate() {
                assert_eq!(dt[row * (n - 1) + j], toks[(row, g as usize)]);
            }
        }
    }

    // build_tree: parent_list [bs, steps] (column t = the parent candidate of step t's
    // children), a sorted selection (sometimes unsorted or out of range).
    let width = if b.u8() % 8 == 0 {
        b.below(steps + 1)
    } else {
        steps
    };
    let parent_list = Array2::from_shape_fn((bs, width), |_| b.below(pool + 1) as i64 - 1);
    let sel = Array2::from_shape_fn((bs, n - 1), |_| {
        b.below(pool + 1) as i64 - i64::from(b.u8() == 0)
    });
    let seq: Vec<usize> = (0..bs).map(|_| b.below(4)).collect();
    // Model parents (None = not a tree / invalid).
    let model: Option<Vec<Vec<i32>>> = (0..bs)
        .map(|r| {
            let mut parents = vec![-1i32];
            for i in 1..n {
                let g = sel[(r, i - 1)];
                if g < 0 || g >= pool as i64 || (i >= 2 && g <= sel[(r, i - 2)]) {
                    return None;
                }
                let tb = g as usize / topk;
                if tb == 0 {
                    parents.push(0);
                    continue;
                }
                if tb >= width {
                    return None;
                }
                let pg = parent_list[(r, tb)];
                let p = (1..i).find(|&j| sel[(r, j - 1)] == pg)?;
                parents.push(p as i32);
            }
            Some(parents)
        })
        .collect();
    let total = bs * n;
    let mode = b.u8() % 3;
    let (mut full, mut qlen, mut p32) = (
        vec![false; full_mask_len(&seq, n).expect("small lengths")],
        vec![false; bs * n * n],
        vec![0u32; total],
    );
    let (mut pos, mut ri, mut nt, mut ns) = (
        vec![0i64; total],
        vec![0i64; total],
        vec![0i64; total],
        vec![0i64; total],
    );
    let mask = match mode {
        0 => MaskOut::Full(&mut full),
        1 => MaskOut::Qlen(&mut qlen),
        _ => MaskOut::Packed32(&mut p32),
    };
    let out = BuildOut {
        tree_mask: mask,
        positions: &mut pos,
        retrive_index: &mut ri,
        retrive_next_token: &mut nt,
        retrive_next_sibling: &mut ns,
    };
    let r = build_tree(parent_list.view(), sel.view(), &seq, topk, steps, n, out);
    assert_eq!(
        r.is_ok(),
        model.is_some(),
        "sel {sel:?} parent_list {parent_list:?}: {r:?}"
    );
    let Some(model) = model else { return };
    let mut full_base = 0;
    for (r, parents) in model.iter().enumerate() {
        let anc = model_ancestors(parents);
        let depth = model_depths(parents);
        let row0 = r * n;
        for i in 0..n {
            assert_eq!(pos[row0 + i], (seq[r] + depth[i]) as i64);
            assert_eq!(ri[row0 + i], (row0 + i) as i64);
            let kids: Vec<usize> = (0..n).filter(|&c| parents[c] == i as i32).collect();
            assert_eq!(nt[row0 + i], kids.first().map_or(-1, |&c| c as i64));
            if i > 0 {
                let sibs: Vec<usize> = (0..n).filter(|&c| parents[c] == parents[i]).collect();
                assert_eq!(
                    ns[row0 + i],
                    sibs.iter().find(|&&s| s > i).map_or(-1, |&s| s as i64)
                );
            }
            for j in 0..n {
                match mode {
                    0 => {
                        let cols = seq[r] + n;
                        for c in 0..seq[r] {
                            assert!(full[full_base + i * cols + c]);
                        }
                        assert_eq!(full[full_base + i * cols + seq[r] + j], anc[i][j]);
                    }
                    1 => assert_eq!(qlen[row0 * n + i * n + j], anc[i][j]),
                    _ => assert_eq!(p32[row0 + i] >> j & 1 == 1, anc[i][j]),
                }
            }
        }
        full_base += n * (seq[r] + n);
    }

    // verify_tree_greedy over the built lists vs the model walk, capped at S = spec steps.
    let s_levels = b.below(n + 1);
    let cands = Array2::from_shape_fn((bs, n), |_| b.below(3) as i64);
    let target = Array1::from_shape_fn(total, |_| b.below(3) as i64);
    let shape = |v: &[i64]| Array2::from_shape_vec((bs, n), v.to_vec()).unwrap();
    let (ri2, nt2, ns2) = (shape(&ri), shape(&nt), shape(&ns));
    let mut predicts = vec![-7i32; total];
    // Entries past the path keep what the caller put there (SGLang's -1), as the kernel's do.
    let mut accept_index = vec![-9i32; bs * (s_levels + 1)];
    let mut accept_num = vec![0i32; bs];
    let inp = GreedyIn {
        candidates: cands.view(),
        retrive_index: ri2.view(),
        retrive_next_token: nt2.view(),
        retrive_next_sibling: ns2.view(),
        target_predict: target.view(),
    };
    verify_tree_greedy(inp, &mut predicts, &mut accept_index, &mut accept_num).unwrap();
    let mut want_pred = vec![-7i32; total];
    for (r, parents) in model.iter().enumerate() {
        let row0 = r * n;
        let tokens: Vec<i64> = cands.row(r).to_vec();
        let choice: Vec<i64> = (0..n).map(|v| target[row0 + v]).collect();
        let (mut acc, _) = model_walk(parents, &tokens, &choice);
        acc.truncate(s_levels + 1);
        assert_eq!(accept_num[r] as usize, acc.len() - 1);
        let row = &accept_index[r * (s_levels + 1)..(r + 1) * (s_levels + 1)];
        for (j, &x) in row.iter().enumerate() {
            assert_eq!(x, acc.get(j).map_or(-9, |&a| row0 as i32 + a));
        }
        for &a in &acc {
            want_pred[row0 + a as usize] = choice[a as usize] as i32;
        }
    }
    assert_eq!(predicts, want_pred);

    // Arbitrary lists: refused or walked, never a panic or an endless loop.
    let junk = |b: &mut Bytes<'_>| Array2::from_shape_fn((bs, n), |_| b.below(n + 3) as i64 - 2);
    let (jn, js, jr) = (
        junk(&mut b),
        junk(&mut b),
        Array2::from_shape_fn((bs, n), |_| b.below(total + 2) as i64 - 1),
    );
    let inp = GreedyIn {
        candidates: cands.view(),
        retrive_index: jr.view(),
        retrive_next_token: jn.view(),
        retrive_next_sibling: js.view(),
        target_predict: target.view(),
    };
    if verify_tree_greedy(inp, &mut predicts, &mut accept_index, &mut accept_num).is_ok() {
        for r in 0..bs {
            assert!(accept_num[r] as usize <= s_levels);
        }
    }
});
