//! A holder stalled inside a fenced transaction (its process stopped, or stuck in a long
//! statement) never holds up the next term past the bound: once its lease has lapsed by the
//! database clock, the next candidate is granted within `BOUND`, and the stalled transaction
//! never commits. PostgreSQL (direct and through a transaction-pooling PgBouncer) and MariaDB.
//! (SQLite cannot: a stopped writer holds the file's write lock whatever we do; see the docs.)

mod common;

use std::time::Duration;

use orion_beacon::{FencingToken, LeaseOutcome, LeaseStore, SeaOrmLeaseStore, Term};
use sea_orm::sea_query::{Alias, ColumnDef, InsertStatement, Query, Table};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement, TransactionTrait};
use tokio::time::Instant;

use common::conformance::Harness;
use common::sql::SqlHarness;
use common::{unique, Server};

const LEASE: Duration = Duration::from_secs(1);
/// How long the holder stays stalled: eight leases.
const STALL: Duration = Duration::from_secs(8);
/// The documented bound from a lapse to the next grant, past a stalled holder.
const BOUND: Duration = Duration::from_secs(1);

/// How the holder stalls inside its fenced transaction.
#[derive(Clone, Copy, Debug)]
enum Stall {
    /// Sends nothing (a stopped process, a pause, a partition, as the server sees it).
    Idle,
    /// Runs one statement that takes `STALL`.
    LongStatement,
}

async fn app_table(db: &DatabaseConnection) -> String {
    let table = unique("app");
    db.execute(
        &Table::create()
            .table(Alias::new(&table))
            .col(ColumnDef::new(Alias::new("token")).big_integer().not_null())
            .to_owned(),
    )
    .await
    .unwrap();
    table
}

async fn rows(db: &DatabaseConnection, table: &str) -> usize {
    db.query_all(
        &Query::select()
            .column(Alias::new("token"))
            .from(Alias::new(table))
            .to_owned(),
    )
    .await
    .unwrap()
    .len()
}

/// The row a holder writes into the application's table inside its fenced transaction.
fn app_row(table: &str, token: FencingToken) -> InsertStatement {
    Query::insert()
        .into_table(Alias::new(table))
        .columns([Alias::new("token")])
        .values_panic([token.get().into()])
        .to_owned()
}

fn sleep_statement(backend: DbBackend) -> Statement {
    let secs = STALL.as_secs();
    let sql = match backend {
        DbBackend::Postgres => format!("SELECT pg_sleep({secs})"),
        _ => format!("SELECT SLEEP({secs})"),
    };
    Statement::from_string(backend, sql)
}

/// A acquires with a one-second lease, fences a transaction and inserts a row, then stalls
/// there for eight leases; B, on a pool of its own, asks for the lease every 50 ms from just
/// after A's lease ends. B must be granted within `BOUND` of the lapse, and A's transaction must
/// not commit.
async fn a_stalled_holder_never_holds_up_the_next_term(h: SqlHarness, stall: Stall) {
    let a_db = h.connect_again(2).await;
    let a = h.configure(SeaOrmLeaseStore::new(a_db.clone()));
    let b = h.separate_store().await;
    let app = app_table(h.direct()).await;
    // A quote and capitals: the takeover must find the row by its exact key.
    let resource = unique("Stalled'Q");

    let LeaseOutcome::Acquired(lease) = a.acquire_or_renew(&resource, "a", LEASE).await.unwrap()
    else {
        panic!("a first acquire is a grant");
    };
    let lapse = Instant::now() + lease.remaining;
    let txn = a_db.begin().await.unwrap();
    let term = Term {
        resource: &resource,
        holder: "a",
        token: lease.token,
    };
    a.fence(&txn, term).await.expect("a live term fences");
    txn.execute(&app_row(&app, lease.token)).await.unwrap();

    let holder = tokio::spawn(async move {
        match stall {
            Stall::Idle => tokio::time::sleep(STALL).await,
            Stall::LongStatement => {
                let backend = txn.get_database_backend();
                // Ended with the session, or cancelled: either way an error.
                let _ = txn.execute_raw(sleep_statement(backend)).await;
            }
        }
        txn.commit().await
    });

    tokio::time::sleep_until(lapse + Duration::from_millis(50)).await;
    let granted = loop {
        match b.acquire_or_renew(&resource, "b", LEASE).await.unwrap() {
            LeaseOutcome::Acquired(l) => break l,
            LeaseOutcome::Renewed(l) => panic!("b never held the lease: {l:?}"),
            LeaseOutcome::Denied(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let after_lapse = Instant::now().saturating_duration_since(lapse);
    eprintln!("{stall:?}: b granted {after_lapse:?} after a's lease lapsed");
    assert!(
        granted.token > lease.token,
        "the next term's token exceeds the stalled one's"
    );
    assert!(
        after_lapse < BOUND,
        "{stall:?}: b was granted {after_lapse:?} after a's lease lapsed (bound {BOUND:?})"
    );

    let committed = holder.await.unwrap();
    assert!(
        committed.is_err(),
        "{stall:?}: the stalled holder's fenced transaction committed after its term ended"
    );
    assert_eq!(
        rows(h.direct(), &app).await,
        0,
        "{stall:?}: the stalled holder's write is in the table"
    );
    // The holder's pool recovers: its next call is answered (B's lease may have lapsed by now).
    a.acquire_or_renew(&resource, "a", LEASE)
        .await
        .expect("the stalled holder's pool answers again");
}

/// A live term's fenced transaction is never ended: A's lease (5 s) outlives its 2.5 s fenced
/// transaction, and B asks for the lease throughout (so keeps looking for a lapsed holder).
async fn a_live_holders_fenced_transaction_is_never_ended(h: SqlHarness) {
    let a_db = h.connect_again(2).await;
    let a = h.configure(SeaOrmLeaseStore::new(a_db.clone()));
    let b = h.separate_store().await;
    let app = app_table(h.direct()).await;
    let resource = unique("live");
    let LeaseOutcome::Acquired(lease) = a
        .acquire_or_renew(&resource, "a", Duration::from_secs(5))
        .await
        .unwrap()
    else {
        panic!("a first acquire is a grant");
    };
    let txn = a_db.begin().await.unwrap();
    a.fence(
        &txn,
        Term {
            resource: &resource,
            holder: "a",
            token: lease.token,
        },
    )
    .await
    .unwrap();
    let b_asks = tokio::spawn(async move {
        let until = Instant::now() + Duration::from_millis(2_500);
        let mut asked = 0;
        while Instant::now() < until {
            let out = tokio::time::timeout(
                Duration::from_millis(700),
                b.acquire_or_renew(&resource, "b", LEASE),
            )
            .await;
            if let Ok(out) = out {
                assert!(matches!(out.unwrap(), LeaseOutcome::Denied(_)));
            }
            asked += 1;
        }
        asked
    });
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    txn.execute(&app_row(&app, lease.token))
        .await
        .expect("a live term's transaction runs on");
    txn.commit()
        .await
        .expect("a live term's transaction commits");
    assert!(b_asks.await.unwrap() > 0);
    assert_eq!(rows(h.direct(), &app).await, 1);
}

macro_rules! stalled_suite {
    ($make:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_holder_stopped_inside_a_fenced_transaction_is_taken_over_within_the_bound() {
            let Some(h) = $make.await else { return };
            a_stalled_holder_never_holds_up_the_next_term(h, Stall::Idle).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_holder_stuck_in_a_long_statement_is_taken_over_within_the_bound() {
            let Some(h) = $make.await else { return };
            a_stalled_holder_never_holds_up_the_next_term(h, Stall::LongStatement).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_live_holders_fenced_transaction_runs_on() {
            let Some(h) = $make.await else { return };
            a_live_holders_fenced_transaction_is_never_ended(h).await;
        }
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    stalled_suite!(SqlHarness::server(Server::Postgres));
}

#[cfg(feature = "postgres")]
mod pgbouncer {
    use super::*;
    stalled_suite!(SqlHarness::pgbouncer());
}

#[cfg(feature = "mysql")]
mod mariadb {
    use super::*;
    stalled_suite!(SqlHarness::server(Server::MySql));
}
