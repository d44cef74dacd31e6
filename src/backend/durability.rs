//! Whether the server makes a commit durable before it answers.
//!
//! A grant is a commit: a server that acknowledges commits before they are on disk
//! (PostgreSQL `fsync = off` or `synchronous_commit = off`, MariaDB/MySQL `innodb_flush_log_at_trx_commit` other than 1, SQLite
//! `PRAGMA synchronous = OFF`) can lose a reported grant in a crash, and then issue its token
//! again to another term. The store looks once, at its first grant, and warns; a
//! program can also ask with [`SeaOrmLeaseStore::durability`]. See docs/topologies.md, next to
//! the asynchronous-replica caveat.

use sea_orm::Statement;

use super::store::SeaOrmLeaseStore;
use crate::error::StoreError;

/// What the server's settings say about the durability of a commit, as this session sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Durability {
    /// A commit is on disk when the server acknowledges it.
    Durable,
    /// A server setting lets an acknowledged commit vanish in a crash: a reported grant can be
    /// lost and its fencing token issued again.
    NotDurable {
        /// The setting.
        setting: &'static str,
        /// Its value.
        value: String,
    },
}

impl SeaOrmLeaseStore {
    /// Reads the server settings that decide whether a commit is durable (one read, on a
    /// pooled connection; PostgreSQL `fsync` and `synchronous_commit`, MySQL/MariaDB
    /// `innodb_flush_log_at_trx_commit`, SQLite `PRAGMA synchronous`). The store does this
    /// once by itself, at its first grant, and logs a warning if a commit is not durable.
    pub async fn durability(&self) -> Result<Durability, StoreError> {
        let engine = self.engine()?;
        let (sql, settings) = engine.backend.durability_question();
        // On a checked connection, like every statement of ours: a session left inside an
        // abandoned transaction is closed, not read from.
        let stmt = Statement::from_string(engine.cx.db_backend, sql);
        let rows = engine.plain(stmt).await?;
        let Some(row) = rows.first() else {
            return Ok(Durability::Durable);
        };
        for (i, setting) in settings.iter().enumerate() {
            let value: String = row
                .try_get_by_index(i)
                .map_err(|e| engine.cx.decode_error(e))?;
            if !durable(setting, &value) {
                return Ok(Durability::NotDurable { setting, value });
            }
        }
        Ok(Durability::Durable)
    }

    /// The look [`durability`](Self::durability) makes, once per store, as a warning.
    pub(crate) async fn warn_once_if_not_durable(&self) {
        let Ok(engine) = self.engine() else {
            return;
        };
        engine
            .cx
            .durability_checked
            .get_or_init(|| async {
                match self.durability().await {
                    Ok(Durability::Durable) => {}
                    Ok(Durability::NotDurable { setting, value }) => tracing::warn!(
                        setting,
                        %value,
                        table = self.table(),
                        "the lease database does not make commits durable: a grant reported \
                         before a crash can be lost and its fencing token issued again"
                    ),
                    Err(error) => {
                        tracing::debug!(%error, "could not read the server's durability settings")
                    }
                }
            })
            .await;
    }
}

/// Whether `value` of `setting` makes an acknowledged commit durable.
fn durable(setting: &str, value: &str) -> bool {
    let value = value.trim().to_ascii_lowercase();
    match setting {
        "fsync" => value == "on",
        // Only `off` acknowledges before the local WAL flush; `local`, `on`, `remote_write`
        // and `remote_apply` wait for it (standbys are the replication caveat's matter).
        "synchronous_commit" => value != "off",
        "innodb_flush_log_at_trx_commit" => value == "1",
        // 0 = OFF; NORMAL (1) in WAL mode can lose the last commits on power loss, not on a
        // process crash: only OFF is reported.
        "synchronous" => value != "0",
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::durable;

    #[test]
    fn settings_that_lose_acknowledged_commits() {
        assert!(durable("fsync", "on"));
        assert!(!durable("fsync", "off"));
        for v in ["on", "remote_write", "remote_apply", "local"] {
            assert!(durable("synchronous_commit", v), "{v}");
        }
        for v in ["off", "OFF"] {
            assert!(!durable("synchronous_commit", v), "{v}");
        }
        assert!(durable("innodb_flush_log_at_trx_commit", "1"));
        assert!(!durable("innodb_flush_log_at_trx_commit", "0"));
        assert!(!durable("innodb_flush_log_at_trx_commit", "2"));
        assert!(!durable("synchronous", "0"));
        assert!(durable("synchronous", "1"));
        assert!(durable("synchronous", "2"));
    }
}
