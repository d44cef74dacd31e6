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

pub(crate) use super::{MIN_WAIT_BEFORE_TAKEOVER, WAIT_BEFORE_TAKEOVER};

/// MySQL/MariaDB: how long a blocking transaction's client must have been silent to be ended.
const SILENT_MS: i64 = 200;

/// MySQL/MariaDB: how soon after the look that found a blocking session the kill must go
/// out (the look and the kill are two statements).
#[cfg(feature = "mysql")]
const KILL_WITHIN: Duration = Duration::from_millis(100);

/// How often it looks again while it still waits (a fifth of the lease when that is shorter).
pub(crate) const TAKEOVER_EVERY: Duration = Duration::from_millis(250);

/// The two waits for a lease of `lease`: each at most a fifth of it, and at least 10 ms.
fn takeover_waits(lease: Duration) -> (Duration, Duration) {
    let fifth = (lease / 5).max(MIN_WAIT_BEFORE_TAKEOVER);
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

/// Says what a takeover did; `true` when the server refused it (no privilege, no lock tables):
/// not worth asking again soon. Any other failure (a timeout, a lost connection) is asked again.
fn report(table: &str, resource: &str, ended: Result<u64, StoreError>) -> bool {
    match ended {
        Ok(0) => false,
        Ok(n) => {
            tracing::warn!(
                table,
                resource,
                sessions = n,
                "ended the database session of a lapsed term that held the lease row \
                 locked (a holder stopped, cut off or stuck inside a fenced transaction); \
                 its transaction rolls back"
            );
            false
        }
        Err(error) if refused(&error) => {
            if !REFUSED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    table,
                    resource,
                    %error,
                    "could not look for or end a lapsed holder's session; a holder \
                     stalled inside a fenced transaction then holds the lease until \
                     the server ends its session (PostgreSQL: the same role or \
                     pg_signal_backend; MariaDB: the PROCESS privilege, and \
                     CONNECTION ADMIN for other users' sessions)"
                );
            } else {
                tracing::debug!(table, resource, %error, "takeover refused");
            }
            true
        }
        Err(error) => {
            tracing::debug!(table, resource, %error, "takeover failed; asking again later");
            false
        }
    }
}

/// Whether a takeover failed because the server will not do it for this role (PostgreSQL
/// `42501`; MariaDB: access denied, not the thread's owner, or MySQL 8's missing lock tables),
/// as opposed to a timeout or a lost connection.
fn refused(err: &StoreError) -> bool {
    database_error(err).is_some_and(refusal)
}

/// The database's own error inside `err`, if there is one.
fn database_error(err: &StoreError) -> Option<&sea_orm::DbErr> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        // `BackendError` is transparent: its `source()` skips the `DbErr` it holds.
        if let Some(crate::BackendError::SeaOrm(db)) = e.downcast_ref::<crate::BackendError>() {
            return Some(db);
        }
        if let Some(db) = e.downcast_ref::<sea_orm::DbErr>() {
            return Some(db);
        }
        source = e.source();
    }
    None
}

/// Whether the statement behind `err` gave up waiting for a lock (see
/// `autocommit::lock_wait_ran_out`).
fn lock_wait_timed_out(err: &StoreError) -> bool {
    use sea_orm::RuntimeErr;
    matches!(
        database_error(err),
        Some(
            sea_orm::DbErr::Exec(RuntimeErr::SqlxError(e))
                | sea_orm::DbErr::Query(RuntimeErr::SqlxError(e))
        ) if super::autocommit::lock_wait_ran_out(e)
    )
}

fn refusal(err: &sea_orm::DbErr) -> bool {
    #[cfg(feature = "mysql")]
    if let Some(number) = super::mysql::errors::error_number(err) {
        // access denied (1044, 1142, 1143, 1227), not the thread's owner (1095), unknown
        // information_schema table (1109: MySQL 8 has no INNODB_LOCK_WAITS)
        return matches!(number, 1044 | 1095 | 1109 | 1142 | 1143 | 1227);
    }
    use sea_orm::RuntimeErr;
    let (sea_orm::DbErr::Exec(RuntimeErr::SqlxError(e))
    | sea_orm::DbErr::Query(RuntimeErr::SqlxError(e))) = err
    else {
        return false;
    };
    // insufficient_privilege
    e.as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|code| code == "42501")
}

/// How long after the server refused a takeover (no privileges, MySQL 8) dropped acquires do
/// not ask again.
const REFUSED_BACKOFF: Duration = Duration::from_secs(30);

/// The takeovers dropped acquires asked for: at most one at a time per store (a shard set's
/// round gives up on many acquires at once when the database is slow, and a takeover per
/// resource would take the pool's connections from the batched renew), and none for a while
/// after the server refused one.
#[derive(Default)]
pub(crate) struct Gate(std::sync::Mutex<GateState>);

#[derive(Default)]
struct GateState {
    in_flight: Option<String>,
    refused_until: Option<tokio::time::Instant>,
}

impl Gate {
    fn state(&self) -> std::sync::MutexGuard<'_, GateState> {
        // Nothing in it can be left half-changed by a panic: use it as it is.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a takeover of `resource` may start now; if so, it is in flight until
    /// [`finish`](Self::finish).
    fn start(&self, resource: &str) -> bool {
        let mut st = self.state();
        if st
            .refused_until
            .is_some_and(|until| tokio::time::Instant::now() < until)
        {
            return false;
        }
        if st.in_flight.is_some() {
            return false;
        }
        st.in_flight = Some(resource.to_owned());
        true
    }

    /// Whether the server refused a takeover within the backoff.
    fn refused(&self) -> bool {
        self.state()
            .refused_until
            .is_some_and(|until| tokio::time::Instant::now() < until)
    }

    /// The server refused a takeover: none for the backoff.
    fn refuse(&self) {
        self.state().refused_until = Some(tokio::time::Instant::now() + REFUSED_BACKOFF);
    }

    fn finish(&self, resource: &str, failed: bool) {
        let mut st = self.state();
        if st.in_flight.as_deref() == Some(resource) {
            st.in_flight = None;
        }
        if failed {
            st.refused_until = Some(tokio::time::Instant::now() + REFUSED_BACKOFF);
        }
    }
}

/// Marks a dropped acquire's takeover finished when its task ends, however it ends (the
/// runtime shutting down drops it unfinished).
struct InFlight {
    store: SeaOrmLeaseStore,
    resource: String,
    failed: bool,
}

impl InFlight {
    /// Whether the server refused it (read when the marker goes).
    fn failed(&mut self, failed: bool) {
        self.failed = failed;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.store.takeovers.finish(&self.resource, self.failed);
    }
}

/// An acquire dropped by its caller before it was answered (a shard set's round bounds each
/// of its statements by its interval, which can be shorter than the takeover's first wait)
/// leaves its statement waiting on the server for the row lock. A lapsed holder stalled inside
/// a fenced transaction would then hold the resource for as long as it is stalled, whoever
/// asks: so the drop asks the server once, from a task of its own, to end such a holder's
/// session, as the acquire would have had it waited on. One such task per store at a time
/// (see [`Gate`]), each bounded by `limit`.
struct TakeoverOnDrop {
    /// The store and resource, until the acquire was answered.
    armed: Option<(SeaOrmLeaseStore, String)>,
    /// How long the task may take.
    limit: Duration,
}

impl Drop for TakeoverOnDrop {
    fn drop(&mut self) {
        let Some((store, resource)) = self.armed.take() else {
            return;
        };
        // Outside a runtime there is nobody to ask with (a runtime shutting down drops the
        // task unstarted).
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !store.takeovers.start(&resource) {
            return; // one is in flight, or they fail for now
        }
        let limit = self.limit;
        // Made before the task, so that a task dropped before it first runs (a runtime
        // shutting down) still marks the takeover finished.
        let mut guard = InFlight {
            store,
            resource,
            failed: false,
        };
        runtime.spawn(async move {
            let (store, resource) = (&guard.store, guard.resource.as_str());
            let failed = match tokio::time::timeout(limit, store.end_lapsed_holders(resource)).await
            {
                Ok(ended) => report(store.table(), resource, ended),
                Err(_) => {
                    tracing::debug!(
                        table = %store.table(),
                        resource,
                        "takeover after a dropped acquire got no answer in time"
                    );
                    false
                }
            };
            guard.failed(failed);
        });
    }
}

impl SeaOrmLeaseStore {
    /// Runs `acquire` (a new acquire-or-renew of `resource` for `candidate` each call) until it
    /// is answered. On PostgreSQL its statement (the bounded upsert, see
    /// `postgres::statements::bounded_upsert`) waits for each lock at most the takeover's first
    /// wait, then fails; the row was then held locked that long by another transaction: a
    /// lapsed term's stalled one (its session is ended and the acquire asked again at once), a
    /// live holder's fenced one (a denial that names it), or this candidate's own (asked again
    /// at once). A statement waits on the server at most two such
    /// waits, whatever the stall, so a caller that stops waiting leaves no statement behind for
    /// long that could grant it a lease later; the drop still asks for one takeover
    /// ([`TakeoverOnDrop`]).
    ///
    /// On MariaDB the upsert waits at most a second (its own `innodb_lock_wait_timeout`, whole
    /// seconds; not MySQL 8's transaction form, which waits the server's), and the takeover
    /// runs while it waits (after `first`, then every `every`); then the same.
    pub(crate) async fn acquiring<F, Fut>(
        &self,
        resource: &str,
        candidate: &str,
        lease: Duration,
        mut acquire: F,
    ) -> Result<crate::LeaseOutcome, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<crate::LeaseOutcome, StoreError>>,
    {
        use crate::LeaseStore;
        let (first, every) = takeover_waits(lease);
        let mut on_drop = TakeoverOnDrop {
            armed: Some((self.clone(), resource.to_owned())),
            limit: (lease / 2).clamp(Duration::from_millis(100), Duration::from_secs(1)),
        };
        // MariaDB finds a blocker only while a statement waits on it: the takeover runs then.
        let concurrent = self.takes_over_while_waiting();
        let out = loop {
            let started = tokio::time::Instant::now();
            let attempt = acquire();
            let answer = if concurrent {
                tokio::pin!(attempt);
                self.waiting(resource, first, every, &mut attempt).await
            } else {
                attempt.await
            };
            match answer {
                Err(err) if lock_wait_timed_out(&err) => {}
                out => break out,
            }
            if !concurrent && !self.takeovers.refused() {
                let ended = self.end_lapsed_holders(resource).await;
                let some = matches!(ended, Ok(n) if n > 0);
                if report(self.table(), resource, ended) {
                    self.takeovers.refuse();
                }
                if some {
                    continue; // its transaction rolled back: the row is free now
                }
            }
            // Nobody lapsed to end: a live holder's transaction, or this candidate's own (a
            // renew behind its own fenced transaction), or a lock no takeover ends. Asked again
            // at once: the statement's own lock wait paces the loop, and a renew is queued for
            // the row nearly all the time, as it would be if it waited on.
            match self.current(resource).await {
                Ok(Some(record)) if record.live && record.holder != candidate => {
                    break Ok(crate::LeaseOutcome::Denied(crate::Denial {
                        resource: resource.to_owned(),
                        holder: Some(record.holder),
                        token: Some(record.token),
                        remaining: record.remaining,
                        expires_at: record.expires_at,
                    }));
                }
                // At least the first wait between two statements (a short lease's lock wait
                // is short too).
                Ok(_) => tokio::time::sleep_until(started + first).await,
                Err(err) => break Err(err),
            }
        };
        on_drop.armed = None; // answered
        out
    }

    /// Whether this store's takeover looks for a blocker of a waiting statement (MySQL and
    /// MariaDB), rather than after the statement gave up (PostgreSQL).
    fn takes_over_while_waiting(&self) -> bool {
        #[cfg(feature = "mysql")]
        if matches!(self.form(), Ok(super::Form::MySql)) {
            return true;
        }
        false
    }

    /// Awaits `acquire`; after `first` and then every `every`, ends the sessions of lapsed
    /// terms that hold `resource`'s row.
    async fn waiting<T, F>(
        &self,
        resource: &str,
        first: Duration,
        every: Duration,
        acquire: &mut std::pin::Pin<&mut F>,
    ) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = Result<T, StoreError>>,
    {
        let mut wait = first;
        loop {
            tokio::select! {
                biased;
                out = &mut *acquire => return out,
                () = tokio::time::sleep(wait) => {}
            }
            if self.takeovers.refused() {
                return acquire.await; // refused a moment ago: not again in this call
            }
            let takeover = self.end_lapsed_holders(resource);
            tokio::pin!(takeover);
            let given_up = tokio::select! {
                biased;
                out = &mut *acquire => return out,
                ended = &mut takeover => report(self.table(), resource, ended),
            };
            if given_up {
                self.takeovers.refuse();
                // Not again in this call: a refusal would only repeat.
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
                let rows = self.plain(stmt).await?;
                let looked = tokio::time::Instant::now();
                for row in rows {
                    // The blocker was seen stalled at the look: a kill sent much later could
                    // find the connection back at work for a newer term. Look again instead.
                    if looked.elapsed() > KILL_WITHIN {
                        tracing::debug!(
                            resource,
                            "a lapsed holder's session was seen too long ago to end"
                        );
                        break;
                    }
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
                    // Waiting for a pool connection counts too: a kill not sent within the
                    // window is not sent.
                    let left = KILL_WITHIN.saturating_sub(looked.elapsed());
                    let Ok(killed) = tokio::time::timeout(left, self.counted(kill)).await else {
                        break;
                    };
                    match killed {
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
    fn a_refusal_is_found_through_every_error_wrapper() {
        // No database error code in a custom error: never a refusal, whichever wrapper.
        let custom = || sea_orm::DbErr::Custom("permission denied".into());
        for err in [
            StoreError::Database(custom().into()),
            StoreError::MissingTable {
                table: "t".into(),
                source: custom().into(),
            },
            StoreError::Conflict {
                source: custom().into(),
            },
        ] {
            assert!(!refused(&err), "{err}");
        }
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
