//! `specsched._core`: the Python bindings of specsched-core. Boring on purpose: extract and
//! check arrays, release the GIL, call one core function, map its error.

use pyo3::prelude::*;

mod buffers;
mod build;
mod convert;
mod draft;
mod kv;
mod ndconv;
mod sglang;
mod sim;
mod stats;
mod tree;
mod verify;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<tree::PyTree>()?;
    m.add_class::<tree::PyTreeBatch>()?;
    m.add_class::<verify::PyVerifyResult>()?;
    m.add_class::<verify::PyBatchVerifyResult>()?;
    m.add_function(wrap_pyfunction!(verify::verify_target_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(verify::verify_greedy, m)?)?;
    m.add_function(wrap_pyfunction!(verify::verify_sampled, m)?)?;
    m.add_function(wrap_pyfunction!(kv::kv_compaction_plan, m)?)?;
    m.add_function(wrap_pyfunction!(kv::compact_kv, m)?)?;
    m.add_function(wrap_pyfunction!(kv::cache_moves, m)?)?;
    m.add_function(wrap_pyfunction!(kv::check_cache_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(kv::commit_slots, m)?)?;
    m.add_function(wrap_pyfunction!(sim::sim_chain_expected_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(sim::sim_expected_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(sim::sim_path_probs, m)?)?;
    m.add_function(wrap_pyfunction!(sim::sim_best_tree, m)?)?;
    m.add_function(wrap_pyfunction!(sim::sim_simulate, m)?)?;
    m.add_class::<build::PyDynamicTreeBuilder>()?;
    m.add_class::<buffers::PyDraftBuffers>()?;
    m.add_class::<stats::PyAcceptanceStats>()?;
    m.add_function(wrap_pyfunction!(build::top_n_tree, m)?)?;
    m.add_function(wrap_pyfunction!(build::optimal_tree, m)?)?;
    m.add_function(wrap_pyfunction!(build::expected_accept_length, m)?)?;
    m.add_function(wrap_pyfunction!(build::choose_tree, m)?)?;
    m.add_function(wrap_pyfunction!(sglang::sglang_organize, m)?)?;
    m.add_function(wrap_pyfunction!(sglang::sglang_build_tree, m)?)?;
    m.add_function(wrap_pyfunction!(sglang::sglang_verify_tree_greedy, m)?)?;
    m.add_function(wrap_pyfunction!(convert::key_by_storage, m)?)?;
    m.add_class::<draft::PySuffixDrafter>()?;
    m.add_class::<draft::PyNgramDrafter>()?;
    m.add_class::<draft::PyDraft>()?;
    m.add("MAX_TOKEN_ID", specsched_core::draft::MAX_TOKEN_ID)?;
    m.add("MAX_NODES", specsched_core::tree::MAX_NODES)?;
    m.add("MAX_BATCH_NODES", specsched_core::tree::MAX_BATCH_NODES)?;
    m.add("DRAFT_SUM_TOL", specsched_core::select::DRAFT_SUM_TOL)?;
    m.add(
        "MAX_OUTPUT_ELEMENTS",
        specsched_core::layout::MAX_OUTPUT_ELEMENTS,
    )?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
