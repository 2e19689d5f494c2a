//! Tree builders for static topologies: chains and choice lists.
//!
//! A choice list (Medusa, EAGLE-1, vLLM `speculative_token_tree`, TensorRT-LLM `*_choices`)
//! names each draft node by its path of sibling ranks from the root, which is implicit. Nodes
//! are ordered as vLLM orders them — root, then by `(len, choice)` — so parents come first and
//! siblings appear in rank order. Cost: O(M log M · D) for M choices of depth D.

use std::collections::HashMap;

use ndarray::ArrayView1;

use crate::error::{Error, Result};
use crate::tree::{IndexLike, Tree, MAX_NODES};

/// A chain: node `i`'s parent is `i - 1`; `tokens[0]` is the root.
pub fn chain<I: IndexLike>(tokens: ArrayView1<'_, I>) -> Result<Tree> {
    if tokens.is_empty() {
        return Err(Error::value(
            "tokens",
            "empty chain: a tree has at least the root token",
        ));
    }
    if tokens.len() > MAX_NODES {
        return Err(Error::value(
            "tokens",
            format!(
                "{} nodes, more than the supported maximum of {MAX_NODES}",
                tokens.len()
            ),
        ));
    }
    let parents: Vec<i32> = (0..tokens.len() as i32).map(|i| i - 1).collect();
    Tree::from_views(ArrayView1::from(&parents), tokens)
}

fn fmt_choice(c: &[i64]) -> String {
    let inner: Vec<String> = c.iter().map(|x| x.to_string()).collect();
    if inner.len() == 1 {
        format!("({},)", inner[0])
    } else {
        format!("({})", inner.join(", "))
    }
}

/// Node order of a choice list: `order[n]` is the index into `choices` of node `n + 1`.
/// Validates entries (non-empty, non-negative, unique, every proper prefix present) and
/// returns the parent of every node in that order.
pub fn choices_layout(choices: &[Vec<i64>]) -> Result<(Vec<usize>, Vec<i32>)> {
    if choices.len() + 1 > MAX_NODES {
        return Err(Error::value(
            "choices",
            format!(
                "{} choices, more than the supported maximum of {}",
                choices.len(),
                MAX_NODES - 1
            ),
        ));
    }
    for (j, c) in choices.iter().enumerate() {
        if c.is_empty() {
            return Err(Error::value(
                "choices",
                format!("choices[{j}] is empty; the root is implicit and must not be listed"),
            ));
        }
        if let Some(x) = c.iter().find(|&&x| x < 0) {
            return Err(Error::value(
                "choices",
                format!("choices[{j}] = {} has a negative rank {x}", fmt_choice(c)),
            ));
        }
    }
    let mut order: Vec<usize> = (0..choices.len()).collect();
    order.sort_by(|&a, &b| {
        let (ca, cb) = (&choices[a], &choices[b]);
        ca.len().cmp(&cb.len()).then_with(|| ca.cmp(cb))
    });
    let mut node_of: HashMap<&[i64], usize> = HashMap::with_capacity(choices.len());
    let mut parents = Vec::with_capacity(choices.len() + 1);
    parents.push(-1i32);
    for (pos, &j) in order.iter().enumerate() {
        let c = choices[j].as_slice();
        let node = pos + 1;
        if let Some(&prev) = node_of.get(c) {
            let first = order[prev - 1];
            let (a, b) = (first.min(j), first.max(j));
            return Err(Error::value(
                "choices",
                format!("choices[{b}] = {} duplicates choices[{a}]", fmt_choice(c)),
            ));
        }
        let parent = if c.len() == 1 {
            0
        } else {
            let prefix = &c[..c.len() - 1];
            match node_of.get(prefix) {
                Some(&p) => p,
                None => {
                    return Err(Error::value(
                        "choices",
                        format!(
                            "choices[{j}] = {}: its prefix {} is not in choices",
                            fmt_choice(c),
                            fmt_choice(prefix)
                        ),
                    ))
                }
            }
        };
        parents.push(parent as i32);
        node_of.insert(c, node);
    }
    Ok((order, parents))
}

/// Builds a tree from a choice list. `tokens`, if given, has `choices.len() + 1` entries:
/// `tokens[0]` for the root and `tokens[1 + j]` for `choices[j]` in the order given. Without
/// tokens, the root gets 0 and every node its sibling rank (the choice's last entry), so a
/// topology-only tree still has distinct siblings.
pub fn from_choices<I: IndexLike>(
    choices: &[Vec<i64>],
    tokens: Option<ArrayView1<'_, I>>,
) -> Result<Tree> {
    let (order, parents) = choices_layout(choices)?;
    let mut node_tokens = Vec::with_capacity(parents.len());
    match tokens {
        Some(t) => {
            if t.len() != choices.len() + 1 {
                return Err(Error::value(
                    "tokens",
                    format!(
                        "has {} entries, expected len(choices) + 1 = {} (the root's token first)",
                        t.len(),
                        choices.len() + 1
                    ),
                ));
            }
            node_tokens.push(t[0].to_i64());
            node_tokens.extend(order.iter().map(|&j| t[1 + j].to_i64()));
        }
        None => {
            node_tokens.push(0);
            // Entries were checked non-empty above.
            node_tokens.extend(order.iter().map(|&j| choices[j][choices[j].len() - 1]));
        }
    }
    Tree::new(&parents, &node_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: Option<ArrayView1<'static, i64>> = None;

    fn ch(v: &[&[i64]]) -> Vec<Vec<i64>> {
        v.iter().map(|c| c.to_vec()).collect()
    }

    #[test]
    fn orders_like_vllm_and_permutes_tokens() {
        let choices = ch(&[&[0, 0], &[1], &[0]]);
        let tokens = [100i64, 200, 300, 400];
        let t = from_choices(&choices, Some(ArrayView1::from(&tokens))).unwrap();
        // Node order: (0,), (1,), (0, 0)
        assert_eq!(t.parents(), &[-1, 0, 0, 1]);
        assert_eq!(t.tokens(), &[100, 400, 300, 200]);
        let t = from_choices(&choices, None::<ArrayView1<'_, i64>>).unwrap();
        assert_eq!(t.tokens(), &[0, 0, 1, 0]);
    }

    #[test]
    fn rejects_bad_choice_lists() {
        let e = from_choices(&ch(&[&[0], &[1, 0]]), NONE).unwrap_err();
        assert!(e.to_string().contains("choices[1]"), "{e}");
        let e = from_choices(&ch(&[&[0], &[0]]), NONE).unwrap_err();
        assert!(e.to_string().contains("duplicates"), "{e}");
        assert!(from_choices(&ch(&[&[]]), NONE).is_err());
        assert!(from_choices(&ch(&[&[-1]]), NONE).is_err());
        assert_eq!(from_choices(&[], NONE).unwrap().num_nodes(), 1);
    }

    #[test]
    fn chain_links_each_node_to_the_previous() {
        let t = chain(ArrayView1::from(&[5i64, 6, 7])).unwrap();
        assert_eq!(t.parents(), &[-1, 0, 1]);
        assert_eq!(t.max_depth(), 2);
        assert!(chain(ArrayView1::<i64>::from(&[])).is_err());
    }
}
