//! Fenced writes and the grants behind them: stale terms refused, phantom grants, statements
//! abandoned mid-flight, stalled holders.
//!
//! One test binary per concern; each file below is a module. Run one with
//! `cargo test --all-features --test fencing MODULE::`.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod abandoned_statements;
mod blast_radius;
mod busy_rows;
mod fences;
mod phantom_grants;
mod stalled_holders;
