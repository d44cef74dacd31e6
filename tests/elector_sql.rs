//! The elector on real databases: SQLite (file), PostgreSQL and MariaDB.

mod common;

#[cfg(feature = "sqlite")]
mod sqlite {
    use crate::common::sql::SqlHarness;
    use crate::election_suite;
    election_suite!(SqlHarness::sqlite());
}

#[cfg(feature = "postgres")]
mod postgres {
    use crate::common::sql::SqlHarness;
    use crate::common::Server;
    use crate::election_suite;
    election_suite!(SqlHarness::server(Server::Postgres));
}

#[cfg(feature = "mysql")]
mod mariadb {
    use crate::common::sql::SqlHarness;
    use crate::common::Server;
    use crate::election_suite;
    election_suite!(SqlHarness::server(Server::MySql));
}
