//! Tree validation and construction from arbitrary bytes. Invariants: `Tree::new` accepts
//! exactly the inputs the definition allows (`parents[0] == -1`, `0 <= parents[i] < i`,
//! matching lengths, at least one node), and an accepted tree's derived data (depths, links,
//! leaves, max depth) equals the naive model; `TreeBatch::from_views` accepts exactly valid
//! offsets over valid trees; `chain` and `from_choices` build the trees their inputs describe,
//! in breadth-first and in depth-first (path) order alike.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ndarray::ArrayView1;
use specsched_core::topology::{
    chain, choices_layout, choices_layout_in, from_choices_in, ChoiceOrder,
};
use specsched_core::{Tree, TreeBatch, TreeRef};
use specsched_fuzz::{model_children, model_depths, Bytes};

fn check_derived(t: TreeRef<'_>, parents: &[i32], tokens: &[i64]) {
    assert_eq!(t.parents, parents);
    assert_eq!(t.tokens, tokens);
    let depths = model_depths(parents);
    let n = parents.len();
    for i in 0..n {
        assert_eq!(t.depths[i] as usize, depths[i], "depth of {i}");
        let kids = model_children(parents, i);
        assert_eq!(t.children(i).collect::<Vec<_>>(), kids, "children of {i}");
        assert_eq!(t.first_child[i], kids.first().map_or(-1, |&c| c as i32));
    }
    assert_eq!(t.max_depth as usize, *depths.iter().max().unwrap());
    let leaves = (0..n)
        .filter(|&i| model_children(parents, i).is_empty())
        .count();
    assert_eq!(t.num_leaves, leaves);
}

fn valid(parents: &[i32]) -> bool {
    !parents.is_empty()
        && parents[0] == -1
        && parents
            .iter()
            .enumerate()
            .skip(1)
            .all(|(i, &p)| p >= 0 && (p as usize) < i)
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes::new(data);
    let mode = b.u8();
    let n = b.below(40);
    // Raw parents: mostly plausible, sometimes anything (cycles, forward refs, negatives).
    let parents: Vec<i32> = (0..n)
        .map(|i| match b.u8() % 8 {
            0 => b.i32(),
            1 => i as i32,
            2 => -1,
            _ => i as i32 - 1 - b.below(i.max(1)) as i32,
        })
        .collect();
    let ntok = if mode & 1 == 1 { n + b.below(2) } else { n };
    let tokens: Vec<i64> = (0..ntok).map(|_| b.u8() as i64 % 5).collect();
    let r = Tree::new(&parents, &tokens);
    let ok = valid(&parents) && tokens.len() == parents.len();
    assert_eq!(
        r.is_ok(),
        ok,
        "parents {parents:?} tokens {tokens:?}: {r:?}"
    );
    if let Ok(t) = &r {
        check_derived(t.view(), &parents, &tokens);
        // A strided int64 view of the same data validates to the same tree.
        let wide: Vec<i64> = parents.iter().flat_map(|&p| [p as i64, 7]).collect();
        let strided = ArrayView1::from(&wide[..]).slice_move(ndarray::s![..;2]);
        let t2 = Tree::from_views(strided, ArrayView1::from(&tokens[..])).unwrap();
        assert_eq!(&t2, t);
        // chain(tokens) is the path 0-1-2-...
        let c = chain(ArrayView1::from(&tokens[..])).unwrap();
        let cp: Vec<i32> = (0..n as i32).map(|i| i - 1).collect();
        check_derived(c.view(), &cp, &tokens);
    }

    // Batches: offsets over the raw parents; valid iff every segment is a valid tree.
    let nb = b.below(5);
    let mut offs = vec![0i64];
    for _ in 0..nb {
        let last = *offs.last().unwrap();
        offs.push(if b.u8() % 16 == 0 {
            b.i32() as i64
        } else {
            last + 1 + b.below(8) as i64
        });
    }
    if b.bool() && !offs.is_empty() {
        *offs.last_mut().unwrap() = n as i64;
    }
    if tokens.len() == parents.len() {
        let r = TreeBatch::from_views(
            ArrayView1::from(&parents[..]),
            ArrayView1::from(&tokens[..]),
            ArrayView1::from(&offs[..]),
        );
        let offs_ok = offs.len() >= 2
            && offs[0] == 0
            && offs.windows(2).all(|w| w[1] > w[0])
            && *offs.last().unwrap() == n as i64;
        let ok = offs_ok
            && offs
                .windows(2)
                .all(|w| valid(&parents[w[0] as usize..w[1] as usize]));
        assert_eq!(r.is_ok(), ok, "offsets {offs:?} parents {parents:?}: {r:?}");
        if let Ok(batch) = r {
            for (i, w) in offs.windows(2).enumerate() {
                let (s, e) = (w[0] as usize, w[1] as usize);
                check_derived(batch.tree(i), &parents[s..e], &tokens[s..e]);
            }
        }
    }

    // Choice paths: valid iff every entry is non-empty, non-negative, unique, prefix-closed.
    let nc = b.below(12);
    let choices: Vec<Vec<i64>> = (0..nc)
        .map(|_| {
            let len = b.below(4);
            (0..len)
                .map(|_| b.u8() as i64 % 4 - i64::from(b.u8() == 255))
                .collect()
        })
        .collect();
    let ok = choices.iter().enumerate().all(|(j, c)| {
        !c.is_empty()
            && c.iter().all(|&x| x >= 0)
            && !choices[..j].contains(c)
            && (c.len() == 1 || choices.contains(&c[..c.len() - 1].to_vec()))
    });
    assert_eq!(choices_layout(&choices).is_ok(), ok);
    for layout in [ChoiceOrder::BreadthFirst, ChoiceOrder::DepthFirst] {
        let r = choices_layout_in(&choices, layout);
        assert_eq!(r.is_ok(), ok, "choices {choices:?}: {r:?}");
        if !ok {
            continue;
        }
        let t = from_choices_in::<i64>(&choices, None, layout).unwrap();
        // Node n + 1 is choice order[n]; its root path spells the choice.
        let (order, _) = r.unwrap();
        let v = t.view();
        for (node, &j) in order.iter().enumerate() {
            let mut path = vec![];
            let mut x = node as i32 + 1;
            while x > 0 {
                path.push(v.tokens[x as usize]);
                x = v.parents[x as usize];
            }
            path.reverse();
            assert_eq!(path, choices[j], "node {} of {choices:?}", node + 1);
        }
        // vLLM order: sorted by (length, lexicographic); depth first: lexicographic.
        let mut sorted = choices.clone();
        match layout {
            ChoiceOrder::BreadthFirst => sorted.sort_by(|a, b| (a.len(), a).cmp(&(b.len(), b))),
            ChoiceOrder::DepthFirst => sorted.sort(),
        }
        let in_order: Vec<Vec<i64>> = order.iter().map(|&j| choices[j].clone()).collect();
        assert_eq!(in_order, sorted);
    }
});
