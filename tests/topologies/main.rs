//! Topologies users run the store on: a Galera cluster. PgBouncer is in the store and elector
//! suites, a promoted standby in the torture run.
//!
//! One test binary per concern; each file below is a module. Run one with
//! `cargo test --all-features --test topologies MODULE::`.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod galera;
