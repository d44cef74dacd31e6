//! The store contract on MySQL/MariaDB, for both statement forms: MariaDB's one-statement
//! `... RETURNING`, and the transaction that MySQL needs (which MariaDB runs too); both again
//! on sessions whose `sql_mode` has MariaDB's `SIMULTANEOUS_ASSIGNMENT` (every `SET` of an
//! `UPDATE` reads the old row), as a server-wide `sql_mode=ORACLE` gives.
#![cfg(feature = "mysql")]

use crate::common;

use common::sql::SqlHarness;
use common::Server;
use orion_beacon::MySqlUpsert;

mod returning {
    use super::*;
    conformance_suite!(SqlHarness::mysql(MySqlUpsert::Returning));
    sql_store_suite!(SqlHarness::mysql(MySqlUpsert::Returning));
    shard_suite!(SqlHarness::mysql(MySqlUpsert::Returning));
    lock_suite!(SqlHarness::mysql(MySqlUpsert::Returning));
    rate_suite!(SqlHarness::mysql(MySqlUpsert::Returning));
    job_suite!(SqlHarness::mysql(MySqlUpsert::Returning));
}

mod transaction {
    use super::*;
    conformance_suite!(SqlHarness::mysql(MySqlUpsert::Transaction));
    sql_store_suite!(SqlHarness::mysql(MySqlUpsert::Transaction));
    shard_suite!(SqlHarness::mysql(MySqlUpsert::Transaction));
    lock_suite!(SqlHarness::mysql(MySqlUpsert::Transaction));
    rate_suite!(SqlHarness::mysql(MySqlUpsert::Transaction));
    job_suite!(SqlHarness::mysql(MySqlUpsert::Transaction));
}

/// COMMITs this session sent (`Com_commit`): the transaction form sends one per call, the
/// `RETURNING` form none (autocommit).
async fn commits(db: &sea_orm::DatabaseConnection) -> u64 {
    use sea_orm::ConnectionTrait;
    let row = db
        .query_one_raw(sea_orm::Statement::from_string(
            db.get_database_backend(),
            "SHOW SESSION STATUS LIKE 'Com_commit'",
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get_by_index::<String>(1).unwrap().parse().unwrap()
}

/// The harness's stores really use the form each suite names (one session: a pool of one).
#[tokio::test]
async fn each_suite_runs_the_form_it_names() {
    use orion_beacon::{LeaseStore, SeaOrmLeaseStore};
    for (form, per_call) in [(MySqlUpsert::Transaction, 1), (MySqlUpsert::Returning, 0)] {
        let Some(h) = SqlHarness::mysql(form).await else {
            return;
        };
        let db = Server::MySql.connect(1).await;
        // On the pool's one session, whose commits the test counts.
        let store = h
            .configure(SeaOrmLeaseStore::new(db.clone()))
            .with_lease_connections(0)
            .unwrap();
        let before = commits(&db).await;
        for _ in 0..3 {
            store
                .acquire_or_renew("r", "a", std::time::Duration::from_secs(5))
                .await
                .unwrap();
        }
        assert_eq!(commits(&db).await - before, 3 * per_call, "{form:?}");
        common::conformance::Harness::teardown(h).await;
    }
}

/// On a session where every assignment of `ON DUPLICATE KEY UPDATE` reads the old row.
pub const SIMULTANEOUS_ASSIGNMENT: &str =
    "SET SESSION sql_mode = CONCAT(@@sql_mode, ',SIMULTANEOUS_ASSIGNMENT')";

mod simultaneous_assignment {
    use super::*;
    mod returning {
        use super::*;
        conformance_suite!(SqlHarness::mysql_with_session(
            MySqlUpsert::Returning,
            SIMULTANEOUS_ASSIGNMENT
        ));
        shard_suite!(SqlHarness::mysql_with_session(
            MySqlUpsert::Returning,
            SIMULTANEOUS_ASSIGNMENT
        ));
    }
    mod transaction {
        use super::*;
        conformance_suite!(SqlHarness::mysql_with_session(
            MySqlUpsert::Transaction,
            SIMULTANEOUS_ASSIGNMENT
        ));
    }
}

/// Without an override the store asks the server, and MariaDB gets the one-statement form.
#[tokio::test]
async fn detects_mariadb_and_works_without_override() {
    use orion_beacon::{store::LeaseOutcome, LeaseStore, SeaOrmLeaseStore};
    let Some(h) = SqlHarness::server(Server::MySql).await else {
        return;
    };
    let store = SeaOrmLeaseStore::new(h.db().clone())
        .with_table(h.table())
        .unwrap();
    let out = store
        .acquire_or_renew("r", "a", std::time::Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        matches!(out, LeaseOutcome::Acquired(ref l) if l.token.get() == 1),
        "{out:?}"
    );
    let version: String = {
        use sea_orm::ConnectionTrait;
        let row = h
            .db()
            .query_one_raw(sea_orm::Statement::from_string(
                h.db().get_database_backend(),
                "SELECT VERSION()",
            ))
            .await
            .unwrap()
            .unwrap();
        row.try_get_by_index(0).unwrap()
    };
    if version.contains("MariaDB") {
        assert_eq!(
            MySqlUpsert::for_version(&version),
            MySqlUpsert::Returning,
            "{version}"
        );
    }
    common::conformance::Harness::teardown(h).await;
}
