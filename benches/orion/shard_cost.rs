//! What a shard set's rounds cost the database as the work grows: N resources over M node
//! processes (the shard-set benchmark's nodes, `shards::node`), once all are led, in a steady
//! window: rows the lease table's scans returned per round (`pg_stat_user_tables`: sequential
//! and index tuples read) and the server's CPU per round, next to N × M, the rows a round reads
//! when every node reads the whole set. The membership table has the members' counts
//! (`AddMemberHolding`, which a store requires): a settled set skips its looks.

use std::time::Duration;

use plotters::prelude::*;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use tokio::time::Instant;

use super::shards::{add_member_counts, drop_members, migrate_members, spawn_with, Node};
use super::{cpu, Error};

/// Rounds are slower than the placement benchmark's, so that the largest sets fit 2 cores.
const LEASE: Duration = Duration::from_secs(10);
const INTERVAL: Duration = Duration::from_secs(2);
/// The longest wait for every resource to be led.
const SETTLE_LIMIT: Duration = Duration::from_secs(240);

/// Rows read from `table` so far: sequential scans' tuples and index scans' fetches.
async fn rows_read(db: &DatabaseConnection, table: &str) -> Result<i64, Error> {
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT CAST(COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0) AS BIGINT) \
             FROM pg_stat_user_tables WHERE relname = $1",
            [table.into()],
        ))
        .await?
        .ok_or("no statistics for the lease table")?;
    Ok(row.try_get_by_index::<i64>(0)?)
}

async fn live(db: &DatabaseConnection, table: &str) -> Result<i64, Error> {
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            format!("SELECT COUNT(*) FROM \"{table}\" WHERE expires_at > clock_timestamp()"),
        ))
        .await?
        .ok_or("no count")?;
    Ok(row.try_get_by_index::<i64>(0)?)
}

/// One cell: rows read and database CPU per round, or why it has none.
struct Cell {
    resources: usize,
    nodes: usize,
    outcome: Result<(f64, Option<f64>, f64), String>,
}

async fn cell(url: &str, resources: usize, nodes: usize, window: Duration) -> Result<Cell, Error> {
    let table = super::unique(&format!("obcost{resources}x{nodes}"));
    let db = super::connect(url, 2, false).await?;
    super::migrate(&db, &table).await?;
    migrate_members(&db, &table).await?;
    add_member_counts(&db, &table).await?;
    let settings = [
        ("ORION_BENCH_SHARD_COUNT", resources.to_string()),
        ("ORION_BENCH_SHARD_LEASE_MS", LEASE.as_millis().to_string()),
        (
            "ORION_BENCH_SHARD_INTERVAL_MS",
            INTERVAL.as_millis().to_string(),
        ),
    ];
    let mut procs: Vec<Node> = Vec::new();
    for id in 1..=nodes {
        procs.push(spawn_with(id, url, &table, &settings)?);
    }
    let t0 = Instant::now();
    let mut settled = false;
    while t0.elapsed() < SETTLE_LIMIT {
        if live(&db, &table).await? >= resources as i64 {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let outcome = if settled {
        // The server reports its backends' counts up to 10 s late: the start-up's land first.
        tokio::time::sleep(Duration::from_secs(12)).await;
        let server = cpu::postgres();
        let (r0, c0, t1) = (
            rows_read(&db, &table).await?,
            server.map(|s| s.cpu()),
            Instant::now(),
        );
        tokio::time::sleep(window).await;
        let (r1, c1) = (rows_read(&db, &table).await?, cpu::delta(server, c0));
        let rounds = t1.elapsed().as_secs_f64() / INTERVAL.as_secs_f64();
        let still = live(&db, &table).await?;
        Ok((
            (r1 - r0) as f64 / rounds,
            c1.map(|c| c.as_secs_f64() * 1e3 / rounds),
            still as f64,
        ))
    } else {
        Err(format!("not all led within {} s", SETTLE_LIMIT.as_secs()))
    };
    for n in &mut procs {
        drop(n.child.stdin.take());
    }
    // A graceful stop, or a kill after 30 s (a node that cannot keep up with its set).
    let stop = Instant::now();
    for n in &mut procs {
        while matches!(n.child.try_wait(), Ok(None)) && stop.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = n.child.kill();
        let _ = n.child.wait();
    }
    super::drop(&db, &table).await;
    drop_members(&db, &table).await;
    Ok(Cell {
        resources,
        nodes,
        outcome,
    })
}

/// `cargo bench --all-features --bench orion -- shardcost`; `BENCH_SHARD_COST` picks cells
/// (`resources x nodes`, comma-separated; default 1000, 10000 and 50000 over 2, 5 and 10),
/// `BENCH_SHARD_COST_SECS` the window (default 20).
pub async fn shard_cost() -> Result<(), Error> {
    let cells: Vec<(usize, usize)> = std::env::var("BENCH_SHARD_COST")
        .ok()
        .map(|s| {
            s.split(',')
                .filter_map(|c| {
                    let (r, n) = c.trim().split_once('x')?;
                    Some((r.parse().ok()?, n.parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_else(|| {
            [1_000, 10_000, 50_000]
                .into_iter()
                .flat_map(|r| [2, 5, 10].into_iter().map(move |n| (r, n)))
                .collect()
        });
    let window = Duration::from_secs(
        std::env::var("BENCH_SHARD_COST_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(20),
    );
    let url = super::pg_url();
    println!(
        "\n## Shard-set rounds as the work grows (PostgreSQL, lease {} s, interval {} s, {} s windows)\n",
        LEASE.as_secs(),
        INTERVAL.as_secs(),
        window.as_secs()
    );
    println!("| resources | node processes | resources × nodes | rows read per round | ratio to resources × nodes | database CPU per round | live leases at the end |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    let mut results = Vec::new();
    for (resources, nodes) in cells {
        let measured = cell(&url, resources, nodes, window).await?;
        let rows = |c: &Cell| {
            c.outcome
                .as_ref()
                .map_or_else(|why| why.clone(), |o| format!("{:.0}", o.0))
        };
        let cpu = |c: &Cell| {
            c.outcome
                .as_ref()
                .ok()
                .and_then(|o| o.1)
                .map_or("-".to_owned(), |ms| format!("{ms:.0} ms"))
        };
        let still = |c: &Cell| {
            c.outcome
                .as_ref()
                .map_or("-".to_owned(), |o| format!("{:.0}", o.2))
        };
        let ratio = match &measured.outcome {
            Ok(c) if resources * nodes > 0 => format!("{:.3}", c.0 / (resources * nodes) as f64),
            _ => "-".to_owned(),
        };
        println!(
            "| {resources} | {nodes} | {} | {} | {ratio} | {} | {} |",
            resources * nodes,
            rows(&measured),
            cpu(&measured),
            still(&measured),
        );
        results.push(measured);
    }
    std::fs::create_dir_all("target/orion-bench")?;
    let path = std::path::PathBuf::from("target/orion-bench/shard-cost.svg");
    chart(&results, &path)?;
    println!("\nchart: {}", path.display());
    Ok(())
}

/// Rows read per round against resources, a line per node count.
fn chart(cells: &[Cell], path: &std::path::Path) -> Result<(), Error> {
    let points = |nodes: usize| -> Vec<(f64, f64)> {
        cells
            .iter()
            .filter(|c| c.nodes == nodes)
            .filter_map(|c| Some((c.resources as f64, c.outcome.as_ref().ok()?.0)))
            .collect()
    };
    let mut counts: Vec<usize> = cells.iter().map(|c| c.nodes).collect();
    counts.sort_unstable();
    counts.dedup();
    let xmax = cells.iter().map(|c| c.resources).max().unwrap_or(1) as f64 * 1.05;
    let ymax = cells
        .iter()
        .filter_map(|c| c.outcome.as_ref().ok().map(|o| o.0))
        .chain(
            cells
                .iter()
                .filter(|c| c.outcome.is_ok())
                .map(|c| (c.resources * c.nodes) as f64),
        )
        .fold(1.0_f64, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "ShardSet on PostgreSQL: lease-table rows read per round",
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..xmax, 0.0..ymax)?;
    chart
        .configure_mesh()
        .x_desc("resources in the set")
        .y_desc("rows read per round (all nodes)")
        .draw()?;
    let colors = [
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0xd6, 0x27, 0x28),
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0xff, 0x7f, 0x0e),
    ];
    for (i, nodes) in counts.into_iter().enumerate() {
        let color = colors[i % colors.len()];
        // What a round would read were every node to read the whole set: resources × nodes.
        let full: Vec<(f64, f64)> = points(nodes)
            .into_iter()
            .map(|(x, _)| (x, x * nodes as f64))
            .collect();
        let light = color.mix(0.5);
        chart
            .draw_series(LineSeries::new(full, light.stroke_width(1)))?
            .label(format!("{nodes} node processes, resources × nodes"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], light));
        chart
            .draw_series(
                points(nodes)
                    .into_iter()
                    .map(move |(x, y)| Circle::new((x, y), 4, color.filled())),
            )?
            .label(format!("{nodes} node processes, rows read"))
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, color.filled()));
        chart.draw_series(LineSeries::new(points(nodes), color.stroke_width(2)))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
