//! Shard sets: assignment, liveness under faults, safety (one holder per shard).
//!
//! One test binary per concern; each file below is a module. Run one with
//! `cargo test --all-features --test shards MODULE::`.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod liveness;
mod safety;
mod sets;
