//! The model checks of orion-beacon's protocols live in this crate's tests:
//! `tests/model_election.rs` (the elector: one leader at a time, tokens that only grow, the
//! step-down rule) and `tests/model_shards.rs` (shard-set rounds). It has no code of its own;
//! it exists so that the searches are built optimised in debug builds. Run them with
//! `cargo test -p orion-beacon-model` (the longer runs: `-- --ignored`).
#![forbid(unsafe_code)]
#![warn(missing_docs)]
