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
//! (its commit fails), and nothing it would have written may commit any more. PostgreSQL
//! targets only sessions marked by a fence of exactly the lapsed term; MariaDB, the
//! transaction that holds the lapsed row against a waiting statement, unless it is running a
//! lease statement or a commit.
//!
//! - **PostgreSQL**: the fence also takes a shared transaction-level advisory lock keyed by a
//!   64-bit hash of (table, resource, token), which `pg_locks` shows with its session;
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

/// How long an acquire waits before it looks for a lapsed holder's session (a fifth of the
/// lease when that is shorter, so a short lease's grant is not spent waiting).
pub(crate) const WAIT_BEFORE_TAKEOVER: Duration = Duration::from_millis(200);

/// MySQL/MariaDB: how long a blocking transaction's client must have been silent to be ended.
const SILENT_MS: i64 = 200;

/// How often it looks again while it still waits (a fifth of the lease when that is shorter).
pub(crate) const TAKEOVER_EVERY: Duration = Duration::from_millis(250);

/// The two waits for a lease of `lease`: each at most a fifth of it, and at least 10 ms.
fn takeover_waits(lease: Duration) -> (Duration, Duration) {
    let fifth = (lease / 5).max(Duration::from_millis(10));
    (WAIT_BEFORE_TAKEOVER.min(fifth), TAKEOVER_EVERY.min(fifth))
}

/// The advisory-lock key a fence on PostgreSQL marks its session with: FNV-1a (64 bits) over
/// the table, the resource and the token, so one key names one term of one resource.
pub(crate) fn marker_key(table: &str, resource: &str, token: i64) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = table
        .bytes()
        .chain([0])
        .chain(resource.bytes())
        .chain([0])
        .chain(token.to_le_bytes());
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash as i64
}

/// PostgreSQL: `pg_try_advisory_xact_lock_shared(key)`: the marker a fence leaves on its
/// session until its transaction ends (true unless someone holds the key exclusively, which
/// nothing does; the fence never depends on the answer).
pub(crate) fn postgres_marker(table: &str, resource: &str, token: i64) -> Expr {
    Func::cust(Alias::new("pg_try_advisory_xact_lock_shared"))
        .arg(marker_key(table, resource, token))
        .into()
}

/// PostgreSQL: the token of `resource`'s row if its lease has lapsed by the database clock.
pub(crate) fn postgres_lapsed(d: &dyn Dialect, table: &Alias, resource: &str) -> SelectStatement {
    Query::select()
        .column(Column::FencingToken)
        .from(table.clone())
        .and_where(Expr::col(Column::Resource).eq(resource))
        .and_where(Expr::col(Column::ExpiresAt).lte(d.now()))
        .to_owned()
}

/// PostgreSQL: ends the sessions that hold the marker of `resource`'s term `token`, if the row
/// is still that term, lapsed by the database clock; one row per session signalled.
pub(crate) fn postgres_takeover(
    d: &dyn Dialect,
    table: &Alias,
    table_name: &str,
    resource: &str,
    token: i64,
) -> SelectStatement {
    let l = Alias::new("l");
    let col = |c: &str| Expr::col((l.clone(), Alias::new(c)));
    // pg_locks shows a bigint key as its high (classid) and low (objid) 32 bits, objsubid 1.
    let key = marker_key(table_name, resource, token) as u64;
    let (high, low) = ((key >> 32) as i64, (key & 0xffff_ffff) as i64);
    Query::select()
        .expr(Func::cust(Alias::new("pg_terminate_backend")).arg(col("pid")))
        .from_as(Alias::new("pg_locks"), l.clone())
        .and_where(col("locktype").eq("advisory"))
        .and_where(col("mode").eq("ShareLock"))
        .and_where(col("granted").eq(true))
        .and_where(col("objsubid").eq(1))
        .and_where(col("classid").cast_as(Alias::new("bigint")).eq(high))
        .and_where(col("objid").cast_as(Alias::new("bigint")).eq(low))
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
        .and_where(Expr::exists(
            postgres_lapsed(d, table, resource)
                .and_where(Expr::col(Column::FencingToken).eq(token))
                .take(),
        ))
        .to_owned()
}

/// A string key as InnoDB prints it in `lock_data`: quoted, with `'` and `\` doubled.
fn innodb_key(resource: &str) -> String {
    format!("'{}'", resource.replace('\\', "\\\\").replace('\'', "''"))
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
    let (w, l, t, r, w2, p) = (
        Alias::new("w"),
        Alias::new("l"),
        Alias::new("t"),
        Alias::new("r"),
        Alias::new("w2"),
        Alias::new("p"),
    );
    let c = |a: &Alias, c: &str| Expr::col((a.clone(), Alias::new(c)));
    let lease_statement = format!("%`{table_name}`%");
    Query::select()
        .distinct()
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
        // The thread's state now (the INNODB_* tables are a snapshot up to 0.1 s old).
        .join_as(
            JoinType::InnerJoin,
            is("PROCESSLIST"),
            p.clone(),
            c(&p, "ID").equals((t.clone(), Alias::new("trx_mysql_thread_id"))),
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
        // As InnoDB prints the key (quotes doubled), compared byte for byte (information_schema
        // compares case-insensitively).
        .and_where(
            c(&l, "lock_data")
                .cast_as(Alias::new("BINARY"))
                .eq(Expr::val(innodb_key(resource)).cast_as(Alias::new("BINARY"))),
        )
        // A read-only transaction shows id 0, and so does every other: never a target.
        .and_where(c(&w, "blocking_trx_id").ne(0))
        .and_where(c(&t, "trx_mysql_thread_id").ne(Func::cust(Alias::new("CONNECTION_ID"))))
        .and_where(c(&t, "trx_mysql_thread_id").ne(0))
        // A transaction whose client has sent nothing for 200 ms (stopped, cut off), or that
        // runs a statement of the application's: never a statement naming the lease table (a
        // grant, renew or release holding the row for a moment), a commit, or a transaction
        // of the store's between its statements.
        .and_where(
            c(&p, "COMMAND")
                .eq("Sleep")
                .and(c(&p, "TIME_MS").gte(SILENT_MS))
                .or(c(&p, "COMMAND")
                    .ne("Sleep")
                    .and(c(&p, "INFO").not_like(lease_statement))
                    .and(c(&p, "INFO").not_like("COMMIT%"))),
        )
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
        lease: Duration,
        acquire: F,
    ) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = Result<T, StoreError>>,
    {
        tokio::pin!(acquire);
        let (first, every) = takeover_waits(lease);
        let mut wait = first;
        let mut given_up = false;
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
                        // Not again in this call: a refusal would only repeat.
                        given_up = true;
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
            if given_up {
                return acquire.await;
            }
            wait = every;
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
                let lapsed = form.backend().build(&postgres_lapsed(d, &table, resource));
                let Some(row) = self.plain(lapsed).await?.into_iter().next() else {
                    return Ok(0); // live, or gone: nobody to end
                };
                let token: i64 = row
                    .try_get_by_index(0)
                    .map_err(|source| self.decode_error(source))?;
                let stmt = form.backend().build(&postgres_takeover(
                    d,
                    &table,
                    self.table(),
                    resource,
                    token,
                ));
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
                    // Gone already (unknown thread id) is what we wanted; a refusal of a
                    // thread that is still there is reported.
                    match self.counted(kill).await {
                        Ok(_) => ended += 1,
                        Err(e) => {
                            let still = form.backend().build(
                                &Query::select()
                                    .expr(Expr::val(1))
                                    .from((
                                        Alias::new("information_schema"),
                                        Alias::new("PROCESSLIST"),
                                    ))
                                    .and_where(Expr::col(Alias::new("ID")).eq(id))
                                    .to_owned(),
                            );
                            if !self.plain(still).await?.is_empty() {
                                return Err(e);
                            }
                        }
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
    #[test]
    fn short_leases_wait_a_fifth_of_the_lease() {
        use super::takeover_waits;
        use std::time::Duration;
        let ms = Duration::from_millis;
        assert_eq!(takeover_waits(Duration::from_secs(15)), (ms(200), ms(250)));
        assert_eq!(takeover_waits(ms(1_000)), (ms(200), ms(200)));
        assert_eq!(takeover_waits(ms(500)), (ms(100), ms(100)));
        assert_eq!(takeover_waits(ms(20)), (ms(10), ms(10)));
    }

    use super::*;
    use crate::backend::{mysql::MySql, postgres::Postgres};
    use sea_orm::sea_query::{MysqlQueryBuilder, PostgresQueryBuilder};

    #[test]
    fn the_marker_key_names_one_term_of_one_resource() {
        let t = "orionbeacon_leases";
        assert_eq!(marker_key(t, "r", 7), marker_key(t, "r", 7));
        assert_ne!(marker_key(t, "r", 7), marker_key(t, "s", 7));
        assert_ne!(marker_key(t, "r", 7), marker_key(t, "r", 8));
        assert_ne!(marker_key(t, "r", 7), marker_key("other", "r", 7));
        assert_ne!(marker_key("a", "bc", 1), marker_key("ab", "c", 1));
    }

    #[test]
    fn keys_are_quoted_as_innodb_prints_them() {
        assert_eq!(innodb_key("r"), "'r'");
        assert_eq!(innodb_key("it's"), "'it''s'");
        assert_eq!(innodb_key(r"a\b"), r"'a\\b'");
    }

    #[test]
    fn takeover_sql_per_backend() {
        let t = Alias::new("orionbeacon_leases");
        let (sql, values) = postgres_takeover(&Postgres, &t, "orionbeacon_leases", "r", 7)
            .build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"SELECT pg_terminate_backend("l"."pid") FROM "pg_locks" AS "l" WHERE "l"."locktype" = $1 AND "l"."mode" = $2 AND "l"."granted" = $3 AND "l"."objsubid" = $4 AND CAST("l"."classid" AS bigint) = $5 AND CAST("l"."objid" AS bigint) = $6 AND "l"."database" = (SELECT "oid" FROM "pg_database" WHERE "datname" = current_database()) AND "l"."pid" <> pg_backend_pid() AND EXISTS(SELECT "fencing_token" FROM "orionbeacon_leases" WHERE "resource" = $7 AND "expires_at" <= (statement_timestamp()) AND "fencing_token" = $8)"#
        );
        assert_eq!(values.0.len(), 8);
        let (sql, _) = postgres_lapsed(&Postgres, &t, "r").build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"SELECT "fencing_token" FROM "orionbeacon_leases" WHERE "resource" = $1 AND "expires_at" <= (statement_timestamp())"#
        );
        let (sql, values) =
            mysql_blockers(&MySql, &t, "orionbeacon_leases", "r").build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            "SELECT DISTINCT `t`.`trx_mysql_thread_id` FROM `information_schema`.`INNODB_LOCK_WAITS` AS `w` INNER JOIN `information_schema`.`INNODB_LOCKS` AS `l` ON `l`.`lock_id` = `w`.`requested_lock_id` INNER JOIN `information_schema`.`INNODB_TRX` AS `t` ON `t`.`trx_id` = `w`.`blocking_trx_id` INNER JOIN `information_schema`.`PROCESSLIST` AS `p` ON `p`.`ID` = `t`.`trx_mysql_thread_id` INNER JOIN `orionbeacon_leases` AS `r` ON `r`.`resource` = ? WHERE `r`.`expires_at` <= (UTC_TIMESTAMP(6)) AND `l`.`lock_table` = CONCAT(?, DATABASE(), ?, ?, ?) AND `l`.`lock_index` = ? AND CAST(`l`.`lock_data` AS BINARY) = CAST(? AS BINARY) AND `w`.`blocking_trx_id` <> ? AND `t`.`trx_mysql_thread_id` <> CONNECTION_ID() AND `t`.`trx_mysql_thread_id` <> ? AND ((`p`.`COMMAND` = ? AND `p`.`TIME_MS` >= ?) OR (`p`.`COMMAND` <> ? AND `p`.`INFO` NOT LIKE ? AND `p`.`INFO` NOT LIKE ?)) AND (NOT EXISTS(SELECT ? FROM `information_schema`.`INNODB_LOCK_WAITS` AS `w2` WHERE `w2`.`requested_lock_id` = `w`.`blocking_lock_id`))"
        );
        assert_eq!(values.0.len(), 15);
    }
}
