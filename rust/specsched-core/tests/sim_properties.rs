//! Property tests of the simulator and the analytic model on random trees.

use proptest::prelude::*;

use specsched_core::sim::{best_tree, expected_tokens, path_probs, simulate, Acceptance};
use specsched_core::Tree;

fn parents_strategy(max_nodes: usize) -> impl Strategy<Value = Vec<i32>> {
    (1..=max_nodes)
        .prop_flat_map(|n| (1..n).map(|i| 0..i as i32).collect::<Vec<_>>())
        .prop_map(|rest| {
            let mut parents = vec![-1];
            parents.extend(rest);
            parents
        })
}

fn model_strategy() -> impl Strategy<Value = Acceptance> {
    prop_oneof![
        (0.0f64..=1.0).prop_map(Acceptance::Iid),
        proptest::collection::vec(0.0f64..=1.0, 24).prop_map(Acceptance::PerDepth),
        proptest::collection::vec(0.0f64..0.333, 1..4).prop_map(Acceptance::PerRank),
        proptest::collection::vec(proptest::collection::vec(0.0f64..0.333, 0..4), 24)
            .prop_map(Acceptance::Table),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The Monte-Carlo mean agrees with `1 + Σ P(v)` within 5 standard errors (plus what an
    /// outcome too rare to show up in the sample can move).
    #[test]
    fn simulation_agrees_with_the_analytic_model(parents in parents_strategy(24), model in model_strategy(), seed in any::<u64>()) {
        let t = Tree::new(&parents, &vec![0; parents.len()]).unwrap();
        let s = simulate(t.view(), &model, 20_000, seed, None).unwrap();
        let exact = expected_tokens(t.view(), &model).unwrap() - 1.0;
        let se = (s.variance() / s.steps as f64).sqrt();
        // The sample's standard error is 0 when every step accepted the same count, yet an
        // outcome of probability q ~ 1/steps that never showed up still moves the exact mean
        // by up to q * max_depth: allow 10 / steps of that (an unseen outcome with q above it
        // has probability < e^-10), so near-certain models do not fail at random.
        let unseen = 10.0 * t.max_depth() as f64 / s.steps as f64;
        prop_assert!((s.mean_accepted() - exact).abs() <= 5.0 * se + unseen,
            "mean {} exact {} se {}", s.mean_accepted(), exact, se);
    }

    /// Path probabilities never grow along a path, and a child set never exceeds its parent.
    #[test]
    fn path_probabilities_are_consistent(parents in parents_strategy(32), model in model_strategy()) {
        let t = Tree::new(&parents, &vec![0; parents.len()]).unwrap();
        let p = path_probs(t.view(), &model).unwrap();
        let mut child_sum = vec![0.0; p.len()];
        for v in 1..p.len() {
            let u = parents[v] as usize;
            prop_assert!(p[v] <= p[u] + 1e-12);
            child_sum[u] += p[v];
        }
        for v in 0..p.len() {
            prop_assert!(child_sum[v] <= p[v] + 1e-9);
        }
    }

    /// Under an i.i.d. model no tree of the same size beats the best-first tree.
    #[test]
    fn best_tree_beats_random_trees(parents in parents_strategy(20), alpha in 0.05f64..0.95) {
        let m = Acceptance::Iid(alpha);
        let n = parents.len();
        let t = Tree::new(&parents, &vec![0; n]).unwrap();
        let best = best_tree(&m, n, n, n).unwrap();
        prop_assert_eq!(best.num_nodes(), n);
        let (eb, et) = (expected_tokens(best.view(), &m).unwrap(), expected_tokens(t.view(), &m).unwrap());
        prop_assert!(eb >= et - 1e-12, "best {} random {}", eb, et);
    }
}
