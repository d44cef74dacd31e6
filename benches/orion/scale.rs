//! One process holding many leases, and batched renewal per backend.

use std::time::Duration;

use orion_beacon::{store::LeaseOutcome, Elector, LeaseStore, SeaOrmLeaseStore};
use sea_orm::{ConnectionTrait, DatabaseConnection};
use tokio::time::Instant;

use super::*;

/// The PostgreSQL's committed transactions so far (each autocommit statement is one), from
/// `pg_stat_database`: the server reports its backends' counts up to 10 s late, so a steady
/// window that starts 10 s after a burst reads the steady rate to within a few statements.
async fn commits(db: &DatabaseConnection) -> Result<i64, Error> {
    use sea_orm::{DbBackend, Statement};
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT CAST(xact_commit AS BIGINT) FROM pg_stat_database WHERE datname = current_database()",
        ))
        .await?
        .ok_or("no pg_stat_database row")?;
    Ok(row.try_get_by_index::<i64>(0)?)
}

/// Waits until every elector of `handles` leads (at most 120 s from `t0`).
async fn all_leading(handles: &[orion_beacon::ElectorHandle], t0: Instant) -> Result<(), Error> {
    while handles.iter().filter(|h| h.is_leader()).count() < handles.len() {
        if t0.elapsed() > Duration::from_secs(120) {
            return Err("not all electors led within 120 s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// A steady window of `d`, 12 s after the holds were taken (they fall into step within a renew
/// interval; the server reports its backends' commits up to 10 s late, so the taking's count
/// lands before the window).
struct Window {
    /// The server's commits per second, less this benchmark's own two reads of the count.
    commits_per_s: f64,
    /// This process's CPU, a share of one core.
    process: f64,
    /// The private server's CPU, a share of one core (`None` on a server you name).
    database: Option<f64>,
}

impl Window {
    async fn measure(
        db: &DatabaseConnection,
        server: Option<cpu::Server>,
        d: Duration,
    ) -> Result<Self, Error> {
        tokio::time::sleep(Duration::from_secs(12)).await;
        let (cpu0, db0, c0, t1) = (
            cpu::process(),
            server.map(|s| s.cpu()),
            commits(db).await?,
            Instant::now(),
        );
        tokio::time::sleep(d).await;
        let (cpu1, db1, c1, secs) = (
            cpu::process(),
            cpu::delta(server, db0),
            commits(db).await?,
            t1.elapsed().as_secs_f64(),
        );
        Ok(Self {
            commits_per_s: (c1 - c0 - 1).max(0) as f64 / secs,
            process: (cpu1 - cpu0).as_secs_f64() / secs,
            database: db1.map(|d| d.as_secs_f64() / secs),
        })
    }

    /// The database's share as a table cell.
    fn database_cell(&self) -> String {
        self.database
            .map(|share| format!("{:.1} %", share * 100.0))
            .unwrap_or_else(|| "-".to_owned())
    }
}

/// One process with `BENCH_ELECTORS` electors (default 10, 1,000 and 10,000), each leading its
/// own resource on one store (lease 15 s, renew 5 s, pool of 16, PostgreSQL), renewing lease by
/// lease (`renew_together(false)`) and together, side by side: the server's commits per second
/// in a steady window of `BENCH_SCALE_SECS` (default 20), and the CPU it and this process use.
pub(crate) async fn scale() -> Result<(), Error> {
    let counts: Vec<usize> = std::env::var("BENCH_ELECTORS")
        .ok()
        .map(|s| s.split(',').filter_map(|c| c.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![10, 1_000, 10_000]);
    let d = Duration::from_secs(
        std::env::var("BENCH_SCALE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(20),
    );
    let server = cpu::postgres();
    println!(
        "\n## Electors in one process (lease 15 s, renew 5 s, pool of 16, PostgreSQL, {} s windows)\n",
        d.as_secs()
    );
    println!("| electors | renews | all leading in | server commits per second | expected lease by lease | database CPU | process CPU | still leading |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for &n in &counts {
        for together in [false, true] {
            let table = unique(&format!("obscale{n}"));
            let db = connect(&pg_url(), 16, false).await?;
            migrate(&db, &table).await?;
            let store = SeaOrmLeaseStore::new(db.clone())
                .with_table(&table)?
                .with_release_notifications(false);
            let mut handles = Vec::with_capacity(n);
            let t0 = Instant::now();
            for i in 0..n {
                handles.push(
                    Elector::builder(store.clone())
                        .resource(format!("shard-{i}"))
                        .candidate_id("scale-node")
                        .lease_duration(Duration::from_secs(15))
                        .renew_interval(Duration::from_secs(5))
                        .renew_together(together)
                        .build()?
                        .start(),
                );
            }
            all_leading(&handles, t0).await?;
            let elected_in = t0.elapsed();
            let w = Window::measure(&db, server, d).await?;
            let leading = handles.iter().filter(|h| h.is_leader()).count();
            println!(
                "| {n} | {} | {:.1} s | {:.1} | {:.1} | {} | {:.1} % | {leading} / {n} |",
                if together {
                    "together"
                } else {
                    "lease by lease"
                },
                elected_in.as_secs_f64(),
                w.commits_per_s,
                n as f64 / 5.0,
                w.database_cell(),
                w.process * 100.0,
            );
            for h in handles {
                h.abort().await;
            }
            drop(&db, &table).await;
        }
    }
    Ok(())
}

/// This process's resident memory (`VmRSS` in `/proc/self/status`), in bytes; 0 where there is
/// no `/proc`.
fn resident() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// One process holding `BENCH_MIXED` holds (default 10,000) of every kind on one store and
/// one PostgreSQL table: 40 % electors each leading a resource, 30 % locks held by one `Locks`,
/// 30 % the resources of one shard-set node (alone, so it leads them all); lease 15 s, renew
/// 5 s (the shard set's round every 5 s). Printed: the time until all are held, the server's
/// commits per renew interval in a steady window, database and process CPU, and resident
/// memory per hold (the process's growth from before the first hold, over the holds).
pub(crate) async fn mixed() -> Result<(), Error> {
    use orion_beacon::locks::Locks;
    use orion_beacon::ShardSet;
    let n: usize = std::env::var("BENCH_MIXED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let d = Duration::from_secs(
        std::env::var("BENCH_SCALE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(20),
    );
    let (lease, renew) = (Duration::from_secs(15), Duration::from_secs(5));
    let (electors, locks) = (n * 4 / 10, n * 3 / 10);
    let shards = n - electors - locks;
    let server = cpu::postgres();
    let table = unique("obmixed");
    let db = connect(&pg_url(), 16, false).await?;
    migrate(&db, &table).await?;
    super::shards::migrate_members(&db, &table).await?;
    super::shards::add_member_counts(&db, &table).await?;
    let store = SeaOrmLeaseStore::new(db.clone())
        .with_table(&table)?
        .with_member_table(format!("{table}_m"))?
        .with_release_notifications(false);
    let before = resident();
    let t0 = Instant::now();
    let mut handles = Vec::with_capacity(electors);
    for i in 0..electors {
        handles.push(
            Elector::builder(store.clone())
                .resource(format!("elected-{i}"))
                .candidate_id("mixed-node")
                .lease_duration(lease)
                .renew_interval(renew)
                .build()?
                .start(),
        );
    }
    let held_locks = Locks::builder(store.clone())
        .owner("mixed-node")
        .lease_duration(lease)
        .renew_interval(renew)
        .build()?;
    let mut guards = Vec::with_capacity(locks);
    for i in 0..locks {
        guards.push(
            held_locks
                .lock(format!("locked-{i}"))?
                .acquire(Duration::from_secs(60))
                .await?,
        );
    }
    let node = ShardSet::builder(store.clone())
        .name("mixed")
        .resources((0..shards).map(|i| format!("shard-{i}")))
        .member_id("mixed-node")
        .lease_duration(lease)
        .interval(renew)
        .build()?
        .start();
    let mut led = node.watch();
    let all_led = tokio::time::timeout(
        Duration::from_secs(120),
        led.wait_for(|a| a.led.len() == shards),
    );
    all_led
        .await
        .map_err(|_| "the shard set did not lead all its resources within 120 s")??;
    all_leading(&handles, t0).await?;
    let held_in = t0.elapsed();
    let w = Window::measure(&db, server, d).await?;
    let grown = resident().saturating_sub(before);
    let still = handles.iter().filter(|h| h.is_leader()).count()
        + guards.iter().filter(|g| g.is_held()).count()
        + node.assignment().led.len();
    println!(
        "\n## Mixed holds in one process ({electors} electors, {locks} locks, {shards} shards of one node; lease 15 s, renew 5 s, pool of 16, PostgreSQL, {} s window)\n",
        d.as_secs()
    );
    println!("| holds | all held in | server commits per renew interval | database CPU | process CPU | CPU per hold | resident memory per hold | still held |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    println!(
        "| {n} | {:.1} s | {:.1} | {} | {:.1} % | {:.2} µs/s | {:.0} bytes | {still} / {n} |",
        held_in.as_secs_f64(),
        w.commits_per_s * renew.as_secs_f64(),
        w.database_cell(),
        w.process * 100.0,
        w.process * 1e6 / n as f64,
        grown as f64 / n as f64,
    );
    for h in handles {
        h.abort().await;
    }
    std::mem::drop(guards);
    node.shutdown().await;
    drop(&db, &table).await;
    super::shards::drop_members(&db, &table).await;
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Batched renewal

/// One process holding `BENCH_LEASES` leases (default 10,000) in one table renews them all,
/// `BENCH_ROUNDS` times (default 5): lease by lease (16 at a time, as electors sharing a pool
/// of 16 would) and with one `renew_all` per round, side by side on the same leases. Client
/// CPU is this process's; database CPU is the private server's processes' (`/proc`), not
/// measured on a server you name.
pub(crate) async fn batch_backend(
    name: &str,
    url: &str,
    server: Option<cpu::Server>,
) -> Result<(), Error> {
    let leases: usize = std::env::var("BENCH_LEASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let lease = Duration::from_secs(60);
    let table = unique("obbatch");
    let db = connect(url, 16, false).await?;
    migrate(&db, &table).await?;
    let store = SeaOrmLeaseStore::new(db.clone()).with_table(&table)?;
    // Acquire them all (16 at a time).
    let mut held = Vec::with_capacity(leases);
    for chunk in (0..leases).collect::<Vec<_>>().chunks(16) {
        let grants = futures::future::join_all(chunk.iter().map(|i| {
            let store = store.clone();
            async move {
                store
                    .acquire_or_renew(&format!("shard-{i}"), "batch-node", lease)
                    .await
            }
        }))
        .await;
        for g in grants {
            match g? {
                LeaseOutcome::Acquired(l) | LeaseOutcome::Renewed(l) => held.push(l),
                LeaseOutcome::Denied(d) => return Err(format!("denied: {d:?}").into()),
            }
        }
    }
    let server_cpu = || server.map(|s| s.cpu());
    // Lease by lease.
    let (cpu0, db0, t0) = (cpu::process(), server_cpu(), Instant::now());
    for _ in 0..rounds {
        for chunk in held.chunks(16) {
            for r in futures::future::join_all(chunk.iter().map(|l| {
                let store = store.clone();
                async move { store.acquire_or_renew(&l.resource, &l.holder, lease).await }
            }))
            .await
            {
                if !matches!(r?, LeaseOutcome::Renewed(_)) {
                    return Err("a per-lease renew did not renew".into());
                }
            }
        }
    }
    let (single_cpu, single_wall) = (cpu::process() - cpu0, t0.elapsed());
    let single_db = cpu::delta(server, db0);
    // One statement per round.
    let (cpu0, db0, t0) = (cpu::process(), server_cpu(), Instant::now());
    for _ in 0..rounds {
        let out = store.renew_all(&held, lease).await?;
        if out.renewed.len() != leases {
            return Err(format!("the batch renewed {} of {leases}", out.renewed.len()).into());
        }
    }
    let (batch_cpu, batch_wall) = (cpu::process() - cpu0, t0.elapsed());
    let batch_db = cpu::delta(server, db0);
    let renewals = (leases * rounds) as f64;
    let per = |d: Duration| d.as_secs_f64() * 1e6 / renewals;
    let per_round = |d: Option<Duration>| match d {
        Some(d) => format!("{:.0} ms", d.as_secs_f64() * 1e3 / rounds as f64),
        None => "-".to_owned(),
    };
    let per_lease = |d: Option<Duration>| match d {
        Some(d) => format!("{:.1} µs", per(d)),
        None => "-".to_owned(),
    };
    let ratio = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
        (Some(a), Some(b)) => format!("{:.1}", a.as_secs_f64() / b.as_secs_f64().max(1e-9)),
        _ => "-".to_owned(),
    };
    println!(
        "\n## Batched renewal: {leases} leases, {rounds} rounds, {name}\n\n\
         | path | statements per round | wall time per round | client CPU per lease renewal | database CPU per round | database CPU per lease renewal |\n\
         | --- | --- | --- | --- | --- | --- |\n\
         | lease by lease (16 at a time) | {leases} | {:.0} ms | {:.1} µs | {} | {} |\n\
         | `renew_all` | 1 | {:.0} ms | {:.1} µs | {} | {} |\n\
         | ratio (lease by lease / batch) | {leases} | {:.1} | {:.1} | {} | |",
        single_wall.as_secs_f64() * 1e3 / rounds as f64,
        per(single_cpu),
        per_round(single_db),
        per_lease(single_db),
        batch_wall.as_secs_f64() * 1e3 / rounds as f64,
        per(batch_cpu),
        per_round(batch_db),
        per_lease(batch_db),
        single_wall.as_secs_f64() / batch_wall.as_secs_f64().max(1e-9),
        single_cpu.as_secs_f64() / batch_cpu.as_secs_f64().max(1e-9),
        ratio(single_db, batch_db),
    );
    drop(&db, &table).await;
    Ok(())
}

pub(crate) async fn batch() -> Result<(), Error> {
    let (pg, my) = (pg_url(), mysql_url());
    batch_backend("PostgreSQL", &pg, cpu::postgres()).await?;
    batch_backend("MariaDB", &my, cpu::mariadb()).await
}
