//! The store contract on SQLite (a file, several connection pools), in WAL mode (what
//! `backend::sqlite::connect_options` sets up) and in rollback-journal mode (SQLite's own
//! default, where a commit waits for every reader).
#![cfg(feature = "sqlite")]

mod common;

use common::sql::SqlHarness;

conformance_suite!(SqlHarness::sqlite());

sql_store_suite!(SqlHarness::sqlite());

mod rollback_journal {
    use super::*;
    conformance_suite!(SqlHarness::sqlite_rollback_journal());
    sql_store_suite!(SqlHarness::sqlite_rollback_journal());
}
