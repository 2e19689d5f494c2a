//! The top-N builder on random pools. Invariants: a valid pool (parents earlier or -1, scores
//! <= 0 or -inf and, cumulative, never above the parent's) is accepted exactly when the
//! definition allows; the selection is exactly the first `budget - 1` candidates in the rank
//! order (higher cumulative score, then shallower, then lower pool index), is ancestor-closed,
//! and the tree's parents and tokens map back onto the pool.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ndarray::ArrayView1;
use specsched_core::topology::top_n;
use specsched_fuzz::Bytes;

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes::new(data);
    let m = b.below(30);
    let cumulative = b.bool();
    let parents: Vec<i64> = (0..m)
        .map(|i| match b.u8() % 16 {
            0 => i as i64, // forward / self reference: invalid
            1 => -2,
            _ => b.below(i + 1) as i64 - 1,
        })
        .collect();
    let edge: Vec<f64> = (0..m)
        .map(|_| match b.u8() {
            0 => f64::NAN,
            1 => f64::NEG_INFINITY,
            2 => 0.5,
            x => -((x % 6) as f64) * 0.5,
        })
        .collect();
    // Cumulative scores along the path (model), or the edge scores as given.
    let valid_parents = parents
        .iter()
        .enumerate()
        .all(|(i, &p)| p >= -1 && p < i as i64);
    let mut cum = vec![0f64; m];
    let mut depth = vec![1u32; m];
    if valid_parents {
        for i in 0..m {
            let (pc, pd) = if parents[i] < 0 {
                (0.0, 0)
            } else {
                (cum[parents[i] as usize], depth[parents[i] as usize])
            };
            cum[i] = if cumulative { edge[i] } else { pc + edge[i] };
            depth[i] = pd + 1;
        }
    }
    let scores_ok = edge.iter().all(|&s| !s.is_nan() && s <= 0.0)
        && (!cumulative || (0..m).all(|i| parents[i] < 0 || edge[i] <= edge[parents[i] as usize]));
    let budget = b.below(m + 3);
    let tokens: Vec<i64> = (0..m).map(|i| 100 + i as i64).collect();
    let r = top_n(
        ArrayView1::from(&parents[..]),
        ArrayView1::from(&edge[..]),
        Some(ArrayView1::from(&tokens[..])),
        -5,
        budget,
        cumulative,
    );
    let ok = valid_parents && scores_ok && budget >= 1 && budget - 1 <= m;
    assert_eq!(
        r.is_ok(),
        ok,
        "parents {parents:?} scores {edge:?} budget {budget}: {r:?}"
    );
    let Ok((tree, pool)) = r else { return };
    // Model selection: sort by the rank order, take budget - 1, in increasing pool index.
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&x, &y| {
        cum[y]
            .partial_cmp(&cum[x])
            .unwrap()
            .then(depth[x].cmp(&depth[y]))
            .then(x.cmp(&y))
    });
    let mut want: Vec<i64> = order[..budget - 1].iter().map(|&i| i as i64).collect();
    want.sort_unstable();
    assert_eq!(pool, want, "selection");
    assert_eq!(tree.num_nodes(), budget);
    assert_eq!(tree.tokens()[0], -5);
    for (node, &g) in pool.iter().enumerate() {
        let v = node + 1;
        assert_eq!(tree.tokens()[v], tokens[g as usize]);
        let pp = parents[g as usize];
        let tp = tree.parents()[v];
        if pp < 0 {
            assert_eq!(tp, 0);
        } else {
            // Ancestor-closed: the pool parent is selected and is this node's parent.
            assert!(tp >= 1, "candidate {g}'s parent {pp} not selected");
            assert_eq!(pool[tp as usize - 1], pp);
        }
    }
});
