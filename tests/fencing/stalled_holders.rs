//! A holder stalled inside a fenced transaction (its process stopped, cut off from the database
//! by a partition, or stuck in a long statement) never holds up the next term past the bound:
//! once its lease has lapsed by the database clock, the next candidate is granted within
//! `BOUND`, the stalled transaction never commits, and the holder's pool answers again after.
//! PostgreSQL (direct and through a transaction-pooling PgBouncer), MariaDB, and a MariaDB
//! Galera cluster (the next candidate on the holder's node, and on another node).
//! (SQLite cannot: a stopped writer holds the file's write lock whatever we do; see the docs.)

use crate::common;

use std::time::Duration;

use orion_beacon::{store::LeaseOutcome, FencingToken, LeaseStore, SeaOrmLeaseStore, Term};
use sea_orm::sea_query::{Alias, ColumnDef, InsertStatement, Query, Table};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement, TransactionTrait};
use tokio::time::Instant;

use common::conformance::Harness;
use common::partition::Partitions;
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
    /// Sends nothing (a stopped process, a pause, as the server sees it).
    Idle,
    /// Cut off by a partition that loses the server's FIN: its connections stay open and
    /// silent at both ends until the heal, and the one the takeover ended stays half-open.
    CutOff,
    /// Runs one statement that takes `STALL`.
    LongStatement,
}

/// The two candidates of a scenario: A (its pool, and its proxy if it is to be cut off) and B
/// (a pool of its own), and a direct connection for the application's table.
struct Sides {
    a_db: DatabaseConnection,
    a: SeaOrmLeaseStore,
    b: SeaOrmLeaseStore,
    direct: DatabaseConnection,
    /// A's proxy, named "a".
    partitions: Partitions,
    /// The lease table.
    table: String,
}

async fn sides(h: &SqlHarness) -> Sides {
    let partitions = Partitions::default();
    let a_db = h.connect_through(&partitions, "a", 2).await;
    Sides {
        a: h.configure(SeaOrmLeaseStore::new(a_db.clone())),
        a_db,
        b: h.separate_store().await,
        direct: h.direct().clone(),
        partitions,
        table: h.table().to_owned(),
    }
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

/// A acquires `resource` with a one-second lease, begins a transaction on its pool, fences it
/// with the term and inserts its row into `app`: the lease, when it lapses, and the transaction.
async fn fenced_holder(
    a: &SeaOrmLeaseStore,
    a_db: &DatabaseConnection,
    app: &str,
    resource: &str,
) -> (orion_beacon::Lease, Instant, sea_orm::DatabaseTransaction) {
    let LeaseOutcome::Acquired(lease) = a.acquire_or_renew(resource, "a", LEASE).await.unwrap()
    else {
        panic!("a first acquire is a grant");
    };
    let lapse = Instant::now() + lease.remaining;
    let txn = a_db.begin().await.unwrap();
    let term = Term {
        resource,
        holder: "a",
        token: lease.token,
    };
    a.fence(&txn, term).await.expect("a live term fences");
    txn.execute(&app_row(app, lease.token)).await.unwrap();
    (lease, lapse, txn)
}

/// B asks for `resource` every 50 ms from just after `lapse` until it is granted (within
/// `STALL`, or the test fails): the grant, and how long after the lapse it came.
async fn b_granted(
    b: &SeaOrmLeaseStore,
    resource: &str,
    lapse: Instant,
) -> (orion_beacon::Lease, Duration) {
    tokio::time::sleep_until(lapse + Duration::from_millis(50)).await;
    let asking = async {
        loop {
            match b.acquire_or_renew(resource, "b", LEASE).await.unwrap() {
                LeaseOutcome::Acquired(l) => break l,
                LeaseOutcome::Renewed(l) => panic!("b never held the lease: {l:?}"),
                LeaseOutcome::Denied(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    };
    let granted = tokio::time::timeout(STALL, asking)
        .await
        .unwrap_or_else(|_| panic!("b was not granted within {STALL:?} of a's lapse"));
    (granted, Instant::now().saturating_duration_since(lapse))
}

/// A acquires with a one-second lease, fences a transaction and inserts a row, then stalls
/// there for eight leases; B, on a pool of its own, asks for the lease every 50 ms from just
/// after A's lease ends. B must be granted within `BOUND` of the lapse, and A's transaction must
/// not commit.
async fn a_stalled_holder_never_holds_up_the_next_term(s: Sides, stall: Stall) {
    let Sides {
        a_db,
        a,
        b,
        direct,
        partitions,
        ..
    } = s;
    let app = app_table(&direct).await;
    // A quote and capitals: the takeover must find the row by its exact key.
    let resource = unique("Stalled'Q");

    let (lease, lapse, txn) = fenced_holder(&a, &a_db, &app, &resource).await;

    let cut = partitions.clone();
    let holder = tokio::spawn(async move {
        match stall {
            Stall::Idle => tokio::time::sleep(STALL).await,
            Stall::CutOff => {
                cut.set_with("a", true, true);
                tokio::time::sleep(STALL).await;
                cut.set("a", false);
            }
            Stall::LongStatement => {
                let backend = txn.get_database_backend();
                // Ended with the session, or aborted (Galera): either way an error.
                txn.execute_raw(sleep_statement(backend)).await?;
            }
        }
        txn.commit().await
    });

    let (granted, after_lapse) = b_granted(&b, &resource, lapse).await;
    eprintln!("{stall:?}: b granted {after_lapse:?} after a's lease lapsed");
    assert!(
        granted.token > lease.token,
        "the next term's token exceeds the stalled one's"
    );
    assert!(
        after_lapse < BOUND,
        "{stall:?}: b was granted {after_lapse:?} after a's lease lapsed (bound {BOUND:?})"
    );

    // Its next statement or its commit fails (the work learns the term ended), and nothing it
    // wrote is in the table.
    let committed = holder.await.unwrap();
    let written = rows(&direct, &app).await;
    assert_eq!(
        written, 0,
        "{stall:?}: the stalled holder's write is in the table (its commit: {committed:?})"
    );
    assert!(
        committed.is_err(),
        "{stall:?}: the stalled holder's fenced transaction reported a commit after its term ended (nothing was written)"
    );
    eprintln!("{stall:?}: a's transaction ended with {committed:?}");
    // The holder's pool recovers: its next call is answered (B's lease may have lapsed by now),
    // and soon (no connection stuck on a socket the partition left half-open).
    let asked = Instant::now();
    tokio::time::timeout(LEASE, a.acquire_or_renew(&resource, "a", LEASE))
        .await
        .unwrap_or_else(|_| {
            panic!("{stall:?}: the stalled holder's pool did not answer within {LEASE:?}")
        })
        .expect("the stalled holder's pool answers again");
    eprintln!(
        "{stall:?}: a's pool answered {:?} after the stall",
        asked.elapsed()
    );
}

/// A live term's fenced transaction is never ended: A's lease (5 s) outlives its 2.5 s fenced
/// transaction, and B asks for the lease throughout (so keeps looking for a lapsed holder).
async fn a_live_holders_fenced_transaction_is_never_ended(s: Sides) {
    let Sides {
        a_db, a, b, direct, ..
    } = s;
    let app = app_table(&direct).await;
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
    assert_eq!(rows(&direct, &app).await, 1);
}

/// A caller that bounds each acquire more tightly than the takeover's first wait (a shard set
/// bounds every statement of its round by its interval) drops each one while it waits for the
/// stalled holder's lock: the takeover must still happen, so B comes to hold the lease within
/// the bound (granted by a later call, or by one it dropped whose statement ran on once the
/// stalled session ended: then its next call renews it), and A's transaction never commits.
async fn a_caller_that_gives_up_early_still_gets_the_stalled_holder_ended(s: Sides) {
    let Sides {
        a_db, a, b, direct, ..
    } = s;
    let app = app_table(&direct).await;
    let resource = unique("impatient");
    let (lease, lapse, txn) = fenced_holder(&a, &a_db, &app, &resource).await;
    let holder = tokio::spawn(async move {
        tokio::time::sleep(STALL).await;
        txn.commit().await
    });
    tokio::time::sleep_until(lapse + Duration::from_millis(50)).await;
    let asking = async {
        loop {
            let out = tokio::time::timeout(
                Duration::from_millis(50),
                b.acquire_or_renew(&resource, "b", LEASE),
            )
            .await;
            match out {
                Ok(Ok(LeaseOutcome::Acquired(l) | LeaseOutcome::Renewed(l))) => break l,
                Ok(Ok(LeaseOutcome::Denied(_))) | Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Ok(Err(e)) => panic!("b's acquire failed: {e}"),
            }
        }
    };
    let held = tokio::time::timeout(STALL, asking)
        .await
        .unwrap_or_else(|_| panic!("b, giving up on each acquire after 50 ms, never came to hold the lease while a was stalled"));
    let after_lapse = Instant::now().saturating_duration_since(lapse);
    eprintln!("b, giving up on each acquire after 50 ms, held the lease {after_lapse:?} after a's lease lapsed");
    assert!(held.token > lease.token);
    assert!(
        after_lapse < BOUND,
        "b came to hold the lease {after_lapse:?} after a's lease lapsed (bound {BOUND:?})"
    );
    assert!(
        holder.await.unwrap().is_err(),
        "the stalled holder's fenced transaction committed after its term ended"
    );
    assert_eq!(rows(&direct, &app).await, 0);
}

/// A lock on a lapsed lease row that no takeover ends (here the application's own
/// `SELECT … FOR UPDATE` of the row; on MariaDB followed by a long statement that names the
/// lease table, which the takeover spares; the same as a fenced holder's when the role may not
/// end other sessions) makes every acquire wait. An acquire whose caller gives up must leave
/// nothing behind: B's pool (two connections) answers other calls after five acquires it gave
/// up on, and once A's transaction ends (`server_wait` after the last: twice the statement's
/// own lock-wait limit), no statement of those acquires runs on to grant B a lease nobody asked
/// for any more. (Before the statement bounded its own lock wait, the five waited on the server
/// as long as the lock was held, and the first to get the row was granted.)
async fn an_acquire_given_up_on_leaves_nothing_behind(s: Sides, server_wait: Duration) {
    use sea_orm::sea_query::{Expr, ExprTrait, LockType};
    let Sides {
        a_db,
        a,
        b,
        table,
        direct: s_direct,
        ..
    } = s;
    let backend_of = |db: &DatabaseConnection| db.get_database_backend();
    let resource = unique("given-up");
    let LeaseOutcome::Acquired(lease) = a.acquire_or_renew(&resource, "a", LEASE).await.unwrap()
    else {
        panic!("a first acquire is a grant");
    };
    let lapse = Instant::now() + lease.remaining;
    let txn = a_db.begin().await.unwrap();
    let lock = Query::select()
        .expr(Expr::val(1))
        .from(Alias::new(&table))
        .and_where(Expr::col(Alias::new("resource")).eq(resource.as_str()))
        .lock(LockType::Update)
        .to_owned();
    assert_eq!(txn.query_all(&lock).await.unwrap().len(), 1);
    // A lets go once B's five acquires and its other call are done, and `server_wait` more.
    let release_at = lapse + Duration::from_millis(800) + server_wait;
    let backend = txn.get_database_backend();
    let (holding_table, holding_resource) = (table.clone(), resource.clone());
    let holder = tokio::spawn(async move {
        if backend == DbBackend::MySql {
            let secs = release_at
                .saturating_duration_since(Instant::now())
                .as_secs_f64();
            let sleep = Statement::from_sql_and_values(
                DbBackend::MySql,
                format!("SELECT SLEEP(?) FROM `{holding_table}` WHERE `resource` = ?"),
                [secs.into(), holding_resource.into()],
            );
            txn.query_all_raw(sleep).await.unwrap();
        } else {
            tokio::time::sleep_until(release_at).await;
        }
        txn.commit().await.unwrap();
    });
    tokio::time::sleep_until(lapse + Duration::from_millis(50)).await;
    for _ in 0..5 {
        let out = tokio::time::timeout(
            Duration::from_millis(50),
            b.acquire_or_renew(&resource, "b", LEASE),
        )
        .await;
        assert!(
            out.is_err(),
            "the row is locked: no answer within 50 ms ({out:?})"
        );
    }
    // The last ones still wait on the server (else the test proves nothing): statements on
    // this test's own lease table, waiting for a lock.
    let backend = backend_of(&s_direct);
    let waiting = if backend == DbBackend::Postgres {
        "SELECT CAST(count(*) AS bigint) FROM pg_stat_activity \
         WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0"
    } else {
        "SELECT CAST(count(*) AS SIGNED) FROM information_schema.INNODB_TRX \
         WHERE trx_state = 'LOCK WAIT' AND LOCATE(?, trx_query) > 0"
    };
    let rows = s_direct
        .query_all_raw(Statement::from_sql_and_values(
            backend,
            waiting,
            [table.clone().into()],
        ))
        .await
        .unwrap();
    let n: i64 = rows[0].try_get_by_index(0).unwrap();
    assert!(n >= 1, "none of b's acquires was waiting on the server");
    let other = unique("other");
    let asked = Instant::now();
    let answered = tokio::time::timeout(LEASE, b.acquire_or_renew(&other, "b", LEASE)).await;
    assert!(
        matches!(answered, Ok(Ok(LeaseOutcome::Acquired(_)))),
        "b's pool did not answer another acquire within {LEASE:?} after five it gave up on: {answered:?}"
    );
    eprintln!(
        "b's pool answered {:?} after five acquires it gave up on",
        asked.elapsed()
    );
    assert!(
        Instant::now() + server_wait <= release_at,
        "the test's own calls took too long to leave the statements their whole wait"
    );
    holder.await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let row = a
        .current(&resource)
        .await
        .unwrap()
        .expect("the row is there");
    assert_eq!(
        (row.holder.as_str(), row.token),
        ("a", lease.token),
        "an acquire b gave up on was granted after a's lock went: {row:?}"
    );
}

/// The suite over `$sides`, an expression giving `Option<Sides>` (`None`: skipped).
macro_rules! stalled_suite {
    ($sides:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_holder_stopped_inside_a_fenced_transaction_is_taken_over_within_the_bound() {
            let Some(s) = $sides.await else { return };
            a_stalled_holder_never_holds_up_the_next_term(s, Stall::Idle).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_holder_cut_off_inside_a_fenced_transaction_is_taken_over_within_the_bound() {
            let Some(s) = $sides.await else { return };
            a_stalled_holder_never_holds_up_the_next_term(s, Stall::CutOff).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_holder_stuck_in_a_long_statement_is_taken_over_within_the_bound() {
            let Some(s) = $sides.await else { return };
            a_stalled_holder_never_holds_up_the_next_term(s, Stall::LongStatement).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn an_acquire_dropped_while_it_waits_still_ends_the_stalled_holder() {
            let Some(s) = $sides.await else { return };
            a_caller_that_gives_up_early_still_gets_the_stalled_holder_ended(s).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_live_holders_fenced_transaction_runs_on() {
            let Some(s) = $sides.await else { return };
            a_live_holders_fenced_transaction_is_never_ended(s).await;
        }
    };
}

async fn on(h: Option<SqlHarness>) -> Option<Sides> {
    Some(sides(&h?).await)
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    stalled_suite!(on(SqlHarness::server(Server::Postgres).await));

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_acquire_given_up_on_waits_for_nothing_on_the_server() {
        let Some(s) = on(SqlHarness::server(Server::Postgres).await).await else {
            return;
        };
        // Two lock waits of 200 ms at most.
        an_acquire_given_up_on_leaves_nothing_behind(s, Duration::from_millis(500)).await;
    }
}

#[cfg(feature = "postgres")]
mod pgbouncer {
    use super::*;
    stalled_suite!(on(SqlHarness::pgbouncer().await));

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_acquire_given_up_on_waits_for_nothing_on_the_server() {
        let Some(s) = on(SqlHarness::pgbouncer().await).await else {
            return;
        };
        // Two lock waits of 200 ms at most.
        an_acquire_given_up_on_leaves_nothing_behind(s, Duration::from_millis(500)).await;
    }

    /// Behind a transaction-pooling proxy every lease statement runs in a transaction of the
    /// store's own (`BEGIN`, the statement, `COMMIT`). A holder's call sent just before it was
    /// cut off (here just after its lease lapsed, just before the next candidate's takeover)
    /// waits behind its own fenced transaction; once the takeover ends that one, the call's
    /// upsert runs, and its transaction then waits for a `COMMIT` that cannot come. The server
    /// ends it after 250 ms idle, so it neither renews or regains the term nor holds the row
    /// past the bound.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_renew_queued_behind_a_cut_off_holders_fence_does_not_hold_the_row() {
        let Some(s) = on(SqlHarness::pgbouncer().await).await else {
            return;
        };
        let Sides {
            a_db,
            a,
            b,
            direct,
            partitions,
            ..
        } = s;
        let app = app_table(&direct).await;
        let resource = unique("queued");
        let (lease, lapse, txn) = fenced_holder(&a, &a_db, &app, &resource).await;
        // The renew, queued behind the fence; then the partition. Its statement waits for the
        // row at most 200 ms, so it is sent just before b's first takeover (b asks from 50 ms
        // after the lapse, and ends the fence once its own statement's 200 ms wait ran out).
        let renewing = a.clone();
        let queued = resource.clone();
        let cut = partitions.clone();
        let renew = tokio::spawn(async move {
            tokio::time::sleep_until(lapse + Duration::from_millis(150)).await;
            let renewed = renewing.acquire_or_renew(&queued, "a", LEASE);
            tokio::pin!(renewed);
            // Sent; then the partition.
            if let Ok(out) = tokio::time::timeout(Duration::from_millis(50), &mut renewed).await {
                return Some(out);
            }
            cut.set_with("a", true, true);
            tokio::time::timeout(STALL, renewed).await.ok()
        });

        // (a is healed only after this: without the idle limit b would wait forever)
        let (granted, after_lapse) = b_granted(&b, &resource, lapse).await;
        eprintln!("b granted {after_lapse:?} after a's lease lapsed");
        assert!(granted.token > lease.token);
        assert!(
            after_lapse < BOUND,
            "b was granted {after_lapse:?} after a's lease lapsed (bound {BOUND:?})"
        );
        partitions.set("a", false);
        // Its answer was lost with the partition (the connection is left half-open): a caller
        // bounds the wait, as the elector does; what it gets, if anything, is no renew.
        let renewed = tokio::time::timeout(LEASE, renew).await;
        assert!(
            !matches!(
                renewed,
                Ok(Ok(Some(Ok(
                    LeaseOutcome::Renewed(_) | LeaseOutcome::Acquired(_)
                ))))
            ),
            "the queued renew counted: {renewed:?}"
        );
        assert!(
            txn.commit().await.is_err(),
            "the stale fenced transaction committed"
        );
        assert_eq!(rows(&direct, &app).await, 0);
    }
}

#[cfg(feature = "mysql")]
mod mariadb {
    use super::*;
    stalled_suite!(on(SqlHarness::server(Server::MySql).await));

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_acquire_given_up_on_waits_for_nothing_on_the_server() {
        let Some(s) = on(SqlHarness::server(Server::MySql).await).await else {
            return;
        };
        // Two lock waits of a second at most.
        an_acquire_given_up_on_leaves_nothing_behind(s, Duration::from_millis(2200)).await;
    }
}

/// A three-node Galera cluster of this binary's own. The fence writes the lease row there
/// (row locks stay on their node): a next candidate on the holder's node waits for the stalled
/// transaction's lock and ends it like on one server; one on another node is not blocked at
/// all, and its committed grant aborts the stalled transaction when it replicates.
#[cfg(feature = "mysql")]
mod galera {
    use super::*;
    use common::{connect_url, migrate};

    fn cluster() -> &'static orion_beacon_testkit::Galera {
        static CLUSTER: std::sync::OnceLock<orion_beacon_testkit::Galera> =
            std::sync::OnceLock::new();
        CLUSTER.get_or_init(|| {
            orion_beacon_testkit::Galera::builder(3)
                .start()
                .unwrap_or_else(|e| panic!("cannot start this test binary's Galera cluster: {e}"))
        })
    }

    /// A on node 0 (through its proxy), B on node `b_node`.
    async fn sides(b_node: usize) -> Option<Sides> {
        if Server::MySql.skipped() {
            return None;
        }
        let g = tokio::task::spawn_blocking(cluster).await.unwrap();
        let direct = connect_url(&g.node(0).url(), 2).await;
        let table = unique("obt");
        migrate(&direct, &table).await;
        let store = |db: DatabaseConnection| {
            SeaOrmLeaseStore::new(db)
                .with_table(&table)
                .expect("valid table")
        };
        let partitions = Partitions::default();
        let a_url = partitions.route("a", &g.node(0).url()).unwrap();
        let a_db = connect_url(&a_url, 2).await;
        Some(Sides {
            a: store(a_db.clone()),
            a_db,
            b: store(connect_url(&g.node(b_node).url(), 2).await),
            direct,
            partitions,
            table,
        })
    }

    mod same_node {
        use super::*;
        stalled_suite!(sides(0));
    }

    mod other_node {
        use super::*;
        stalled_suite!(sides(1));
    }
}
