"""Concurrency: shared read-only inputs, many threads, results identical to serial runs; the
GIL is released during the Rust work (observed by a heartbeat thread); no deadlock under a
tiny switch interval.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import specsched as ss

THREADS = 8
TIMEOUT = 60.0


def _trees(rng: np.random.Generator, count: int, n: int, vocab: int) -> list[ss.Tree]:
    trees = []
    for _ in range(count):
        parents = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n)], dtype=np.int32)
        trees.append(ss.Tree(parents, rng.integers(0, vocab, n)))
    return trees


@pytest.fixture(scope="module")
def shared() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    vocab = 4
    trees = _trees(rng, 16, 24, vocab)
    batch = ss.TreeBatch(trees)
    # A low-entropy target so walks go deep; logits are shared read-only by every thread.
    logits = rng.normal(size=(batch.num_nodes, vocab)).astype(np.float32)
    logits.flags.writeable = False
    target = rng.integers(0, vocab, batch.num_nodes)
    target.flags.writeable = False
    pool_parents = np.array([-1] + [int(rng.integers(-1, i)) for i in range(1, 400)])
    edge = -rng.exponential(size=400)
    return {
        "batch": batch,
        "logits": logits,
        "target": target,
        "pool_parents": pool_parents,
        "edge": edge,
    }


def _flat(x: Any) -> Any:
    if isinstance(x, tuple | list):
        return [_flat(v) for v in x]
    if isinstance(x, np.ndarray):
        return (x.dtype.str, x.shape, x.tobytes())
    if isinstance(x, ss.BatchVerifyResult):
        return _flat((x.num_accepted, x.accepted_nodes, x.tokens))
    if isinstance(x, ss.Tree):
        return _flat((x.parents, x.tokens))
    return x


def _workloads(s: dict[str, Any]) -> dict[str, Callable[[int], Any]]:
    """Name -> f(i): a deterministic call; i selects per-call variation (seed, prefix)."""
    batch, logits = s["batch"], s["logits"]

    def compact(i: int) -> Any:
        r = ss.verify(batch, target_tokens=s["target"])
        cache = np.arange(batch.num_trees * 40 * 6, dtype=np.float32).reshape(
            batch.num_trees, 40, 6
        )  # each call its own cache
        ss.compact_kv(cache, r, i % 5, seq_dim=1)
        return cache

    return {
        "verify_greedy": lambda i: ss.verify(batch, logits),
        "verify_tokens": lambda i: ss.verify(batch, target_tokens=s["target"]),
        "verify_sampled": lambda i: ss.verify(
            batch, logits, temperature=0.9, top_p=0.9, seed=i % 7
        ),
        "verify_rejection": lambda i: ss.verify(
            batch,
            logits,
            temperature=1.0,
            seed=i % 3,
            draft_probs=np.full(logits.shape, 0.25),
        ),
        "attention_mask": lambda i: batch.attention_mask(i % 9),
        "attention_bias": lambda i: batch.attention_bias(i % 4),
        "packed_attention_mask": lambda i: batch.packed_attention_mask(i % 11),
        "paths": lambda i: batch.paths(),
        "kv_plan": lambda i: ss.kv_compaction_plan(
            ss.verify(batch, target_tokens=s["target"]), i % 6
        ),
        "compact_kv": compact,
        "top_n_tree": lambda i: ss.top_n_tree(
            s["pool_parents"], s["edge"], 10 + i % 50, cumulative=False
        ),
        "from_choices": lambda i: ss.Tree.from_choices([(0,), (1,), (0, 0), (0, 1), (1, 0)]),
    }


def test_threads_match_serial(shared: dict[str, Any]) -> None:
    work = _workloads(shared)
    calls = [(name, i) for i in range(12) for name in work]
    serial = {(name, i): _flat(work[name](i)) for name, i in calls}
    with ThreadPoolExecutor(THREADS) as pool:
        # A list of pairs: a dict keyed by the call kept only the last of its three runs.
        futures = [(c, pool.submit(work[c[0]], c[1])) for c in calls * 3]
        assert len(futures) == 3 * len(calls)
        for (name, i), fut in futures:
            assert _flat(fut.result(timeout=TIMEOUT)) == serial[(name, i)], name


def test_inputs_unmodified_by_threads(shared: dict[str, Any]) -> None:
    before = {k: np.array(v, copy=True) for k, v in shared.items() if isinstance(v, np.ndarray)}
    test_threads_match_serial(shared)
    for k, v in before.items():
        assert np.array_equal(shared[k], v), k


def _heartbeat_during(call: Callable[[], Any]) -> tuple[int, float]:
    """Runs `call()` on this thread while a heartbeat thread stamps the time in a Python loop.

    Returns the number of heartbeats whose timestamps fall in the middle half of the call and
    the call's duration. A call that holds the GIL starves the heartbeat for its whole
    duration, so no timestamp can land inside it; one that releases it lets the heartbeat run.
    """
    stamps: list[float] = []
    stop = threading.Event()
    started = threading.Event()

    def beat() -> None:
        started.set()
        while not stop.is_set():
            stamps.append(time.perf_counter())

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    t = threading.Thread(target=beat)
    try:
        t.start()
        started.wait(TIMEOUT)
        time.sleep(0.01)
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
    finally:
        stop.set()
        t.join(TIMEOUT)
        sys.setswitchinterval(old)
    lo, hi = t0 + 0.25 * (t1 - t0), t0 + 0.75 * (t1 - t0)
    return sum(lo <= x <= hi for x in stamps), t1 - t0


@functools.cache
def _big_inputs() -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """Per name, `(setup, call)`: what the call needs before each run, outside the timed
    call, and the call."""
    rng = np.random.default_rng(1)
    chain = ss.Tree.chain(np.zeros(48, dtype=np.int64))
    vocab = 100_000
    logits = rng.normal(size=(48, vocab)).astype(np.float32)
    logits[:, 0] = 50.0  # token 0 wins every row: the walk visits all 48 rows
    trees = ss.TreeBatch([chain] * 16)
    padded = ss.TreeBatch([ss.Tree.chain(np.zeros(128, dtype=np.int64))] * 2048)
    # Node 1 is rejected and the chain 2..n-1 accepted: every kept entry moves one slot down.
    n = 4000
    detour = ss.Tree(
        np.r_[-1, 0, 0, np.arange(2, n - 1)].astype(np.int32),
        np.r_[0, 9, np.zeros(n - 2, np.int64)],
    )
    r_shift = ss.verify(ss.TreeBatch([detour] * 8), target_tokens=np.zeros(8 * n, np.int64))
    cache = np.zeros((8, n + 16, 512), dtype=np.float32)
    parents = np.r_[-1, rng.integers(-1, np.arange(1, 400_000))]
    edge = -rng.exponential(size=400_000)
    # One draft level of 4096 requests x 16 x 16 candidates, from and into the buffers.
    drafting = ss.DynamicTreeBuilder(4096, 16, 2, 16)
    buf = drafting.buffers
    buf.topk_tokens[:] = rng.integers(0, 1000, buf.topk_tokens.shape)
    buf.topk_logprobs[:] = -rng.exponential(size=buf.topk_logprobs.shape)

    def draft_level_in_place() -> None:
        # Started untimed, before each run (its setup): only the level itself is observed.
        drafting.expand_in_place()

    setups: dict[str, Callable[[], Any]] = {"expand_in_place": drafting.start_in_place}
    # 1,000 detours of 4,000 nodes: every request moves ~4,000 entries, so the plans, slot
    # commits, cuts and counts each handle ~4M nodes (a chain accepted whole moves nothing:
    # its plan took under 4 ms, too short to observe).
    long_batch = ss.TreeBatch([detour] * 1000)
    r_long = ss.verify(long_batch, target_tokens=np.zeros(long_batch.num_nodes, np.int64))
    slots = np.arange(long_batch.num_nodes, dtype=np.int64)
    keep = np.full(1000, n // 2, np.int64)
    calls: dict[str, Callable[[], Any]] = {
        "verify_sampled": lambda: ss.verify(chain, logits, temperature=0.7, top_p=0.95, seed=1),
        "attention_mask": lambda: trees.attention_mask(400_000),
        "padded_layout": lambda: padded.padded_layout(7),
        "compact_kv": lambda: ss.compact_kv(cache, r_shift, 16, seq_dim=1, batch_dim=0),
        "top_n_tree": lambda: ss.top_n_tree(parents, edge, 4096, cumulative=False),
        "expand_in_place": draft_level_in_place,
        "kv_compaction_plan": lambda: ss.kv_compaction_plan(r_long, 7),
        "commit_slots": lambda: ss.commit_slots(slots, r_long),
        "truncate": lambda: r_long.truncate(keep),
        "to_sglang": lambda: r_long.to_sglang(),
        "stats_update": lambda: ss.AcceptanceStats().update(long_batch, r_long),
    }
    return {name: (setups.get(name, lambda: None), call) for name, call in calls.items()}


@pytest.mark.parametrize(
    "name",
    [
        "verify_sampled",
        "attention_mask",
        "padded_layout",
        "compact_kv",
        "top_n_tree",
        "expand_in_place",
        "kv_compaction_plan",
        "commit_slots",
        "truncate",
        "to_sglang",
        "stats_update",
    ],
)
def test_gil_released_heartbeat(name: str) -> None:
    setup, call = _big_inputs()[name]
    setup()
    call()  # warm up (page in, thread pool)
    best = 0
    for _ in range(3):
        setup()
        beats, dur = _heartbeat_during(call)
        best = max(best, beats)
        if beats > 0 and dur > 0.004:
            break
    assert dur > 0.004, f"{name}: the call is too short ({dur * 1e3:.1f} ms) to observe"
    assert best > 0, f"{name}: no heartbeat during a {dur * 1e3:.1f} ms call: GIL held"


def test_heartbeat_detects_a_gil_holding_call() -> None:
    """The probe has teeth: builtin `sum` over a range is one C loop that never releases the
    GIL, so no heartbeat can land inside it."""
    beats, dur = _heartbeat_during(lambda: sum(range(3_000_000)))
    assert dur > 0.004
    assert beats == 0


def test_no_deadlock_tiny_switch_interval(shared: dict[str, Any]) -> None:
    work = _workloads(shared)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(THREADS) as pool:
            futures = [pool.submit(work[name], i) for i in range(4) for name in work]
            for fut in futures:
                fut.result(timeout=TIMEOUT)
    finally:
        sys.setswitchinterval(old)
    assert sys.getswitchinterval() == old


def test_dynamic_builders_per_thread_match_serial() -> None:
    """Each thread drives its own DynamicTreeBuilder (stateful objects are not shared)."""
    rng = np.random.default_rng(3)
    b, k = 4, 3
    root = rng.integers(0, 100, b)
    tk = rng.integers(0, 100, (b, k))
    lp = np.sort(-rng.exponential(size=(b, k)), axis=1)[:, ::-1].copy()
    steps = [
        (
            rng.integers(0, 100, (b, k, k)),
            np.sort(-rng.exponential(size=(b, k, k)))[..., ::-1].copy(),
        )
        for _ in range(3)
    ]

    def run() -> Any:
        d = ss.DynamicTreeBuilder(b, k, 4, 10)
        outs = [d.start(root, tk, lp)]
        outs += [d.expand(t, p) for t, p in steps]
        batch, pool_index = d.build()
        return _flat([*outs, batch.parents, batch.tokens, pool_index])

    serial = run()
    with ThreadPoolExecutor(THREADS) as pool:
        for fut in [pool.submit(run) for _ in range(24)]:
            assert fut.result(timeout=TIMEOUT) == serial


def test_builder_buffers_in_use_are_refused_not_raced() -> None:
    """While `expand_in_place` writes its buffers (GIL released), a specsched call reading one
    of the views it writes, in another thread, is refused by rust-numpy's borrow check, and
    an in-place call meeting such a reader is refused the same way. A read that runs sees one
    whole step (level 1's or level 2's frontier), never a mix."""
    b, k = 4096, 16
    rng = np.random.default_rng(5)
    drafting = ss.DynamicTreeBuilder(b, k, 2, 16)
    buf = drafting.buffers
    buf.topk_tokens[:] = rng.integers(0, 1 << 40, buf.topk_tokens.shape)
    buf.topk_logprobs[:] = -rng.exponential(size=buf.topk_logprobs.shape)
    drafting.start_in_place()
    level1 = buf.tokens.reshape(-1).copy()
    drafting.expand_in_place()
    level2 = buf.tokens.reshape(-1).copy()
    assert not np.array_equal(level1, level2)
    # The verify walk of root-only trees returns each tree's target token: the view, read.
    roots = ss.TreeBatch([ss.Tree.chain(np.zeros(1, np.int64))] * (b * k))
    refused = {"reader": 0, "writer": 0}
    reads = 0
    done = threading.Event()

    def write() -> None:
        while not done.is_set():
            try:
                drafting.start_in_place()
                drafting.expand_in_place()
            except ValueError as e:
                assert "in use" in str(e)
                refused["writer"] += 1
            time.sleep(0.001)  # a window for the reader

    def read() -> None:
        nonlocal reads
        deadline = time.perf_counter() + 20.0
        while time.perf_counter() < deadline and (reads < 3 or sum(refused.values()) == 0):
            try:
                got = ss.verify(roots, target_tokens=buf.tokens.reshape(-1)).tokens[:, 0]
            except ValueError as e:
                assert "borrow" in str(e).lower() or "cannot be read" in str(e)
                refused["reader"] += 1
            else:
                assert np.array_equal(got, level1) or np.array_equal(got, level2)
                reads += 1
        done.set()

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(write), pool.submit(read)]
        for f in futures:
            f.result(timeout=TIMEOUT)
    assert sum(refused.values()) > 0, "the reader and the writer never met"
    assert reads >= 3
    # Every borrow was released: both calls run again.
    drafting.start_in_place()
    drafting.expand_in_place()
    got = ss.verify(roots, target_tokens=buf.tokens.reshape(-1)).tokens[:, 0]
    assert np.array_equal(got, level2)


def test_shared_builder_is_safe_or_refuses() -> None:
    """A DynamicTreeBuilder shared by threads either serves a call or refuses it with a
    RuntimeError (PyO3's borrow check); it never races, and a served call is correct."""
    rng = np.random.default_rng(4)
    b, k = 2, 2
    root = rng.integers(0, 50, b)
    tk = rng.integers(0, 50, (b, k))
    lp = np.sort(-rng.exponential(size=(b, k)), axis=1)[:, ::-1].copy()
    expected = _flat(ss.DynamicTreeBuilder(b, k, 3, 5).start(root, tk, lp))
    shared_builder = ss.DynamicTreeBuilder(b, k, 3, 5)
    refused = 0

    def call() -> Any:
        try:
            return _flat(shared_builder.start(root, tk, lp))
        except RuntimeError as e:
            assert "borrow" in str(e).lower()
            return None

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(THREADS) as pool:
            for fut in [pool.submit(call) for _ in range(200)]:
                got = fut.result(timeout=TIMEOUT)
                if got is None:
                    refused += 1
                else:
                    assert got == expected
    finally:
        sys.setswitchinterval(old)
    assert refused < 200


@pytest.mark.parametrize("kind", ["numpy", "torch", "torch views"])
def test_compaction_and_a_reader_of_the_same_array_are_refused_not_raced(kind: str) -> None:
    """`compact_kv` holds its buffer's write borrow in rust-numpy's registry while it moves
    entries with the GIL released, as every in-place specsched call does: a verify reading the
    same array in another thread is refused (or refuses the compaction), and a read that runs
    sees the array before or after the moves, never half-moved (that read a maximum in one pass
    and missed it in the next: 'row 2 contains NaN' on NaN-free logits). A torch CPU tensor
    likewise, also when the two calls get two tensor objects over its storage: its numpy
    views are keyed by the storage (each `tensor.numpy()` is based on a new object, so the
    registry never saw one call from the other: 3 torn reads in 300)."""
    vocab = 1 << 21
    logits: Any = np.empty((4, vocab), np.float32)
    reader_logits, compacted_logits = logits, logits
    if kind != "numpy":
        torch = pytest.importorskip("torch")
        logits = torch.empty((4, vocab), dtype=torch.float32)
        reader_logits = logits[:] if kind == "torch views" else logits
        compacted_logits = logits.detach() if kind == "torch views" else logits
    tree = ss.Tree([-1, 0, 0, 2], [5, 6, 7, 8])
    plan_rows = np.zeros((4, 16), np.float32)
    plan_rows[0, 7], plan_rows[2, 8], plan_rows[3, 3] = 1, 1, 1
    moves = ss.verify(tree, plan_rows)  # accepts node 2, then 3: rows 2 -> 1 and 3 -> 2

    def reset() -> None:
        logits[:] = 0
        logits[0, 7] = 1  # the root accepts node 2 (token 7) either way
        logits[2, vocab - 1] = 10  # before the moves: row 2's bonus is the last token
        logits[3, 1] = 5  # after them, row 2 holds this row: bonus 1

    before, after = ([0, 2], vocab - 1), ([0, 2], 1)

    def read(barrier: threading.Barrier, seen: dict[str, Any], delay: float) -> None:
        barrier.wait()
        time.sleep(delay)
        try:
            r = ss.verify(tree, reader_logits)
            seen["r"] = (r.accepted_nodes.tolist(), r.bonus_token)
        except ValueError as e:  # refused by the borrow, or a torn read's error
            seen["r"] = str(e)

    outcomes: dict[str, int] = {"before": 0, "after": 0, "refused": 0}
    for i in range(200):
        reset()
        barrier, seen = threading.Barrier(2), {}
        reader = threading.Thread(target=read, args=(barrier, seen, (i % 8) * 0.0005))
        reader.start()
        barrier.wait()
        try:
            ss.compact_kv(compacted_logits, moves, 0, 0)
            compacted = True
        except ValueError as e:
            assert "borrowed" in str(e), e
            compacted = False
        reader.join(timeout=TIMEOUT)
        got = seen["r"]
        if isinstance(got, str):
            assert "borrowed" in got, got  # refused, never "row 2 contains NaN"
        if isinstance(got, str) or not compacted:
            outcomes["refused"] += 1
        else:
            assert got in (before, after), got
            outcomes["before" if got == before else "after"] += 1
        if outcomes["refused"] and i >= 20:
            break
    assert outcomes["refused"] > 0, f"the reader and the compaction never met: {outcomes}"
