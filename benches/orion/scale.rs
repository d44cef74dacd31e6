//! One process holding many leases, and batched renewal per backend.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use orion_beacon::{
    Elector, LeaseOutcome, LeaseStore, ReleaseEvents, SeaOrmLeaseStore, StoreError,
};
use tokio::time::Instant;

use super::*;

#[derive(Clone)]
pub(crate) struct Counting {
    renews: Arc<AtomicU64>,
    calls: Arc<AtomicU64>,
}

#[async_trait]
impl Intercept<SeaOrmLeaseStore> for Counting {
    async fn acquire_or_renew(
        &self,
        inner: &SeaOrmLeaseStore,
        r: &str,
        c: &str,
        lease: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let out = inner.acquire_or_renew(r, c, lease).await?;
        if matches!(out, LeaseOutcome::Renewed(_)) {
            self.renews.fetch_add(1, Ordering::Relaxed);
        }
        Ok(out)
    }
    /// No release notifications (no listener per elector): followers poll.
    fn release_events(&self, _inner: &SeaOrmLeaseStore) -> Option<ReleaseEvents> {
        None
    }
}

pub(crate) async fn scale() -> Result<(), Error> {
    let leases: usize = std::env::var("BENCH_LEASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let d = Duration::from_secs(
        std::env::var("BENCH_SCALE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(30),
    );
    let table = unique("obscale");
    let db = connect(&pg_url(), 16, false).await?;
    migrate(&db, &table).await?;
    let counting = Double::over(
        SeaOrmLeaseStore::new(db.clone()).with_table(&table)?,
        Counting {
            renews: Arc::default(),
            calls: Arc::default(),
        },
    );
    let mut handles = Vec::with_capacity(leases);
    for i in 0..leases {
        handles.push(
            Elector::builder(counting.clone())
                .resource(format!("shard-{i}"))
                .candidate_id("scale-node")
                .lease_duration(Duration::from_secs(15))
                .renew_interval(Duration::from_secs(5))
                .build()?
                .start(),
        );
    }
    // Everyone elected, then measure a steady window.
    let t0 = Instant::now();
    while handles.iter().filter(|h| h.is_leader()).count() < leases {
        if t0.elapsed() > Duration::from_secs(120) {
            return Err("not all leases were acquired within 120 s".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let elected_in = t0.elapsed();
    let (cpu0, renews0, t1) = (
        cpu::process(),
        counting.renews.load(Ordering::Relaxed),
        Instant::now(),
    );
    tokio::time::sleep(d).await;
    let (cpu1, renews1, secs) = (
        cpu::process(),
        counting.renews.load(Ordering::Relaxed),
        t1.elapsed().as_secs_f64(),
    );
    let renews = (renews1 - renews0) as f64;
    let leading = handles.iter().filter(|h| h.is_leader()).count();
    println!("\n## Scale: one process, {leases} leases (lease 15 s, renew 5 s, pool of 16, PostgreSQL)\n");
    println!("| measure | value |");
    println!("| --- | --- |");
    println!(
        "| all {leases} acquired in | {:.1} s |",
        elected_in.as_secs_f64()
    );
    println!(
        "| renew statements per second | {:.0} (expected {:.0}) |",
        renews / secs,
        leases as f64 / 5.0
    );
    println!(
        "| process CPU per renewal (elector + store + driver) | {:.1} µs |",
        (cpu1 - cpu0).as_secs_f64() * 1e6 / renews.max(1.0)
    );
    println!(
        "| process CPU | {:.1} % of one core |",
        (cpu1 - cpu0).as_secs_f64() / secs * 100.0
    );
    println!("| leases still held at the end | {leading} / {leases} |");
    for h in handles {
        h.abort().await;
    }
    drop(&db, &table).await;
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
