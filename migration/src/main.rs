//! `orion-beacon-migration`: the same command line as `sea-orm-cli migrate`, for the lease
//! table (`up`, `down`, `status`, `fresh`, `refresh`, `reset`; `-u URL` or `DATABASE_URL`).
#![forbid(unsafe_code)]

use sea_orm_migration::prelude::*;

#[tokio::main]
async fn main() {
    cli::run_cli(orion_beacon_migration::Migrator).await;
}
