//! `orion-beacon-migration`: the lease table's migration with the command line of
//! `sea-orm-cli migrate` (`up`, `down`, `status`; `-u URL` or `DATABASE_URL`).
//!
//! `fresh`, `refresh` and `reset` are refused: they drop every table of the database (or undo
//! every migration), and this migration lives in the application's database.
#![forbid(unsafe_code)]

use sea_orm_migration::prelude::*;

/// Commands of sea-orm-migration's command line that act on more than this migration.
const REFUSED: [&str; 5] = ["fresh", "refresh", "reset", "init", "generate"];

#[tokio::main]
async fn main() {
    if let Some(command) = std::env::args()
        .skip(1)
        .find(|arg| REFUSED.contains(&arg.as_str()))
    {
        eprintln!(
            "orion-beacon-migration: `{command}` is not offered. The lease table lives in your \
             application's database, where `fresh`, `refresh` and `reset` would drop or undo \
             your own tables and migrations too. Use `up`, `down` or `status` here, and your \
             application's migrator for the rest."
        );
        std::process::exit(2);
    }
    cli::run_cli(orion_beacon_migration::Migrator).await;
}
