//! A paused leader's write is refused while the new leader's goes through.
//!
//! ```sh
//! cargo run --example fenced_writes --features sqlite
//! ```
//!
//! Leader A takes the lease, then "pauses" (think GC or SIGSTOP) past its lease. B takes over
//! with a higher token. A wakes up still believing it leads and tries to write inside a fenced
//! transaction: the database refuses. B's fenced write commits.

use std::time::Duration;

use orion_beacon::{store::LeaseOutcome, FenceError, LeaseStore, SeaOrmLeaseStore, Term};
use orion_beacon_migration::{Migrator, MigratorTrait};
use sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait};

type Error = Box<dyn std::error::Error + Send + Sync>;

const LEASE: Duration = Duration::from_secs(1);

async fn write_report(
    db: &DatabaseConnection,
    store: &SeaOrmLeaseStore,
    term: Term<'_>,
    body: &str,
) -> Result<(), Error> {
    let txn = db.begin().await?;
    match store.fence(&txn, term).await {
        Ok(()) => {
            txn.execute_raw(sea_orm::Statement::from_sql_and_values(
                txn.get_database_backend(),
                "INSERT INTO reports (token, body) VALUES (?, ?)",
                [term.token.get().into(), body.into()],
            ))
            .await?;
            txn.commit().await?;
            println!("  {} (token {}): write committed", term.holder, term.token);
        }
        Err(FenceError::Fenced { .. }) => {
            txn.rollback().await?;
            println!(
                "  {} (token {}): write REFUSED: no longer the leader",
                term.holder, term.token
            );
        }
        Err(other) => return Err(other.into()),
    }
    Ok(())
}

fn token(out: &LeaseOutcome) -> Result<orion_beacon::FencingToken, Error> {
    out.token()
        .ok_or_else(|| format!("expected to lead: {out:?}").into())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("app.db").display());
    let db =
        sea_orm::Database::connect(orion_beacon::backend::sqlite::connect_options(url)).await?;
    Migrator::up(&db, None).await?;
    db.execute_unprepared("CREATE TABLE reports (token INTEGER NOT NULL, body TEXT NOT NULL)")
        .await?;
    let store = SeaOrmLeaseStore::new(db.clone());

    let a = token(
        &store
            .acquire_or_renew("nightly-report", "node-a", LEASE)
            .await?,
    )?;
    println!("node-a leads with token {a}");
    write_report(
        &db,
        &store,
        Term {
            resource: "nightly-report",
            holder: "node-a",
            token: a,
        },
        "first half",
    )
    .await?;

    println!("node-a pauses for 1.5 s (longer than its 1 s lease)...");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let b = token(
        &store
            .acquire_or_renew("nightly-report", "node-b", LEASE)
            .await?,
    )?;
    println!("node-b takes over with token {b}");

    println!("node-a wakes up, still believing it leads, and writes:");
    write_report(
        &db,
        &store,
        Term {
            resource: "nightly-report",
            holder: "node-a",
            token: a,
        },
        "stale second half",
    )
    .await?;
    println!("node-b writes:");
    write_report(
        &db,
        &store,
        Term {
            resource: "nightly-report",
            holder: "node-b",
            token: b,
        },
        "second half",
    )
    .await?;

    let rows = db
        .query_all_raw(sea_orm::Statement::from_string(
            db.get_database_backend(),
            "SELECT token, body FROM reports",
        ))
        .await?;
    println!("reports table:");
    for row in rows {
        let (token, body): (i64, String) = (row.try_get_by_index(0)?, row.try_get_by_index(1)?);
        println!("  token {token}: {body}");
    }
    Ok(())
}
