//! Values as a user meets them. What logs show: the `Debug` of every public type a user holds
//! names the resource, the candidate, the token, the time left and the backend, and never SQL,
//! a pool or a password; a term's is short enough to log on every change, and a 16-shard
//! assignment's too; errors read like their message. And a `FencingToken` is a column type of
//! the application's own SeaORM entities.

use crate::common;

use std::time::Duration;

use orion_beacon::{Elector, LeaseStore, SeaOrmLeaseStore, ShardSet};
use sea_orm::{ConnectionTrait, DatabaseConnection};

use common::{member_table, migrate, unique, Server};

/// Words that only appear in SQL or in a pool's options.
const NEVER: [&str; 8] = [
    "INSERT",
    "SELECT",
    "UPDATE",
    "ON CONFLICT",
    "password",
    "max_connections",
    "Pool",
    "prepared",
];

fn assert_readable(what: &str, debug: &str, max_len: usize, secret: Option<&str>) {
    for word in NEVER {
        assert!(
            !debug.contains(word),
            "{what}'s Debug shows {word:?}: {debug}"
        );
    }
    if let Some(secret) = secret {
        assert!(
            !debug.contains(secret),
            "{what}'s Debug shows the password: {debug}"
        );
    }
    assert!(
        debug.len() <= max_len,
        "{what}'s Debug is {} bytes (at most {max_len}): {debug}",
        debug.len()
    );
}

/// An elector and a 16-shard set on `db`, and every value a user holds of them.
async fn values_read_well(db: DatabaseConnection, backend: &str, secret: Option<&str>) {
    let table = unique("readable");
    migrate(&db, &table).await;
    let store = SeaOrmLeaseStore::new(db)
        .with_table(&table)
        .unwrap()
        .with_member_table(member_table(&table))
        .unwrap();
    let debug = format!("{store:?}");
    assert_readable("SeaOrmLeaseStore", &debug, 300, secret);
    assert!(debug.contains(backend) && debug.contains(&table), "{debug}");

    let resource = unique("nightly");
    let builder = Elector::builder(store.clone())
        .resource(&resource)
        .candidate_id("node-a");
    assert_readable("ElectorBuilder", &format!("{builder:?}"), 600, secret);
    let elector = builder.build().unwrap();
    assert_readable("Elector", &format!("{elector:?}"), 600, secret);
    let handle = elector.start();
    let mut watch = handle.watch();
    let leadership = watch.wait_for(|l| l.is_leader()).await.unwrap();
    let term = leadership.term().unwrap().clone();
    let debug = format!("{term:?}");
    assert_readable("LeaderTerm", &debug, 200, secret);
    for part in [
        resource.as_str(),
        "node-a",
        &format!("token: {}", term.token().get()),
        "remaining",
        backend,
    ] {
        assert!(
            debug.contains(part),
            "LeaderTerm's Debug lacks {part:?}: {debug}"
        );
    }
    assert_readable("Leadership", &format!("{leadership:?}"), 250, secret);
    assert_readable("ElectorHandle", &format!("{handle:?}"), 400, secret);
    handle.shutdown().await;
    let debug = format!("{term:?}");
    assert!(debug.contains("ended"), "an ended term says so: {debug}");

    let shards: Vec<String> = (0..16).map(|i| format!("{resource}-{i}")).collect();
    let set = ShardSet::builder(store.clone())
        .name(unique("set"))
        .resources(shards)
        .member_id("node-a")
        .lease_duration(Duration::from_secs(10))
        .interval(Duration::from_millis(200));
    assert_readable("ShardSetBuilder", &format!("{set:?}"), 3_000, secret);
    let set = set.build().unwrap();
    assert_readable("ShardSet", &format!("{set:?}"), 400, secret);
    let node = set.start();
    let mut watch = node.watch();
    let assignment = watch.wait_for(|a| a.current().count() == 16).await.unwrap();
    // 16 terms of about 150 bytes each, not 16 stores.
    assert_readable("Assignment", &format!("{assignment:?}"), 16 * 200, secret);
    assert_readable("ShardHandle", &format!("{node:?}"), 16 * 200 + 300, secret);
    node.shutdown().await;
    let lease = store
        .acquire_or_renew(&unique("lease"), "node-a", Duration::from_secs(5))
        .await
        .unwrap();
    assert_readable("LeaseOutcome", &format!("{lease:?}"), 400, secret);
}

/// The in-memory store counts what it holds; it never lists it (one elector's term would
/// otherwise print every lease and member of the store with it).
#[tokio::test]
async fn the_memory_store_reads_well() {
    use orion_beacon::InMemoryLeaseStore;
    let store = InMemoryLeaseStore::new();
    for i in 0..100 {
        store
            .acquire_or_renew(&format!("shard-{i}"), "node-a", Duration::from_secs(5))
            .await
            .unwrap();
    }
    let debug = format!("{store:?}");
    assert_eq!(
        debug,
        "InMemoryLeaseStore { backend: \"memory\", resources: 100, members: 0, .. }"
    );
    assert_readable("InMemoryLeaseStore", &debug, 120, None);
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn values_read_well_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = common::connect_sqlite(&dir.path().join("leases.db"), 4).await;
    values_read_well(db, "SQLite", None).await;
}

/// The URL carries a password (the private server trusts every local connection, so any
/// password connects): no `Debug` shows it.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_read_well_on_postgres_and_hide_the_password() {
    if Server::Postgres.skipped() {
        return;
    }
    let secret = "hunter2-s3cret";
    let url = Server::Postgres.private_url();
    let with_password = url.replacen("://postgres@", &format!("://postgres:{secret}@"), 1);
    assert_ne!(
        url, with_password,
        "the private server's URL names user postgres: {url}"
    );
    let db = common::connect_url(&with_password, 4).await;
    values_read_well(db, "PostgreSQL", Some(secret)).await;
}

/// What `fn main() -> Result<(), Box<dyn Error>>` and `unwrap()` print of our errors: the
/// message, which crate and type speak, and the causes, not a tree of variant names.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn errors_read_like_their_message_and_name_the_crate() {
    let err = Elector::builder_in_memory()
        .resource("nightly")
        .lease_duration(Duration::from_secs(10))
        .build()
        .unwrap_err();
    assert_eq!(
        format!("{err:?}"),
        format!("orion-beacon ConfigError: {err}"),
    );
    assert!(
        err.to_string()
            .ends_with("renew_interval 4.5s or less would do (or a longer lease_duration)"),
        "{err}"
    );

    // A database error: the causes follow, one per line.
    let dir = tempfile::tempdir().unwrap();
    let db = common::connect_sqlite(&dir.path().join("leases.db"), 2).await;
    let store = SeaOrmLeaseStore::new(db)
        .with_table("never_migrated")
        .unwrap();
    let err = store
        .acquire_or_renew("r", "me", Duration::from_secs(5))
        .await
        .unwrap_err();
    let debug = format!("{err:?}");
    assert!(
        debug.starts_with(&format!("orion-beacon StoreError: {err}")),
        "{debug}"
    );
    assert!(debug.contains("\n  caused by: "), "{debug}");
    assert!(
        !debug.contains("Query(") && !debug.contains("SqlxError"),
        "{debug}"
    );
}

/// The errors that come before any SQL (options, table names, a watch whose loop ended) read
/// the same way, and say a value that would work.
#[tokio::test]
async fn option_errors_name_the_crate_and_suggest_a_value() {
    let zero = Elector::builder_in_memory()
        .resource("nightly")
        .renew_interval(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(
        format!("{zero:?}"),
        format!("orion-beacon ConfigError: {zero}")
    );
    assert!(
        zero.to_string().contains("leave it unset for the default"),
        "{zero}"
    );
    let slack = ShardSet::builder(orion_beacon::InMemoryLeaseStore::new())
        .name("set")
        .resources(["a", "b"])
        .slack(3)
        .build()
        .unwrap_err();
    assert!(slack.to_string().contains("2 or less would do"), "{slack}");

    let name = orion_beacon::entity::validate_table_name("").unwrap_err();
    assert_eq!(
        format!("{name:?}"),
        format!("orion-beacon TableNameError: {name}")
    );

    let elector = Elector::builder_in_memory()
        .resource("r")
        .build()
        .unwrap()
        .start();
    let mut watch = elector.watch();
    elector.shutdown().await;
    let closed = loop {
        if let Err(e) = watch.changed().await {
            break e;
        }
    };
    assert_eq!(
        format!("{closed:?}"),
        format!("orion-beacon WatchClosed: {closed}")
    );
}

/// An application's entity with a `FencingToken` column (and an optional one), written through
/// its `ActiveModel` inside a fenced transaction and read back and filtered on by token.
mod report {
    use orion_beacon::FencingToken;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "reports")]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub body: String,
        pub written_by: FencingToken,
        pub superseded_by: Option<FencingToken>,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

async fn a_token_is_an_entity_column(db: DatabaseConnection) {
    use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, Set, TransactionTrait};
    let table = unique("tokens");
    migrate(&db, &table).await;
    let backend = db.get_database_backend();
    db.execute_raw(
        backend.build(
            sea_orm::Schema::new(backend)
                .create_table_from_entity(report::Entity)
                .if_not_exists(),
        ),
    )
    .await
    .unwrap();
    let store = SeaOrmLeaseStore::new(db.clone())
        .with_table(&table)
        .unwrap();
    let elector = Elector::builder(store)
        .resource(unique("nightly"))
        .build()
        .unwrap()
        .start();
    let leadership = elector.watch().wait_for(|l| l.is_leader()).await.unwrap();
    let term = leadership.term().unwrap().clone();

    let txn = db.begin().await.unwrap();
    term.fence(&txn).await.unwrap();
    let written = report::ActiveModel {
        body: Set("tonight".into()),
        written_by: Set(term.token()),
        superseded_by: Set(None),
        ..Default::default()
    }
    .insert(&txn)
    .await
    .unwrap();
    txn.commit().await.unwrap();
    assert_eq!(written.written_by, term.token());

    let found = report::Entity::find()
        .filter(report::Column::WrittenBy.eq(term.token()))
        .filter(report::Column::SupersededBy.is_null())
        .all(&db)
        .await
        .unwrap();
    assert_eq!(found, vec![written.clone()]);
    let later = orion_beacon::FencingToken::new(term.token().get() + 1);
    let mut update: report::ActiveModel = written.into();
    update.superseded_by = Set(Some(later));
    let updated = update.update(&db).await.unwrap();
    assert_eq!(updated.superseded_by, Some(later));
    assert!(report::Entity::find()
        .filter(report::Column::WrittenBy.gt(later))
        .all(&db)
        .await
        .unwrap()
        .is_empty());
    elector.shutdown().await;
    db.execute_unprepared("DROP TABLE reports").await.unwrap();
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_token_is_an_entity_column_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = common::connect_sqlite(&dir.path().join("leases.db"), 4).await;
    a_token_is_an_entity_column(db).await;
}

/// (The entity's table, `reports`, is this test's alone.)
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_an_entity_column_on_postgres() {
    if Server::Postgres.skipped() {
        return;
    }
    let db = Server::Postgres.connect(4).await;
    a_token_is_an_entity_column(db).await;
}
