//! Property tests: every kernel against a naive model of its definition on random trees.

use ndarray::ArrayView1;
use proptest::prelude::*;

use specsched_core::kv::{compaction_plan, StridedMut};
use specsched_core::layout::{
    fill_ancestor_rows, fill_packed_mask, fill_paths, fill_positions, packed_words,
};
use specsched_core::verify::{choice_from_tokens, verify_tree};
use specsched_core::Tree;

/// Random valid trees: `parents[i]` drawn from `[0, i)`, tokens from a small vocabulary so
/// sibling collisions happen.
fn tree_strategy(max_nodes: usize) -> impl Strategy<Value = (Vec<i32>, Vec<i64>)> {
    (1..=max_nodes)
        .prop_flat_map(|n| {
            let parents = (1..n).map(|i| 0..i as i32).collect::<Vec<_>>();
            (parents, proptest::collection::vec(0i64..4, n))
        })
        .prop_map(|(rest, tokens)| {
            let mut parents = vec![-1];
            parents.extend(rest);
            (parents, tokens)
        })
}

fn is_ancestor_or_self(parents: &[i32], i: usize, j: usize) -> bool {
    let mut v = i as i32;
    while v >= 0 {
        if v as usize == j {
            return true;
        }
        v = parents[v as usize];
    }
    false
}

proptest! {
    #[test]
    fn masks_are_the_ancestor_closure((parents, tokens) in tree_strategy(80), prefix in 0usize..5) {
        let t = Tree::new(&parents, &tokens).unwrap();
        let n = t.num_nodes();
        let w = prefix + n;
        let mut dense = vec![false; n * w];
        fill_ancestor_rows(t.view(), prefix, w, true, false, &mut dense).unwrap();
        let words = packed_words(n);
        let mut packed = vec![0u32; n * words];
        fill_packed_mask(t.view(), words, &mut packed).unwrap();
        for i in 0..n {
            for c in 0..prefix {
                prop_assert!(dense[i * w + c]);
            }
            for j in 0..n {
                let want = is_ancestor_or_self(&parents, i, j);
                prop_assert_eq!(dense[i * w + prefix + j], want);
                prop_assert_eq!(packed[i * words + j / 32] >> (j % 32) & 1 == 1, want);
            }
        }
    }

    #[test]
    fn paths_are_root_to_leaf_walks((parents, tokens) in tree_strategy(60)) {
        let t = Tree::new(&parents, &tokens).unwrap();
        let width = t.max_depth() as usize + 1;
        let mut paths = vec![0i32; t.num_leaves() * width];
        fill_paths(t.view(), width, &mut paths).unwrap();
        let leaves: Vec<usize> = (0..t.num_nodes())
            .filter(|&v| !parents.contains(&(v as i32)))
            .collect();
        prop_assert_eq!(leaves.len(), t.num_leaves());
        for (row, &leaf) in paths.chunks(width).zip(&leaves) {
            let len = t.depths()[leaf] as usize + 1;
            prop_assert_eq!(row[len - 1], leaf as i32);
            prop_assert_eq!(row[0], 0);
            for d in 1..len {
                prop_assert_eq!(parents[row[d] as usize], row[d - 1]);
            }
            prop_assert!(row[len..].iter().all(|&x| x == -1));
        }
        let mut pos = vec![0i64; t.num_nodes()];
        fill_positions(t.view(), 7, &mut pos).unwrap();
        for (p, &d) in pos.iter().zip(t.depths()) {
            prop_assert_eq!(*p, 7 + d as i64);
        }
    }

    #[test]
    fn walk_accepts_a_matching_root_path(
        (parents, tokens) in tree_strategy(60),
        seed in proptest::collection::vec(0i64..4, 60),
    ) {
        let t = Tree::new(&parents, &tokens).unwrap();
        let n = t.num_nodes();
        let target = &seed[..n];
        let choose = choice_from_tokens(ArrayView1::from(target), None, None, n).unwrap();
        let r = verify_tree(t.view(), &choose).unwrap();
        let k = r.num_accepted();
        prop_assert_eq!(r.accepted_nodes[0], 0);
        for j in 1..=k {
            let (a, prev) = (r.accepted_nodes[j] as usize, r.accepted_nodes[j - 1]);
            prop_assert_eq!(parents[a], prev);
            prop_assert_eq!(tokens[a], target[prev as usize]);
            prop_assert_eq!(r.tokens[j - 1], tokens[a]);
            // The first matching sibling is taken: no lower-index sibling matches.
            for s in 1..a {
                if parents[s] == prev {
                    prop_assert_ne!(tokens[s], target[prev as usize]);
                }
            }
        }
        // The walk stopped because no child of the last node matches its choice.
        let last = r.accepted_nodes[k] as usize;
        prop_assert_eq!(r.tokens[k], target[last]);
        for c in 1..n {
            if parents[c] == last as i32 {
                prop_assert_ne!(tokens[c], target[last]);
            }
        }

        // Compaction in place equals gathering the accepted rows, and touches nothing else.
        let prefix = 3usize;
        let moves = compaction_plan(&r, prefix as i64).unwrap();
        let row = 5usize;
        let seq = prefix + n;
        let before: Vec<u16> = (0..(seq * row) as u16).collect();
        let mut cache = before.clone();
        // SAFETY: the parts describe `cache` exactly; nothing else touches it meanwhile.
        let mut buf = unsafe {
            StridedMut::new(cache.as_mut_ptr() as *mut u8, vec![seq, row], vec![2 * row as isize, 2], 2)
        }
        .unwrap();
        buf.apply(0, None, &moves).unwrap();
        for s in 0..seq {
            let want_from = if s >= prefix && s - prefix <= k {
                prefix + r.accepted_nodes[s - prefix] as usize
            } else {
                s
            };
            prop_assert_eq!(&cache[s * row..(s + 1) * row], &before[want_from * row..(want_from + 1) * row]);
        }
    }
}
