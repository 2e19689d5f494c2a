//! The suffix drafter under random request lifecycles (start, append, finish with or without
//! caching, response removal, FIFO eviction of the global index). Invariant: every proposal
//! equals the proposal of a drafter rebuilt from scratch over the same live content (the
//! request's context and the cached responses, oldest first), so the incremental index (node
//! splits and merges, active suffixes, eviction and its relabelling) is exact; and no call
//! panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use specsched_core::draft::suffix::{ProposeOptions, SuffixDrafter};
use specsched_fuzz::Bytes;

fn tokens(b: &mut Bytes, alpha: usize, max_len: usize) -> Vec<i64> {
    let n = b.below(max_len + 1);
    (0..n).map(|_| b.below(alpha) as i64).collect()
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes::new(data);
    let depth = 1 + b.below(8) as i64;
    let max_global = b.below(80);
    let alpha = 1 + b.below(12);
    let Ok(mut d) = SuffixDrafter::new(depth, max_global as i64) else {
        return;
    };
    // Model: live requests (id -> (context, prompt length)); cached responses, oldest first.
    let mut live: Vec<(i64, Vec<i64>, usize)> = Vec::new();
    let mut cached: Vec<(i64, Vec<i64>)> = Vec::new();
    for _ in 0..40 {
        if b.is_empty() {
            break;
        }
        let id = b.below(4) as i64;
        let pos = live.iter().position(|r| r.0 == id);
        match b.below(5) {
            0 => {
                let prompt = tokens(&mut b, alpha, 12);
                let ok = d.start_request(id, &prompt).is_ok();
                assert_eq!(ok, pos.is_none());
                if ok {
                    let n = prompt.len();
                    live.push((id, prompt, n));
                }
            }
            1 => {
                let t = tokens(&mut b, alpha, 12);
                let ok = d.append(id, &t).is_ok();
                assert_eq!(ok, pos.is_some());
                if let Some(k) = pos {
                    live[k].1.extend(&t);
                }
            }
            2 => {
                let cache = b.bool();
                let ok = d.finish_request(id, cache).is_ok();
                assert_eq!(ok, pos.is_some());
                if let Some(k) = pos {
                    let (rid, ctx, plen) = live.remove(k);
                    let resp = ctx[plen..].to_vec();
                    if cache && !resp.is_empty() && max_global > 0 {
                        cached.retain(|c| c.0 != rid);
                        if resp.len() > max_global {
                            continue; // alone over the budget: never cached
                        }
                        cached.push((rid, resp));
                        while cached.iter().map(|c| c.1.len()).sum::<usize>() > max_global {
                            cached.remove(0);
                        }
                    }
                }
            }
            3 => {
                let had = cached.iter().position(|c| c.0 == id);
                assert_eq!(d.remove_response(id).is_ok(), had.is_some());
                if let Some(k) = had {
                    cached.remove(k);
                }
            }
            _ => {
                let want: Vec<i64> = cached.iter().map(|c| c.0).collect();
                assert_eq!(d.cached_responses(), want);
                let budget = 1 + b.below(8) as i64;
                let min_prob = [0.01, 0.1, 0.3, 1.0][b.below(4)];
                let Ok(opt) = ProposeOptions::new(budget, min_prob, 4.0, b.bool()) else {
                    return;
                };
                let mut fresh = SuffixDrafter::new(depth, max_global as i64).expect("valid");
                for (cid, resp) in &cached {
                    fresh.start_request(*cid, &[]).expect("new id");
                    fresh.append(*cid, resp).expect("live id");
                    fresh.finish_request(*cid, true).expect("live id");
                }
                for (rid, ctx, _) in &live {
                    if ctx.is_empty() {
                        assert!(d.propose(*rid, &opt, true).is_err());
                        continue;
                    }
                    fresh.start_request(*rid, ctx).expect("new id");
                    for use_global in [false, true] {
                        let got = d.propose(*rid, &opt, use_global).expect("live request");
                        let again = fresh.propose(*rid, &opt, use_global).expect("live");
                        assert_eq!(
                            got, again,
                            "request {rid} context {ctx:?} cached {cached:?}"
                        );
                    }
                }
            }
        }
    }
});
