//! The one place a backend is chosen, from the connection and the settings, and its engine
//! assembled.

use super::*;

/// The backend of `settings`' connection in this build.
///
/// SQLite needs nothing of its driver beyond what SeaORM runs, so it works in every build;
/// PostgreSQL and MySQL need their driver's own connection type for the check that a grant
/// committed outside any transaction (see `sessions`), which only their cargo features compile
/// in. Without it they are refused when the store is made (reported by every call, and by
/// [`LeaseStore::validate`]), rather than run without that check.
pub(super) fn choose(settings: &Settings) -> Result<Box<dyn LeaseBackend>, Refused> {
    // SeaORM panics when asked the backend of a disconnected connection.
    if matches!(settings.db.inner, DatabaseConnectionType::Disconnected) {
        return Err(Refused::Disconnected);
    }
    let unsupported = |backend, feature| Refused::Unsupported { backend, feature };
    match settings.db.get_database_backend() {
        DbBackend::Sqlite => Ok(Box::new(
            crate::backend::sqlite::backend::SqliteBackend::new(settings.notifications),
        )),
        #[cfg(feature = "postgres")]
        DbBackend::Postgres => Ok(Box::new(crate::backend::postgres::backend::PgBackend::new(
            &settings.db,
            settings.transaction_pooling,
            settings.notifications,
            settings.lease_connections,
        ))),
        #[cfg(not(feature = "postgres"))]
        DbBackend::Postgres => Err(unsupported("PostgreSQL", "postgres")),
        #[cfg(feature = "mysql")]
        DbBackend::MySql => Ok(Box::new(crate::backend::mysql::backend::MySqlBackend::new(
            &settings.db,
            settings.mysql_upsert,
            settings.notifications,
            settings.lease_connections,
        ))),
        #[cfg(not(feature = "mysql"))]
        DbBackend::MySql => Err(unsupported("MySQL", "mysql")),
        #[allow(unreachable_patterns)]
        _ => Err(unsupported("unknown", "the matching backend")),
    }
}

pub(super) fn engine(settings: &Settings) -> Result<Arc<Engine>, Refused> {
    Ok(assemble(settings, choose(settings)?, None))
}

/// The engine of `backend` for `settings`; what the store looked at once (durability) and its
/// takeover gate carried over from `old`, the engine a builder call derives from.
pub(super) fn assemble(
    settings: &Settings,
    backend: Box<dyn LeaseBackend>,
    old: Option<&Engine>,
) -> Arc<Engine> {
    let mut cx = Context::new(
        settings.db.clone(),
        Arc::clone(&settings.table),
        Arc::clone(&settings.member_table),
        backend.dialect(),
        backend.db_backend(),
        backend.classifier(),
        old.map(|e| Arc::clone(&e.cx.durability_checked))
            .unwrap_or_default(),
    );
    cx.rate_table = Arc::clone(&settings.rate_table);
    let sessions = backend.own_sessions();
    let attempts = match old {
        Some(old) if old.backend.own_sessions() == sessions => old.attempts.clone(),
        _ => (sessions >= 2).then(|| Arc::new(crate::backend::engine::Attempts::new(sessions - 1))),
    };
    let wakeups = backend.wakeups();
    Arc::new(Engine {
        cx,
        backend,
        wakeups,
        takeovers: old.map(|e| Arc::clone(&e.takeovers)).unwrap_or_default(),
        renewer: Default::default(),
        attempts,
        held: old.map(|e| Arc::clone(&e.held)).unwrap_or_default(),
    })
}
