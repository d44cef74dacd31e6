//! The elector on real databases: SQLite (file), PostgreSQL and MariaDB.

#[cfg(feature = "sqlite")]
mod sqlite {
    use crate::common::sql::SqlHarness;
    election_suite!(SqlHarness::sqlite());
}

#[cfg(feature = "postgres")]
mod postgres {
    use crate::common::sql::SqlHarness;
    use crate::common::Server;
    election_suite!(SqlHarness::server(Server::Postgres));

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_fenced_transaction_holds_up_no_other_leader() {
        use crate::common::conformance::Harness as _;
        if let Some(h) = SqlHarness::server(Server::Postgres).await {
            crate::common::election::a_long_fenced_transaction_holds_up_no_other_leader(&h).await;
            h.teardown().await;
        }
    }
}

/// PostgreSQL through a transaction-pooling PgBouncer.
#[cfg(feature = "postgres")]
mod postgres_through_pgbouncer {
    use crate::common::sql::SqlHarness;
    election_suite!(SqlHarness::pgbouncer());
}

#[cfg(feature = "mysql")]
mod mariadb {
    use crate::common::sql::SqlHarness;
    use crate::common::Server;
    election_suite!(SqlHarness::server(Server::MySql));
}
