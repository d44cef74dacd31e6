//! Takeover past a stalled holder: a candidate whose acquire waits for the lease row's lock
//! ends the database session of a term that has lapsed by the database clock but still holds
//! the row locked inside a fenced transaction (its process stopped, cut off, or stuck in a long
//! statement).
//!
//! The fence locks the lease row so that no rival can take over while a fenced transaction is
//! open. A holder that stops inside one would hold the lock, and so the resource, for as long as
//! it is stopped (a partition: until the server notices the client is gone, hours with the
//! defaults). So an acquire that has waited [`WAIT_BEFORE_TAKEOVER`] asks the server, on
//! another connection of the pool, to end every session that holds the row for a term whose
//! lease has lapsed, and asks again every [`TAKEOVER_EVERY`] while it waits. Ending such a
//! session is always safe: its term is over by the database clock, its transaction rolls back
//! (its commit fails), and nothing it would have written may commit any more. A live term's
//! session is never a target: the statement names only the term of the row as it is, lapsed.
//!
//! - **PostgreSQL**: the fence also takes a shared transaction-level advisory lock keyed by
//!   (table and resource, low 32 bits of the token), which `pg_locks` shows with its session;
//!   `pg_terminate_backend` ends the sessions that hold the key of the lapsed row's term. That
//!   needs the same role as the holder, or membership of `pg_signal_backend`.
//! - **MySQL/MariaDB**: the fence locks the row `FOR UPDATE`, so its transaction has an id;
//!   `information_schema.INNODB_LOCK_WAITS` names the transaction that blocks a wait on the
//!   lapsed row, and `KILL CONNECTION` ends it. That needs the `PROCESS` privilege, and
//!   `CONNECTION ADMIN` (or `SUPER`) for a holder connected as another user. MySQL 8, which
//!   has no `INNODB_LOCK_WAITS`, gets no takeover (a warning says so).
//!
//! Without the privileges a warning says what is missing, and the takeover waits for the
//! server to end the session itself (`idle_in_transaction_session_timeout`, `wait_timeout`,
//! TCP keepalives).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use orion_beacon_entity::lease::Column;
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Func, JoinType, Query, SelectStatement};

use super::Dialect;
use crate::{SeaOrmLeaseStore, StoreError};

/// How long an acquire waits before it looks for a lapsed holder's session.
pub(crate) const WAIT_BEFORE_TAKEOVER: Duration = Duration::from_millis(200);

/// How often it looks again while it still waits.
pub(crate) const TAKEOVER_EVERY: Duration = Duration::from_millis(250);

/// The first advisory-lock key of a fence on PostgreSQL: FNV-1a over the table and resource
/// names (a collision only lets a takeover end a session of another lapsed term).
pub(crate) fn marker_key(table: &str, resource: &str) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in table.bytes().chain([0]).chain(resource.bytes()) {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

/// The second key: the token's low 32 bits.
fn token_key(token: i64) -> u32 {
    (token as u64 & 0xffff_ffff) as u32
}

/// PostgreSQL: `pg_try_advisory_xact_lock_shared(key, token key)`, always true (nobody takes
/// the key exclusively): the marker a fence leaves on its session until its transaction ends.
pub(crate) fn postgres_marker(table: &str, resource: &str, token: i64) -> Expr {
    // Bound as int4: the keys' bits, as pg_locks shows them (as oid) again.
    let key = marker_key(table, resource) as i32;
    let token = token_key(token) as i32;
    Func::cust(Alias::new("pg_try_advisory_xact_lock_shared"))
        .arg(key)
        .arg(token)
        .into()
}

/// PostgreSQL: ends the sessions that hold the marker of `resource`'s term, if that term has
/// lapsed by the database clock; one row per session signalled.
pub(crate) fn postgres_takeover(
    d: &dyn Dialect,
    table: &Alias,
    table_name: &str,
    resource: &str,
) -> SelectStatement {
    let l = Alias::new("l");
    let r = Alias::new("r");
    let col = |c: &str| Expr::col((l.clone(), Alias::new(c)));
    let key = i64::from(marker_key(table_name, resource));
    Query::select()
        .expr(Func::cust(Alias::new("pg_terminate_backend")).arg(col("pid")))
        .from_as(Alias::new("pg_locks"), l.clone())
        .join_as(
            JoinType::InnerJoin,
            table.clone(),
            r.clone(),
            Expr::col((r.clone(), Column::Resource)).eq(resource),
        )
        .and_where(Expr::col((r.clone(), Column::ExpiresAt)).lte(d.now()))
        .and_where(col("locktype").eq("advisory"))
        .and_where(col("granted").eq(true))
        .and_where(col("objsubid").eq(2))
        .and_where(col("classid").cast_as(Alias::new("bigint")).eq(key))
        .and_where(
            col("objid").cast_as(Alias::new("bigint")).eq(Expr::col((
                r.clone(),
                Column::FencingToken,
            ))
            .bit_and(0xffff_ffff_i64)),
        )
        .and_where(
            col("database").eq(Query::select()
                .column(Alias::new("oid"))
                .from(Alias::new("pg_database"))
                .and_where(
                    Expr::col(Alias::new("datname")).eq(Func::cust(Alias::new("current_database"))),
                )
                .take()),
        )
        .and_where(col("pid").ne(Func::cust(Alias::new("pg_backend_pid"))))
        .to_owned()
}

/// MySQL/MariaDB: the connections whose transactions hold `resource`'s row locked while
/// another waits for it, if its term has lapsed by the database clock.
pub(crate) fn mysql_blockers(
    d: &dyn Dialect,
    table: &Alias,
    table_name: &str,
    resource: &str,
) -> SelectStatement {
    let is = |t: &str| (Alias::new("information_schema"), Alias::new(t));
    let (w, l, t, r, w2) = (
        Alias::new("w"),
        Alias::new("l"),
        Alias::new("t"),
        Alias::new("r"),
        Alias::new("w2"),
    );
    let c = |a: &Alias, c: &str| Expr::col((a.clone(), Alias::new(c)));
    Query::select()
        .expr(c(&t, "trx_mysql_thread_id"))
        .from_as(is("INNODB_LOCK_WAITS"), w.clone())
        .join_as(
            JoinType::InnerJoin,
            is("INNODB_LOCKS"),
            l.clone(),
            c(&l, "lock_id").equals((w.clone(), Alias::new("requested_lock_id"))),
        )
        .join_as(
            JoinType::InnerJoin,
            is("INNODB_TRX"),
            t.clone(),
            c(&t, "trx_id").equals((w.clone(), Alias::new("blocking_trx_id"))),
        )
        .join_as(
            JoinType::InnerJoin,
            table.clone(),
            r.clone(),
            Expr::col((r.clone(), Column::Resource)).eq(resource),
        )
        .and_where(Expr::col((r.clone(), Column::ExpiresAt)).lte(d.now()))
        .and_where(
            c(&l, "lock_table").eq(Func::cust(Alias::new("CONCAT")).args([
                Expr::val("`"),
                Func::cust(Alias::new("DATABASE")).into(),
                Expr::val("`.`"),
                Expr::val(table_name),
                Expr::val("`"),
            ])),
        )
        .and_where(c(&l, "lock_index").eq("PRIMARY"))
        .and_where(c(&l, "lock_data").eq(Func::cust(Alias::new("QUOTE")).arg(resource)))
        // A read-only transaction shows id 0, and so does every other: never a target.
        .and_where(c(&w, "blocking_trx_id").ne(0))
        .and_where(c(&t, "trx_mysql_thread_id").ne(Func::cust(Alias::new("CONNECTION_ID"))))
        // A transaction queued before ours is reported as blocking it too: only the holder.
        .and_where(
            Expr::exists(
                Query::select()
                    .expr(Expr::val(1))
                    .from_as(is("INNODB_LOCK_WAITS"), w2.clone())
                    .and_where(
                        c(&w2, "requested_lock_id")
                            .equals((w.clone(), Alias::new("blocking_lock_id"))),
                    )
                    .take(),
            )
            .not(),
        )
        .to_owned()
}

/// Warns once per process that takeover cannot end a stalled holder's session.
static REFUSED: AtomicBool = AtomicBool::new(false);

impl SeaOrmLeaseStore {
    /// Runs `acquire` (an acquire-or-renew of `resource`); while it waits, ends the session of a
    /// lapsed term that holds the row (see the module docs).
    pub(crate) async fn taking_over<T, F>(
        &self,
        resource: &str,
        acquire: F,
    ) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = Result<T, StoreError>>,
    {
        tokio::pin!(acquire);
        let mut wait = WAIT_BEFORE_TAKEOVER;
        loop {
            tokio::select! {
                biased;
                out = &mut acquire => return out,
                () = tokio::time::sleep(wait) => {}
            }
            let takeover = self.end_lapsed_holders(resource);
            tokio::pin!(takeover);
            tokio::select! {
                biased;
                out = &mut acquire => return out,
                ended = &mut takeover => match ended {
                    Ok(0) => {}
                    Ok(n) => tracing::warn!(
                        table = %self.table(),
                        resource,
                        sessions = n,
                        "ended the database session of a lapsed term that held the lease row \
                         locked (a holder stopped, cut off or stuck inside a fenced transaction); \
                         its transaction rolls back"
                    ),
                    Err(error) => {
                        if !REFUSED.swap(true, Ordering::Relaxed) {
                            tracing::warn!(
                                table = %self.table(),
                                resource,
                                %error,
                                "could not look for or end a lapsed holder's session; a holder \
                                 stalled inside a fenced transaction then holds the lease until \
                                 the server ends its session (PostgreSQL: the same role or \
                                 pg_signal_backend; MariaDB: the PROCESS privilege, and \
                                 CONNECTION ADMIN for other users' sessions)"
                            );
                        } else {
                            tracing::debug!(table = %self.table(), resource, %error, "takeover failed");
                        }
                    }
                },
            }
            wait = TAKEOVER_EVERY;
        }
    }

    /// Ends the sessions that hold `resource`'s row for a lapsed term; how many.
    async fn end_lapsed_holders(&self, resource: &str) -> Result<u64, StoreError> {
        let form = self.form()?;
        let d = form.dialect();
        let table = self.table_iden();
        match form {
            #[cfg(feature = "postgres")]
            super::Form::Postgres => {
                let stmt =
                    form.backend()
                        .build(&postgres_takeover(d, &table, self.table(), resource));
                Ok(self.plain(stmt).await?.len() as u64)
            }
            #[cfg(feature = "mysql")]
            super::Form::MySql => {
                let stmt = form
                    .backend()
                    .build(&mysql_blockers(d, &table, self.table(), resource));
                let mut ended = 0;
                for row in self.plain(stmt).await? {
                    let id: u64 = row
                        .try_get_by_index(0)
                        .map_err(|source| self.decode_error(source))?;
                    // An id the server just gave us, as a number: no quoting to get wrong.
                    let kill = sea_orm::Statement::from_string(
                        form.backend(),
                        format!("KILL CONNECTION {id}"),
                    );
                    match self.counted(kill).await {
                        Ok(_) => ended += 1,
                        // Gone already (1094: unknown thread id): what we wanted.
                        Err(e) if e.to_string().contains("1094") => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(ended)
            }
            #[allow(unreachable_patterns)]
            _ => Ok(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{mysql::MySql, postgres::Postgres};
    use sea_orm::sea_query::{MysqlQueryBuilder, PostgresQueryBuilder};

    #[test]
    fn the_marker_key_is_stable_and_tells_tables_and_resources_apart() {
        assert_eq!(
            marker_key("orionbeacon_leases", "r"),
            marker_key("orionbeacon_leases", "r")
        );
        assert_ne!(
            marker_key("orionbeacon_leases", "r"),
            marker_key("orionbeacon_leases", "s")
        );
        assert_ne!(marker_key("a", "bc"), marker_key("ab", "c"));
        assert_eq!(token_key(7), 7);
        assert_eq!(token_key((1 << 32) + 7), 7);
        assert_eq!(token_key(i64::MAX), u32::MAX);
    }

    #[test]
    fn takeover_sql_per_backend() {
        let t = Alias::new("orionbeacon_leases");
        let (sql, values) =
            postgres_takeover(&Postgres, &t, "orionbeacon_leases", "r").build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"SELECT pg_terminate_backend("l"."pid") FROM "pg_locks" AS "l" INNER JOIN "orionbeacon_leases" AS "r" ON "r"."resource" = $1 WHERE "r"."expires_at" <= (statement_timestamp()) AND "l"."locktype" = $2 AND "l"."granted" = $3 AND "l"."objsubid" = $4 AND CAST("l"."classid" AS bigint) = $5 AND CAST("l"."objid" AS bigint) = ("r"."fencing_token" & $6) AND "l"."database" = (SELECT "oid" FROM "pg_database" WHERE "datname" = current_database()) AND "l"."pid" <> pg_backend_pid()"#
        );
        assert_eq!(values.0.len(), 6);
        let (sql, values) =
            mysql_blockers(&MySql, &t, "orionbeacon_leases", "r").build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            "SELECT `t`.`trx_mysql_thread_id` FROM `information_schema`.`INNODB_LOCK_WAITS` AS `w` INNER JOIN `information_schema`.`INNODB_LOCKS` AS `l` ON `l`.`lock_id` = `w`.`requested_lock_id` INNER JOIN `information_schema`.`INNODB_TRX` AS `t` ON `t`.`trx_id` = `w`.`blocking_trx_id` INNER JOIN `orionbeacon_leases` AS `r` ON `r`.`resource` = ? WHERE `r`.`expires_at` <= (UTC_TIMESTAMP(6)) AND `l`.`lock_table` = CONCAT(?, DATABASE(), ?, ?, ?) AND `l`.`lock_index` = ? AND `l`.`lock_data` = QUOTE(?) AND `w`.`blocking_trx_id` <> ? AND `t`.`trx_mysql_thread_id` <> CONNECTION_ID() AND (NOT EXISTS(SELECT ? FROM `information_schema`.`INNODB_LOCK_WAITS` AS `w2` WHERE `w2`.`requested_lock_id` = `w`.`blocking_lock_id`))"
        );
        assert_eq!(values.0.len(), 9);
    }
}
