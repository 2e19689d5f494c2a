//! The verify walk, greedy and sampled. Invariants: the greedy walk over target tokens and over
//! logits (argmax, ties to the lowest id, NaN in a visited row an error) equals the naive model
//! walk; a batch gives each tree's single result; every sampled rule returns a root path whose
//! accepted tokens are the emitted ones, a bonus inside the vocabulary, the same result when
//! repeated (counter-based draws), and for sample-and-match the path the model walk takes on
//! the emitted choices, each choice inside the row's top-k support. The argmax kernel on long
//! rows of every logits format (SIMD paths included) equals the naive argmax.
#![no_main]

use half::{bf16, f16};
use libfuzzer_sys::fuzz_target;
use ndarray::{Array2, ArrayView1};
use specsched_core::rng::mix;
use specsched_core::select::{argmax, LogitsView, ProbsView, SamplingParams};
use specsched_core::verify::*;
use specsched_core::{Tree, TreeBatch};
use specsched_fuzz::{arb_tree, model_walk, Bytes};

fn model_argmax(row: &[f32]) -> Option<i64> {
    if row.iter().any(|x| x.is_nan()) {
        return None;
    }
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    Some(best as i64)
}

/// Structural checks every rule shares; returns the (node -> emitted choice) pairs.
fn check_path(t: &Tree, r: &Verified, vocab: usize) {
    let (p, tok) = (t.parents(), t.tokens());
    assert_eq!(r.accepted_nodes[0], 0);
    assert_eq!(r.tokens.len(), r.accepted_nodes.len());
    for j in 1..r.accepted_nodes.len() {
        let a = r.accepted_nodes[j] as usize;
        assert_eq!(
            p[a],
            r.accepted_nodes[j - 1],
            "accepted path is a root path"
        );
        assert_eq!(tok[a], r.tokens[j - 1], "accepted token is the emitted one");
    }
    let bonus = *r.tokens.last().unwrap();
    assert!(
        (0..vocab as i64).contains(&bonus),
        "bonus {bonus} outside vocab {vocab}"
    );
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes::new(data);
    let vocab = 1 + b.below(6);
    let t = arb_tree(&mut b, 24, vocab as i64);
    let n = t.num_nodes();
    let (p, tok) = (t.parents().to_vec(), t.tokens().to_vec());

    // Greedy over target tokens.
    let choice: Vec<i64> = (0..n).map(|_| b.below(vocab) as i64).collect();
    let f = choice_from_tokens(ArrayView1::from(&choice[..]), None, None, n).unwrap();
    let r = verify_tree(t.view(), &f).unwrap();
    let (acc, emi) = model_walk(&p, &tok, &choice);
    assert_eq!((r.accepted_nodes.clone(), r.tokens.clone()), (acc, emi));
    assert!(choice_from_tokens(ArrayView1::from(&choice[..]), None, None, n + 1).is_err());
    let batch = TreeBatch::from_trees(&[&t, &t]).unwrap();
    let twice: Vec<i64> = choice.iter().chain(&choice).copied().collect();
    let f2 = choice_from_tokens(ArrayView1::from(&twice[..]), None, None, 2 * n).unwrap();
    let rb = verify_batch(&batch, &f2, 1).unwrap();
    assert_eq!(rb.get(0), r);
    assert_eq!(rb.get(1), r);

    // Logits, with the odd NaN / inf.
    let logits = Array2::from_shape_fn((n, vocab), |_| match b.u8() {
        0 => f32::NAN,
        1 => f32::INFINITY,
        2 => f32::NEG_INFINITY,
        x => (x % 8) as f32 - 4.0,
    });
    let rows: Vec<Vec<f32>> = logits.rows().into_iter().map(|r| r.to_vec()).collect();
    // Greedy model: walk with argmax choices, failing at a visited NaN row.
    let greedy_model = {
        let mut v = 0usize;
        let mut acc = vec![0i32];
        let mut emi = vec![];
        loop {
            match model_argmax(&rows[v]) {
                None => break None,
                Some(y) => {
                    emi.push(y);
                    match (0..n).find(|&c| p[c] == v as i32 && tok[c] == y) {
                        Some(c) => {
                            acc.push(c as i32);
                            v = c;
                        }
                        None => break Some((acc, emi)),
                    }
                }
            }
        }
    };
    let view = LogitsView::F32(logits.view());
    let g = verify_tree(t.view(), |v| view.argmax(v));
    assert_eq!(
        g.as_ref()
            .ok()
            .map(|r| (r.accepted_nodes.clone(), r.tokens.clone())),
        greedy_model
    );
    // F-ordered (transposed) logits read the same.
    let transposed = logits.t().as_standard_layout().into_owned();
    let vf = LogitsView::F32(transposed.t());
    assert_eq!(verify_tree(t.view(), |v| vf.argmax(v)).ok(), g.clone().ok());

    // Sampled rules.
    let temperature = if b.u8() % 4 == 0 {
        0.0
    } else {
        0.1 + b.below(30) as f64 / 10.0
    };
    let top_k = b.below(vocab + 1) as i64;
    let top_p = if b.bool() {
        1.0
    } else {
        0.05 + b.below(95) as f64 / 100.0
    };
    let params = SamplingParams::new(temperature, top_k, top_p, 0).unwrap();
    let seed = b.u64();
    let rule_kind = b.u8() % 3;
    let q = Array2::from_shape_fn((n, vocab), |_| 1.0 / vocab as f64);
    let rule = || match rule_kind {
        0 => Rule::Match,
        1 => Rule::Rejection {
            draft_probs: ProbsView::F64(q.view()),
            without_replacement: false,
        },
        _ => Rule::Typical {
            posterior_threshold: 0.09,
            posterior_alpha: 0.3,
        },
    };
    let trees = || std::iter::once((0usize, t.view()));
    let s = Sampled::new(view.clone(), vec![params], seed, rule(), trees(), n).unwrap();
    let r1 = verify_tree_sampled(t.view(), &s);
    let r2 = verify_tree_sampled(t.view(), &s);
    assert_eq!(r1, r2, "seeded sampling is deterministic");
    // As request 0 of a batch, the draws are the same.
    let s1 = Sampled::new(view.clone(), vec![params], seed, rule(), trees(), n).unwrap();
    let batch1 = TreeBatch::from_trees(&[&t]).unwrap();
    let rb1 = verify_batch_sampled(&batch1, &s1);
    assert_eq!(rb1.map(|rb| rb.get(0)).ok(), r1.clone().ok());
    if let Ok(r) = &r1 {
        check_path(&t, r, vocab);
        if temperature == 0.0 {
            assert_eq!(
                Some((r.accepted_nodes.clone(), r.tokens.clone())),
                greedy_model
            );
        } else if rule_kind == 0 {
            let mut ch = vec![-1i64; n];
            for (j, &a) in r.accepted_nodes.iter().enumerate() {
                ch[a as usize] = r.tokens[j];
                // Top-k support: at least top_k entries of the row are >= the chosen one.
                let row = &rows[a as usize];
                let y = r.tokens[j] as usize;
                if top_k > 0 {
                    let above = row.iter().filter(|&&x| x > row[y]).count();
                    assert!(above < top_k as usize, "choice {y} outside top-{top_k}");
                }
                assert!(row[y] > f32::NEG_INFINITY || row.iter().all(|&x| x == row[y]));
            }
            let (acc, emi) = model_walk(&p, &tok, &ch);
            assert_eq!((acc, emi), (r.accepted_nodes.clone(), r.tokens.clone()));
        }
    } else if temperature > 0.0 {
        // A sampled walk fails only on a NaN row or a row with no finite logit.
        assert!(rows.iter().any(|r| r.iter().any(|x| !x.is_finite())));
    }
    // Too few logits rows are refused.
    if n > 1 {
        let short = LogitsView::F32(logits.slice(ndarray::s![..n - 1, ..]));
        assert!(Sampled::new(short, vec![params], seed, Rule::Match, trees(), n).is_err());
    }

    // The argmax kernel alone on rows long enough to cross every lane, chunk and block
    // boundary (1024), in each format: small integers (exact in f16 and bf16, ties common),
    // a few planted maxima, infinities and NaNs.
    let len = 1 + b.below(2100);
    let row_seed = b.u64();
    let mut row: Vec<f32> = (0..len)
        .map(|i| (mix(row_seed ^ i as u64) % 8) as f32 - 4.0)
        .collect();
    for _ in 0..b.below(4) {
        let at = b.below(len);
        row[at] = [5.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN][b.below(4)];
    }
    let want = model_argmax(&row).map(|i| i as usize);
    assert_eq!(argmax(ArrayView1::from(&row)), want, "f32");
    let halves: Vec<f16> = row.iter().map(|&x| f16::from_f32(x)).collect();
    assert_eq!(argmax(ArrayView1::from(&halves)), want, "f16");
    let brains: Vec<bf16> = row.iter().map(|&x| bf16::from_f32(x)).collect();
    assert_eq!(argmax(ArrayView1::from(&brains)), want, "bf16");
    let wide: Vec<f64> = row.iter().map(|&x| x as f64).collect();
    assert_eq!(argmax(ArrayView1::from(&wide)), want, "f64");
    let strided = Array2::from_shape_fn((len, 2), |(i, j)| if j == 0 { row[i] } else { 9.0 });
    assert_eq!(argmax(strided.column(0)), want, "strided");
});
