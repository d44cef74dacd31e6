//! The store contract on PostgreSQL (`ORION_BEACON_PG_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`).
#![cfg(feature = "postgres")]

mod common;

use common::sql::SqlHarness;
use common::Server;

conformance_suite!(SqlHarness::server(Server::Postgres));

sql_store_suite!(SqlHarness::server(Server::Postgres));
