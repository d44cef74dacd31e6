//! Shard sets: 256 resources over 4 node processes on PostgreSQL, then a 5th node joins, then
//! one node is killed with SIGKILL.
//!
//! Each node is this benchmark binary started again with `ORION_BENCH_SHARD_NODE=<member id>`
//! (see [`node`]): one `ShardSet` on its own pool, one task per led shard that returns as soon
//! as its term ends, and a line on standard output whenever what it leads changes. The parent
//! samples ownership from the lease table itself every [`SAMPLE`] (`SELECT resource, holder
//! WHERE expires_at > clock_timestamp()`, the database clock), and computes from the samples:
//!
//! - (a) from spawning the 4 processes to a balanced assignment: every shard has a live lease
//!   and no node holds more than `ceil(256 / 4) + slack`;
//! - (b) from spawning a 5th to balanced again (`ceil(256 / 5) + slack`), and the longest time
//!   any shard had no live lease meanwhile (a graceful handover: term ends, work returns, the
//!   lease is released, the new node is woken by the release notification);
//! - (c) from the SIGKILL of one node to every shard it held led again by another node
//!   (against lease + interval).
//!
//! The nodes' own reports give the same gap as the work sees it (from the old term's end, when
//! its `lost()` fired, to the new term showing in its node's assignment: an upper bound) and a
//! check that no shard was led by two nodes at once (an overlap found this way is real: the
//! end is exact and the start is stamped at or after the term began).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use orion_beacon::{SeaOrmLeaseStore, ShardSet};
use plotters::prelude::*;
use sea_orm::{ConnectionTrait, DatabaseConnection};

use super::Error;

/// The variable that makes this binary a shard-set node.
const NODE_VAR: &str = "ORION_BENCH_SHARD_NODE";
const SHARDS: usize = 256;
const LEASE: Duration = Duration::from_secs(3);
const INTERVAL: Duration = Duration::from_millis(500);
const GRACE: Duration = Duration::from_secs(1);
const SLACK: usize = 1;
/// How often the parent reads ownership from the lease table.
const SAMPLE: Duration = Duration::from_millis(25);
/// How long an assignment must hold (no lease changing hands) before the next phase.
const SETTLE: Duration = Duration::from_secs(3);
/// The longest any phase may take.
const PHASE_LIMIT: Duration = Duration::from_secs(60);
/// The node that is killed in phase (c).
const VICTIM: usize = 2;

fn unix_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

fn member(i: usize) -> String {
    format!("node-{i}")
}

fn resources(count: usize) -> impl Iterator<Item = String> {
    (0..count).map(|i| format!("shard-{i}"))
}

/// A node's setting from the environment (the cost benchmark sets them), else `default`.
fn setting(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Whether this process was started as a shard-set node.
pub fn is_node() -> bool {
    std::env::var_os(NODE_VAR).is_some()
}

// ------------------------------------------------------------------------------------------
// The node process

/// A shard-set node: runs until its standard input closes (then shuts down gracefully:
/// releases, leaves) or it is killed. Prints `ready`, then `+ <unix µs> <resource>` when a
/// resource appears in its published assignment (at the end of the round that acquired it, so
/// at or after the term's start) and `- <unix µs> <resource>` when a term ends (from its
/// work, at once; again from the assignment, later, which the parent ignores), and
/// `cpu <µs>` at the end.
pub fn node() -> Result<(), Error> {
    let id = std::env::var(NODE_VAR)?;
    let url = std::env::var("ORION_BENCH_SHARD_URL")?;
    let table = std::env::var("ORION_BENCH_SHARD_TABLE")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let db = super::connect(&url, 4, false).await?;
        let store = SeaOrmLeaseStore::new(db)
            .with_table(&table)?
            .with_member_table(format!("{table}_m"))?;
        let count = setting("ORION_BENCH_SHARD_COUNT", SHARDS as u64) as usize;
        let lease = Duration::from_millis(setting(
            "ORION_BENCH_SHARD_LEASE_MS",
            LEASE.as_millis() as u64,
        ));
        let interval = Duration::from_millis(setting(
            "ORION_BENCH_SHARD_INTERVAL_MS",
            INTERVAL.as_millis() as u64,
        ));
        let handle = ShardSet::builder(store)
            .name("bench")
            .resources(resources(count))
            .member_id(&id)
            .lease_duration(lease)
            .interval(interval)
            .grace_period(GRACE)
            .slack(SLACK)
            .build()?
            .start();
        // A term's end is stamped by its work, when `lost()` fires: the moment the node ended
        // it (hand-over, shutdown), before its lease is released. The watch below publishes a
        // round's changes only when the round ends, which can be after that release.
        handle.run_per_shard(|term| async move {
            term.lost().await;
            println!("- {} {}", unix_us(), term.resource());
        });
        let mut out = std::io::stdout().lock();
        writeln!(out, "ready {}", unix_us())?;
        out.flush()?;
        drop(out);
        let (eof_tx, mut eof) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
            let _ = eof_tx.send(());
        });
        let mut rx = handle.watch();
        let mut led: HashSet<Arc<str>> = HashSet::new();
        // Reports go on while the node shuts down, so a term's end is stamped when the node
        // ended it (shutdown ends every term at once), not when the shutdown finished.
        let mut stopping: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> =
            None;
        loop {
            let now: HashSet<Arc<str>> = rx.borrow_and_update().led.keys().cloned().collect();
            let t = unix_us();
            let mut out = std::io::stdout().lock();
            for r in now.difference(&led) {
                writeln!(out, "+ {t} {r}")?;
            }
            for r in led.difference(&now) {
                writeln!(out, "- {t} {r}")?;
            }
            out.flush()?;
            drop(out);
            led = now;
            match stopping.as_mut() {
                None => tokio::select! {
                    changed = rx.changed() => if changed.is_err() { break },
                    _ = &mut eof => stopping = Some(Box::pin(handle.shutdown())),
                },
                Some(stop) => tokio::select! {
                    changed = rx.changed() => if changed.is_err() { break },
                    _ = stop => break,
                },
            }
        }
        handle.shutdown().await;
        let t = unix_us();
        let mut out = std::io::stdout().lock();
        for r in &led {
            writeln!(out, "- {t} {r}")?;
        }
        writeln!(out, "cpu {}", super::cpu::process().as_micros())?;
        out.flush()?;
        Ok::<_, Error>(())
    })?;
    std::process::exit(0)
}

// ------------------------------------------------------------------------------------------
// The parent: processes, samples, phases

/// One node process and what it printed.
pub(crate) struct Node {
    id: usize,
    pub(crate) child: Child,
    events: Arc<Mutex<Vec<(i64, bool, String)>>>,
    ready: Arc<Mutex<Option<i64>>>,
    cpu_us: Arc<Mutex<Option<u64>>>,
    spawned: i64,
    killed: Option<i64>,
}

fn spawn(id: usize, url: &str, table: &str) -> Result<Node, Error> {
    spawn_with(id, url, table, &[])
}

/// A node process with extra settings (`ORION_BENCH_SHARD_COUNT` and the like).
pub(crate) fn spawn_with(
    id: usize,
    url: &str,
    table: &str,
    settings: &[(&str, String)],
) -> Result<Node, Error> {
    let spawned = unix_us();
    let mut child = Command::new(std::env::current_exe()?)
        .envs(settings.iter().map(|(k, v)| (*k, v.as_str())))
        .env(NODE_VAR, member(id))
        .env("ORION_BENCH_SHARD_URL", url)
        .env("ORION_BENCH_SHARD_TABLE", table)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let events = Arc::new(Mutex::new(Vec::new()));
    let ready = Arc::new(Mutex::new(None));
    let cpu_us = Arc::new(Mutex::new(None));
    let (e, r, c) = (events.clone(), ready.clone(), cpu_us.clone());
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let mut parts = line.split_whitespace();
            match (parts.next(), parts.next(), parts.next()) {
                (Some("ready"), Some(t), _) => *r.lock().unwrap() = t.parse().ok(),
                (Some("cpu"), Some(us), _) => *c.lock().unwrap() = us.parse().ok(),
                (Some(sign @ ("+" | "-")), Some(t), Some(res)) => {
                    if let Ok(t) = t.parse() {
                        e.lock().unwrap().push((t, sign == "+", res.to_owned()));
                    }
                }
                _ => {}
            }
        }
    });
    Ok(Node {
        id,
        child,
        events,
        ready,
        cpu_us,
        spawned,
        killed: None,
    })
}

/// Ownership at one moment: the sample's time and each shard's live holder (0: none, else the
/// node's number).
struct Sample {
    t: i64,
    owner: Vec<u8>,
}

fn shard_index(resource: &str) -> Option<usize> {
    resource.strip_prefix("shard-")?.parse().ok()
}

fn node_index(holder: &str) -> u8 {
    holder
        .strip_prefix("node-")
        .and_then(|n| n.parse().ok())
        .unwrap_or(u8::MAX)
}

async fn sample(db: &DatabaseConnection, table: &str) -> Result<Sample, Error> {
    let before = unix_us();
    let rows = db
        .query_all_raw(sea_orm::Statement::from_string(
            db.get_database_backend(),
            format!(
                "SELECT resource, holder FROM \"{table}\" WHERE expires_at > clock_timestamp()"
            ),
        ))
        .await?;
    let after = unix_us();
    let mut owner = vec![0u8; SHARDS];
    for row in rows {
        let resource: String = row.try_get_by_index(0)?;
        let holder: String = row.try_get_by_index(1)?;
        if let Some(i) = shard_index(&resource).filter(|i| *i < SHARDS) {
            owner[i] = node_index(&holder);
        }
    }
    Ok(Sample {
        t: (before + after) / 2,
        owner,
    })
}

fn counts(s: &Sample, nodes: usize) -> Vec<usize> {
    let mut c = vec![0; nodes + 1];
    for o in &s.owner {
        if (*o as usize) <= nodes {
            c[*o as usize] += 1;
        }
    }
    c
}

/// Every shard led by one of `live`, none of them above `ceil(N / |live|) + slack`.
fn balanced(s: &Sample, live: &[usize]) -> bool {
    let cap = SHARDS.div_ceil(live.len()) + SLACK;
    let mut per: HashMap<u8, usize> = HashMap::new();
    for o in &s.owner {
        if !live.contains(&(*o as usize)) {
            return false;
        }
        *per.entry(*o).or_default() += 1;
    }
    per.values().all(|n| *n <= cap)
}

/// Samples into `samples` until `done` says so (given the samples so far) or the limit.
async fn sample_until<F>(
    db: &DatabaseConnection,
    table: &str,
    samples: &mut Vec<Sample>,
    limit: Duration,
    mut done: F,
) -> Result<bool, Error>
where
    F: FnMut(&[Sample]) -> bool,
{
    let start = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(SAMPLE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        samples.push(sample(db, table).await?);
        if done(samples) {
            return Ok(true);
        }
        if start.elapsed() > limit {
            return Ok(false);
        }
    }
}

/// The first sample at or after `from` (a sample index) that is balanced over `live`.
fn first_balanced(samples: &[Sample], from: usize, live: &[usize]) -> Option<i64> {
    samples[from..]
        .iter()
        .find(|s| balanced(s, live))
        .map(|s| s.t)
}

/// Whether ownership has not changed for [`SETTLE`] and the last sample is balanced.
fn settled(samples: &[Sample], from: usize, live: &[usize]) -> bool {
    let Some(last) = samples.last() else {
        return false;
    };
    if samples.len() <= from || !balanced(last, live) {
        return false;
    }
    let since = samples[from..]
        .iter()
        .rev()
        .take_while(|s| s.owner == last.owner)
        .last()
        .map(|s| s.t)
        .unwrap_or(last.t);
    last.t - since >= SETTLE.as_micros() as i64
}

/// The longest time a shard had no live lease over `samples[from..to]`, in ms, bounded by the
/// sampling: `(lower, upper)`, from the first to the last sample without a lease, and from
/// the last sample with one before to the first with one after.
fn longest_gap(samples: &[Sample], from: usize, to: usize) -> (f64, f64) {
    let mut best = (0.0f64, 0.0f64);
    for shard in 0..SHARDS {
        let mut last_led: Option<i64> = None;
        let mut first_free: Option<i64> = None;
        let mut last_free: Option<i64> = None;
        for s in &samples[from.saturating_sub(1)..to] {
            if s.owner[shard] == 0 {
                first_free.get_or_insert(s.t);
                last_free = Some(s.t);
            } else {
                if let (Some(l), Some(f), Some(e)) = (last_led, first_free, last_free) {
                    let upper = (s.t - l) as f64 / 1e3;
                    if upper > best.1 {
                        best = ((e - f) as f64 / 1e3, upper);
                    }
                }
                first_free = None;
                last_free = None;
                last_led = Some(s.t);
            }
        }
    }
    best
}

/// Shards whose holder changed between `samples[from]` and `samples[to]`.
fn moved(samples: &[Sample], from: usize, to: usize) -> usize {
    (0..SHARDS)
        .filter(|i| samples[from].owner[*i] != samples[to].owner[*i])
        .count()
}

/// What the nodes reported, per shard: (start, end, node) of every term, in time order.
fn terms(nodes: &[Node], end: i64) -> BTreeMap<String, Vec<(i64, i64, usize)>> {
    let mut out: BTreeMap<String, Vec<(i64, i64, usize)>> = BTreeMap::new();
    for n in nodes {
        let mut open: HashMap<String, i64> = HashMap::new();
        let events = n.events.lock().unwrap().clone();
        for (t, plus, r) in events {
            if plus {
                open.insert(r, t);
            } else if let Some(s) = open.remove(&r) {
                out.entry(r).or_default().push((s, t, n.id));
            }
        }
        // Still open: a killed node's terms end when it died; the others' at `end`.
        for (r, s) in open {
            out.entry(r)
                .or_default()
                .push((s, n.killed.unwrap_or(end), n.id));
        }
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

/// From the nodes' reports over `[from, to]`: the longest time between one node's term of a
/// shard ending and the next term of it starting (ms), and how many times two nodes' terms of
/// the same shard overlapped (a killed node's terms excluded: it cannot report their end).
fn term_gaps(nodes: &[Node], from: i64, to: i64, end: i64) -> (f64, Vec<String>) {
    let mut longest = 0.0f64;
    let mut overlaps = Vec::new();
    let killed: HashSet<usize> = nodes
        .iter()
        .filter(|n| n.killed.is_some())
        .map(|n| n.id)
        .collect();
    for (shard, v) in terms(nodes, end) {
        for w in v.windows(2) {
            let ((_, e0, n0), (s1, _, _)) = (w[0], w[1]);
            if e0 >= from && s1 <= to {
                longest = longest.max((s1 - e0) as f64 / 1e3);
            }
            let (_, _, n1) = w[1];
            if s1 < e0 && !killed.contains(&n0) && s1 >= from && e0 <= to {
                overlaps.push(format!(
                    "{shard}: node-{n0}'s term ended {:.1} ms after node-{n1}'s started",
                    (e0 - s1) as f64 / 1e3
                ));
            }
        }
    }
    (longest, overlaps)
}

struct Run {
    cold_ms: f64,
    cold_settled_ms: f64,
    join_ms: f64,
    join_moved: usize,
    join_gap_ms: (f64, f64),
    join_term_gap_ms: f64,
    kill_orphans: usize,
    kill_ms: f64,
    kill_lapse_ms: f64,
    kill_first_ms: f64,
    kill_in_one_round: usize,
    kill_balanced_ms: f64,
    overlaps: usize,
    node_cpu_ms_per_s: f64,
    samples: Vec<Sample>,
    t0: i64,
    join_at: i64,
    kill_at: i64,
}

async fn one_run(url: &str, run: usize) -> Result<Run, Error> {
    let table = super::unique(&format!("obshard{run}"));
    let db = super::connect(url, 2, false).await?;
    super::migrate(&db, &table).await?;
    migrate_members(&db, &table).await?;
    // With the members' counts, as a user who runs every migration has them.
    add_member_counts(&db, &table).await?;
    let mut samples: Vec<Sample> = Vec::new();
    let mut nodes: Vec<Node> = Vec::new();

    // (a) Cold start: 4 processes at once.
    let t0 = unix_us();
    for id in 1..=4 {
        nodes.push(spawn(id, url, &table)?);
    }
    let four = [1, 2, 3, 4];
    if !sample_until(&db, &table, &mut samples, PHASE_LIMIT, |s| {
        settled(s, 0, &four)
    })
    .await?
    {
        return Err("the 4 nodes did not settle on a balanced assignment within 60 s".into());
    }
    let cold = first_balanced(&samples, 0, &four).ok_or("never balanced")?;
    let last = samples.last().map(|s| s.owner.clone()).unwrap_or_default();
    let cold_settled = samples
        .iter()
        .rev()
        .take_while(|s| s.owner == last)
        .last()
        .map(|s| s.t)
        .unwrap_or(cold);

    // (b) A 5th node joins.
    let join_from = samples.len() - 1;
    let join_at = unix_us();
    nodes.push(spawn(5, url, &table)?);
    let five = [1, 2, 3, 4, 5];
    if !sample_until(&db, &table, &mut samples, PHASE_LIMIT, |s| {
        settled(s, join_from + 1, &five)
    })
    .await?
    {
        return Err("no balanced assignment over 5 nodes within 60 s of the join".into());
    }
    let join_balanced = first_balanced(&samples, join_from + 1, &five).ok_or("never balanced")?;
    let join_to = samples.len();
    let join_gap = longest_gap(&samples, join_from + 1, join_to);
    let join_moved = moved(&samples, join_from, join_to - 1);

    // (c) SIGKILL one node.
    let kill_from = samples.len() - 1;
    let orphans: Vec<usize> = (0..SHARDS)
        .filter(|i| samples[kill_from].owner[*i] as usize == VICTIM)
        .collect();
    let kill_at = unix_us();
    {
        let victim = nodes
            .iter_mut()
            .find(|n| n.id == VICTIM)
            .ok_or("no victim")?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(victim.child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )?;
        victim.killed = Some(kill_at);
        let _ = victim.child.wait();
    }
    let rest = [1, 3, 4, 5];
    let led_again = |s: &Sample| {
        orphans
            .iter()
            .all(|i| s.owner[*i] != 0 && s.owner[*i] as usize != VICTIM)
    };
    if !sample_until(&db, &table, &mut samples, PHASE_LIMIT, |s| {
        s.last().is_some_and(led_again) && settled(s, kill_from + 1, &rest)
    })
    .await?
    {
        return Err("the killed node's shards were not all led again within 60 s".into());
    }
    let kill_led = samples[kill_from + 1..]
        .iter()
        .find(|s| led_again(s))
        .map(|s| s.t)
        .ok_or("never led again")?;
    let kill_balanced = first_balanced(&samples, kill_from + 1, &rest).ok_or("never balanced")?;
    // When the killed node's leases lapsed (the first sample where it holds none), and when
    // each of its shards was led again.
    let after_kill = &samples[kill_from + 1..];
    let lapse = after_kill
        .iter()
        .find(|s| s.owner.iter().all(|o| *o as usize != VICTIM))
        .map(|s| s.t)
        .ok_or("its leases never lapsed")?;
    let again: Vec<i64> = orphans
        .iter()
        .filter_map(|i| {
            after_kill
                .iter()
                .find(|s| s.owner[*i] != 0 && s.owner[*i] as usize != VICTIM)
                .map(|s| s.t)
        })
        .collect();
    let kill_first = again.iter().copied().min().unwrap_or(lapse);
    let in_one_round = again
        .iter()
        .filter(|t| **t <= lapse + INTERVAL.as_micros() as i64)
        .count();

    // Stop the others gracefully (their standard input closes).
    let end = unix_us();
    for n in nodes.iter_mut().filter(|n| n.killed.is_none()) {
        std::mem::drop(n.child.stdin.take());
    }
    let mut cpu = Vec::new();
    for n in nodes.iter_mut().filter(|n| n.killed.is_none()) {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        loop {
            if n.child.try_wait()?.is_some() {
                break;
            }
            if std::time::Instant::now() > deadline {
                eprintln!("node-{} did not stop within 15 s; killing it", n.id);
                let _ = n.child.kill();
                let _ = n.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(50)); // its last lines
        if let Some(us) = *n.cpu_us.lock().unwrap() {
            let ready = n.ready.lock().unwrap().unwrap_or(n.spawned);
            cpu.push(us as f64 / 1e3 / ((end - ready) as f64 / 1e6));
        }
    }
    dump(run, t0, &samples, &nodes)?;
    let (join_term_gap, _) = term_gaps(&nodes, join_at, kill_at, end);
    let (_, overlaps) = term_gaps(&nodes, t0, i64::MAX, end);
    for o in &overlaps {
        eprintln!("shards: run {run}: two terms of one shard overlapped: {o}");
    }
    let overlaps = overlaps.len();

    super::drop(&db, &table).await;
    drop_members(&db, &table).await;
    let ms = |a: i64, b: i64| (b - a) as f64 / 1e3;
    Ok(Run {
        cold_ms: ms(t0, cold),
        cold_settled_ms: ms(t0, cold_settled),
        join_ms: ms(join_at, join_balanced),
        join_moved,
        join_gap_ms: join_gap,
        join_term_gap_ms: join_term_gap,
        kill_orphans: orphans.len(),
        kill_ms: ms(kill_at, kill_led),
        kill_lapse_ms: ms(kill_at, lapse),
        kill_first_ms: ms(kill_at, kill_first),
        kill_in_one_round: in_one_round,
        kill_balanced_ms: ms(kill_at, kill_balanced),
        overlaps,
        node_cpu_ms_per_s: cpu.iter().sum::<f64>() / cpu.len().max(1) as f64,
        samples,
        t0,
        join_at,
        kill_at,
    })
}

/// Writes the run's samples and the nodes' reports to `target/orion-bench/shards-run<N>-*.csv`
/// (times in ms since the 4 processes were spawned), for a closer look.
fn dump(run: usize, t0: i64, samples: &[Sample], nodes: &[Node]) -> Result<(), Error> {
    let dir = std::path::Path::new("target/orion-bench");
    std::fs::create_dir_all(dir)?;
    let ms = |t: i64| (t - t0) as f64 / 1e3;
    let mut out = String::from("t_ms");
    for i in 0..SHARDS {
        out.push_str(&format!(",shard-{i}"));
    }
    out.push('\n');
    for s in samples {
        out.push_str(&format!("{:.1}", ms(s.t)));
        for o in &s.owner {
            out.push_str(&format!(",{o}"));
        }
        out.push('\n');
    }
    std::fs::write(dir.join(format!("shards-run{run}-samples.csv")), out)?;
    let mut out = String::from("node,t_ms,event,resource\n");
    for n in nodes {
        out.push_str(&format!("{},{:.1},spawned,\n", n.id, ms(n.spawned)));
        if let Some(k) = n.killed {
            out.push_str(&format!("{},{:.1},killed,\n", n.id, ms(k)));
        }
        for (t, plus, r) in n.events.lock().unwrap().iter() {
            let e = if *plus { "led" } else { "ended" };
            out.push_str(&format!("{},{:.1},{e},{r}\n", n.id, ms(*t)));
        }
    }
    std::fs::write(dir.join(format!("shards-run{run}-events.csv")), out)?;
    Ok(())
}

pub(crate) async fn migrate_members(db: &DatabaseConnection, table: &str) -> Result<(), Error> {
    use orion_beacon_migration::{CreateMemberTable, MigrationTrait, SchemaManager};
    drop_members(db, table).await;
    CreateMemberTable::with_table(format!("{table}_m"))?
        .up(&SchemaManager::new(db))
        .await?;
    Ok(())
}

/// Adds the members' count columns (`AddMemberHolding`) to the membership table of `table`.
pub(crate) async fn add_member_counts(db: &DatabaseConnection, table: &str) -> Result<(), Error> {
    use orion_beacon_migration::{AddMemberHolding, MigrationTrait, SchemaManager};
    AddMemberHolding::with_table(format!("{table}_m"))?
        .up(&SchemaManager::new(db))
        .await?;
    Ok(())
}

pub(crate) async fn drop_members(db: &DatabaseConnection, table: &str) {
    use orion_beacon_migration::{CreateMemberTable, MigrationTrait, SchemaManager};
    if let Ok(m) = CreateMemberTable::with_table(format!("{table}_m")) {
        let _ = m.down(&SchemaManager::new(db)).await;
    }
}

/// Shards led per node over time, and shards with no live lease.
fn chart(r: &Run, path: &std::path::Path) -> Result<(), Error> {
    let secs = |t: i64| (t - r.t0) as f64 / 1e6;
    let tmax = r.samples.last().map(|s| secs(s.t)).unwrap_or(1.0).max(1.0);
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "ShardSet on PostgreSQL: {SHARDS} shards, shards led per node (lease {} s, interval {} ms)",
                LEASE.as_secs(),
                INTERVAL.as_millis()
            ),
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(45)
        .build_cartesian_2d(0.0..tmax, 0usize..SHARDS + 8)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the 4 node processes were spawned")
        .y_desc("shards with a live lease")
        .draw()?;
    let colors = [
        RGBColor(0x88, 0x88, 0x88),
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0xd6, 0x27, 0x28),
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0xff, 0x7f, 0x0e),
        RGBColor(0x94, 0x67, 0xbd),
    ];
    for (i, color) in colors.iter().copied().enumerate() {
        let label = if i == 0 {
            "no live lease".to_owned()
        } else if i == VICTIM {
            format!("node-{i} (SIGKILL)")
        } else {
            format!("node-{i}")
        };
        chart
            .draw_series(LineSeries::new(
                r.samples.iter().map(|s| (secs(s.t), counts(s, 5)[i])),
                color.stroke_width(2),
            ))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    for (t, what) in [(r.join_at, "node-5 joins"), (r.kill_at, "node-2 killed")] {
        let x = secs(t);
        chart.draw_series(LineSeries::new(
            vec![(x, 0), (x, SHARDS + 8)],
            BLACK.mix(0.4).stroke_width(1),
        ))?;
        chart.draw_series(std::iter::once(Text::new(
            what,
            (x + tmax / 200.0, SHARDS),
            ("sans-serif", 12),
        )))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

pub async fn shards() -> Result<(), Error> {
    if super::external("ORION_BEACON_PG_URL") {
        println!("\n(shards: on the server ORION_BEACON_PG_URL names)");
    }
    let url = super::pg_url();
    let runs: usize = std::env::var("BENCH_SHARD_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let mut results = Vec::new();
    for run in 0..runs {
        results.push(one_run(&url, run).await?);
    }
    println!(
        "\n## Shard sets: {SHARDS} shards over node processes on PostgreSQL \
         (lease {} s, interval {} ms, slack {SLACK}, grace {} s; ownership sampled from the lease \
         table every {} ms; {runs} runs)\n",
        LEASE.as_secs(),
        INTERVAL.as_millis(),
        GRACE.as_secs(),
        SAMPLE.as_millis()
    );
    let cap = |m: usize| SHARDS.div_ceil(m) + SLACK;
    let col = |f: &dyn Fn(&Run) -> String| results.iter().map(f).collect::<Vec<_>>().join(" / ");
    println!("| measure | runs |");
    println!("| --- | --- |");
    println!(
        "| (a) cold start, 4 processes: spawn to balanced (all led, each <= {}) | {} ms |",
        cap(4),
        col(&|r| format!("{:.0}", r.cold_ms))
    );
    println!(
        "| (a) ... to the last lease changing hands | {} ms |",
        col(&|r| format!("{:.0}", r.cold_settled_ms))
    );
    println!(
        "| (b) 5th node joins: spawn to balanced (each <= {}) | {} ms |",
        cap(5),
        col(&|r| format!("{:.0}", r.join_ms))
    );
    println!(
        "| (b) shards that changed hands | {} |",
        col(&|r| r.join_moved.to_string())
    );
    println!(
        "| (b) longest time a shard had no live lease (lease table; bounds from the sampling) | {} ms |",
        col(&|r| format!("{:.0}-{:.0}", r.join_gap_ms.0, r.join_gap_ms.1))
    );
    println!(
        "| (b) longest time a shard had no term (nodes' reports: old term's `lost()` to the new term in its node's assignment, an upper bound) | {} ms |",
        col(&|r| format!("{:.0}", r.join_term_gap_ms))
    );
    println!(
        "| (c) SIGKILL of node-{VICTIM}: its shards | {} |",
        col(&|r| r.kill_orphans.to_string())
    );
    println!(
        "| (c) kill to its leases lapsing (no live lease of node-{VICTIM} left) | {} ms |",
        col(&|r| format!("{:.0}", r.kill_lapse_ms))
    );
    println!(
        "| (c) kill to the first of them led again | {} ms |",
        col(&|r| format!("{:.0}", r.kill_first_ms))
    );
    println!(
        "| (c) of them led again within one interval of the lapse | {} |",
        col(&|r| format!("{} of {}", r.kill_in_one_round, r.kill_orphans))
    );
    println!(
        "| (c) kill to every one of them led again (lease + interval = {} ms) | {} ms |",
        (LEASE + INTERVAL).as_millis(),
        col(&|r| format!("{:.0}", r.kill_ms))
    );
    println!(
        "| (c) kill to balanced over the 4 left (each <= {}) | {} ms |",
        cap(4),
        col(&|r| format!("{:.0}", r.kill_balanced_ms))
    );
    println!(
        "| shards led by two nodes at once (nodes' reports) | {} |",
        col(&|r| r.overlaps.to_string())
    );
    println!(
        "| node process CPU (mean over the nodes that lived to the end) | {} ms/s |",
        col(&|r| format!("{:.1}", r.node_cpu_ms_per_s))
    );
    std::fs::create_dir_all("target/orion-bench")?;
    let path = std::path::PathBuf::from("target/orion-bench/shards.svg");
    chart(&results[0], &path)?;
    println!("\nchart (first run): {}", path.display());
    Ok(())
}
