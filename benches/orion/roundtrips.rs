//! The statements per acquire or renew, counted on a private PostgreSQL that logs every statement.

use std::time::Duration;

use orion_beacon::{LeaseStore, SeaOrmLeaseStore};

use super::throughput::pg_statements_per_call;
use super::*;

/// Round trips, counted by the server: the statements a private PostgreSQL instance (started
/// with `log_statement = 'all'`, never an external server) logged for our connection.
pub(crate) async fn roundtrips() -> Result<(), Error> {
    let pg = tokio::task::spawn_blocking(|| {
        orion_beacon_testkit::Postgres::builder()
            .setting("log_statement", "all")
            .start()
    })
    .await??;
    let log = pg.log_file().to_path_buf();
    let table = unique("obrt");
    let db = connect(&pg.url(), 1, false).await?;
    migrate(&db, &table).await?;
    let store = SeaOrmLeaseStore::new(db.clone()).with_table(&table)?;
    store
        .acquire_or_renew("rt", "me", Duration::from_secs(60))
        .await?;
    let s = store.clone();
    let renew = pg_statements_per_call(&db, &log, 200, || {
        let s = s.clone();
        async move {
            s.acquire_or_renew("rt", "me", Duration::from_secs(60))
                .await
                .map(|_| ())
                .map_err(Into::into)
        }
    })
    .await?;
    let s = store.clone();
    let denied = pg_statements_per_call(&db, &log, 200, || {
        let s = s.clone();
        async move {
            s.acquire_or_renew("rt", "other", Duration::from_secs(60))
                .await
                .map(|_| ())
                .map_err(Into::into)
        }
    })
    .await?;
    let s = store.clone();
    let cycle = pg_statements_per_call(&db, &log, 200, || {
        let s = s.clone();
        async move {
            s.release("rt", "me").await?;
            s.acquire_or_renew("rt", "me", Duration::from_secs(60))
                .await?;
            Ok(())
        }
    })
    .await?;
    println!(
        "\nPostgreSQL statements per call, from the server log (log_statement = 'all', 200 calls each): \
         renew {renew:.2}, denied acquire {denied:.2}, release + acquire {cycle:.2}"
    );
    drop(&db, &table).await;
    db.close().await?;
    tokio::task::spawn_blocking(move || std::mem::drop(pg)).await?;
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Handover and failover
