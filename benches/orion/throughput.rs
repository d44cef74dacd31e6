//! Store throughput next to pgbench running the same statement, with client and database CPU per call.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use orion_beacon::{LeaseStore, SeaOrmLeaseStore, StoreError};
use sea_orm::ConnectionTrait;
use tokio::time::Instant;

use super::*;

/// `clients` tasks on this (2-worker) runtime, each acquiring-or-renewing its own resource in
/// a loop for `d`, on one shared pool.
pub(crate) async fn store_rate(
    store: &SeaOrmLeaseStore,
    clients: usize,
    d: Duration,
    server: Option<cpu::Server>,
) -> Result<Rate, Error> {
    let done = Arc::new(AtomicU64::new(0));
    let (cpu0, db0) = (cpu::process(), server.map(|s| s.cpu()));
    let start = Instant::now();
    let stop = start + d;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (store, done) = (store.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let resource = format!("bench-{c}");
            let mut n = 0;
            while Instant::now() < stop {
                store
                    .acquire_or_renew(&resource, "bench", Duration::from_secs(60))
                    .await?;
                n += 1;
            }
            done.fetch_add(n, Ordering::Relaxed);
            Ok::<_, StoreError>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let wall = start.elapsed();
    Ok(Rate::new(
        done.load(Ordering::Relaxed),
        wall,
        cpu::process() - cpu0,
        cpu::delta(server, db0),
    ))
}

/// What each client of [`store_rate_threaded`] runs in its loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// `acquire_or_renew`, the store's call, on its own sessions (as many as the thread's
    /// pool has connections).
    Store,
    /// `acquire_or_renew` on the application's pool, every statement checked
    /// (`with_lease_connections(0)`).
    StoreChecked,
    /// The store's acquire-or-renew statement (`acquire_statement`, the very text pgbench
    /// runs) sent through SeaORM (`query_all_raw`), without the store's check: what the
    /// client stack costs for one statement.
    Statement,
    /// The same statement on a plain sqlx `PgConnection` of the client's own (no pool, no
    /// SeaORM, no store): the floor of the Rust client stack the store is built on.
    Sqlx,
    /// [`Op::Sqlx`] with each call under a 30 s `tokio::time::timeout`, as services bound
    /// their queries: the runtime then has a timer armed while it waits for the answer, as
    /// the store has (its takeover's first look).
    SqlxTimeout,
}

/// The loop with pgbench's threading (`-j min(clients, 2)`): each of `threads` OS threads runs
/// a current-thread runtime with its own pool of `clients / threads` connections (times
/// `BENCH_POOL_MULT`) and its own clients, so no call wakes a task on another thread.
pub(crate) fn store_rate_threaded(
    url: &str,
    table: &str,
    clients: usize,
    d: Duration,
    op: Op,
    server: Option<cpu::Server>,
) -> Result<Rate, Error> {
    let (url, table) = (url.to_owned(), table.to_owned());
    let (calls, (cpu0, db0, start)) = on_threads(
        clients,
        || (cpu::process(), server.map(|s| s.cpu()), Instant::now()),
        move |mine, go| {
            let (url, table) = (url.clone(), table.clone());
            async move {
                let size = mine.len() * pool_mult();
                let db = connect(&url, size as u32, false).await;
                // sqlx alone: the clients' connections, opened before the clock starts.
                let mut plain = if matches!(op, Op::Sqlx | Op::SqlxTimeout) {
                    plain_connections(&url, mine.len()).await
                } else {
                    Vec::new()
                };
                go.wait(); // even on error, so the others are not left waiting
                let sessions = if op == Op::StoreChecked {
                    0
                } else {
                    size.min(64)
                };
                let store = SeaOrmLeaseStore::new(db?)
                    .with_table(&table)?
                    .with_lease_connections(sessions)?;
                let stop = Instant::now() + d;
                let lease = Duration::from_secs(60);
                let tasks: Vec<_> = mine
                    .into_iter()
                    .map(|c| {
                        let store = store.clone();
                        let conn = plain.pop();
                        tokio::spawn(async move {
                            let resource = format!("bench-{c}");
                            let stmt = store.acquire_statement(&resource, "bench", lease)?;
                            if let Some(conn) = conn {
                                let timeout = op == Op::SqlxTimeout;
                                return plain_client(conn?, &[stmt], stop, timeout).await;
                            }
                            let mut n = 0u64;
                            while Instant::now() < stop {
                                match op {
                                    Op::Store | Op::StoreChecked => {
                                        store.acquire_or_renew(&resource, "bench", lease).await?;
                                    }
                                    Op::Statement | Op::Sqlx | Op::SqlxTimeout => {
                                        store.connection().query_all_raw(stmt.clone()).await?;
                                    }
                                }
                                n += 1;
                            }
                            Ok::<_, Error>(n)
                        })
                    })
                    .collect();
                calls_of(tasks).await
            }
        },
    )?;
    let wall = start.elapsed();
    mark_cell(&format!("{op:?}, {clients} clients"), start);
    Ok(Rate::new(
        calls,
        wall,
        cpu::process() - cpu0,
        cpu::delta(server, db0),
    ))
}

/// pgbench running the store's exact acquire-or-renew statement, prepared, one resource per
/// client; with `check`, followed by the store's second statement on PostgreSQL (`SELECT
/// transaction_timestamp()`, the autocommit check), i.e. the two statements one call sends.
/// A call is one run of the script. Client CPU is pgbench's own (its rusage as our child).
pub(crate) fn pgbench_rate(
    url: &str,
    store: &SeaOrmLeaseStore,
    clients: usize,
    d: Duration,
    check: bool,
    server: Option<cpu::Server>,
) -> Result<Rate, Error> {
    let stmt = store.acquire_statement("RESOURCE", "bench", Duration::from_secs(60))?;
    let mut text = format!("{};\n", pgbench_sql(stmt)?);
    if check {
        text.push_str("SELECT transaction_timestamp();\n");
    }
    let script = PathBuf::from("target/orion-bench").join(if check {
        "acquire-checked.sql"
    } else {
        "acquire.sql"
    });
    pgbench_script_rate(url, &script, &text, clients, d, server)
}

/// `stmt` as pgbench script text: its bound values as literals, and the resource `RESOURCE`
/// as one per client (`'bench-' || :client_id`).
pub(crate) fn pgbench_sql(stmt: sea_orm::Statement) -> Result<String, Error> {
    let values = stmt.values.map(|v| v.0).unwrap_or_default();
    let mut sql = stmt.sql;
    // $n -> a literal (or the per-client resource), highest number first so $1 does not eat $10.
    for (i, v) in values.iter().enumerate().rev() {
        let literal = match v {
            sea_orm::Value::String(Some(s)) if s == "RESOURCE" => {
                "('bench-' || :client_id)".to_owned()
            }
            sea_orm::Value::String(Some(s)) => format!("'{s}'"),
            sea_orm::Value::BigInt(Some(n)) => format!("{n}::bigint"),
            sea_orm::Value::Int(Some(n)) => n.to_string(),
            sea_orm::Value::Bool(Some(b)) => b.to_string(),
            // No payload (the statement of a table with the payload columns).
            sea_orm::Value::String(None) => "NULL::text".to_owned(),
            other => return Err(format!("unexpected value {other:?}").into()),
        };
        sql = sql.replace(&format!("${}", i + 1), &literal);
    }
    Ok(sql)
}

/// pgbench running the script `text` (written to `script`), prepared, `clients` clients, for
/// `d`. A call is one run of the script.
pub(crate) fn pgbench_script_rate(
    url: &str,
    script: &std::path::Path,
    text: &str,
    clients: usize,
    d: Duration,
    server: Option<cpu::Server>,
) -> Result<Rate, Error> {
    if let Some(dir) = script.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(script, text)?;
    let (cpu0, db0, start) = (cpu::children(), server.map(|s| s.cpu()), Instant::now());
    let out = std::process::Command::new("pgbench")
        .args([
            "-n",
            "-M",
            "prepared",
            "-c",
            &clients.to_string(),
            "-j",
            &clients.min(2).to_string(),
        ])
        .args(["-T", &d.as_secs().to_string(), "-f"])
        .arg(script)
        .arg(url)
        .output()?;
    let (client, db) = (cpu::children() - cpu0, cpu::delta(server, db0));
    let wall = start.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |prefix: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
    };
    let tps = field("tps = ").ok_or_else(|| {
        format!(
            "no tps in pgbench output: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let calls = field("number of transactions actually processed: ")
        .unwrap_or(tps * d.as_secs_f64()) as u64;
    // pgbench's own rate excludes its connection set-up; CPU per call is over all of it.
    let mut rate = Rate::new(calls, wall, client, db);
    rate.per_s = tps;
    Ok(rate)
}

pub(crate) async fn throughput() -> Result<(), Error> {
    let d = secs();
    // BENCH_PG_DURABLE=1: a private PostgreSQL with Debian's durability defaults (fsync and
    // full_page_writes on) instead of the test kit's; put it on a disk with
    // ORION_TESTKIT_TMPDIR (in /dev/shm an fsync costs nothing).
    let durable =
        if std::env::var_os("BENCH_PG_DURABLE").is_some() && !external("ORION_BEACON_PG_URL") {
            Some(
                tokio::task::spawn_blocking(|| {
                    orion_beacon_testkit::Postgres::builder()
                        .setting("fsync", "on")
                        .setting("full_page_writes", "on")
                        .start()
                })
                .await??,
            )
        } else {
            None
        };
    let (url, server) = match &durable {
        Some(pg) => (pg.url(), cpu::Server::new(pg.pid())),
        None => (pg_url(), cpu::postgres()),
    };
    if durable.is_some() {
        println!("\n(throughput: a private PostgreSQL with fsync = on, full_page_writes = on)");
    }
    let table = unique("obbench");
    let mut pg_rows = Vec::new();
    for clients in client_counts() {
        let db = connect(&url, (clients * pool_mult()) as u32, false).await?;
        migrate(&db, &table).await?;
        let store = SeaOrmLeaseStore::new(db.clone())
            .with_table(&table)?
            .with_lease_connections((clients * pool_mult()).min(64))?;
        let threaded = |op: Op| {
            let (url, table) = (url.clone(), table.clone());
            tokio::task::spawn_blocking(move || {
                store_rate_threaded(&url, &table, clients, d, op, server)
            })
        };
        // The cells one after the other, `BENCH_REPEATS` times: a slow moment of the machine
        // then hits one repeat of every cell rather than all repeats of one.
        let mut reps = Vec::new();
        for _ in 0..repeats() {
            let pgbench = pgbench_rate(&url, &store, clients, d, false, server)?;
            let ours = store_rate(&store, clients, d, server).await?;
            let per_thread = threaded(Op::Store).await??;
            let statement = threaded(Op::Statement).await??;
            let checked = threaded(Op::StoreChecked).await??;
            let pgbench2 = pgbench_rate(&url, &store, clients, d, true, server)?;
            let sqlx = threaded(Op::Sqlx).await??;
            let sqlx_timeout = threaded(Op::SqlxTimeout).await??;
            reps.push([
                pgbench,
                ours,
                per_thread,
                statement,
                checked,
                pgbench2,
                sqlx,
                sqlx_timeout,
            ]);
        }
        drop(&db, &table).await;
        db.close().await?;
        pg_rows.push((clients, reps));
    }
    // Per cell: the median rate and CPU over the repeats; ratios: the median of each repeat's
    // own ratio (the cells of one repeat ran within a minute of each other).
    let cell = |reps: &[[Rate; 8]], k: usize| -> Rate {
        let db: Vec<f64> = reps.iter().filter_map(|r| r[k].db_us).collect();
        Rate {
            per_s: median(reps.iter().map(|r| r[k].per_s).collect()),
            client_us: median(reps.iter().map(|r| r[k].client_us).collect()),
            db_us: (!db.is_empty()).then(|| median(db)),
        }
    };
    let ratio = |reps: &[[Rate; 8]], k: usize, of: usize| -> f64 {
        median(reps.iter().map(|r| r[k].per_s / r[of].per_s).collect())
    };
    println!(
        "\n## Store throughput (acquire-or-renew, one resource per client, {}s per cell, medians of {} repeats)\n",
        d.as_secs(),
        repeats()
    );
    println!(
        "Calls per second. pgbench: the store's acquire-or-renew statement, prepared (\"1 \
         statement\"), or that statement and the autocommit check `SELECT \
         transaction_timestamp()` (\"2 statements\": what one call sends on the application's \
         pool). orion-beacon: `acquire_or_renew` on the store's own sessions (as many as the \
         pool's connections), in tasks on one 2-worker runtime, or with pgbench's threading (a \
         current-thread runtime and a store per thread, `-j min(clients, 2)`). SeaORM, 1 \
         statement: the store's statement sent through SeaORM's pool without the check, \
         pgbench's threading. Application pool, checked: `with_lease_connections(0)`, \
         pgbench's threading. sqlx alone, 1 statement: the store's statement on a plain sqlx \
         `PgConnection` per client (no pool, no SeaORM, no store), pgbench's threading; under \
         a timeout: each call in a 30 s `tokio::time::timeout`. Ratios are to pgbench, 1 statement, unless named.\n"
    );
    println!("| backend | clients | pgbench, 1 statement | orion-beacon, one runtime | ratio | orion-beacon, a runtime per thread | ratio | SeaORM, 1 statement | ratio | application pool, checked | ratio | pgbench, 2 statements | ratio of the checked store to it | sqlx alone, 1 statement | ratio | a runtime per thread / sqlx alone | sqlx alone, under a timeout | ratio | a runtime per thread / it |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (clients, reps) in &pg_rows {
        println!(
            "| PostgreSQL 15 | {clients} | {:.0} | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} | {:.2} | {:.2} | {:.0} | {:.2} | {:.2} |",
            cell(reps, 0).per_s,
            cell(reps, 1).per_s,
            ratio(reps, 1, 0),
            cell(reps, 2).per_s,
            ratio(reps, 2, 0),
            cell(reps, 3).per_s,
            ratio(reps, 3, 0),
            cell(reps, 4).per_s,
            ratio(reps, 4, 0),
            cell(reps, 5).per_s,
            ratio(reps, 4, 5),
            cell(reps, 6).per_s,
            ratio(reps, 6, 0),
            ratio(reps, 2, 6),
            cell(reps, 7).per_s,
            ratio(reps, 7, 0),
            ratio(reps, 2, 7),
        );
    }
    let mut other_rows = Vec::new();
    let others = if std::env::var_os("BENCH_PG_ONLY").is_some() {
        Vec::new()
    } else {
        vec![
            ("MariaDB 10.11", mysql_url()),
            (
                "SQLite (file, WAL)",
                format!(
                    "sqlite://{}/target/orion-bench/bench.db",
                    std::env::current_dir()?.display()
                ),
            ),
        ]
    };
    for (name, url) in others {
        std::fs::create_dir_all("target/orion-bench")?;
        for clients in client_counts() {
            let db = connect(&url, clients as u32, false).await?;
            migrate(&db, &table).await?;
            let store = SeaOrmLeaseStore::new(db.clone()).with_table(&table)?;
            let ours = store_rate(&store, clients, d, None).await?;
            other_rows.push(format!(
                "| {name} | {clients} | - | {:.0} | - | - | - | - | - | - | - | - | - | - | - | - | - | - | - |",
                ours.per_s
            ));
            drop(&db, &table).await;
        }
    }
    for row in other_rows {
        println!("{row}");
    }
    println!(
        "\n### CPU per call, PostgreSQL (client: this process's rusage, or pgbench's as our \
         child; database: the private server's processes, from /proc)\n"
    );
    println!("| clients | pgbench, 1 statement: client | database | orion-beacon, one runtime: client | database | orion-beacon, a runtime per thread: client | database | SeaORM, 1 statement: client | database | application pool, checked: client | database | pgbench, 2 statements: client | database | sqlx alone: client | database | sqlx alone, under a timeout: client | database | database, a runtime per thread / pgbench |");
    println!(
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for (clients, reps) in &pg_rows {
        let db_ratio = match (cell(reps, 2).db_us, cell(reps, 0).db_us) {
            (Some(ours), Some(theirs)) if theirs > 0.0 => format!("{:.2}", ours / theirs),
            _ => "-".to_owned(),
        };
        let cells: Vec<String> = (0..8)
            .map(|k| {
                let x = cell(reps, k);
                format!("{:.1} µs | {}", x.client_us, us(x.db_us))
            })
            .collect();
        println!("| {clients} | {} | {db_ratio} |", cells.join(" | "));
    }
    // Each repeat's ratio of cell `k` to pgbench, 1 statement.
    let each = |reps: &[[Rate; 8]], k: usize| -> String {
        reps.iter()
            .map(|r| format!("{:.2}", r[k].per_s / r[0].per_s))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("\nEach repeat's ratio, a runtime per thread / pgbench, 1 statement:");
    for (clients, reps) in &pg_rows {
        println!("- {clients} clients: {}", each(reps, 2));
    }
    println!(
        "\nEach repeat's ratios to pgbench, 1 statement: sqlx alone; sqlx alone under a timeout:"
    );
    for (clients, reps) in &pg_rows {
        println!("- {clients} clients: {}; {}", each(reps, 6), each(reps, 7));
    }

    if let Some(pg) = durable {
        tokio::task::spawn_blocking(move || std::mem::drop(pg)).await?;
    }
    super::roundtrips::roundtrips().await
}
