//! The store reads the settings that decide whether a commit is durable (a grant lost in a
//! crash can have its token issued again), per backend, and warns once at its first grant.

use crate::common;

use orion_beacon::{Durability, SeaOrmLeaseStore};

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_synchronous_off_is_not_durable() {
    use sea_orm::sqlx::sqlite::SqliteSynchronous;
    let dir = tempfile::tempdir().unwrap();
    for (mode, durable) in [
        (SqliteSynchronous::Full, true),
        (SqliteSynchronous::Normal, true),
        (SqliteSynchronous::Off, false),
    ] {
        let path = dir.path().join(format!("{mode:?}.db"));
        let mut options =
            orion_beacon::backend::sqlite::connect_options(format!("sqlite://{}", path.display()));
        options
            .max_connections(1)
            .sqlx_logging(false)
            .map_sqlx_sqlite_opts(move |o| o.create_if_missing(true).synchronous(mode));
        let db = sea_orm::Database::connect(options).await.unwrap();
        let found = SeaOrmLeaseStore::new(db).durability().await.unwrap();
        if durable {
            assert_eq!(found, Durability::Durable, "{mode:?}");
        } else {
            assert_eq!(
                found,
                Durability::NotDurable {
                    setting: "synchronous",
                    value: "0".to_owned()
                }
            );
        }
    }
}

/// The test kit's PostgreSQL runs with `fsync = off` (fast, and exactly the setting to catch);
/// `synchronous_commit` is the session's own and is read too.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_fsync_and_synchronous_commit_are_read() {
    use common::Server;
    use sea_orm::ConnectionTrait;
    if Server::Postgres.skipped() {
        return;
    }
    let db = Server::Postgres.connect(1).await;
    let fsync = db
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            "SELECT current_setting('fsync')",
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get_by_index::<String>(0)
        .unwrap();
    let store = SeaOrmLeaseStore::new(db.clone());
    let found = store.durability().await.unwrap();
    if fsync == "off" {
        assert_eq!(
            found,
            Durability::NotDurable {
                setting: "fsync",
                value: "off".to_owned()
            }
        );
    } else {
        assert_eq!(found, Durability::Durable);
        // A pool of one: the session setting stays on the connection the store reads on.
        db.execute_unprepared("SET synchronous_commit = off")
            .await
            .unwrap();
        assert_eq!(
            store.durability().await.unwrap(),
            Durability::NotDurable {
                setting: "synchronous_commit",
                value: "off".to_owned()
            }
        );
        db.execute_unprepared("RESET synchronous_commit")
            .await
            .unwrap();
    }
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_innodb_flush_log_at_trx_commit_is_read() {
    use common::Server;
    use sea_orm::ConnectionTrait;
    if Server::MySql.skipped() || Server::MySql.external() {
        // Changes a global setting: only on this binary's private server.
        return;
    }
    let db = Server::MySql.connect(1).await;
    let store = SeaOrmLeaseStore::new(db.clone());
    db.execute_unprepared("SET GLOBAL innodb_flush_log_at_trx_commit = 1")
        .await
        .unwrap();
    assert_eq!(store.durability().await.unwrap(), Durability::Durable);
    db.execute_unprepared("SET GLOBAL innodb_flush_log_at_trx_commit = 2")
        .await
        .unwrap();
    let found = store.durability().await.unwrap();
    db.execute_unprepared("SET GLOBAL innodb_flush_log_at_trx_commit = 1")
        .await
        .unwrap();
    assert_eq!(
        found,
        Durability::NotDurable {
            setting: "innodb_flush_log_at_trx_commit",
            value: "2".to_owned()
        }
    );
}
