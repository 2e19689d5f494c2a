//! The EAGLE-2 dynamic builder (the stateful drafter) against a naive pool model. Invariants:
//! every step's frontier is the best `K` of the `K²` children by cumulative log probability
//! (ties to the lower pool index), in that order, with the parent's slot, the draft mask
//! (ancestor-or-self over every fed token) and positions of the model; a refused step (NaN or
//! positive log probabilities, a step past the depth) changes nothing; `build()` returns, per
//! request, the model's top `budget - 1` candidates (score, then depth, then pool index) as a
//! tree in pool order, with the candidates' tokens and parents; `build_in(DepthFirst)` the
//! same candidates, tokens and parents numbered in depth-first preorder, siblings by pool
//! index (so every subtree is a run of nodes that starts with its lowest-index child);
//! `build_into` both of them, its indices written into a reused buffer; `settled` after
//! every step is the model's (no candidate can still enter a tree). A request not running
//! (`active` at start) builds to its root alone with a pool row of -1, and is left out of
//! `settled` and of the budget check. A
//! twin builder stepped with `start_into` / `expand_into` into buffers with room for every
//! level (junk bytes in them) holds each step too, zeros past its width.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ndarray::{Array1, Array2, Array3};
use specsched_core::topology::dynamic::{DynamicTreeBuilder, NodeOrder, Step, StepOut};
use specsched_fuzz::Bytes;

fn logprob(b: &mut Bytes<'_>) -> f64 {
    match b.u8() {
        0 => f64::NAN,
        1 => 0.5,
        2 => f64::NEG_INFINITY,
        x => -((x % 5) as f64) * 0.25,
    }
}

/// Caller buffers of the twin builder: `[B, K]` tokens, parents, positions; a `[B, K, stride]`
/// mask.
struct Held {
    ints: [Vec<i64>; 3],
    mask: Vec<u8>,
    stride: usize,
}

impl Held {
    fn out(&mut self) -> StepOut<'_, u8> {
        let [tokens, parent_index, positions] = &mut self.ints;
        StepOut {
            tokens,
            parent_index,
            positions,
            mask: &mut self.mask,
            mask_stride: self.stride,
        }
    }

    fn assert_holds(&self, s: &Step) {
        assert_eq!(
            self.ints,
            [&s.tokens, &s.parent_index, &s.positions].map(|v| v.clone())
        );
        for (row, got) in s.mask.chunks(s.width).zip(self.mask.chunks(self.stride)) {
            assert!(row.iter().zip(got).all(|(&w, &g)| u8::from(w) == g));
            assert!(got[s.width..].iter().all(|&g| g == 0));
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes::new(data);
    let (bs, k, depth) = (1 + b.below(2), 1 + b.below(3), 1 + b.below(4));
    let budget = 1 + b.below(k + (depth - 1) * k * k + 2);
    let Ok(mut d) = DynamicTreeBuilder::new(bs, k, depth, budget) else {
        return;
    };
    let mut twin = d.clone();
    let mut held = Held {
        ints: [vec![-7; bs * k], vec![-7; bs * k], vec![-7; bs * k]],
        mask: vec![0xA5; bs * k * depth * k],
        stride: depth * k,
    };
    let root = Array1::from_shape_fn(bs, |r| 1000 + r as i64);
    // Model pool per request: (score, token, parent pool index or -1, depth).
    let mut pool: Vec<Vec<(f64, i64, i64, u32)>> = vec![vec![]; bs];
    let mut frontiers: Vec<Vec<Vec<usize>>> = vec![vec![]; bs]; // per level, slot -> pool idx
    let prefix: Vec<i64> = (0..bs).map(|_| b.below(5) as i64).collect();
    let active: Option<Vec<bool>> = match b.u8() % 2 {
        0 => None,
        _ => Some((0..bs).map(|_| b.u8() % 3 != 0).collect()),
    };
    let running = |r: usize| active.as_ref().is_none_or(|a| a[r]);
    // `settled` of the model: every running request has budget - 1 frontier nodes (all
    // levels) and its best current frontier score is at most the (budget - 1)-th best of them.
    let settled = |pool: &[Vec<(f64, i64, i64, u32)>], frontiers: &[Vec<Vec<usize>>]| {
        (0..bs).filter(|&r| running(r)).all(|r| {
            let mut fed: Vec<f64> = frontiers[r]
                .iter()
                .flatten()
                .map(|&g| pool[r][g].0)
                .collect();
            fed.sort_by(|x, y| y.partial_cmp(x).unwrap());
            let front = frontiers[r].last().unwrap();
            let best = front
                .iter()
                .map(|&g| pool[r][g].0)
                .fold(f64::NEG_INFINITY, f64::max);
            fed.len() >= budget - 1 && (budget == 1 || best <= fed[budget - 2])
        })
    };
    // start, retried until the fuzzer gives valid log probabilities.
    loop {
        if b.is_empty() {
            return;
        }
        let tk = Array2::from_shape_fn((bs, k), |_| b.below(6) as i64);
        let lp = Array2::from_shape_fn((bs, k), |_| logprob(&mut b));
        let valid = lp.iter().all(|&x| x <= 0.0);
        let r = d.start(
            root.view(),
            tk.view(),
            lp.view(),
            &prefix,
            active.as_deref(),
        );
        assert_eq!(r.is_ok(), valid, "start with {lp:?}");
        let t = twin.start_into(
            root.view(),
            tk.view(),
            lp.view(),
            &prefix,
            active.as_deref(),
            held.out(),
        );
        assert_eq!(t.is_ok(), valid);
        let Ok(step) = r else { continue };
        held.assert_holds(&step);
        for r in 0..bs {
            for c in 0..k {
                pool[r].push((lp[(r, c)], tk[(r, c)], -1, 1));
            }
            frontiers[r].push((0..k).collect());
            for j in 0..k {
                assert_eq!(step.tokens[r * k + j], tk[(r, j)]);
                assert_eq!(step.positions[r * k + j], prefix[r] + 1);
                for c in 0..k {
                    assert_eq!(step.mask[(r * k + j) * k + c], c == j);
                }
            }
        }
        assert_eq!(d.settled(), settled(&pool, &frontiers), "after start");
        assert_eq!(twin.settled(), d.settled());
        break;
    }
    let mut level = 1;
    while !b.is_empty() && b.u8() % 4 != 0 {
        let tk = Array3::from_shape_fn((bs, k, k), |_| b.below(6) as i64);
        let lp = Array3::from_shape_fn((bs, k, k), |_| logprob(&mut b));
        let valid = lp.iter().all(|&x| x <= 0.0) && level < depth;
        let r = d.expand(tk.view(), lp.view());
        assert_eq!(r.is_ok(), valid);
        assert_eq!(
            twin.expand_into(tk.view(), lp.view(), held.out()).is_ok(),
            valid
        );
        let Ok(step) = r else { continue };
        held.assert_holds(&step);
        let base = k + (level - 1) * k * k;
        let w = (level + 1) * k;
        assert_eq!(step.width, w);
        for r in 0..bs {
            let front = frontiers[r].last().unwrap().clone();
            let mut kids = vec![];
            for (j, &f) in front.iter().enumerate() {
                for c in 0..k {
                    let g = base + j * k + c;
                    assert_eq!(pool[r].len(), g);
                    let s = pool[r][f].0 + lp[(r, j, c)];
                    pool[r].push((s, tk[(r, j, c)], f as i64, level as u32 + 1));
                    kids.push((s, g, j));
                }
            }
            kids.sort_by(|x, y| y.0.partial_cmp(&x.0).unwrap().then(x.1.cmp(&y.1)));
            let next: Vec<usize> = kids[..k].iter().map(|x| x.1).collect();
            for (j, &(_, g, slot)) in kids[..k].iter().enumerate() {
                assert_eq!(step.parent_index[r * k + j], slot as i64);
                assert_eq!(step.tokens[r * k + j], pool[r][g].1);
                assert_eq!(step.positions[r * k + j], prefix[r] + level as i64 + 1);
                // Mask column (t-1)·K + s: frontier slot s of level t is g or an ancestor.
                let mut anc = vec![g];
                let mut x = pool[r][g].2;
                while x >= 0 {
                    anc.push(x as usize);
                    x = pool[r][x as usize].2;
                }
                for (t, fr) in frontiers[r].iter().chain([&next]).enumerate() {
                    for (s, &p) in fr.iter().enumerate() {
                        let got = step.mask[(r * k + j) * w + t * k + s];
                        assert_eq!(
                            got,
                            anc.contains(&p),
                            "mask req {r} slot {j} level {t} col {s}"
                        );
                    }
                }
            }
            frontiers[r].push(next);
        }
        level += 1;
        assert_eq!(
            d.settled(),
            settled(&pool, &frontiers),
            "after level {level}"
        );
        assert_eq!(twin.settled(), d.settled());
    }
    // build: the model's top budget - 1 candidates per request.
    let r = d.build();
    let m = pool[0].len();
    let none_running = !(0..bs).any(running);
    assert_eq!(
        r.is_ok(),
        budget - 1 <= m || none_running,
        "budget {budget}, pool {m}"
    );
    let Ok((batch, pool_index)) = r else { return };
    let n = budget;
    for r in 0..bs {
        if !running(r) {
            let t = batch.tree(r);
            assert_eq!((t.num_nodes(), t.tokens[0]), (1, root[r]));
            assert!(pool_index[r * (n - 1)..(r + 1) * (n - 1)]
                .iter()
                .all(|&g| g == -1));
            continue;
        }
        let mut order: Vec<usize> = (0..m).collect();
        let p = &pool[r];
        order.sort_by(|&x, &y| {
            p[y].0
                .partial_cmp(&p[x].0)
                .unwrap()
                .then(p[x].3.cmp(&p[y].3))
                .then(x.cmp(&y))
        });
        let mut want: Vec<i64> = order[..n - 1].iter().map(|&g| g as i64).collect();
        want.sort_unstable();
        assert_eq!(&pool_index[r * (n - 1)..(r + 1) * (n - 1)], &want[..]);
        let t = batch.tree(r);
        assert_eq!(t.num_nodes(), n);
        assert_eq!(t.tokens[0], root[r]);
        for (node, &g) in want.iter().enumerate() {
            let (_, tok, parent, _) = p[g as usize];
            assert_eq!(t.tokens[node + 1], tok);
            let tp = t.parents[node + 1];
            if parent < 0 {
                assert_eq!(tp, 0);
            } else {
                assert!(tp >= 1, "the selection is ancestor-closed");
                assert_eq!(want[tp as usize - 1], parent);
            }
        }
    }
    let (dfs, dfs_index) = d.build_in(NodeOrder::DepthFirst).expect("pool order built");
    // Into a reused buffer (junk from before): the same trees and indices.
    for (order, (want_batch, want_index)) in [
        (NodeOrder::Pool, (&batch, &pool_index)),
        (NodeOrder::DepthFirst, (&dfs, &dfs_index)),
    ] {
        let mut buf = vec![i64::MIN; bs * (n - 1)];
        let got = d.build_into(order, &mut buf).expect("built above");
        assert_eq!(&got, want_batch);
        assert_eq!(&buf, want_index);
    }
    for r in (0..bs).filter(|&r| running(r)) {
        let t = dfs.tree(r);
        let idx = &dfs_index[r * (n - 1)..(r + 1) * (n - 1)];
        let mut same = idx.to_vec();
        same.sort_unstable();
        assert_eq!(same, &pool_index[r * (n - 1)..(r + 1) * (n - 1)]);
        // Pool index of each node (-1 = root): tokens and parents follow their candidates.
        let g_of = |v: usize| if v == 0 { -1 } else { idx[v - 1] };
        let mut size = vec![1usize; n];
        for v in (1..n).rev() {
            let g = g_of(v) as usize;
            assert_eq!(t.tokens[v], pool[r][g].1);
            let tp = t.parents[v] as usize;
            assert_eq!(g_of(tp), pool[r][g].2);
            size[tp] += size[v];
        }
        for v in 0..n {
            let kids: Vec<usize> = t.children(v).collect();
            // Preorder: the first child follows its parent, each next sibling follows the
            // previous sibling's subtree, and siblings keep pool (rank) order.
            let mut at = v + 1;
            for &c in &kids {
                assert_eq!(c, at, "request {r}: node {v}'s children {kids:?}");
                at += size[c];
            }
            assert_eq!(at, v + size[v]);
            assert!(kids.windows(2).all(|w| g_of(w[0]) < g_of(w[1])));
        }
    }
});
