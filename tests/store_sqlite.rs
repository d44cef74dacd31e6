//! The store contract on SQLite (a file, several connection pools).
#![cfg(feature = "sqlite")]

mod common;

use common::sql::SqlHarness;

conformance_suite!(SqlHarness::sqlite());

sql_store_suite!(SqlHarness::sqlite());
