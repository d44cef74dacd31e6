//! The elector: terms, handover, paused and cut-off leaders, options, health, metrics, watch
//! readers, the README's example app.
//!
//! One test binary per concern; each file below is a module. Run one with
//! `cargo test --all-features --test elector MODULE::`.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod example_app;
mod health;
mod metrics;
mod options;
mod paused;
mod ranked;
mod sql;
mod watch_readers;
