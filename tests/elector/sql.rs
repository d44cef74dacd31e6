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
