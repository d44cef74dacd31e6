//! The store contract on SQL Server, when `ORION_BEACON_MSSQL_URL` names one (an ADO.NET
//! connection string, e.g. `Server=localhost;Database=test;User Id=sa;Password=...;
//! TrustServerCertificate=True`).
//!
//! No SQL Server can be installed where CI runs, so the server tests are `#[ignore]`d: a plain
//! `cargo test` reports them as ignored (never as passed). Run them against a server with
//! `ORION_BEACON_MSSQL_URL='Server=...;...' cargo test -p orion-beacon-sqlserver --test store -- --include-ignored`;
//! asked to run without the variable, they fail and say so.
//!
//! The tests below the suite need no server and always run.
#[path = "../../tests/common/mod.rs"]
#[macro_use]
mod common;

use std::io::Write as _;

use async_trait::async_trait;
use orion_beacon::{LeaseStore, MembershipStore, StoreError};
use orion_beacon_sqlserver::SqlServerLeaseStore;
use tiberius::SqlBrowser;
use tokio_util::compat::TokioAsyncWriteCompatExt;

use common::conformance::{Harness, LONG};
use common::unique;

const URL_VAR: &str = "ORION_BEACON_MSSQL_URL";

/// The server's connection string. The server tests only run when asked for explicitly
/// (`--include-ignored`), so a missing variable is a failure that says what to set.
fn mssql_url() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            // Straight to the process's stderr, in one write, before failing.
            let line = format!("NOT RUN: SQL Server conformance (set {URL_VAR}=...)\n");
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
            panic!("the SQL Server tests were asked to run, but {URL_VAR} is not set");
        }
    }
}

/// One migrated table of its own on the SQL Server, with its membership table (ranked
/// electors' candidates) and its rate-limit table.
struct MssqlHarness {
    url: String,
    table: String,
    store: SqlServerLeaseStore,
}

impl MssqlHarness {
    async fn setup() -> Option<Self> {
        let url = mssql_url()?;
        let table = unique("obt");
        let store = configure(connect(&url), &table);
        store.migrate().await.expect("migrate the lease table");
        store
            .migrate_members()
            .await
            .expect("migrate the membership table");
        store
            .migrate_rate_limits()
            .await
            .expect("migrate the rate-limit table");
        Some(Self { url, table, store })
    }

    /// Plain T-SQL on a connection of its own, outside the store.
    async fn exec(&self, sql: &str) {
        let config = tiberius::Config::from_ado_string(&self.url).expect("connection string");
        let tcp = tokio::net::TcpStream::connect_named(&config)
            .await
            .expect("reach the SQL Server");
        tcp.set_nodelay(true).expect("nodelay");
        let mut client = tiberius::Client::connect(config, tcp.compat_write())
            .await
            .expect("log in to the SQL Server");
        client.execute(sql, &[]).await.expect(sql);
    }
}

/// A store with a pool of its own; never prints the connection string (it holds a password).
fn connect(url: &str) -> SqlServerLeaseStore {
    SqlServerLeaseStore::new(url).unwrap_or_else(|e| panic!("{URL_VAR} is refused: {e:?}"))
}

/// `store` on the lease table `table` and the membership and rate-limit tables that go with it.
fn configure(store: SqlServerLeaseStore, table: &str) -> SqlServerLeaseStore {
    store
        .with_table(table)
        .and_then(|s| s.with_member_table(common::member_table(table)))
        .and_then(|s| s.with_rate_limit_table(common::rate_table(table)))
        .expect("valid table name")
}

/// The other lease table of [`Harness::store_on_another_lease_table`].
fn other_table(table: &str) -> String {
    format!("{table}_g")
}

#[async_trait]
impl Harness for MssqlHarness {
    type Store = SqlServerLeaseStore;

    fn store(&self) -> SqlServerLeaseStore {
        self.store.clone()
    }

    async fn separate_store(&self) -> SqlServerLeaseStore {
        configure(connect(&self.url).with_max_connections(2), &self.table)
    }

    /// Another lease table, on the harness's membership table.
    async fn store_on_another_lease_table(&self) -> Option<SqlServerLeaseStore> {
        let store = self
            .separate_store()
            .await
            .with_table(other_table(&self.table))
            .expect("valid table name");
        store
            .migrate()
            .await
            .expect("migrate the other lease table");
        Some(store)
    }

    async fn teardown(self) {
        self.exec(&format!(
            "DROP TABLE IF EXISTS [{}]; DROP TABLE IF EXISTS [{}]; DROP TABLE IF EXISTS [{}]; \
             DROP TABLE IF EXISTS [{}];",
            self.table,
            common::member_table(&self.table),
            common::rate_table(&self.table),
            other_table(&self.table),
        ))
        .await;
    }
}

conformance_suite!(
    #[ignore = "needs a SQL Server: set ORION_BEACON_MSSQL_URL and pass --include-ignored"]
    MssqlHarness::setup()
);

lock_suite!(
    #[ignore = "needs a SQL Server: set ORION_BEACON_MSSQL_URL and pass --include-ignored"]
    MssqlHarness::setup()
);

rate_suite!(
    #[ignore = "needs a SQL Server: set ORION_BEACON_MSSQL_URL and pass --include-ignored"]
    MssqlHarness::setup()
);

/// SQL Server specifics, on a server only.
macro_rules! mssql_cases {
    ($($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = "needs a SQL Server: set ORION_BEACON_MSSQL_URL and pass --include-ignored"]
            async fn $case() {
                if let Some(h) = MssqlHarness::setup().await {
                    cases::$case(&h).await;
                    h.teardown().await;
                }
            }
        )*
    };
}

mssql_cases!(
    migrate_is_idempotent,
    missing_table_says_run_the_migration,
    names_compare_byte_for_byte,
    members_heartbeat_list_and_leave,
    members_lapse_and_rejoin,
    missing_member_table_says_run_the_migration,
    candidates_need_the_rank_migration,
);

mod cases {
    use super::*;

    pub async fn migrate_is_idempotent(h: &MssqlHarness) {
        let store = h.store();
        let t = store.acquire_or_renew("m", "a", LONG).await.unwrap();
        // Twice more, and from two stores at once: the table and its row stay.
        store.migrate().await.unwrap();
        let other = h.separate_store().await;
        let (a, b) = tokio::join!(store.migrate(), other.migrate());
        a.unwrap();
        b.unwrap();
        let rec = store.current("m").await.unwrap().unwrap();
        assert_eq!(Some(rec.token), t.token());
        assert!(store.migration_sql().contains(&format!("[{}]", h.table)));
    }

    pub async fn missing_table_says_run_the_migration(h: &MssqlHarness) {
        let store = connect(&h.url)
            .with_table(unique("never_migrated"))
            .unwrap();
        for err in [
            store.acquire_or_renew("r", "a", LONG).await.unwrap_err(),
            store.current("r").await.unwrap_err(),
            store.release("r", "a").await.unwrap_err(),
        ] {
            assert!(matches!(err, StoreError::MissingTable { .. }), "{err:?}");
            let text = err.to_string();
            assert!(
                text.contains("run the migration") && text.contains("never_migrated"),
                "{text}"
            );
            assert!(std::error::Error::source(&err).is_some());
        }
    }

    /// The BIN2 collation: names differing in case or accents are different names.
    pub async fn names_compare_byte_for_byte(h: &MssqlHarness) {
        let store = h.store();
        let r = unique("collation");
        assert!(store
            .acquire_or_renew(&r, "node", LONG)
            .await
            .unwrap()
            .is_held());
        assert!(!store
            .acquire_or_renew(&r, "NODE", LONG)
            .await
            .unwrap()
            .is_held());
        assert!(!store
            .acquire_or_renew(&r, "nöde", LONG)
            .await
            .unwrap()
            .is_held());
        let upper = r.to_uppercase();
        assert!(store.current(&upper).await.unwrap().is_none());
    }

    /// The store with a membership table of its own, created (twice: `migrate_members` is
    /// idempotent); `drop_members` removes it.
    async fn with_members(h: &MssqlHarness) -> SqlServerLeaseStore {
        let store = h
            .store()
            .with_member_table(unique("obm"))
            .expect("valid table name");
        store
            .migrate_members()
            .await
            .expect("migrate the member table");
        store
            .migrate_members()
            .await
            .expect("migrate_members again");
        assert!(store
            .member_migration_sql()
            .contains(&format!("[{}]", store.member_table())));
        store
    }

    async fn drop_members(h: &MssqlHarness, store: &SqlServerLeaseStore) {
        h.exec(&format!("DROP TABLE IF EXISTS [{}];", store.member_table()))
            .await;
    }

    pub async fn members_heartbeat_list_and_leave(h: &MssqlHarness) {
        let store = with_members(h).await;
        let set = unique("set");
        let ttl = std::time::Duration::from_secs(60);
        let first = store.heartbeat(&set, "node-b", ttl, false).await.unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].member, "node-b");
        assert!(!first[0].draining);
        assert!(first[0].remaining > std::time::Duration::from_secs(50));
        assert!(first[0].remaining <= ttl);
        let joined = first[0].joined_at.expect("database times");
        assert_eq!(first[0].heartbeat_at, Some(joined));

        let both = store.heartbeat(&set, "node-a", ttl, true).await.unwrap();
        let ids: Vec<&str> = both.iter().map(|m| m.member.as_str()).collect();
        assert_eq!(ids, ["node-a", "node-b"], "ordered by id");
        assert!(both[0].draining && !both[1].draining);
        // Another set, and a name differing only in case, are other members.
        store
            .heartbeat(&format!("{set}-other"), "node-c", ttl, false)
            .await
            .unwrap();
        store.heartbeat(&set, "NODE-A", ttl, false).await.unwrap();
        let all = store.members(&set).await.unwrap();
        let ids: Vec<&str> = all.iter().map(|m| m.member.as_str()).collect();
        assert_eq!(ids, ["NODE-A", "node-a", "node-b"], "byte order");

        // A renewal keeps joined_at, moves heartbeat_at, and sets draining as told.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let again = store.heartbeat(&set, "node-b", ttl, true).await.unwrap();
        let b = again.iter().find(|m| m.member == "node-b").unwrap();
        assert_eq!(b.joined_at, Some(joined));
        assert!(b.heartbeat_at > Some(joined));
        assert!(b.draining);

        assert!(store.leave(&set, "node-b").await.unwrap());
        assert!(!store.leave(&set, "node-b").await.unwrap(), "already gone");
        let ids: Vec<String> = store
            .members(&set)
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.member)
            .collect();
        assert_eq!(ids, ["NODE-A", "node-a"]);
        assert!(store.members(&unique("empty")).await.unwrap().is_empty());
        drop_members(h, &store).await;
    }

    pub async fn members_lapse_and_rejoin(h: &MssqlHarness) {
        let store = with_members(h).await;
        let set = unique("set");
        let short = std::time::Duration::from_millis(300);
        let long = std::time::Duration::from_secs(60);
        let first = store.heartbeat(&set, "gone", short, false).await.unwrap();
        let joined = first[0].joined_at;
        store.heartbeat(&set, "stays", long, false).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(600)).await;
        let live = store.members(&set).await.unwrap();
        assert_eq!(live.len(), 1, "{live:?}");
        assert_eq!(live[0].member, "stays");
        // Coming back after lapsing is a new membership.
        let back = store.heartbeat(&set, "gone", long, false).await.unwrap();
        let gone = back.iter().find(|m| m.member == "gone").unwrap();
        assert!(gone.joined_at > joined, "{gone:?}");
        // A lapsed member's leave is false, and a leave prunes the set's lapsed rows.
        store.heartbeat(&set, "dies", short, false).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(600)).await;
        assert!(!store.leave(&set, "dies").await.unwrap());
        assert!(store.leave(&set, "gone").await.unwrap());
        let config = tiberius::Config::from_ado_string(&h.url).unwrap();
        let tcp = tokio::net::TcpStream::connect_named(&config).await.unwrap();
        let mut client = tiberius::Client::connect(config, tcp.compat_write())
            .await
            .unwrap();
        let rows = client
            .query(
                format!(
                    "SELECT COUNT(*) FROM [{}] WHERE shard_set = @P1",
                    store.member_table()
                ),
                &[&set.as_str()],
            )
            .await
            .unwrap()
            .into_first_result()
            .await
            .unwrap();
        assert_eq!(
            rows[0].get::<i32, _>(0),
            Some(1),
            "only the live member is left"
        );
        drop_members(h, &store).await;
    }

    pub async fn missing_member_table_says_run_the_migration(h: &MssqlHarness) {
        let table = unique("never_migrated_members");
        let store = h.store().with_member_table(&table).unwrap();
        let ttl = std::time::Duration::from_secs(5);
        for err in [
            store.heartbeat("s", "a", ttl, false).await.unwrap_err(),
            store.members("s").await.unwrap_err(),
            store.leave("s", "a").await.unwrap_err(),
        ] {
            match &err {
                StoreError::MissingTable { table: named, .. } => assert_eq!(named, &table),
                other => panic!("{other:?}"),
            }
            assert!(err.to_string().contains("migrate_members()"), "{err}");
        }
        // The lease table is still there and works.
        assert!(store
            .acquire_or_renew("r", "a", LONG)
            .await
            .unwrap()
            .is_held());
    }

    /// A membership table made before the rank (the first two migrations, by hand) refuses
    /// candidates, naming `AddMemberRank`, while shard sets go on; `migrate_members` then adds
    /// the rank, and the same store takes candidates (a refusal is not remembered).
    pub async fn candidates_need_the_rank_migration(h: &MssqlHarness) {
        let store = h
            .store()
            .with_member_table(unique("obm_norank"))
            .expect("valid table name");
        h.exec(&store.member_migration_sql()).await;
        h.exec(&store.holding_migration_sql()).await;
        let members = store.membership().expect("the store keeps candidates");
        let ttl = std::time::Duration::from_secs(30);
        for err in [
            members
                .candidate_heartbeat("r", "a", ttl, 1)
                .await
                .unwrap_err(),
            members.candidates("r").await.unwrap_err(),
        ] {
            match &err {
                StoreError::OutdatedSchema {
                    table, migration, ..
                } => {
                    assert_eq!(table, store.member_table());
                    assert_eq!(*migration, "AddMemberRank");
                }
                other => panic!("{other:?}"),
            }
            assert!(err.to_string().contains("migrate_members()"), "{err}");
        }
        // Shard sets do not need the rank.
        let joined = store.heartbeat("s", "node", ttl, false).await.unwrap();
        assert_eq!(joined.len(), 1, "{joined:?}");
        assert!(!members.candidate_leave("r", "a").await.unwrap());
        store.migrate_members().await.expect("add the rank");
        let listed = members.candidate_heartbeat("r", "a", ttl, 4).await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!((listed[0].candidate.as_str(), listed[0].rank), ("a", 4));
        // The shard set's member is no candidate, and the candidate no member of the set.
        assert_eq!(store.members("s").await.unwrap().len(), 1);
        assert!(members.candidate_leave("r", "a").await.unwrap());
        drop_members(h, &store).await;
    }
}

// No server needed from here on.

#[test]
fn bad_table_names_are_refused() {
    for bad in [
        "",
        "x; DROP TABLE y",
        "a]b",
        "a\"b",
        "a`b",
        "1x",
        &"t".repeat(64),
    ] {
        let err = connect("Server=localhost;Database=app;User Id=sa;Password=secret")
            .with_table(bad)
            .unwrap_err();
        assert!(
            matches!(err, StoreError::InvalidTableName(_)),
            "{bad:?}: {err:?}"
        );
        let err = connect("Server=localhost;Database=app;User Id=sa;Password=secret")
            .with_member_table(bad)
            .unwrap_err();
        assert!(
            matches!(err, StoreError::InvalidTableName(_)),
            "{bad:?}: {err:?}"
        );
    }
}

#[test]
fn bad_connection_strings_are_refused() {
    let err = SqlServerLeaseStore::new("Server=localhost,port;Database=app").unwrap_err();
    assert!(matches!(err, StoreError::InvalidConnectionString { .. }));
    assert!(
        std::error::Error::source(&err).is_some(),
        "tiberius' error is kept"
    );
}

/// Bad input is refused before any connection is tried (nothing listens on port 1), and an
/// unreachable server is an error, not a hang.
#[tokio::test]
async fn bad_input_is_refused_before_connecting_and_unreachable_is_an_error() {
    let store = connect("Server=127.0.0.1,1;Database=app;User Id=sa;Password=secret;Encrypt=false");
    assert!(matches!(
        store.acquire_or_renew("", "a", LONG).await,
        Err(StoreError::InvalidResource { .. })
    ));
    assert!(matches!(
        store.acquire_or_renew(&"𝄞".repeat(200), "a", LONG).await,
        Err(StoreError::InvalidResource { .. })
    ));
    assert!(matches!(
        store.release("r", " a").await,
        Err(StoreError::InvalidCandidate { .. })
    ));
    assert!(matches!(
        store
            .acquire_or_renew("r", "a", std::time::Duration::ZERO)
            .await,
        Err(StoreError::InvalidLeaseDuration { .. })
    ));
    let err = tokio::time::timeout(std::time::Duration::from_secs(30), store.current("r"))
        .await
        .expect("no hang")
        .unwrap_err();
    assert!(matches!(err, StoreError::Database(_)), "{err:?}");
    assert!(std::error::Error::source(&err).is_some());
    // Membership input too: names, the UTF-16 bound, the time to live.
    let ttl = std::time::Duration::from_secs(5);
    assert!(matches!(
        store.heartbeat("", "a", ttl, false).await,
        Err(StoreError::InvalidShardSet { .. })
    ));
    assert!(matches!(
        store.heartbeat(&"𝄞".repeat(200), "a", ttl, false).await,
        Err(StoreError::InvalidShardSet { .. })
    ));
    assert!(matches!(
        store.heartbeat("s", "a\n", ttl, false).await,
        Err(StoreError::InvalidCandidate { .. })
    ));
    assert!(matches!(
        store
            .heartbeat("s", "a", std::time::Duration::ZERO, false)
            .await,
        Err(StoreError::InvalidLeaseDuration { .. })
    ));
    assert!(matches!(
        store.leave(" s", "a").await,
        Err(StoreError::InvalidShardSet { .. })
    ));
    assert!(matches!(
        store.members("s\t").await,
        Err(StoreError::InvalidShardSet { .. })
    ));
    let err = tokio::time::timeout(std::time::Duration::from_secs(30), store.members("s"))
        .await
        .expect("no hang")
        .unwrap_err();
    assert!(matches!(err, StoreError::Database(_)), "{err:?}");
    // Candidates' input too, with their stored name's bound (the lease table's name and the
    // resource, in UTF-16 code units).
    let members = store.membership().expect("the store keeps candidates");
    for (resource, candidate, ttl) in [
        ("", "a", ttl),
        (" r", "a", ttl),
        ("r", "", ttl),
        ("r", "a\n", ttl),
        ("r", "a", std::time::Duration::ZERO),
        (&*"𝄞".repeat(118), "a", ttl),
        (&*"x".repeat(235), "a", ttl),
    ] {
        let err = members
            .candidate_heartbeat(resource, candidate, ttl, 1)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::InvalidResource { .. }
                    | StoreError::InvalidCandidate { .. }
                    | StoreError::InvalidLeaseDuration { .. }
            ),
            "{resource:?}/{candidate:?}: {err:?}"
        );
    }
    assert!(matches!(
        members.candidate_leave(&"𝄞".repeat(118), "a").await,
        Err(StoreError::InvalidResource { .. })
    ));
    assert!(matches!(
        members.candidate_leave("r", " a").await,
        Err(StoreError::InvalidCandidate { .. })
    ));
    assert!(matches!(
        members.candidates("r\t").await,
        Err(StoreError::InvalidResource { .. })
    ));
    let err = tokio::time::timeout(std::time::Duration::from_secs(30), members.candidates("r"))
        .await
        .expect("no hang")
        .unwrap_err();
    assert!(matches!(err, StoreError::Database(_)), "{err:?}");
    let err = SqlServerLeaseStore::connect(
        "Server=127.0.0.1,1;Database=app;User Id=sa;Password=secret;Encrypt=false",
    )
    .await
    .unwrap_err();
    assert!(matches!(err, StoreError::Database(_)), "{err:?}");
}

/// The SQL Server store shows its backend and tables, never the T-SQL or the connection string.
#[test]
fn the_sql_server_store_reads_well() {
    let secret = "hunter2-s3cret";
    let store = SqlServerLeaseStore::new(&format!(
        "Server=localhost;Database=app;User Id=sa;Password={secret};TrustServerCertificate=True"
    ))
    .unwrap()
    .with_table("my_leases")
    .unwrap();
    let debug = format!("{store:?}");
    for word in ["MERGE", "SELECT", "Password", "password", "Pool", secret] {
        assert!(!debug.contains(word), "the Debug shows {word:?}: {debug}");
    }
    assert!(debug.len() <= 200, "{} bytes: {debug}", debug.len());
    assert!(
        debug.contains("SQL Server") && debug.contains("my_leases"),
        "{debug}"
    );
    assert!(!debug.contains("MERGE"), "{debug}");
}
