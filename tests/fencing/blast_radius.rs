//! Nothing a takeover does reaches past the one session that blocks its own acquire on exactly
//! its own table's lapsed row: not another tenant's schema (same table and resource names, the
//! same tokens), not a row whose key InnoDB prints alike, not a table whose name differs only
//! in case, not a session a stale lock-table snapshot names; and without the privileges to end
//! a stalled holder, an acquire is answered within its bound with a denial that says why.
//!
//! Each scenario has a healthy leader whose fenced transaction must commit, and a stalled
//! holder whose lease lapses while a next candidate asks for it.

use crate::common;

use std::time::Duration;

use orion_beacon::{store::Denial, store::LeaseOutcome, Lease, LeaseStore, SeaOrmLeaseStore, Term};
use sea_orm::sea_query::{Alias, ColumnDef, Query, Table};
use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DatabaseTransaction, DbBackend,
    Statement, TransactionTrait,
};
use tokio::time::Instant;

use common::{connect_url, migrate, unique, Server};

/// The stalled holder's lease.
const LEASE: Duration = Duration::from_secs(1);
/// The healthy leader's lease: live for the whole test.
const LONG: Duration = Duration::from_secs(30);
/// The documented bound from a lapse to the next grant, past a stalled holder the store ends.
const BOUND: Duration = Duration::from_secs(1);
/// The most an acquire may take to answer past a stalled holder the store does not end: two
/// of its statement's lock waits (a second each on MariaDB) and the looks between.
const ANSWER: Duration = Duration::from_millis(2_600);

async fn exec(db: &DatabaseConnection, sql: impl Into<String>) {
    let backend = db.get_database_backend();
    db.execute_raw(Statement::from_string(backend, sql.into()))
        .await
        .unwrap_or_else(|e| panic!("test setup statement failed: {e}"));
}

/// A table of the application's, where fenced transactions write their token.
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

/// `holder` acquires `resource` for `lease` on `store`, then begins a transaction on `db`,
/// fences it with the term and writes its token into `app`: the lease and the open
/// transaction, which then sits idle (a healthy leader between statements, or a stalled one).
async fn fenced(
    store: &SeaOrmLeaseStore,
    db: &DatabaseConnection,
    app: &str,
    resource: &str,
    holder: &str,
    lease: Duration,
) -> (Lease, DatabaseTransaction) {
    let granted = store
        .acquire_or_renew(resource, holder, lease)
        .await
        .unwrap();
    let LeaseOutcome::Acquired(lease) = granted else {
        panic!("{holder}'s first acquire of {resource} is a grant: {granted:?}");
    };
    let txn = db.begin().await.unwrap();
    let term = Term {
        resource,
        holder,
        token: lease.token,
    };
    store.fence(&txn, term).await.expect("a live term fences");
    txn.execute(
        &Query::insert()
            .into_table(Alias::new(app))
            .columns([Alias::new("token")])
            .values_panic([lease.token.get().into()])
            .to_owned(),
    )
    .await
    .unwrap();
    (lease, txn)
}

/// A follower of `resource` that asks for it every 100 ms until stopped (each of its acquires
/// waits on the leader's row lock, as a real follower's do).
fn follower(store: SeaOrmLeaseStore, resource: String) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let _ = tokio::time::timeout(
                Duration::from_secs(3),
                store.acquire_or_renew(&resource, "follower", LONG),
            )
            .await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// `candidate` asks for `resource` every 50 ms from just after `lapse` until granted: the
/// grant and how long after the lapse it came (the test fails past `within`).
async fn granted_after(
    store: &SeaOrmLeaseStore,
    resource: &str,
    candidate: &str,
    lapse: Instant,
    within: Duration,
) -> (Lease, Duration) {
    tokio::time::sleep_until(lapse + Duration::from_millis(50)).await;
    let asking = async {
        loop {
            match store.acquire_or_renew(resource, candidate, LEASE).await {
                Ok(LeaseOutcome::Acquired(l)) => break l,
                Ok(other) => {
                    assert!(!matches!(other, LeaseOutcome::Renewed(_)), "{other:?}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("{candidate}'s acquire failed: {e}"),
            }
        }
    };
    let lease = tokio::time::timeout(within * 4, asking)
        .await
        .unwrap_or_else(|_| panic!("{candidate} was not granted {resource} past its lapse"));
    (lease, Instant::now().saturating_duration_since(lapse))
}

/// The first answer `candidate` gets for `resource` after `lapse`, and how long it took: the
/// call must be answered within [`ANSWER`] whatever holds the row.
async fn first_answer(
    store: &SeaOrmLeaseStore,
    resource: &str,
    candidate: &str,
    lapse: Instant,
) -> (LeaseOutcome, Duration) {
    tokio::time::sleep_until(lapse + Duration::from_millis(50)).await;
    let asked = Instant::now();
    let out = tokio::time::timeout(ANSWER, store.acquire_or_renew(resource, candidate, LEASE))
        .await
        .unwrap_or_else(|_| {
            panic!("{candidate}'s acquire of {resource} got no answer within {ANSWER:?}")
        })
        .unwrap_or_else(|e| panic!("{candidate}'s acquire of {resource} failed: {e}"));
    (out, asked.elapsed())
}

/// Opens `store`'s sessions and `db`'s connections before the test's takeover, so that its
/// looks and kills go out at once (as in a store that has been running a while).
async fn warm(store: &SeaOrmLeaseStore, db: &DatabaseConnection) {
    let asks = (0..3).map(|_| {
        let resource = unique("warm");
        async move {
            store
                .acquire_or_renew(&resource, "warm", LEASE)
                .await
                .unwrap();
        }
    });
    futures::future::join_all(asks).await;
    let backend = db.get_database_backend();
    let pings = (0..2).map(|_| db.query_all_raw(Statement::from_string(backend, "SELECT 1")));
    for ping in futures::future::join_all(pings).await {
        ping.unwrap();
    }
}

/// Holds `resource`'s row of `table` locked for `secs` seconds from now with one statement of
/// the application's that names the lease table (a takeover spares such a statement, as it
/// spares a grant or renew holding the row for a moment).
fn lock_row_with_a_statement(
    db: DatabaseConnection,
    table: &str,
    resource: &str,
    secs: f64,
) -> tokio::task::JoinHandle<()> {
    let sleep = Statement::from_sql_and_values(
        DbBackend::MySql,
        format!("SELECT SLEEP(?) FROM `{table}` WHERE `resource` = ? FOR UPDATE"),
        [secs.into(), resource.into()],
    );
    tokio::spawn(async move {
        let _ = db.query_all_raw(sleep).await;
    })
}

/// A denial that names the stalled holder and says why it was not ended.
fn stalled_denial(out: &LeaseOutcome, holder: &str) -> Denial {
    match out {
        LeaseOutcome::Denied(d) => {
            assert_eq!(d.holder.as_deref(), Some(holder), "{d:?}");
            assert!(
                d.stalled.is_some(),
                "the denial says the lapsed holder is stalled: {d:?}"
            );
            d.clone()
        }
        other => panic!("a stalled holder the store does not end is a denial: {other:?}"),
    }
}

/// Whether a release of `resource` arrives on `events` within `within`.
#[cfg(feature = "postgres")]
async fn heard(
    events: &mut orion_beacon::store::ReleaseEvents,
    resource: &str,
    within: Duration,
) -> bool {
    let until = Instant::now() + within;
    loop {
        match tokio::time::timeout_at(until, events.recv()).await {
            Ok(Ok(r)) if *r == *resource => return true,
            Ok(Ok(_)) | Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => {}
            Ok(Err(_)) | Err(_) => return false,
        }
    }
}

/// The healthy leader's transaction commits and its row is there.
async fn healthy_commits(txn: DatabaseTransaction, db: &DatabaseConnection, app: &str) {
    txn.commit()
        .await
        .expect("the healthy leader's fenced transaction commits (it was not ended)");
    assert_eq!(rows(db, app).await, 1, "the healthy leader's row landed");
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;

    /// A pool whose sessions look in `schema` first (as a schema-per-tenant app's do).
    async fn tenant_pool(url: &str, schema: &str, max: u32) -> DatabaseConnection {
        let mut options = ConnectOptions::new(url.to_owned());
        options
            .max_connections(max)
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(10))
            .set_schema_search_path(schema.to_owned())
            .sqlx_logging(false);
        Database::connect(options).await.unwrap()
    }

    /// Two tenants' schemas on the server at `url`, each with the default lease table made by
    /// the migration, and a pool of `max` connections per tenant: (A's schema, B's schema,
    /// A's pool, B's pool).
    async fn two_tenants(
        url: &str,
        max: u32,
    ) -> (String, String, DatabaseConnection, DatabaseConnection) {
        let admin = connect_url(url, 2).await;
        let (sa, sb) = (unique("tenant_a"), unique("tenant_b"));
        for schema in [&sa, &sb] {
            exec(&admin, format!("CREATE SCHEMA \"{schema}\"")).await;
        }
        let (a_db, b_db) = (
            tenant_pool(url, &sa, max).await,
            tenant_pool(url, &sb, max).await,
        );
        migrate(&a_db, "orionbeacon_leases").await;
        migrate(&b_db, "orionbeacon_leases").await;
        (sa, sb, a_db, b_db)
    }

    /// Tenant A and tenant B each have their own schema with the same lease table, the same
    /// resource and (both first terms) the same token. A's holder stalls inside a fenced
    /// transaction and A's next candidate takes over; B's healthy leader, idle inside its own
    /// fenced transaction with a follower waiting on its row, must commit. So must A's own
    /// holder of another resource whose lease has lapsed too but which nobody asks for: a
    /// takeover ends only the session that blocks its own acquire.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_takeover_in_one_tenant_schema_never_ends_another_tenants_leader() {
        if Server::Postgres.skipped() {
            return;
        }
        let url = Server::Postgres.url();
        let (sa, sb, a_db, b_db) = two_tenants(&url, 3).await;
        let table = "orionbeacon_leases";
        let (a_app, b_app) = (app_table(&a_db).await, app_table(&b_db).await);
        let store = |db: &DatabaseConnection| SeaOrmLeaseStore::new(db.clone());
        let (a1, b1) = (store(&a_db), store(&b_db));
        let a2 = store(&tenant_pool(&url, &sa, 2).await);
        let b2 = store(&tenant_pool(&url, &sb, 2).await);
        let resource = unique("nightly");
        let quiet = unique("quiet");

        let (b_lease, b_txn) = fenced(&b1, &b_db, &b_app, &resource, "b1", LONG).await;
        let b_follower = follower(b2, resource.clone());
        let (a_lease, a_txn) = fenced(&a1, &a_db, &a_app, &resource, "a1", LEASE).await;
        assert_eq!(
            a_lease.token, b_lease.token,
            "the same token in both tenants"
        );
        let lapse = Instant::now() + a_lease.remaining;
        // A lapsed holder in A's table that nobody asks for: it blocks no acquire.
        let quiet_db = tenant_pool(&url, &sa, 1).await;
        let (_, quiet_txn) = fenced(&a1, &quiet_db, &a_app, &quiet, "a1", LEASE).await;

        // A session that holds the very advisory key the fence marks A's stalled term with
        // (anyone in the database can take any key), idle in its transaction: it blocks no
        // acquire, so it is no business of the takeover's.
        let crafted_db = tenant_pool(&url, &sa, 1).await;
        let crafted = crafted_db.begin().await.unwrap();
        crafted
            .execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                format!(
                    "SELECT pg_advisory_xact_lock_shared(hashtextextended(concat_ws('/', \
                     tableoid, resource, fencing_token), 0)) FROM \"{table}\" WHERE resource = $1"
                ),
                [resource.clone().into()],
            ))
            .await
            .unwrap();

        let (granted, after) = granted_after(&a2, &resource, "a2", lapse, BOUND).await;
        eprintln!("tenant A's next candidate granted {after:?} after the lapse");
        assert!(granted.token > a_lease.token);
        assert!(after < BOUND, "granted {after:?} after the lapse");
        assert!(
            a_txn.commit().await.is_err(),
            "the stalled holder was ended"
        );

        b_follower.abort();
        // Idle well past the takeover's wait, as the stalled holder was: still not ended.
        tokio::time::sleep(Duration::from_millis(300)).await;
        quiet_txn
            .commit()
            .await
            .expect("a lapsed holder that blocks nobody's acquire is left alone");
        crafted
            .commit()
            .await
            .expect("a session that only holds the marker's key is left alone");
        healthy_commits(b_txn, &b_db, &b_app).await;
    }

    /// A holder stalled with several fenced transactions of its term open on several
    /// connections (all holding the row `FOR SHARE`): the waiter waits on one at a time, and
    /// each is ended in turn within the bound.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_holder_stalled_in_several_fenced_transactions_is_taken_over_within_the_bound() {
        if Server::Postgres.skipped() {
            return;
        }
        let url = Server::Postgres.url();
        let db = connect_url(&url, 2).await;
        let table = unique("obt");
        migrate(&db, &table).await;
        let app = app_table(&db).await;
        let holder_db = connect_url(&url, 5).await;
        let holder = SeaOrmLeaseStore::new(holder_db.clone())
            .with_table(&table)
            .unwrap();
        let resource = unique("several");
        let (lease, first) = fenced(&holder, &holder_db, &app, &resource, "a", LEASE).await;
        let mut open = vec![first];
        for _ in 0..3 {
            let txn = holder_db.begin().await.unwrap();
            holder
                .fence(
                    &txn,
                    Term {
                        resource: &resource,
                        holder: "a",
                        token: lease.token,
                    },
                )
                .await
                .unwrap();
            open.push(txn);
        }
        let lapse = Instant::now() + lease.remaining;
        let c = SeaOrmLeaseStore::new(connect_url(&url, 2).await)
            .with_table(&table)
            .unwrap();
        let (granted, after) = granted_after(&c, &resource, "c", lapse, BOUND).await;
        eprintln!("four fenced transactions: granted {after:?} after the lapse");
        assert!(granted.token > lease.token);
        // One after another within one statement's wait (about 20 ms apart), not one per
        // statement (a wait each: about 0.9 s for four).
        let within = Duration::from_millis(700);
        assert!(
            after < within,
            "granted {after:?} after the lapse (within {within:?})"
        );
        for txn in open {
            assert!(
                txn.commit().await.is_err(),
                "every stalled transaction was ended"
            );
        }
    }

    /// Release notifications name the table by its OID: a release in tenant A's schema never
    /// wakes tenant B's followers of the same resource in a table of the same name, and B's own
    /// release does.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_in_one_tenant_schema_never_wakes_another_tenants_followers() {
        use orion_beacon::LeaseStore;
        if Server::Postgres.skipped() {
            return;
        }
        let url = Server::Postgres.url();
        let (_, _, a_db, b_db) = two_tenants(&url, 2).await;
        let (a, b) = (SeaOrmLeaseStore::new(a_db), SeaOrmLeaseStore::new(b_db));
        let mut events = b.release_events().expect("PostgreSQL notifies releases");
        let resource = unique("nightly");
        // B's own release is heard (the listener is up once one is).
        let started = Instant::now();
        loop {
            b.acquire_or_renew(&resource, "b", LONG).await.unwrap();
            assert!(b.release(&resource, "b").await.unwrap());
            if heard(&mut events, &resource, Duration::from_millis(300)).await {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "B's listener never heard B's own release"
            );
        }
        // A's release of the same name in its own table of the same name: not B's business.
        a.acquire_or_renew(&resource, "a", LONG).await.unwrap();
        assert!(a.release(&resource, "a").await.unwrap());
        assert!(
            !heard(&mut events, &resource, Duration::from_millis(500)).await,
            "tenant A's release woke tenant B's followers"
        );
        b.acquire_or_renew(&resource, "b", LONG).await.unwrap();
        assert!(b.release(&resource, "b").await.unwrap());
        assert!(heard(&mut events, &resource, Duration::from_secs(2)).await);
    }

    /// The statement-level fence takes its marker only when it admits: a transaction that
    /// carries on after a refused fenced statement carries no marker of the stale term (which
    /// would make it a takeover's target for a term it never held the row for).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_statement_fence_leaves_no_marker() {
        if Server::Postgres.skipped() {
            return;
        }
        let db = Server::Postgres.connect(2).await;
        let table = unique("obt");
        migrate(&db, &table).await;
        let app = app_table(&db).await;
        let store = SeaOrmLeaseStore::new(db.clone())
            .with_table(&table)
            .unwrap();
        let resource = unique("stmt");
        let markers = Statement::from_string(
            DbBackend::Postgres,
            "SELECT CAST(count(*) AS bigint) FROM pg_locks \
             WHERE pid = pg_backend_pid() AND locktype = 'advisory'",
        );
        let short = Duration::from_millis(200);
        let grant = || async {
            match store.acquire_or_renew(&resource, "a", short).await.unwrap() {
                LeaseOutcome::Acquired(l) => l,
                other => panic!("a grant: {other:?}"),
            }
        };
        // A term that has lapsed (fenced with its own resource, holder and token: only the
        // expiry fails the check), then the current one (a new token).
        let lapsed = grant().await;
        tokio::time::sleep(short + Duration::from_millis(100)).await;
        let current = grant().await;
        for (lease, admitted) in [(lapsed, false), (current, true)] {
            let txn = db.begin().await.unwrap();
            let term = Term {
                resource: &resource,
                holder: "a",
                token: lease.token,
            };
            let insert = Query::insert()
                .into_table(Alias::new(&app))
                .columns([Alias::new("token")])
                .select_from(
                    Query::select()
                        .expr(sea_orm::sea_query::Expr::val(lease.token.get()))
                        .and_where(store.fenced_by(term).unwrap())
                        .to_owned(),
                )
                .unwrap()
                .to_owned();
            let written = txn.execute(&insert).await.unwrap().rows_affected();
            assert_eq!(written, u64::from(admitted), "{lease:?}");
            let rows = txn.query_all_raw(markers.clone()).await.unwrap();
            let held: i64 = rows[0].try_get_by_index(0).unwrap();
            assert_eq!(
                held,
                i64::from(admitted),
                "a marker only when the fence admitted ({lease:?})"
            );
            txn.rollback().await.unwrap();
        }
    }

    /// Without the privileges to end the stalled holder's session (a holder connected as a
    /// superuser, a candidate as a role without pg_signal_backend or pg_read_all_stats), the
    /// candidate's acquire is answered within its bound: a denial naming the stalled holder and
    /// the missing privilege, not a wait until the caller gives up.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_the_privileges_an_acquire_is_denied_within_its_bound_saying_why() {
        if Server::Postgres.skipped() {
            return;
        }
        let url = Server::Postgres.private_url();
        let admin = connect_url(&url, 2).await;
        let table = unique("obt");
        migrate(&admin, &table).await;
        let app = app_table(&admin).await;
        let role = unique("low");
        exec(&admin, format!("CREATE ROLE \"{role}\" LOGIN")).await;
        exec(
            &admin,
            format!("GRANT SELECT, INSERT, UPDATE, DELETE ON \"{table}\" TO \"{role}\""),
        )
        .await;
        let low_url = url.replacen("postgres://postgres@", &format!("postgres://{role}@"), 1);
        let low = SeaOrmLeaseStore::new(connect_url(&low_url, 2).await)
            .with_table(&table)
            .unwrap();
        let holder_db = connect_url(&url, 2).await;
        let holder = SeaOrmLeaseStore::new(holder_db.clone())
            .with_table(&table)
            .unwrap();
        let resource = unique("guarded");
        let (lease, txn) = fenced(&holder, &holder_db, &app, &resource, "a", LEASE).await;
        let lapse = Instant::now() + lease.remaining;

        let (out, took) = first_answer(&low, &resource, "b", lapse).await;
        eprintln!("answered in {took:?}: {out:?}");
        let denial = stalled_denial(&out, "a");
        let why = denial.stalled.unwrap_or_default();
        assert!(
            why.contains("pg_read_all_stats") || why.contains("pg_signal_backend"),
            "the denial names the missing privilege: {why}"
        );
        // Again: answered as fast (the refusal is remembered), and the same.
        let (again, took) = first_answer(&low, &resource, "b", Instant::now()).await;
        stalled_denial(&again, "a");
        assert!(took < ANSWER);
        // An elector of that candidate stays healthy (the store answers) and says who holds
        // the resource up, and why.
        let elector = orion_beacon::Elector::builder(low.clone())
            .resource(resource.clone())
            .candidate_id("e")
            .lease_duration(LEASE)
            .renew_interval(Duration::from_millis(300))
            .retry_interval(Duration::from_millis(300))
            .build()
            .unwrap()
            .start();
        let seen = async {
            loop {
                let health = elector.health();
                if health.stalled_holder.is_some() {
                    break health;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let health = tokio::time::timeout(ANSWER * 2, seen)
            .await
            .expect("the elector's health names the stalled holder");
        eprintln!("{health}");
        assert!(health.healthy, "{health}");
        assert!(!health.leader, "{health}");
        elector.shutdown().await;
        txn.rollback().await.unwrap();
    }
}

#[cfg(feature = "mysql")]
mod mariadb {
    use super::*;

    fn store(db: &DatabaseConnection, table: &str) -> SeaOrmLeaseStore {
        SeaOrmLeaseStore::new(db.clone())
            .with_table(table)
            .expect("valid table")
    }

    /// InnoDB prints keys in utf8mb3, so `x-?` and `x-😀` print alike in its lock tables. A
    /// stalled holder of one and a healthy leader of the other (with a follower waiting on its
    /// row) share a table: the candidate of the stalled one never ends the healthy leader. It
    /// cannot tell the two rows' waits apart, so it ends nobody and is denied within its bound,
    /// saying why. A stalled holder of a key outside the BMP that no other row prints like is
    /// taken over within the bound.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn keys_that_print_alike_never_end_each_others_holders() {
        if Server::MySql.skipped() {
            return;
        }
        let url = Server::MySql.url();
        let db = connect_url(&url, 4).await;
        let table = unique("obt");
        migrate(&db, &table).await;
        let app = app_table(&db).await;
        let prefix = unique("x");
        let (question, smiley) = (format!("{prefix}-?"), format!("{prefix}-\u{1F600}"));
        let (h_db, s_db) = (connect_url(&url, 2).await, connect_url(&url, 2).await);
        let (h, s) = (store(&h_db, &table), store(&s_db, &table));
        let c_db = connect_url(&url, 2).await;
        let c = store(&c_db, &table);
        warm(&c, &c_db).await;

        let (_, h_txn) = fenced(&h, &h_db, &app, &smiley, "h", LONG).await;
        let f = follower(store(&connect_url(&url, 2).await, &table), smiley.clone());
        // `x-?` lapses, held by a statement the takeover spares: the candidate's look then
        // sees its own wait and the follower's, which print alike.
        let lease = match s.acquire_or_renew(&question, "s", LEASE).await.unwrap() {
            LeaseOutcome::Acquired(l) => l,
            other => panic!("{other:?}"),
        };
        let lapse = Instant::now() + lease.remaining;
        let sleeper = lock_row_with_a_statement(s_db.clone(), &table, &question, 4.0);
        let (out, took) = first_answer(&c, &question, "c", lapse).await;
        eprintln!("answered in {took:?}: {out:?}");
        stalled_denial(&out, "s");
        // Idle past another look with its follower waiting: still not ended.
        tokio::time::sleep(Duration::from_millis(300)).await;
        f.abort();
        healthy_commits(h_txn, &h_db, &app).await;
        sleeper.abort();

        // Alone in its table's printing, a key outside the BMP is taken over.
        let lone = format!("{}-\u{1F680}", unique("y"));
        let (lease, s_txn) = fenced(&s, &s_db, &app, &lone, "s", LEASE).await;
        let lapse = Instant::now() + lease.remaining;
        let (granted, after) = granted_after(&c, &lone, "c", lapse, BOUND).await;
        eprintln!("{lone}: granted {after:?} after the lapse");
        assert!(granted.token > lease.token);
        assert!(after < BOUND, "granted {after:?} after the lapse");
        assert!(
            s_txn.commit().await.is_err(),
            "the stalled holder was ended"
        );
    }

    /// Two tables whose names differ only in case are two tables on Linux: a takeover in one
    /// never ends the healthy leader of the same resource in the other (whose follower waits
    /// on its row all along), however the server compares names in its lock tables.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_table_whose_name_differs_only_in_case_is_another_table() {
        if Server::MySql.skipped() {
            return;
        }
        let url = Server::MySql.url();
        let db = connect_url(&url, 4).await;
        let lower = unique("acc");
        let upper = lower.to_uppercase();
        let rows = db
            .query_all_raw(Statement::from_string(
                DbBackend::MySql,
                "SELECT CAST(@@lower_case_table_names AS SIGNED)",
            ))
            .await
            .unwrap();
        let folded: i64 = rows[0].try_get_by_index(0).unwrap();
        if folded != 0 {
            eprintln!("SKIPPED: this server folds table names to lower case");
            return;
        }
        migrate(&db, &lower).await;
        migrate(&db, &upper).await;
        let upper_app = app_table(&db).await;
        let resource = unique("acct");
        let (h_db, s_db) = (connect_url(&url, 2).await, connect_url(&url, 2).await);
        let (_, h_txn) = fenced(
            &store(&h_db, &upper),
            &h_db,
            &upper_app,
            &resource,
            "h",
            LONG,
        )
        .await;
        let f = follower(store(&connect_url(&url, 2).await, &upper), resource.clone());
        // The row in the lower-case table lapses, held by a statement the takeover spares:
        // the candidate's look sees its own wait and the follower's on the other table.
        let s = store(&s_db, &lower);
        let lease = match s.acquire_or_renew(&resource, "s", LEASE).await.unwrap() {
            LeaseOutcome::Acquired(l) => l,
            other => panic!("{other:?}"),
        };
        let lapse = Instant::now() + lease.remaining;
        let sleeper = lock_row_with_a_statement(s_db.clone(), &lower, &resource, 4.0);
        let c_db = connect_url(&url, 2).await;
        let c = store(&c_db, &lower);
        warm(&c, &c_db).await;
        let (out, took) = first_answer(&c, &resource, "c", lapse).await;
        eprintln!("answered in {took:?}: {out:?}");
        stalled_denial(&out, "s");
        sleeper.abort();
        // Idle past the takeover's looks with its follower waiting: still not ended.
        tokio::time::sleep(Duration::from_millis(500)).await;
        f.abort();
        healthy_commits(h_txn, &h_db, &upper_app).await;
    }

    /// A MariaDB instance of the test's own: a reader that freezes InnoDB's lock-table cache
    /// freezes it for every session of the server, so the tests that run one keep it away
    /// from the others (the caller keeps the instance until it is done).
    async fn own_server() -> orion_beacon_testkit::MariaDb {
        tokio::task::spawn_blocking(|| orion_beacon_testkit::MariaDb::builder().start())
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("cannot start a MariaDB instance of the test's own: {e}"))
    }

    /// Reads `information_schema.INNODB_TRX` every `every` until aborted, as a dashboard does:
    /// InnoDB refreshes its lock-table cache only after 100 ms without a read, so this freezes
    /// it.
    fn lock_table_reader(url: String, every: Duration) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let db = connect_url(&url, 1).await;
            loop {
                let _ = db
                    .query_all_raw(Statement::from_string(
                        DbBackend::MySql,
                        "SELECT COUNT(*) FROM information_schema.INNODB_TRX",
                    ))
                    .await;
                tokio::time::sleep(every).await;
            }
        })
    }

    /// A frozen lock-table snapshot names a connection that blocked a wait on the row long
    /// ago; since then that transaction ended, and the connection now runs another resource's
    /// healthy fenced transaction. The takeover must not end it (the live transaction is not
    /// the one the snapshot names), and the acquire is answered within its bound.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stale_lock_table_snapshot_never_ends_a_session_that_moved_on() {
        if Server::MySql.skipped() {
            return;
        }
        let server = own_server().await;
        let url = server.url();
        let db = connect_url(&url, 4).await;
        let table = unique("obt");
        migrate(&db, &table).await;
        let app = app_table(&db).await;
        let (first, second) = (unique("first"), unique("second"));
        // One connection for X's transactions, so the second runs on the same session.
        let x_db = connect_url(&url, 1).await;
        let x = store(&connect_url(&url, 2).await, &table);
        let (lease, x_txn) = fenced(&x, &x_db, &app, &first, "x", LEASE).await;
        let lapse = Instant::now() + lease.remaining;

        // W waits on the row X holds (the application's own lock of the row, which no
        // takeover ends): the snapshot taken now shows X blocking a wait on `first`.
        let w_db = connect_url(&url, 1).await;
        let w_txn = w_db.begin().await.unwrap();
        let lock = Statement::from_sql_and_values(
            DbBackend::MySql,
            format!("SELECT 1 FROM `{table}` WHERE `resource` = ? FOR UPDATE"),
            [first.clone().into()],
        );
        let waiting = tokio::spawn(async move {
            w_txn.query_all_raw(lock).await.unwrap();
            w_txn
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        let reader = lock_table_reader(url.clone(), Duration::from_millis(40));
        tokio::time::sleep(Duration::from_millis(200)).await;
        // X's transaction ends; W now holds the row and stays idle. X moves on to a healthy
        // fenced transaction of another resource on the same session.
        x_txn.commit().await.unwrap();
        let w_txn = waiting.await.unwrap();
        let (_, x_txn2) = fenced(&x, &x_db, &app, &second, "x", LONG).await;

        let c = store(&db, &table);
        warm(&c, &db).await;
        let (out, took) = first_answer(&c, &first, "c", lapse).await;
        eprintln!("answered in {took:?}: {out:?}");
        assert!(matches!(out, LeaseOutcome::Denied(_)), "{out:?}");
        reader.abort();
        x_txn2
            .commit()
            .await
            .expect("the session that moved on was not ended");
        w_txn.rollback().await.unwrap();
    }

    /// With a dashboard reading the lock tables every 80 ms the snapshot never refreshes: a
    /// stalled holder's candidate is still answered within its bound (granted, or denied
    /// naming the stalled holder), never left waiting.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_frozen_lock_table_snapshot_still_answers_within_the_bound() {
        if Server::MySql.skipped() {
            return;
        }
        let server = own_server().await;
        let url = server.url();
        let db = connect_url(&url, 4).await;
        let table = unique("obt");
        migrate(&db, &table).await;
        let app = app_table(&db).await;
        let resource = unique("frozen");
        let reader = lock_table_reader(url.clone(), Duration::from_millis(80));
        tokio::time::sleep(Duration::from_millis(200)).await;
        let s_db = connect_url(&url, 2).await;
        let s = store(&s_db, &table);
        let (lease, s_txn) = fenced(&s, &s_db, &app, &resource, "s", LEASE).await;
        let lapse = Instant::now() + lease.remaining;
        let c = store(&connect_url(&url, 2).await, &table);
        let (out, took) = first_answer(&c, &resource, "c", lapse).await;
        eprintln!("answered in {took:?}: {out:?}");
        match &out {
            LeaseOutcome::Acquired(l) => assert!(l.token > lease.token),
            _ => {
                stalled_denial(&out, "s");
            }
        }
        reader.abort();
        let _ = s_txn.rollback().await;
    }

    /// Without the PROCESS privilege the candidate cannot look for the stalled holder: its
    /// acquire is denied within its bound, the denial naming the holder and the privilege.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_the_privileges_an_acquire_is_denied_within_its_bound_saying_why() {
        if Server::MySql.skipped() {
            return;
        }
        let url = Server::MySql.private_url();
        let admin = connect_url(&url, 2).await;
        let table = unique("obt");
        migrate(&admin, &table).await;
        let app = app_table(&admin).await;
        let user = unique("low");
        let db_name = url.rsplit('/').next().unwrap_or("test").to_owned();
        for host in ["%", "localhost", "127.0.0.1"] {
            exec(
                &admin,
                format!("CREATE USER '{user}'@'{host}' IDENTIFIED BY 'pw'"),
            )
            .await;
            exec(
                &admin,
                format!(
                    "GRANT SELECT, INSERT, UPDATE, DELETE ON `{db_name}`.`{table}` TO '{user}'@'{host}'"
                ),
            )
            .await;
        }
        let low_url = url.replacen("mysql://root@", &format!("mysql://{user}:pw@"), 1);
        let low = store(&connect_url(&low_url, 2).await, &table);
        let holder_db = connect_url(&url, 2).await;
        let resource = unique("guarded");
        let (lease, txn) = fenced(
            &store(&holder_db, &table),
            &holder_db,
            &app,
            &resource,
            "a",
            LEASE,
        )
        .await;
        let lapse = Instant::now() + lease.remaining;
        let (out, took) = first_answer(&low, &resource, "b", lapse).await;
        eprintln!("answered in {took:?}: {out:?}");
        let why = stalled_denial(&out, "a").stalled.unwrap_or_default();
        assert!(
            why.contains("PROCESS"),
            "the denial names the missing privilege: {why}"
        );
        txn.rollback().await.unwrap();
    }
}
