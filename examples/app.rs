//! A small SeaORM application with orion-beacon added, the way the README walks through it:
//! the lease migration in the app's own `Migrator`, one `DatabaseConnection` shared by the app,
//! the elector and its fenced writes, a nightly job run by the leader only.
//!
//! ```sh
//! cargo run --example app --features sqlite                              # a fresh SQLite file
//! cargo run --example app --features sqlite -- sqlite:///tmp/app.db?mode=rwc  # or any URL of a compiled-in backend
//! ```
//!
//! Two instances of the app run in this one process (`node-a`, `node-b`), as two processes
//! would against one database: exactly one runs the job per term, each run is written with its
//! term's fencing token, and the writes are fenced, so a leader that lost its lease cannot
//! write. It exits 0 once a run is recorded and both instances shut down cleanly.

use std::time::Duration;

use orion_beacon::{Elector, ElectorHandle, LeaderTerm, SeaOrmLeaseStore};
// An application's migration crate would import these from sea-orm-migration itself.
use orion_beacon_migration::{
    async_trait, DbErr, MigrationName, MigrationTrait, MigratorTrait, SchemaManager,
};
use sea_orm::sea_query::{Alias, ColumnDef, Query, Table};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, TransactionTrait};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The application's own migration: its `job_runs` table.
struct CreateJobRuns;

impl MigrationName for CreateJobRuns {
    fn name(&self) -> &str {
        "m20261201_000001_create_job_runs"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for CreateJobRuns {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Alias::new("job_runs"))
                    .col(
                        ColumnDef::new(Alias::new("id"))
                            .integer()
                            .not_null()
                            .auto_increment()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(Alias::new("node")).string().not_null())
                    .col(ColumnDef::new(Alias::new("token")).big_integer().not_null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Alias::new("job_runs")).to_owned())
            .await
    }
}

/// The application's `Migrator`, with orion-beacon's migrations added to it (one call, every
/// table in order).
struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        let mut steps: Vec<Box<dyn MigrationTrait>> = vec![Box::new(CreateJobRuns)];
        steps.extend(orion_beacon_migration::migrations());
        steps
    }
}

/// The nightly job: one fenced transaction that records the run with the term's token.
async fn nightly_job(term: LeaderTerm, db: DatabaseConnection) -> Result<(), Error> {
    let txn = db.begin().await?;
    // First in the transaction: refused (roll back) if this term is no longer current.
    term.fence(&txn).await?;
    txn.execute(
        &Query::insert()
            .into_table(Alias::new("job_runs"))
            .columns([Alias::new("node"), Alias::new("token")])
            .values([term.candidate().into(), term.token().get().into()])?
            .to_owned(),
    )
    .await?;
    txn.commit().await?;
    println!(
        "{}: nightly job ran with token {}",
        term.candidate(),
        term.token()
    );
    Ok(())
}

fn start(db: &DatabaseConnection, node: &str) -> Result<ElectorHandle, Error> {
    let handle = Elector::builder(SeaOrmLeaseStore::new(db.clone()))
        .resource("nightly-job")
        .candidate_id(node)
        .lease_duration(Duration::from_secs(3))
        .renew_interval(Duration::from_secs(1))
        .retry_interval(Duration::from_millis(500))
        .build()?
        .start();
    handle.run_as_leader_with(db.clone(), |term, db| async move {
        if let Err(err) = nightly_job(term, db).await {
            eprintln!("nightly job failed: {err}");
        }
    });
    Ok(handle)
}

async fn runs(db: &DatabaseConnection) -> Result<Vec<(String, i64)>, Error> {
    let rows = db
        .query_all(
            &Query::select()
                .columns([Alias::new("node"), Alias::new("token")])
                .from(Alias::new("job_runs"))
                .order_by(Alias::new("id"), sea_orm::Order::Asc)
                .to_owned(),
        )
        .await?;
    rows.iter()
        .map(|row| Ok((row.try_get_by_index(0)?, row.try_get_by_index(1)?)))
        .collect()
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| format!("sqlite://{}?mode=rwc", dir.path().join("app.db").display()));
    let db = Database::connect(&url).await?;
    Migrator::up(&db, None).await?;

    let a = start(&db, "node-a")?;
    let b = start(&db, "node-b")?;
    let give_up = tokio::time::Instant::now() + Duration::from_secs(20);
    while runs(&db).await?.is_empty() {
        if tokio::time::Instant::now() > give_up {
            return Err("no job run within 20 s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let leaders = [&a, &b].iter().filter(|h| h.is_leader()).count();
    a.shutdown().await;
    b.shutdown().await;

    let runs = runs(&db).await?;
    println!("job runs: {runs:?}; leaders at once: {leaders}");
    if leaders > 1 {
        return Err("two leaders at once".into());
    }
    // One run per term, tokens strictly increasing.
    if runs.windows(2).any(|w| w[0].1 >= w[1].1) {
        return Err(format!("tokens not increasing: {runs:?}").into());
    }
    Ok(())
}
