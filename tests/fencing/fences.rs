//! Fenced writes on SQLite, PostgreSQL and MariaDB: a stale leader's writes cannot commit.

use crate::common;

use std::time::Duration;

use orion_beacon::{
    store::LeaseOutcome, FenceError, FencingToken, LeaseStore, SeaOrmLeaseStore, Term,
};
use sea_orm::sea_query::{Alias, ColumnDef, Expr, ExprTrait, Query, Table};
use sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait};
use tokio::time::Instant;

use common::conformance::Harness;
use common::sql::SqlHarness;
use common::unique;

const LEASE: Duration = Duration::from_millis(500);
const PAST_LEASE: Duration = Duration::from_millis(800);
/// For tests where a holder must still be current several statements after its acquire: long
/// enough that a loaded machine's stall between them does not end the term (500 ms did once).
const HELD_LEASE: Duration = Duration::from_secs(2);
const PAST_HELD_LEASE: Duration = Duration::from_millis(2_300);

/// A ledger of (token, seq) rows, in commit order by id.
struct Ledger {
    table: String,
}

impl Ledger {
    async fn create(db: &DatabaseConnection) -> Self {
        let table = unique("ledger");
        let stmt = Table::create()
            .table(Alias::new(&table))
            .col(
                ColumnDef::new(Alias::new("id"))
                    .integer()
                    .not_null()
                    .auto_increment()
                    .primary_key(),
            )
            .col(ColumnDef::new(Alias::new("token")).big_integer().not_null())
            .col(ColumnDef::new(Alias::new("seq")).integer().not_null())
            .to_owned();
        db.execute(&stmt).await.unwrap();
        Self { table }
    }

    async fn insert<C: ConnectionTrait>(&self, conn: &C, token: FencingToken, seq: i32) {
        self.try_insert(conn, token, seq).await.unwrap();
    }

    async fn try_insert<C: ConnectionTrait>(
        &self,
        conn: &C,
        token: FencingToken,
        seq: i32,
    ) -> Result<(), sea_orm::DbErr> {
        let stmt = Query::insert()
            .into_table(Alias::new(&self.table))
            .columns([Alias::new("token"), Alias::new("seq")])
            .values_panic([token.get().into(), seq.into()])
            .to_owned();
        conn.execute(&stmt).await.map(|_| ())
    }

    async fn rows(&self, db: &DatabaseConnection) -> Vec<(i64, i32)> {
        let stmt = Query::select()
            .columns([Alias::new("token"), Alias::new("seq")])
            .from(Alias::new(&self.table))
            .order_by(Alias::new("id"), sea_orm::sea_query::Order::Asc)
            .to_owned();
        db.query_all(&stmt)
            .await
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r.try_get_by_index(0).unwrap(),
                    r.try_get_by_index(1).unwrap(),
                )
            })
            .collect()
    }

    async fn drop(self, db: &DatabaseConnection) {
        db.execute(&Table::drop().table(Alias::new(&self.table)).to_owned())
            .await
            .unwrap();
    }
}

async fn acquire(store: &SeaOrmLeaseStore, r: &str, who: &str) -> FencingToken {
    acquire_for(store, r, who, LEASE).await
}

async fn acquire_for(
    store: &SeaOrmLeaseStore,
    r: &str,
    who: &str,
    lease: Duration,
) -> FencingToken {
    match store.acquire_or_renew(r, who, lease).await.unwrap() {
        LeaseOutcome::Acquired(l) => l.token,
        other => panic!("{who} expected to acquire: {other:?}"),
    }
}

/// A leads with t, its lease expires, B acquires t+1: A's fenced transaction is refused and
/// writes nothing, B's commits.
pub async fn stale_term_is_fenced(h: &SqlHarness) {
    let store = h.store();
    let ledger = Ledger::create(h.db()).await;
    let r = unique("fence_stale");
    let t = acquire_for(&store, &r, "a", HELD_LEASE).await;
    let a = Term {
        resource: &r,
        holder: "a",
        token: t,
    };

    // While current, A's fenced transaction commits.
    let txn = h.db().begin().await.unwrap();
    store.fence(&txn, a).await.unwrap();
    ledger.insert(&txn, t, 1).await;
    txn.commit().await.unwrap();

    tokio::time::sleep(PAST_HELD_LEASE).await;
    let t2 = acquire_for(&store, &r, "b", HELD_LEASE).await;
    assert_eq!(t2.get(), t.get() + 1);

    let txn = h.db().begin().await.unwrap();
    let err = store.fence(&txn, a).await.unwrap_err();
    assert!(err.is_fenced(), "{err:?}");
    assert!(matches!(err, FenceError::Fenced { token, .. } if token == t));
    txn.rollback().await.unwrap();

    let txn = fenced(h, &store, &r, "b", t2).await;
    ledger.insert(&txn, t2, 1).await;
    txn.commit().await.unwrap();

    // An expired lease fences its own holder too, before anyone took over.
    tokio::time::sleep(PAST_HELD_LEASE).await;
    let txn = h.db().begin().await.unwrap();
    assert!(store
        .fence(
            &txn,
            Term {
                resource: &r,
                holder: "b",
                token: t2
            }
        )
        .await
        .unwrap_err()
        .is_fenced());
    txn.rollback().await.unwrap();

    assert_eq!(ledger.rows(h.db()).await, vec![(t.get(), 1), (t2.get(), 1)]);
    ledger.drop(h.db()).await;
}

/// A's open transaction (fenced, with ledger row 1 written) outlives A's lease, and B asks for
/// the lease after it expired. PostgreSQL and MariaDB: B ends A's session within the bound and
/// gets t+1, and A's transaction never commits (returns `false`). SQLite: B must wait until A
/// writes row 2 and commits, then gets t+1 (returns `true`).
async fn takeover_waits_for_commit(
    h: &SqlHarness,
    r: &str,
    t: FencingToken,
    ledger: &Ledger,
    txn: sea_orm::DatabaseTransaction,
) -> (orion_beacon::Lease, bool) {
    let b_store = h.separate_store().await;
    let r2 = r.to_owned();
    let b = tokio::spawn(async move {
        tokio::time::sleep(PAST_LEASE).await; // A's lease has expired by now
        let started = Instant::now();
        let out = b_store.acquire_or_renew(&r2, "b", LEASE).await.unwrap();
        (started, Instant::now(), out)
    });
    if h.db().get_database_backend() != sea_orm::DbBackend::Sqlite {
        // PostgreSQL and MariaDB: B waits only briefly, then ends the session of A's lapsed
        // term (see docs/elector.md, "A stalled holder"), whose transaction then never commits.
        let (b_started, b_done, out) = b.await.unwrap();
        assert!(
            b_done - b_started < Duration::from_secs(1),
            "B's takeover past A's lapsed term took {:?}",
            b_done - b_started
        );
        let LeaseOutcome::Acquired(lease) = out else {
            panic!("B should take over: {out:?}")
        };
        assert_eq!(lease.token.get(), t.get() + 1);
        let wrote = ledger.try_insert(&txn, t, 2).await;
        let committed = txn.commit().await;
        assert!(
            wrote.is_err() || committed.is_err(),
            "a lapsed term's fenced transaction committed after the takeover"
        );
        return (lease, false);
    }
    // SQLite: a writer's lock holds every other writer off until it ends.
    tokio::time::sleep(PAST_LEASE + Duration::from_millis(700)).await; // B is waiting on the lock
    ledger.insert(&txn, t, 2).await;
    let committing = Instant::now();
    txn.commit().await.unwrap();

    let (b_started, b_done, out) = b.await.unwrap();
    assert!(b_started < committing, "B asked before A committed");
    assert!(
        b_done >= committing,
        "B's acquire must wait for A's fenced transaction"
    );
    let LeaseOutcome::Acquired(lease) = out else {
        panic!("B should take over: {out:?}")
    };
    assert_eq!(lease.token.get(), t.get() + 1);
    (lease, true)
}

/// A transaction on the harness's database, fenced with `holder`'s term `token` on `r`.
async fn fenced(
    h: &SqlHarness,
    store: &SeaOrmLeaseStore,
    r: &str,
    holder: &str,
    token: FencingToken,
) -> sea_orm::DatabaseTransaction {
    let txn = h.db().begin().await.unwrap();
    store
        .fence(
            &txn,
            Term {
                resource: r,
                holder,
                token,
            },
        )
        .await
        .unwrap();
    txn
}

/// A holds an open fenced transaction while its lease expires; B wins with t+1 once that
/// transaction ended (SQLite: committed; PostgreSQL and MariaDB: ended by B's takeover, its
/// writes gone); A's writes that committed are ordered strictly before B's term.
pub async fn open_fence_holds_off_the_takeover(h: &SqlHarness) {
    let store = h.store();
    let ledger = Ledger::create(h.db()).await;
    let r = unique("fence_race");
    let t = acquire(&store, &r, "a").await;

    let txn = fenced(h, &store, &r, "a", t).await;
    ledger.insert(&txn, t, 1).await;

    let (lease, a_committed) = takeover_waits_for_commit(h, &r, t, &ledger, txn).await;

    let txn = fenced(h, &store, &r, "b", lease.token).await;
    ledger.insert(&txn, lease.token, 1).await;
    txn.commit().await.unwrap();
    let mut expected = if a_committed {
        vec![(t.get(), 1), (t.get(), 2)]
    } else {
        vec![]
    };
    expected.push((t.get() + 1, 1));
    assert_eq!(ledger.rows(h.db()).await, expected);
    ledger.drop(h.db()).await;
}

/// The fence alone, before the transaction wrote anything, holds off the takeover until its
/// term lapses: on PostgreSQL and MariaDB through its lock on the lease row (then ended by the
/// taker), on SQLite through the write lock
/// its no-op update takes (a transaction that only read would let B in at once, and A's later
/// write would then fail against B's commit: safe, but not the order promised).
pub async fn fence_alone_holds_off_the_takeover(h: &SqlHarness) {
    let store = h.store();
    let ledger = Ledger::create(h.db()).await;
    let r = unique("fence_alone");
    let t = acquire(&store, &r, "a").await;
    let txn = fenced(h, &store, &r, "a", t).await;
    let (lease, a_committed) = takeover_waits_for_commit(h, &r, t, &ledger, txn).await;
    assert_eq!(lease.token.get(), t.get() + 1);
    let expected = if a_committed {
        vec![(t.get(), 2)]
    } else {
        vec![]
    };
    assert_eq!(ledger.rows(h.db()).await, expected);
    ledger.drop(h.db()).await;
}

/// The statement-level fence locks the lease row like the transactional one: A's open
/// transaction wrote through `execute_fenced`; B's acquire after A's lease expired waits for
/// that transaction, then wins with t+1; A's writes come strictly before B's term.
pub async fn open_statement_fence_holds_off_the_takeover(h: &SqlHarness) {
    let store = h.store();
    let ledger = Ledger::create(h.db()).await;
    let r = unique("stmt_fence_race");
    let t = acquire(&store, &r, "a").await;
    let a = Term {
        resource: &r,
        holder: "a",
        token: t,
    };
    // INSERT INTO ledger (token, seq) SELECT t, seq WHERE <fenced_by(a)>.
    let fenced_insert = |seq: i32| {
        Query::insert()
            .into_table(Alias::new(&ledger.table))
            .columns([Alias::new("token"), Alias::new("seq")])
            .select_from(
                Query::select()
                    .expr(Expr::val(t.get()))
                    .expr(Expr::val(seq))
                    .and_where(store.fenced_by(a).unwrap())
                    .to_owned(),
            )
            .unwrap()
            .to_owned()
    };

    let txn = h.db().begin().await.unwrap();
    assert_eq!(
        store
            .execute_fenced(&txn, &fenced_insert(1), a)
            .await
            .unwrap(),
        1
    );

    let (_, a_committed) = takeover_waits_for_commit(h, &r, t, &ledger, txn).await;
    // A stale term's fenced statement now writes nothing.
    assert!(store
        .execute_fenced(h.db(), &fenced_insert(3), a)
        .await
        .unwrap_err()
        .is_fenced());
    let expected = if a_committed {
        vec![(t.get(), 1), (t.get(), 2)]
    } else {
        vec![]
    };
    assert_eq!(ledger.rows(h.db()).await, expected);
    ledger.drop(h.db()).await;
}

/// The statement-level fence: one row for the current term, none (and `Fenced`) for a stale one.
pub async fn statement_fence_affects_no_rows_when_stale(h: &SqlHarness) {
    let store = h.store();
    let r = unique("fence_stmt");
    let jobs = unique("jobs");
    let create = Table::create()
        .table(Alias::new(&jobs))
        .col(
            ColumnDef::new(Alias::new("id"))
                .integer()
                .not_null()
                .primary_key(),
        )
        .col(
            ColumnDef::new(Alias::new("owner_token"))
                .big_integer()
                .not_null(),
        )
        .to_owned();
    h.db().execute(&create).await.unwrap();
    let seed = Query::insert()
        .into_table(Alias::new(&jobs))
        .columns([Alias::new("id"), Alias::new("owner_token")])
        .values_panic([1.into(), 0i64.into()])
        .to_owned();
    h.db().execute(&seed).await.unwrap();

    let write = |term: Term<'_>| {
        Query::update()
            .table(Alias::new(&jobs))
            .value(Alias::new("owner_token"), term.token.get())
            .and_where(Expr::col(Alias::new("id")).eq(1))
            .and_where(store.fenced_by(term).unwrap())
            .to_owned()
    };
    let t = acquire_for(&store, &r, "a", HELD_LEASE).await;
    let a = Term {
        resource: &r,
        holder: "a",
        token: t,
    };
    assert_eq!(h.db().execute(&write(a)).await.unwrap().rows_affected(), 1);
    assert_eq!(store.execute_fenced(h.db(), &write(a), a).await.unwrap(), 1);

    tokio::time::sleep(PAST_HELD_LEASE).await;
    let t2 = acquire_for(&store, &r, "b", HELD_LEASE).await;
    assert_eq!(
        h.db().execute(&write(a)).await.unwrap().rows_affected(),
        0,
        "stale term: no rows"
    );
    assert!(store
        .execute_fenced(h.db(), &write(a), a)
        .await
        .unwrap_err()
        .is_fenced());
    let b = Term {
        resource: &r,
        holder: "b",
        token: t2,
    };
    assert_eq!(store.execute_fenced(h.db(), &write(b), b).await.unwrap(), 1);
    // Current term, but the statement's own condition matches nothing: 0, not Fenced.
    let none = Query::update()
        .table(Alias::new(&jobs))
        .value(Alias::new("owner_token"), 5i64)
        .and_where(Expr::col(Alias::new("id")).eq(2))
        .and_where(store.fenced_by(b).unwrap())
        .to_owned();
    assert_eq!(store.execute_fenced(h.db(), &none, b).await.unwrap(), 0);
    h.db()
        .execute(&Table::drop().table(Alias::new(&jobs)).to_owned())
        .await
        .unwrap();
}

/// A reader-writer lock's write hold fences a transaction by every read slot it holds: once
/// any one of them is no longer its own (here the last, revoked by an operator), the fence
/// refuses; a read hold fences by its one slot.
pub async fn a_write_hold_fences_by_every_read_slot(h: &SqlHarness) {
    let ledger = Ledger::create(h.db()).await;
    let locks = orion_beacon::locks::Locks::builder(h.store())
        .owner("writer")
        .lease_duration(Duration::from_secs(30))
        .build()
        .unwrap();
    let name = unique("rw_fence");
    let rw = locks.rw_lock(&name, 3).unwrap();
    let reader = rw.try_read().await.unwrap().expect("free");
    let txn = h.db().begin().await.unwrap();
    reader.fence(&txn).await.expect("a live read hold fences");
    txn.rollback().await.unwrap();
    drop(reader);
    let w = rw.write(Duration::from_secs(10)).await.unwrap();
    let txn = h.db().begin().await.unwrap();
    w.fence(&txn).await.expect("a live write hold fences");
    ledger.insert(&txn, w.token(), 1).await;
    txn.commit().await.unwrap();
    assert!(h
        .store()
        .revoke(&format!("{name}#r2"))
        .await
        .unwrap()
        .is_some());
    let txn = h.db().begin().await.unwrap();
    let err = w
        .fence(&txn)
        .await
        .expect_err("a slot is no longer the writer's");
    assert!(err.is_fenced(), "{err:?}");
    txn.rollback().await.unwrap();
    assert_eq!(ledger.rows(h.db()).await, vec![(w.token().get(), 1)]);
    drop(w);
    ledger.drop(h.db()).await;
}

/// Downstream fencing: a row remembers the highest token that wrote it and refuses older ones.
pub async fn downstream_row_refuses_older_tokens(h: &SqlHarness) {
    let reports = unique("reports");
    let create = Table::create()
        .table(Alias::new(&reports))
        .col(
            ColumnDef::new(Alias::new("id"))
                .integer()
                .not_null()
                .primary_key(),
        )
        .col(ColumnDef::new(Alias::new("body")).string_len(64).not_null())
        .col(
            ColumnDef::new(Alias::new("last_token"))
                .big_integer()
                .null(),
        )
        .to_owned();
    h.db().execute(&create).await.unwrap();
    let seed = Query::insert()
        .into_table(Alias::new(&reports))
        .columns([Alias::new("id"), Alias::new("body")])
        .values_panic([1.into(), "empty".into()])
        .to_owned();
    h.db().execute(&seed).await.unwrap();
    let write = |token: i64, body: &str| {
        let token = FencingToken::new(token);
        Query::update()
            .table(Alias::new(&reports))
            .value(Alias::new("body"), body)
            .value(Alias::new("last_token"), token.get())
            .and_where(Expr::col(Alias::new("id")).eq(1))
            .and_where(token.admits(Alias::new("last_token")))
            .to_owned()
    };
    let rows = |stmt| async move { h.db().execute(&stmt).await.unwrap().rows_affected() };
    assert_eq!(rows(write(1, "by term 1")).await, 1);
    assert_eq!(rows(write(2, "by term 2")).await, 1);
    assert_eq!(
        rows(write(1, "stale term 1")).await,
        0,
        "an older token is refused"
    );
    assert_eq!(
        rows(write(2, "term 2 again")).await,
        1,
        "the same term may write again"
    );
    let body: String = h
        .db()
        .query_one(
            &Query::select()
                .column(Alias::new("body"))
                .from(Alias::new(&reports))
                .to_owned(),
        )
        .await
        .unwrap()
        .unwrap()
        .try_get_by_index(0)
        .unwrap();
    assert_eq!(body, "term 2 again");
    h.db()
        .execute(&Table::drop().table(Alias::new(&reports)).to_owned())
        .await
        .unwrap();
}

macro_rules! fencing_suite {
    ($setup:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn stale_term_is_fenced() {
            if let Some(h) = $setup.await {
                crate::fences::stale_term_is_fenced(&h).await;
                h.teardown().await;
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn open_fence_holds_off_the_takeover() {
            if let Some(h) = $setup.await {
                crate::fences::open_fence_holds_off_the_takeover(&h).await;
                h.teardown().await;
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn fence_alone_holds_off_the_takeover() {
            if let Some(h) = $setup.await {
                crate::fences::fence_alone_holds_off_the_takeover(&h).await;
                h.teardown().await;
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn open_statement_fence_holds_off_the_takeover() {
            if let Some(h) = $setup.await {
                crate::fences::open_statement_fence_holds_off_the_takeover(&h).await;
                h.teardown().await;
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn statement_fence_affects_no_rows_when_stale() {
            if let Some(h) = $setup.await {
                crate::fences::statement_fence_affects_no_rows_when_stale(&h).await;
                h.teardown().await;
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_write_hold_fences_by_every_read_slot() {
            if let Some(h) = $setup.await {
                crate::fences::a_write_hold_fences_by_every_read_slot(&h).await;
                h.teardown().await;
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn downstream_row_refuses_older_tokens() {
            if let Some(h) = $setup.await {
                crate::fences::downstream_row_refuses_older_tokens(&h).await;
                h.teardown().await;
            }
        }
    };
}

/// A term with a bad name is refused before any SQL runs, by both fences.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn bad_terms_are_refused_before_sql() {
    let h = SqlHarness::sqlite().await.unwrap();
    let store = h.store();
    let bad = Term {
        resource: "",
        holder: "a",
        token: FencingToken::new(1),
    };
    let txn = h.db().begin().await.unwrap();
    assert!(matches!(
        store.fence(&txn, bad).await,
        Err(FenceError::Store(
            orion_beacon::StoreError::InvalidResource { .. }
        ))
    ));
    txn.rollback().await.unwrap();
    assert!(matches!(
        store.fenced_by(Term { holder: "", ..bad }),
        Err(FenceError::Store(
            orion_beacon::StoreError::InvalidResource { .. }
        ))
    ));
    h.teardown().await;
}

/// A term fences through its elector's own store (`LeaderTerm::fence`), from work started with
/// `run_as_leader_with`; once the term is over, the same call is refused by the database.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_fences_through_its_elector() {
    let h = SqlHarness::sqlite().await.unwrap();
    let ledger = Ledger::create(h.db()).await;
    let r = unique("term_fence");
    let handle = orion_beacon::Elector::builder(h.store())
        .resource(&r)
        .candidate_id("a")
        .lease_duration(Duration::from_secs(2))
        .renew_interval(Duration::from_millis(500))
        .retry_interval(Duration::from_millis(200))
        .build()
        .unwrap()
        .start();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let ledger_table = ledger.table.clone();
    handle.run_as_leader_with((h.db().clone(), tx), move |term, (db, tx)| {
        let table = ledger_table.clone();
        async move {
            let txn = db.begin().await.unwrap();
            term.fence(&txn).await.unwrap();
            Ledger { table }.insert(&txn, term.token(), 1).await;
            txn.commit().await.unwrap();
            let _ = tx.send(term);
        }
    });
    let term = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("leader work within 10 s")
        .unwrap();
    assert_eq!(ledger.rows(h.db()).await, vec![(term.token().get(), 1)]);
    handle.shutdown().await; // releases: the term is over in the table too
    let txn = h.db().begin().await.unwrap();
    let err = term.fence(&txn).await.expect_err("an ended term");
    assert!(err.is_fenced(), "{err:?}");
    txn.rollback().await.unwrap();
    ledger.drop(h.db()).await;
    h.teardown().await;
}

/// A term of an elector on another kind of store cannot fence a SeaORM transaction, and says so.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_term_without_a_sea_orm_store_cannot_fence() {
    let h = SqlHarness::sqlite().await.unwrap();
    let handle = orion_beacon::Elector::builder_in_memory()
        .resource(unique("memory_term"))
        .build()
        .unwrap()
        .start();
    let term = handle
        .watch()
        .wait_for(|s| s.is_leader())
        .await
        .unwrap()
        .term()
        .cloned()
        .unwrap();
    let txn = h.db().begin().await.unwrap();
    assert!(matches!(
        term.fence(&txn).await,
        Err(FenceError::Unsupported)
    ));
    txn.rollback().await.unwrap();
    handle.shutdown().await;
    h.teardown().await;
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;
    fencing_suite!(SqlHarness::sqlite());
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use crate::common::Server;
    fencing_suite!(SqlHarness::server(Server::Postgres));
}

#[cfg(feature = "mysql")]
mod mariadb {
    use super::*;
    use crate::common::Server;
    fencing_suite!(SqlHarness::server(Server::MySql));
}

/// Under READ COMMITTED, InnoDB takes no shared locks on rows a statement's subquery reads
/// unless asked (`LOCK IN SHARE MODE`); under the default REPEATABLE READ it locks them anyway.
/// Both isolation levels run the suite, so a fence without its lock clause fails here.
#[cfg(feature = "mysql")]
mod mariadb_read_committed {
    use super::*;
    fencing_suite!(SqlHarness::mysql_with_session(
        orion_beacon::MySqlUpsert::Returning,
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"
    ));
}

#[cfg(feature = "serde")]
#[test]
fn tokens_serialize_as_plain_numbers() {
    let token = FencingToken::new(42);
    assert_eq!(serde_json::to_string(&token).unwrap(), "42");
    assert_eq!(serde_json::from_str::<FencingToken>("42").unwrap(), token);
}
