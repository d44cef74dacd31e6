//! The lease store per backend (the shared conformance suite on each), its admin calls, durability
//! and pool settings, release notifications and races, and what its values print and serialize.
//!
//! One test binary per concern; each file below is a module. Run one with
//! `cargo test --all-features --test store MODULE::`.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod admin;
mod durability;
mod memory;
mod mysql;
mod mysql_wakeups;
mod postgres;
mod readable_values;
mod release_notifications;
mod release_races;
mod serde_forms;
mod small_pools;
mod sqlite;
