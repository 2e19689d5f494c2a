//! Property tests of the tree builders against their definitions: top-N selection is the prefix
//! of the (score, depth, index) order and ancestor-closed; the Sequoia heap equals the exact DP
//! on non-increasing vectors and every plan is worth what it claims; the SGLang builder's links
//! and positions describe the tree its selection defines.

use ndarray::{Array2, ArrayView1};
use proptest::prelude::*;

use specsched_core::topology::sequoia::{
    expected_accept_length, optimal_tree_dp, optimal_tree_heap,
};
use specsched_core::topology::sglang::{build_tree, BuildOut, MaskOut};
use specsched_core::topology::{from_choices, top_n};

/// A pool: parents in `[-1, i)`, edge log scores from a coarse set (ties are common).
fn pool_strategy() -> impl Strategy<Value = (Vec<i64>, Vec<f64>)> {
    (0usize..40).prop_flat_map(|m| {
        let parents = (0..m).map(|i| -1..i as i64).collect::<Vec<_>>();
        let edges = proptest::collection::vec(
            prop::sample::select(vec![0.0, -0.5, -1.0, f64::NEG_INFINITY]),
            m,
        );
        (parents, edges)
    })
}

proptest! {
    #[test]
    fn top_n_is_an_ancestor_closed_prefix_of_the_order(
        (parents, edges) in pool_strategy(),
        pick in 0usize..64,
    ) {
        let m = parents.len();
        let budget = 1 + pick % (m + 1);
        let tokens: Vec<i64> = (0..m as i64).collect();
        let (tree, idx) = top_n(
            ArrayView1::from(&parents),
            ArrayView1::from(&edges),
            Some(ArrayView1::from(&tokens)),
            -7,
            budget,
            false,
        ).unwrap();
        let mut score = vec![0f64; m];
        let mut depth = vec![0u32; m];
        for i in 0..m {
            let p = parents[i];
            score[i] = if p < 0 { edges[i] } else { score[p as usize] + edges[i] };
            depth[i] = if p < 0 { 1 } else { depth[p as usize] + 1 };
        }
        let mut order: Vec<usize> = (0..m).collect();
        order.sort_by(|&a, &b| {
            score[b].partial_cmp(&score[a]).unwrap()
                .then(depth[a].cmp(&depth[b]))
                .then(a.cmp(&b))
        });
        let mut want: Vec<i64> = order[..budget - 1].iter().map(|&g| g as i64).collect();
        want.sort_unstable();
        prop_assert_eq!(&idx, &want);
        for &g in &idx {
            let p = parents[g as usize];
            prop_assert!(p < 0 || idx.contains(&p));
        }
        prop_assert_eq!(tree.num_nodes(), budget);
        prop_assert_eq!(tree.tokens()[0], -7);
    }

    #[test]
    fn heap_equals_dp_on_non_increasing_vectors(
        mut p in proptest::collection::vec(0.0f64..=1.0, 1..6),
        budget in 1usize..48,
        depth in 1usize..10,
    ) {
        p.sort_by(|a, b| b.partial_cmp(a).unwrap());
        let heap = optimal_tree_heap(&p, budget, Some(depth)).unwrap();
        let dp = optimal_tree_dp(&p, budget, Some(depth)).unwrap();
        prop_assert!((heap.expected - dp.expected).abs() <= 1e-9 * dp.expected);
        for plan in [&heap, &dp] {
            let t = from_choices(&plan.choices, None::<ArrayView1<'_, i64>>).unwrap();
            prop_assert!(t.num_nodes() <= budget);
            prop_assert!(t.max_depth() as usize <= depth);
            let v = expected_accept_length(t.view(), &p).unwrap();
            prop_assert!((v - plan.expected).abs() <= 1e-9 * v);
        }
    }

    #[test]
    fn dp_plans_are_worth_their_value_for_any_vector(
        p in proptest::collection::vec(0.0f64..=1.0, 1..6),
        budget in 1usize..40,
        depth in 1usize..8,
    ) {
        let dp = optimal_tree_dp(&p, budget, Some(depth)).unwrap();
        let t = from_choices(&dp.choices, None::<ArrayView1<'_, i64>>).unwrap();
        let v = expected_accept_length(t.view(), &p).unwrap();
        prop_assert!((v - dp.expected).abs() <= 1e-9 * v);
        // Never worse than the best chain or the best star that fit.
        let chain_len = (budget - 1).min(depth);
        let chain: f64 = 1.0 + (1..=chain_len).map(|k| p[0].powi(k as i32)).sum::<f64>();
        let star: f64 = 1.0 + p.iter().take(budget - 1).sum::<f64>();
        prop_assert!(dp.expected + 1e-12 >= chain.max(star));
    }

    #[test]
    fn sglang_links_and_positions_follow_the_selection(
        topk in 1usize..4,
        extra in 0usize..20,
        seq in 0usize..5,
    ) {
        // A chain of first children through every level, then the rest of level 1.
        let steps = 3;
        let width = topk * (steps - 1) + 1;
        let mut pl = Array2::<i64>::zeros((1, width));
        pl[(0, 0)] = -1;
        for j in 0..topk {
            pl[(0, 1 + j)] = j as i64; // frontier of step 1: the root's children in order
            pl[(0, 1 + topk + j)] = (topk + j * topk) as i64; // step 2: first child of each
        }
        let mut sel: Vec<i64> = (0..topk as i64).collect();
        sel.extend((0..topk).map(|j| (topk + j * topk) as i64));
        sel.truncate(1 + extra % sel.len());
        let n = sel.len() + 1;
        let sel = Array2::from_shape_vec((1, n - 1), sel).unwrap();
        let mut mask = vec![false; n * (seq + n)];
        let (mut pos, mut ri, mut nt, mut ns) = (vec![0; n], vec![0; n], vec![0; n], vec![0; n]);
        build_tree(pl.view(), sel.view(), &[seq], topk, steps, n, BuildOut {
            tree_mask: MaskOut::Full(&mut mask),
            positions: &mut pos,
            retrive_index: &mut ri,
            retrive_next_token: &mut nt,
            retrive_next_sibling: &mut ns,
        }).unwrap();
        // Rebuild parents from the links and check every row of the mask and every position.
        let mut parent = vec![-1i64; n];
        for (v, &first) in nt.iter().enumerate() {
            let mut c = first;
            while c >= 0 {
                parent[c as usize] = v as i64;
                c = ns[c as usize];
            }
        }
        for i in 1..n {
            let g = sel[(0, i - 1)] as usize;
            let want = if g < topk { 0 } else { 1 + (g - topk) / topk };
            prop_assert_eq!(parent[i], want as i64);
        }
        for i in 0..n {
            let row = &mask[i * (seq + n)..(i + 1) * (seq + n)];
            prop_assert!(row[..seq].iter().all(|&x| x));
            let mut depth = 0;
            let mut v = i as i64;
            let mut anc = vec![false; n];
            while v >= 0 {
                anc[v as usize] = true;
                v = parent[v as usize];
                depth += 1;
            }
            prop_assert_eq!(&row[seq..], &anc[..]);
            prop_assert_eq!(pos[i], (seq + depth - 1) as i64);
            prop_assert_eq!(ri[i], i as i64);
        }
    }
}
