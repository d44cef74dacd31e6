//! The store contract on PostgreSQL (this test binary's private instance, or the server
//! `ORION_BEACON_PG_URL` names).
#![cfg(feature = "postgres")]

mod common;

use common::sql::SqlHarness;
use common::Server;

conformance_suite!(SqlHarness::server(Server::Postgres));

sql_store_suite!(SqlHarness::server(Server::Postgres));
