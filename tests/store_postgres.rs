//! The store contract on PostgreSQL (this test binary's private instance, or the server
//! `ORION_BEACON_PG_URL` names).
#![cfg(feature = "postgres")]

mod common;

use common::sql::SqlHarness;
use common::Server;

conformance_suite!(SqlHarness::server(Server::Postgres));

sql_store_suite!(SqlHarness::server(Server::Postgres));

/// The same contract through a transaction-pooling PgBouncer (consecutive statements of one
/// client may reach different server connections), with the store's
/// `with_transaction_pooling` mode.
mod through_pgbouncer {
    use crate::common::sql::SqlHarness;
    use crate::conformance_suite;
    conformance_suite!(SqlHarness::pgbouncer());
}
