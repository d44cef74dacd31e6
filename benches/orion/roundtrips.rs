//! The statements per store call, counted by the server: a private PostgreSQL that logs every
//! statement (`log_statement = 'all'`) and a private MariaDB with its general query log.

use std::path::{Path, PathBuf};
use std::time::Duration;

use orion_beacon::{Lease, LeaseStore, SeaOrmLeaseStore};

use super::*;

/// Which server's log, and what in it is one statement (one round trip the server answers).
#[derive(Clone, Copy)]
enum Log {
    /// `log_statement = 'all'`: `execute <name>:` (extended protocol) and `statement:` (simple).
    Postgres,
    /// The general query log: `Query`, `Execute`, `Prepare` and `Ping` commands.
    MariaDb,
}

impl Log {
    fn counts(self, line: &str) -> bool {
        match self {
            Log::Postgres => {
                line.contains(" LOG:  execute ") || line.contains(" LOG:  statement: ")
            }
            Log::MariaDb => {
                let mut words = line.split('\t').map(str::trim).filter(|w| !w.is_empty());
                // "<time>\t    12 Query\tSELECT ..." or "\t\t    12 Execute\t..."
                words.any(|w| {
                    w.split_whitespace().nth(1).is_some_and(|command| {
                        matches!(command, "Query" | "Execute" | "Prepare" | "Ping")
                    })
                })
            }
        }
    }
}

/// Statements the server logged for `n` calls of `op`, per call. The server is private to the
/// benchmark, so every line logged in the window is one of ours. One round trip per call
/// means 1.0.
async fn per_call<F, Fut>(log: &Path, kind: Log, n: u64, mut op: F) -> Result<f64, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), Error>>,
{
    tokio::time::sleep(Duration::from_millis(300)).await;
    let offset = std::fs::metadata(log)?.len();
    for _ in 0..n {
        op().await?;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let text = std::fs::read(log)?;
    let tail = String::from_utf8_lossy(&text[offset.min(text.len() as u64) as usize..]);
    let statements = tail.lines().filter(|l| kind.counts(l)).count();
    Ok(statements as f64 / n as f64)
}

/// One row: statements per call of each kind for `store`.
async fn row(store: &SeaOrmLeaseStore, log: &Path, kind: Log) -> Result<Vec<f64>, Error> {
    const N: u64 = 200;
    let lease = Duration::from_secs(60);
    // Warm: the connection(s) made and the statements prepared before counting.
    store.acquire_or_renew("rt", "me", lease).await?;
    store.release("rt", "me").await?;
    store.acquire_or_renew("rt", "me", lease).await?;
    let mut held: Vec<Lease> = Vec::new();
    for i in 0..10 {
        if let Some(l) = store
            .acquire_or_renew(&format!("rt-batch-{i}"), "me", lease)
            .await?
            .lease()
        {
            held.push(l.clone());
        }
    }
    store.renew_all(&held, lease).await?;
    store.current("rt").await?;
    let s = store.clone();
    let renew = per_call(log, kind, N, || {
        let s = s.clone();
        async move {
            s.acquire_or_renew("rt", "me", lease).await?;
            Ok(())
        }
    })
    .await?;
    let s = store.clone();
    let denied = per_call(log, kind, N, || {
        let s = s.clone();
        async move {
            s.acquire_or_renew("rt", "other", lease).await?;
            Ok(())
        }
    })
    .await?;
    let s = store.clone();
    let release = per_call(log, kind, N, || {
        let s = s.clone();
        async move {
            s.release("rt", "me").await?;
            s.acquire_or_renew("rt", "me", lease).await?;
            Ok(())
        }
    })
    .await?;
    let s = store.clone();
    let held2 = held.clone();
    let batch = per_call(log, kind, N, || {
        let (s, held) = (s.clone(), held2.clone());
        async move {
            s.renew_all(&held, lease).await?;
            Ok(())
        }
    })
    .await?;
    let s = store.clone();
    let read = per_call(log, kind, N, || {
        let s = s.clone();
        async move {
            s.current("rt").await?;
            Ok(())
        }
    })
    .await?;
    Ok(vec![renew, denied, release, batch, read])
}

/// Round trips, counted by the server, for the store on its own sessions (the default) and on
/// the application's pool (`with_lease_connections(0)`, every statement checked).
pub(crate) async fn roundtrips() -> Result<(), Error> {
    let pg = tokio::task::spawn_blocking(|| {
        orion_beacon_testkit::Postgres::builder()
            .setting("log_statement", "all")
            .start()
    })
    .await??;
    let general_log: PathBuf =
        std::env::temp_dir().join(format!("orion-bench-general-{}.log", std::process::id()));
    let log_arg = format!("--general-log-file={}", general_log.display());
    let maria = tokio::task::spawn_blocking(move || {
        orion_beacon_testkit::MariaDb::builder()
            .arg("--general-log=1")
            .arg(log_arg)
            .start()
    })
    .await??;
    let servers = [
        (
            "PostgreSQL 15",
            pg.url(),
            pg.log_file().to_path_buf(),
            Log::Postgres,
        ),
        (
            "MariaDB 10.11",
            maria.url(),
            general_log.clone(),
            Log::MariaDb,
        ),
    ];
    let mut rows = Vec::new();
    for (name, url, log, kind) in servers {
        let table = unique("obrt");
        let db = connect(&url, 4, false).await?;
        migrate(&db, &table).await?;
        for (how, n) in [
            ("own sessions (default)", 4),
            ("application pool, checked", 0),
        ] {
            let store = SeaOrmLeaseStore::new(db.clone())
                .with_table(&table)?
                .with_release_notifications(false)
                .with_lease_connections(n)?;
            let cells = row(&store, &log, kind).await?;
            rows.push((name, how, cells));
        }
        drop(&db, &table).await;
        db.close().await?;
    }
    println!(
        "\n### Statements per call, from the server's log (200 calls each; PostgreSQL: \
         log_statement = 'all'; MariaDB: the general query log, Query/Execute/Prepare/Ping)\n"
    );
    println!(
        "| backend | store's connections | renew | denied acquire | release + acquire | renew_all (10 leases) | current |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (name, how, cells) in rows {
        let cells: Vec<String> = cells.iter().map(|c| format!("{c:.2}")).collect();
        println!("| {name} | {how} | {} |", cells.join(" | "));
    }
    tokio::task::spawn_blocking(move || {
        std::mem::drop(pg);
        std::mem::drop(maria);
    })
    .await?;
    std::fs::remove_file(&general_log).ok();
    Ok(())
}
