//! A three-node MariaDB Galera cluster (Debian's `galera-4`, private nodes on loopback): two
//! stores on two different nodes race for fresh resources. Galera certifies at commit, and a
//! node may re-run an autocommit statement that lost certification (`wsrep_retry_autocommit`)
//! and send the rows of both attempts, or send the row and then the error: only the committed
//! result decides, so exactly one of the two is granted in every round.
#![cfg(feature = "mysql")]

use crate::common;

use std::sync::OnceLock;
use std::time::Duration;

use common::{connect_url, migrate, unique, Server};
use orion_beacon::{store::LeaseOutcome, LeaseStore, MySqlUpsert, SeaOrmLeaseStore, StoreError};
use orion_beacon_testkit::Galera;

const LONG: Duration = Duration::from_secs(60);
const ROUNDS: usize = 60;

fn cluster() -> &'static Galera {
    static CLUSTER: OnceLock<Galera> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        Galera::builder(3)
            .start()
            .unwrap_or_else(|e| panic!("cannot start this test binary's Galera cluster: {e}"))
    })
}

/// Statements that lost certification so far, summed over the nodes.
fn cert_failures(g: &Galera) -> u64 {
    g.nodes()
        .iter()
        .map(|node| {
            node.sql(
                "SELECT SUM(VARIABLE_VALUE) FROM information_schema.GLOBAL_STATUS \
                 WHERE VARIABLE_NAME IN ('WSREP_LOCAL_CERT_FAILURES', 'WSREP_LOCAL_BF_ABORTS')",
            )
            .ok()
            .and_then(|out| out.trim().parse::<u64>().ok())
            .unwrap_or(0)
        })
        .sum()
}

/// `SET GLOBAL` on every node.
fn set_everywhere(g: &Galera, sql: &str) {
    for node in g.nodes() {
        node.sql(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_stores_on_two_nodes_get_exactly_one_grant() {
    if Server::MySql.skipped() {
        return;
    }
    let g = tokio::task::spawn_blocking(cluster).await.unwrap();
    let n0 = connect_url(&g.node(0).url(), 4).await;
    let n1 = connect_url(&g.node(1).url(), 4).await;
    let table = unique("galera");
    migrate(&n0, &table).await;

    let failures_before = tokio::task::block_in_place(|| cert_failures(g));
    for form in [MySqlUpsert::Returning, MySqlUpsert::Transaction] {
        let a = SeaOrmLeaseStore::new(n0.clone())
            .with_table(&table)
            .unwrap()
            .with_mysql_upsert(form);
        let b = SeaOrmLeaseStore::new(n1.clone())
            .with_table(&table)
            .unwrap()
            .with_mysql_upsert(form);
        // The server's own retry of a statement that lost certification, on and off.
        for retry in [1, 0] {
            tokio::task::block_in_place(|| {
                set_everywhere(g, &format!("SET GLOBAL wsrep_retry_autocommit = {retry}"))
            });
            let (mut denied, mut conflicts) = (0, 0);
            for round in 0..ROUNDS {
                let r = format!("race-{form:?}-{retry}-{round}");
                let (oa, ob) = tokio::join!(
                    a.acquire_or_renew(&r, "a", LONG),
                    b.acquire_or_renew(&r, "b", LONG)
                );
                let mut granted = Vec::new();
                for (who, outcome) in [("a", &oa), ("b", &ob)] {
                    match outcome {
                        Ok(LeaseOutcome::Acquired(lease)) => {
                            assert_eq!(lease.token.get(), 1);
                            granted.push(who);
                        }
                        Ok(LeaseOutcome::Denied(_)) => denied += 1,
                        Err(StoreError::Conflict { .. }) => conflicts += 1,
                        other => panic!("{form:?}, retry {retry}, round {round}: {who}: {other:?}"),
                    }
                }
                assert_eq!(
                    granted.len(),
                    1,
                    "{form:?}, wsrep_retry_autocommit={retry}, round {round}: {oa:?} / {ob:?}"
                );
                // The cluster agrees, read on the third node after the writes it has seen.
                let holder = tokio::task::block_in_place(|| {
                    g.node(2).sql(&format!(
                        "SET SESSION wsrep_sync_wait = 1; \
                         SELECT holder FROM test.{table} WHERE resource = '{r}'"
                    ))
                })
                .unwrap();
                assert_eq!(holder.trim(), granted[0], "{form:?} round {round}");
            }
            eprintln!(
                "galera {form:?}, wsrep_retry_autocommit={retry}: {ROUNDS} rounds, one grant each; \
                 the other denied {denied} times, a conflict {conflicts} times"
            );
        }
    }
    let lost_certification = tokio::task::block_in_place(|| cert_failures(g)) - failures_before;
    eprintln!("galera: {lost_certification} statements lost certification or were aborted by it");
    // Otherwise the rounds never raced and proved nothing.
    assert!(lost_certification > 0, "no round raced");
    tokio::task::block_in_place(|| set_everywhere(g, "SET GLOBAL wsrep_retry_autocommit = 1"));
}

/// `a` takes a fresh lease on `r`, then opens a transaction on `db` that fences with it and
/// inserts `value` into `ledger`; the transaction is left open.
async fn fenced_insert(
    a: &SeaOrmLeaseStore,
    db: &sea_orm::DatabaseConnection,
    r: &str,
    lease: Duration,
    ledger: &str,
    value: i64,
) -> (orion_beacon::Lease, sea_orm::DatabaseTransaction) {
    use orion_beacon::Term;
    use sea_orm::{ConnectionTrait, TransactionTrait};
    let LeaseOutcome::Acquired(lease) = a.acquire_or_renew(r, "a", lease).await.unwrap() else {
        panic!("a fresh resource is granted");
    };
    let term = Term {
        resource: r,
        holder: "a",
        token: lease.token,
    };
    let txn = db.begin().await.unwrap();
    a.fence(&txn, term).await.unwrap();
    txn.execute_unprepared(&format!("INSERT INTO {ledger} (token) VALUES ({value})"))
        .await
        .unwrap();
    (lease, txn)
}

/// The fence on a Galera node: row locks stay on their node and reads are not certified, so
/// the fence writes the lease row (and puts it back). A fenced transaction that a takeover on
/// another node overtook cannot commit; one that was not commits and leaves the lease row as
/// it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_on_one_node_holds_against_a_takeover_on_another() {
    use sea_orm::ConnectionTrait;
    if Server::MySql.skipped() {
        return;
    }
    let g = tokio::task::spawn_blocking(cluster).await.unwrap();
    let n0 = connect_url(&g.node(0).url(), 4).await;
    let n1 = connect_url(&g.node(1).url(), 4).await;
    let table = unique("galera_fence");
    migrate(&n0, &table).await;
    let ledger = unique("galera_ledger");
    n0.execute_unprepared(&format!(
        "CREATE TABLE {ledger} (id BIGINT AUTO_INCREMENT PRIMARY KEY, token BIGINT NOT NULL)"
    ))
    .await
    .unwrap();
    let a = SeaOrmLeaseStore::new(n0.clone())
        .with_table(&table)
        .unwrap();
    let b = SeaOrmLeaseStore::new(n1.clone())
        .with_table(&table)
        .unwrap();

    // A current term: the fenced write commits, and the lease row is as it was.
    let r = unique("fenced");
    let (lease, txn) = fenced_insert(&a, &n0, &r, LONG, &ledger, 1).await;
    txn.commit().await.unwrap();
    let row = a.current(&r).await.unwrap().unwrap();
    assert_eq!(
        row.expires_at, lease.expires_at,
        "the fence left the lease row as it was"
    );

    // Overtaken: the lease runs out while the fenced transaction is open, and another node
    // grants it to b. The fenced transaction must not commit.
    let r = unique("overtaken");
    let short = Duration::from_millis(300);
    let (lease, txn) = fenced_insert(&a, &n0, &r, short, &ledger, 2).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let taken = b.acquire_or_renew(&r, "b", LONG).await;
    let commit = txn.commit().await;
    match taken {
        Ok(LeaseOutcome::Acquired(l)) => {
            assert!(l.token > lease.token);
            assert!(
                commit.is_err(),
                "a stale fenced write committed after the takeover"
            );
        }
        // The takeover waited for the fenced transaction on node 0 and lost to it: fine too,
        // as long as both did not happen.
        other => assert!(commit.is_ok(), "{other:?} and {commit:?}"),
    }
    let stale = n0
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::MySql,
            format!("SELECT COUNT(*) FROM {ledger} WHERE token = 2"),
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get_by_index::<i64>(0)
        .unwrap();
    let holder = b.current(&r).await.unwrap().unwrap().holder;
    assert!(
        !(stale == 1 && holder == "b"),
        "both the stale write and the takeover committed"
    );
}

/// The statement-level fence only reads the lease row, which Galera neither replicates as a
/// lock nor certifies: it is refused there, with the error naming the transactional fence,
/// both by `fenced_by` once the store knows the topology and by `execute_fenced` on a store
/// that never asked before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_statement_fence_is_refused_on_galera() {
    use orion_beacon::{FenceError, Term};
    use sea_orm::sea_query::{Alias, Expr, ExprTrait, Query};
    if Server::MySql.skipped() {
        return;
    }
    let g = tokio::task::spawn_blocking(cluster).await.unwrap();
    let n0 = connect_url(&g.node(0).url(), 4).await;
    let table = unique("galera_stmt_fence");
    migrate(&n0, &table).await;
    let r = unique("stmt");
    let a = SeaOrmLeaseStore::new(n0.clone())
        .with_table(&table)
        .unwrap();
    let LeaseOutcome::Acquired(lease) = a.acquire_or_renew(&r, "a", LONG).await.unwrap() else {
        panic!("a fresh resource is granted");
    };
    let term = Term {
        resource: &r,
        holder: "a",
        token: lease.token,
    };
    let refused = a.fenced_by(term);
    assert!(
        matches!(refused, Err(FenceError::StatementFenceOnGalera)),
        "{refused:?}"
    );
    // The same with the upsert form set by the program (as behind a proxy): the store still
    // looks at its first grant.
    let preset = SeaOrmLeaseStore::new(n0.clone())
        .with_table(&table)
        .unwrap()
        .with_mysql_upsert(MySqlUpsert::Returning);
    let r2 = unique("stmt_preset");
    let before = preset.fenced_by(Term {
        resource: &r2,
        holder: "a",
        token: lease.token,
    });
    assert!(
        matches!(before, Err(FenceError::TopologyUnknown)),
        "{before:?}"
    );
    let LeaseOutcome::Acquired(l2) = preset.acquire_or_renew(&r2, "a", LONG).await.unwrap() else {
        panic!("a fresh resource is granted");
    };
    let refused = preset.fenced_by(Term {
        resource: &r2,
        holder: "a",
        token: l2.token,
    });
    assert!(
        matches!(refused, Err(FenceError::StatementFenceOnGalera)),
        "{refused:?}"
    );
    let message = FenceError::StatementFenceOnGalera.to_string();
    assert!(message.contains("fence(&txn"), "{message}");

    // A second store on the same node that has granted nothing yet: `execute_fenced` asks.
    let fresh = SeaOrmLeaseStore::new(n0.clone())
        .with_table(&table)
        .unwrap();
    let write = Query::update()
        .table(Alias::new(&table))
        .value(Alias::new("holder"), "a")
        .and_where(Expr::col(Alias::new("resource")).eq(r.as_str()))
        .to_owned();
    let refused = fresh.execute_fenced(&n0, &write, term).await;
    assert!(
        matches!(refused, Err(FenceError::StatementFenceOnGalera)),
        "{refused:?}"
    );
}

/// Pools on a Galera node that read causally (`wsrep_sync_wait = 7`: reads, updates, deletes
/// and inserts first wait for every write the cluster has certified), so a statement on one
/// node sees a release just committed on another, as a suite's next step expects. Without it,
/// that statement may still see the row held and be denied (a retry gets it): correct, but not
/// what a step-by-step test can assert.
async fn connect_causal(url: &str, max_connections: u32) -> sea_orm::DatabaseConnection {
    let mut options = sea_orm::ConnectOptions::new(url.to_owned());
    options
        .max_connections(max_connections)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(10))
        .sqlx_logging(false)
        .map_sqlx_mysql_pool_opts(|o| {
            o.after_connect(|conn, _meta| {
                Box::pin(async move {
                    sea_orm::sqlx::Executor::execute(conn, "SET SESSION wsrep_sync_wait = 7")
                        .await?;
                    Ok(())
                })
            })
        });
    sea_orm::Database::connect(options)
        .await
        .unwrap_or_else(|e| panic!("cannot reach {url}: {e}"))
}

/// The lock suite on Galera: the harness's store on node 0, each separate store (another
/// process) on node 1.
struct GaleraHarness {
    db: sea_orm::DatabaseConnection,
    table: String,
    /// The statement form, where a suite fixes one (MySQL 8's transaction form on Galera).
    form: Option<orion_beacon::MySqlUpsert>,
}

impl GaleraHarness {
    async fn setup() -> Option<Self> {
        if Server::MySql.skipped() {
            return None;
        }
        let g = tokio::task::spawn_blocking(cluster).await.unwrap();
        let db = connect_causal(&g.node(0).url(), 8).await;
        let table = unique("galera");
        migrate(&db, &table).await;
        Some(Self {
            db,
            table,
            form: None,
        })
    }

    async fn setup_with(form: orion_beacon::MySqlUpsert) -> Option<Self> {
        let mut h = Self::setup().await?;
        h.form = Some(form);
        Some(h)
    }

    fn configure(&self, store: SeaOrmLeaseStore) -> SeaOrmLeaseStore {
        let store = store
            .with_table(&self.table)
            .and_then(|s| s.with_rate_limit_table(common::rate_table(&self.table)))
            .and_then(|s| s.with_member_table(common::member_table(&self.table)))
            .unwrap();
        match self.form {
            Some(form) => store.with_mysql_upsert(form),
            None => store,
        }
    }
}

#[async_trait::async_trait]
impl common::conformance::Harness for GaleraHarness {
    type Store = SeaOrmLeaseStore;
    fn store(&self) -> SeaOrmLeaseStore {
        self.configure(SeaOrmLeaseStore::new(self.db.clone()))
    }
    fn decisions_may_go_unreported(&self) -> bool {
        self.form == Some(orion_beacon::MySqlUpsert::Transaction)
    }
    async fn separate_store(&self) -> SeaOrmLeaseStore {
        let db = connect_causal(&cluster().node(1).url(), 4).await;
        self.configure(SeaOrmLeaseStore::new(db))
    }
    async fn teardown(self) {
        use sea_orm::ConnectionTrait;
        for table in [
            common::member_table(&self.table),
            common::rate_table(&self.table),
            self.table.clone(),
        ] {
            let _ = self
                .db
                .execute_unprepared(&format!("DROP TABLE IF EXISTS `{table}`"))
                .await;
        }
    }
}

lock_suite!(GaleraHarness::setup());

rate_suite!(GaleraHarness::setup());

/// The rate limit in MySQL 8's form (the upsert and a read in one transaction of the store's
/// own) on Galera, where a decision is read again after its COMMIT: a transaction that
/// certification rolled back must not hand out the permit it read.
mod rates_transaction_form {
    use super::*;
    rate_suite!(GaleraHarness::setup_with(
        orion_beacon::MySqlUpsert::Transaction
    ));
}

job_suite!(GaleraHarness::setup());

/// Offers (a planned handover) on Galera: made through node 0, seen and taken through node 1;
/// a watcher on node 1 following a leader on node 0; ranked candidates across the nodes.
mod offers {
    use super::*;
    conformance_suite!(@cases [cfg(all())] GaleraHarness::setup();
        an_offer_ends_the_term_and_only_the_successor_takes_it,
        an_offer_nobody_takes_lapses_to_a_higher_token,
        bad_offers_are_refused_before_sql,
        a_watcher_follows_the_leader_and_never_leads,
        candidates_are_listed_with_ranks_and_kept_apart,
        the_highest_ranked_live_candidate_comes_to_lead,
        a_successor_that_never_takes_is_backed_off,
    );
}
