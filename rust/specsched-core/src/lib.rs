//! specsched-core: the host-side engine of tree speculative decoding, in pure Rust.
//!
//! A draft proposes a tree of candidate tokens ([`tree`], built by [`topology`]); the target
//! scores every node in one forward pass under the masks and positions of [`layout`]; [`verify`]
//! finds the longest root path the target accepts, reading the target's logits lazily through
//! [`select`]; [`kv`] turns the accepted path into KV-cache moves. Nothing here knows Python:
//! inputs are slices and ndarray views, outputs are written into caller-provided buffers.

pub mod draft;
pub mod error;
pub mod kv;
pub mod layout;
pub mod rng;
pub mod select;
pub mod sim;
pub mod stats;
pub mod topology;
pub mod tree;
pub mod verify;

pub use error::{Error, Result};
pub use tree::{IndexLike, Tree, TreeBatch, TreeRef};
