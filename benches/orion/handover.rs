//! Handover and failover times, and their timeline as an SVG.

use std::path::PathBuf;
use std::time::Duration;

use orion_beacon::{Elector, ElectorHandle, Leadership, SeaOrmLeaseStore};
use plotters::prelude::*;
use tokio::time::Instant;

use super::*;

/// Transition times (ms) in an HDR histogram: microsecond resolution, 3 significant digits.
pub(crate) fn histogram(times_ms: &[f64]) -> Result<hdrhistogram::Histogram<u64>, Error> {
    let mut h = hdrhistogram::Histogram::<u64>::new(3)?;
    for t in times_ms {
        h.record((t * 1000.0).round().max(1.0) as u64)?;
    }
    Ok(h)
}

/// The `q` quantile of `h`, in milliseconds (`NaN` for no samples).
pub(crate) fn quantile_ms(h: &hdrhistogram::Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        return f64::NAN;
    }
    h.value_at_quantile(q) as f64 / 1000.0
}

pub(crate) async fn start(
    store: SeaOrmLeaseStore,
    resource: &str,
    name: String,
    lease: Duration,
    renew: Duration,
    retry: Duration,
) -> Result<ElectorHandle, Error> {
    Ok(Elector::builder(store)
        .resource(resource)
        .candidate_id(name)
        .lease_duration(lease)
        .renew_interval(renew)
        .retry_interval(retry)
        .jitter(0.0)
        .build()?
        .start())
}

pub(crate) async fn wait_leader(h: &ElectorHandle, limit: Duration) -> Result<(), Error> {
    let mut rx = h.watch();
    tokio::time::timeout(limit, rx.wait_for(|s| matches!(s, Leadership::Leader(_)))).await??;
    Ok(())
}

/// How the leader of a transition goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transition {
    /// `shutdown()`: the lease is released.
    Graceful,
    /// `hand_over_to(the follower)`: the lease is offered to it.
    Named,
    /// A candidate of a higher rank joins (`ElectorBuilder::rank`, `prefer_after` zero): the
    /// leader sees it at its next candidacy heartbeat (within a renew interval) and hands over
    /// to it by name. Timed from the newcomer's first heartbeat committing.
    Preferred,
    /// `abort()`: the lease lapses.
    Crash,
}

impl Transition {
    fn label(self) -> &'static str {
        match self {
            Transition::Graceful => "graceful release",
            Transition::Named => "handover to a named successor",
            Transition::Preferred => "handover to a higher rank (ranked electors)",
            Transition::Crash => "crash (no release)",
        }
    }
}

/// `n` transitions between two candidates, each leader going as `how` says.
pub(crate) async fn transitions(
    url: &str,
    n: usize,
    how: Transition,
    lease: Duration,
    renew: Duration,
    retry: Duration,
) -> Result<Vec<f64>, Error> {
    let table = unique(match how {
        Transition::Graceful => "obhand",
        Transition::Named => "obname",
        Transition::Preferred => "obrank",
        Transition::Crash => "obfail",
    });
    let admin = connect(url, 2, false).await?;
    migrate(&admin, &table).await?;
    if how == Transition::Preferred {
        super::shards::migrate_members(&admin, &table).await?;
        super::shards::add_member_counts(&admin, &table).await?;
        use orion_beacon_migration::{AddMemberRank, MigrationTrait, SchemaManager};
        AddMemberRank::with_table(format!("{table}_m"))?
            .up(&SchemaManager::new(&admin))
            .await?;
    }
    let resource = "transitions";
    let mk = |i: usize| {
        let url = url.to_owned();
        let table = table.clone();
        async move {
            let db = connect(&url, 2, false).await?;
            let store = SeaOrmLeaseStore::new(db).with_table(&table)?;
            if how != Transition::Preferred {
                return start(store, resource, format!("n{i}"), lease, renew, retry).await;
            }
            // Rank i: every newcomer outranks the leader.
            let store = store.with_member_table(format!("{table}_m"))?;
            Ok(Elector::builder(store)
                .resource(resource)
                .candidate_id(format!("n{i}"))
                .lease_duration(lease)
                .renew_interval(renew)
                .retry_interval(retry)
                .jitter(0.0)
                .rank(i as i64)
                .prefer_after(Duration::ZERO)
                .build()?
                .start())
        }
    };
    let mut leader = mk(0).await?;
    wait_leader(&leader, Duration::from_secs(10)).await?;
    let mut times = Vec::new();
    for i in 1..=n {
        let follower = mk(i).await?;
        if how == Transition::Preferred {
            // From the newcomer's first heartbeat: the leader may see it from then on.
            let me = format!("n{i}");
            let listed = async {
                loop {
                    let view = follower.candidacy();
                    if view.is_some_and(|v| v.candidates.iter().any(|c| c.candidate == me)) {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            };
            tokio::time::timeout(Duration::from_secs(10), listed).await?;
            let t0 = Instant::now();
            wait_leader(&follower, lease * 4 + retry * 2).await?;
            times.push((Instant::now() - t0).as_secs_f64() * 1e3);
            leader.shutdown().await;
            leader = follower;
            continue;
        }
        tokio::time::sleep(renew * 2).await; // the follower has been denied once and waits
        let t0 = Instant::now();
        match how {
            Transition::Graceful => leader.shutdown().await,
            Transition::Named => {
                // The answer comes once the successor took it; time to its first term.
                let _ = leader.hand_over_to(&format!("n{i}"), lease).await?;
            }
            Transition::Crash => leader.abort().await,
            Transition::Preferred => {}
        }
        wait_leader(&follower, lease * 4 + retry * 2).await?;
        times.push((Instant::now() - t0).as_secs_f64() * 1e3);
        if how == Transition::Named {
            leader.shutdown().await;
        }
        leader = follower;
    }
    leader.shutdown().await;
    if how == Transition::Preferred {
        super::shards::drop_members(&admin, &table).await;
    }
    drop(&admin, &table).await;
    Ok(times)
}

/// One line per series: time to a new leader (ms) per transition.
pub(crate) fn svg(
    series: &[(&str, RGBColor, Vec<f64>)],
    path: &std::path::Path,
) -> Result<(), Error> {
    let n = series.iter().map(|s| s.2.len()).max().unwrap_or(1).max(2);
    let ymax = series
        .iter()
        .flat_map(|s| s.2.iter().copied())
        .fold(1.0, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (720, 360)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "orion-beacon: graceful handover, time to the new leader per transition (ms)",
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0..n, 0.0..ymax)?;
    chart
        .configure_mesh()
        .x_desc("transition #")
        .y_desc("ms")
        .draw()?;
    for (label, color, values) in series {
        let color = *color;
        chart
            .draw_series(LineSeries::new(
                values.iter().copied().enumerate(),
                color.stroke_width(2),
            ))?
            .label(*label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Rounds of the wake-up transitions (graceful, named), each of `BENCH_TRANSITIONS`: a p99
/// per round and their spread, as single figures move from run to run on a busy machine.
pub(crate) const ROUNDS: usize = 3;

/// `| p50 of all | p99 per round | spread of the p99s | max |` cells (ms).
pub(crate) fn round_cells(rounds: &[Vec<f64>]) -> Result<String, Error> {
    let all: Vec<f64> = rounds.iter().flatten().copied().collect();
    let h = histogram(&all)?;
    let mut p99s = Vec::with_capacity(rounds.len());
    for round in rounds {
        p99s.push(quantile_ms(&histogram(round)?, 0.99));
    }
    let (low, high) = p99s
        .iter()
        .fold((f64::MAX, 0.0_f64), |(l, h), p| (l.min(*p), h.max(*p)));
    let each: Vec<String> = p99s.iter().map(|p| format!("{p:.1}")).collect();
    Ok(format!(
        "{:.1} | {} | {:.1} | {:.1}",
        quantile_ms(&h, 0.5),
        each.join(" / "),
        high - low,
        quantile_ms(&h, 1.0)
    ))
}

pub(crate) async fn handover() -> Result<(), Error> {
    let n: usize = std::env::var("BENCH_TRANSITIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    let lease = Duration::from_millis(500);
    let renew = Duration::from_millis(100);
    let retry = Duration::from_secs(1);
    println!("\n## Handover and failover ({n} transitions a round; {ROUNDS} rounds of the graceful and named ones, one of crashes; lease {lease:?}, renew {renew:?}, follower retry {retry:?})\n");
    println!("| backend | transition | p50 (ms) | p99 per round (ms) | spread of p99 (ms) | max (ms) | goal |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    std::fs::create_dir_all("target/orion-bench")?;
    let sqlite = format!(
        "sqlite://{}/target/orion-bench/handover.db",
        std::env::current_dir()?.display()
    );
    let mut chart = Vec::new();
    for (name, url, color) in [
        ("PostgreSQL", pg_url(), RGBColor(0x1f, 0x77, 0xb4)),
        ("MariaDB", mysql_url(), RGBColor(0xd6, 0x27, 0x28)),
        ("SQLite", sqlite, RGBColor(0x2c, 0xa0, 0x2c)),
    ] {
        for how in [
            Transition::Graceful,
            Transition::Named,
            Transition::Preferred,
            Transition::Crash,
        ] {
            let (rounds, goal) = match how {
                Transition::Graceful | Transition::Named => {
                    (ROUNDS, "p99 < 20 ms (a wake-up)".to_owned())
                }
                Transition::Preferred => (
                    ROUNDS,
                    format!(
                        "p99 < renew + 20 = {} ms (the leader's next look, then a named handover)",
                        renew.as_millis() + 20
                    ),
                ),
                Transition::Crash => (
                    1,
                    format!("p99 <= lease + 100 = {} ms", lease.as_millis() + 100),
                ),
            };
            let mut times = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                times.push(transitions(&url, n, how, lease, renew, retry).await?);
            }
            println!(
                "| {name} | {} | {} | {goal} |",
                how.label(),
                round_cells(&times)?
            );
            if how == Transition::Graceful {
                chart.push((name, color, times.swap_remove(0)));
            }
        }
    }
    let path = PathBuf::from("target/orion-bench/transitions.svg");
    svg(&chart, &path)?;
    println!("\nchart: {}", path.display());
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Scale: one process, 10,000 leases
