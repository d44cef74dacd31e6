//! The faults: which kinds apply to a configuration, the schedule that applies them during a
//! run (leader kills and pauses, connection kills, server restarts, failovers, Galera node
//! faults), and the signals they are made of.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use orion_beacon::{LeaseStore, SeaOrmLeaseStore};
use sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait};
use tokio::task::JoinHandle;

use crate::checker;
use crate::clock::mono_ns;
use crate::common::Rng;
use crate::db::{connect_rollback_journal, db_answers};
use crate::run::{spawn, Proc, Setup};
use crate::servers::{private_postgres, Cluster};
use crate::{Backend, Error, LEASE, ROLLBACK_BUSY_TIMEOUT};

/// The fault kinds that apply to the configuration, narrowed to `--faults` when given.
pub fn applicable(s: &Setup, requested: Option<&[String]>) -> Vec<String> {
    let all: Vec<&str> = match s.backend {
        Backend::Sqlite => vec!["kill", "pause"],
        _ if s.cluster.is_some() => vec![
            "kill",
            "pause",
            "partition",
            "connkill",
            "restart",
            "failover",
        ],
        _ if s.galera.is_some() => {
            vec![
                "kill",
                "pause",
                "partition",
                "connkill",
                "restart",
                "nodekill",
                "nodestop",
            ]
        }
        _ => vec!["kill", "pause", "partition", "connkill", "restart"],
    };
    all.into_iter()
        .filter(|f| requested.is_none_or(|list| list.iter().any(|l| l == f)))
        .map(str::to_owned)
        .collect()
}

/// What the fault schedule applied, for the checker and the summary line.
#[derive(Default)]
pub struct Faults {
    /// Every fault's window, in the histories' monotonic nanoseconds.
    pub log: Vec<checker::Fault>,
    /// When each killed candidate was SIGKILLed.
    pub kills: HashMap<String, u64>,
    /// How many faults of each kind were applied.
    pub counts: HashMap<String, u32>,
    /// Failovers with a leader killed inside the replication lag (see `standby_lag`).
    pub lag_kills: u32,
    /// Faults that did nothing or left the servers broken (a connkill that killed nothing, a
    /// standby not rebuilt, a Galera node that did not rejoin): the run proves less than it says.
    pub problems: Vec<String>,
    /// Replacement candidates started so far: the `M` of `cN-rM`.
    incarnation: u32,
}

impl Faults {
    /// A fault of `kind` was applied over `start..end`.
    fn applied(&mut self, kind: &str, candidate: Option<String>, start: u64, end: u64) {
        self.log.push(checker::Fault {
            kind: kind.into(),
            candidate,
            start,
            end,
        });
        *self.counts.entry(kind.into()).or_default() += 1;
    }

    /// A killed Galera node came back: the window of its state transfer (a server fault of its
    /// own, not counted as one applied), or why it did not.
    fn rejoined(&mut self, outcome: Result<(u64, u64), Error>) {
        match outcome {
            Ok((start, end)) => self.log.push(checker::Fault {
                kind: "noderejoin".into(),
                candidate: None,
                start,
                end,
            }),
            Err(e) => self
                .problems
                .push(format!("a Galera node did not rejoin: {e}")),
        }
    }
}

/// How long past its duration a run goes on to apply the fault kinds it has not applied yet.
const OVERTIME: Duration = Duration::from_secs(30);

/// Applies faults of the `faults` kinds until the run's `duration` after `started` is nearly
/// over (and past it, up to [`OVERTIME`], until each kind was applied once), 1 to 2.5 s apart;
/// then waits out the run and for the standbys and nodes still being repaired.
pub async fn apply(
    s: &Setup,
    procs: &mut Vec<Proc>,
    faults: &[String],
    duration: Duration,
    started: tokio::time::Instant,
    rng: &mut Rng,
) -> Result<Faults, Error> {
    let probe = s.admin_url.clone();
    let mut run = Faults::default();
    // Every kind at least once, in a seeded order, then random ones.
    let mut bag: Vec<String> = faults.to_vec();
    for i in (1..bag.len()).rev() {
        bag.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut restarts = 0;
    // Kinds that found no leader to hit: tried again later.
    let mut skipped: Vec<String> = Vec::new();
    // Standbys being rebuilt after a failover.
    let mut rebuilds = Vec::new();
    // A Galera node rejoining after a kill.
    let mut rejoin: Option<JoinHandle<Result<(u64, u64), Error>>> = None;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    loop {
        let in_time = started.elapsed() + Duration::from_secs(3) < duration;
        // Every requested kind at least once: a run whose slow faults (a Galera node's state
        // transfer, a restart) took its time goes on, up to OVERTIME, with the kinds it has not
        // applied yet, rather than report a kind it never tried.
        let missing: Vec<&String> = faults
            .iter()
            .filter(|k| !run.counts.contains_key(*k))
            .collect();
        let overtime = !in_time && !missing.is_empty() && started.elapsed() < duration + OVERTIME;
        if faults.is_empty() || !(in_time || overtime) {
            break;
        }
        let kind = match (overtime, skipped.len() > 3, bag.pop()) {
            (true, _, popped) => {
                bag.extend(popped);
                missing[rng.below(missing.len() as u64) as usize].clone()
            }
            (false, false, Some(kind)) => kind,
            (false, _, popped) => {
                bag.extend(popped);
                skipped
                    .pop()
                    .unwrap_or_else(|| faults[rng.below(faults.len() as u64) as usize].clone())
            }
        };
        // A restart takes a while; one per 60 s of run is plenty.
        if kind == "restart" && restarts as f64 > duration.as_secs_f64() / 60.0 {
            continue;
        }
        match kind.as_str() {
            "kill" => {
                let found_leader = kill_leader(s, procs, &mut run, rng).await?;
                if !found_leader {
                    skipped.push(kind.clone());
                }
            }
            "pause" => {
                let found_leader = pause_leader(s, procs, &mut run, rng).await;
                if !found_leader {
                    skipped.push(kind.clone());
                }
            }
            "partition" if !partition_leader(s, procs, &mut run, rng).await => {
                skipped.push(kind.clone());
            }
            "partition" => {}
            "connkill" => {
                let at = mono_ns();
                let n = kill_connections(s).await?;
                run.applied(&kind, None, at, at);
                if n == 0 {
                    run.problems
                        .push(format!("connkill at {at} killed no connection"));
                }
            }
            "nodekill" | "nodestop" | "restart" if s.galera.is_some() => {
                let Some(g) = s.galera.clone() else {
                    continue;
                };
                // One node fault at a time: a node still rejoining is not hit again (two of
                // three nodes down is no quorum, which no lease store survives).
                if rejoin.as_ref().is_some_and(|r| !r.is_finished()) {
                    skipped.push(kind.clone());
                } else {
                    if let Some(r) = rejoin.take() {
                        run.rejoined(r.await?);
                    }
                    rejoin = node_fault(g, &kind, &mut run, rng).await?;
                }
            }
            "failover" => {
                let Some(cluster) = s.cluster.clone() else {
                    continue;
                };
                match fail_over(s, procs, cluster, &mut run, rng).await? {
                    Some(rebuild) => rebuilds.push(rebuild),
                    // The standby is still being rebuilt.
                    None => skipped.push(kind.clone()),
                }
            }
            "restart" => {
                let from = mono_ns();
                restart_server(s, &probe).await?;
                let to = mono_ns();
                restarts += 1;
                run.applied(&kind, None, from, to);
            }
            _ => {}
        }
        // Ranked electors: quiet spells long enough for the preferred leader to come back
        // and be seen leading (`rank_checker`).
        let gap = if s.config.ranked { 4000 } else { 1000 };
        tokio::time::sleep(Duration::from_millis(gap + rng.below(1500))).await;
    }
    let remaining = duration.saturating_sub(started.elapsed());
    tokio::time::sleep(remaining.max(Duration::from_secs(2))).await;

    for rebuild in rebuilds {
        if let Err(e) = rebuild.await? {
            run.problems
                .push(format!("a standby could not be rebuilt: {e}"));
        }
    }
    if let Some(r) = rejoin.take() {
        run.rejoined(r.await?);
    }
    Ok(run)
}

/// The candidate the lease table names as the live holder, if it is one of `procs`; in the
/// shard-set configurations, the holder of a live lease of a resource drawn at random.
async fn leader_process<'a>(s: &Setup, procs: &'a [Proc], rng: &mut Rng) -> Option<&'a Proc> {
    // Two tenants: the leader of either, drawn at random (faults on both). Asked on a
    // connection of its own, made for this look: after a failover the harness's pool can be
    // left with connections that hang (the old primary's), and a look that waits for one finds
    // no leader for as long as they do.
    // (SQLite: the harness's own connection, in the run's journal mode.)
    // Rate-limit clients all ask all the time: any live one.
    if s.config.rates {
        let live: Vec<&Proc> = procs.iter().filter(|p| p.child.id().is_some()).collect();
        return (!live.is_empty()).then(|| live[rng.below(live.len() as u64) as usize]);
    }
    let (url, table) = match &s.neighbour {
        Some(n) if rng.below(2) == 1 => (n.admin_url.clone(), n.table.clone()),
        _ => (s.admin_url.clone(), s.table.clone()),
    };
    let db = if s.backend == Backend::Sqlite {
        s.admin.clone()
    } else {
        crate::db::connect(&url, 1).await.ok()?
    };
    let store = SeaOrmLeaseStore::new(db)
        .with_table(&table)
        .ok()?
        .with_lease_connections(0)
        .ok()?;
    if !s.shards.is_empty() {
        let records = store.current_all(&s.shards).await.ok()?;
        let held: Vec<&Proc> = records
            .iter()
            .filter(|r| r.live)
            // A process killed earlier keeps its name in `procs` (its history is read later).
            .filter_map(|r| {
                // A lock client's holds are `<name>/<random>-<n>`.
                let process = r.holder.split('/').next().unwrap_or_default();
                procs
                    .iter()
                    .find(|p| p.name == process && p.child.id().is_some())
            })
            .collect();
        if held.is_empty() {
            return None;
        }
        // Lock clients: a holder inside a fenced transaction (its transaction's marker file
        // exists; only a holder opens one), when one is within two seconds, so pauses and
        // partitions land where a stalled holder keeps its lease rows locked.
        if s.config.locks.is_some() {
            for _ in 0..200 {
                let inside: Vec<&Proc> = procs
                    .iter()
                    .filter(|p| p.child.id().is_some())
                    .filter(|p| crate::lock_node::marker(&p.history).exists())
                    .collect();
                if !inside.is_empty() {
                    return Some(inside[rng.below(inside.len() as u64) as usize]);
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
        return Some(held[rng.below(held.len() as u64) as usize]);
    }
    let rec = store.current(&s.resource).await.ok()??;
    if !rec.live {
        return None;
    }
    procs.iter().find(|p| p.name == rec.holder)
}

/// SIGKILLs the leader (no release: its lease must lapse) and, after a while, starts a new
/// incarnation (a new candidate id) in its place. `false` if no leader was found.
async fn kill_leader(
    s: &Setup,
    procs: &mut Vec<Proc>,
    run: &mut Faults,
    rng: &mut Rng,
) -> Result<bool, Error> {
    let Some(p) = leader_process(s, procs, rng).await else {
        return Ok(false);
    };
    let name = p.name.clone();
    signal(p, Signal::SIGKILL);
    let at = mono_ns();
    run.kills.insert(name.clone(), at);
    run.applied("kill", Some(name.clone()), at, at);
    tokio::time::sleep(Duration::from_millis(300 + rng.below(700))).await;
    run.incarnation += 1;
    let base = name.split("-r").next().unwrap_or(&name);
    let fresh = format!("{base}-r{}", run.incarnation);
    if let Some(slot) = procs.iter_mut().find(|p| p.name == name) {
        let _ = slot.child.wait().await;
        // The replacement runs on the same (skewed) host clock.
        let offset = slot.offset.clone();
        let old = std::mem::replace(slot, spawn(s, &fresh, offset.as_deref())?);
        // keep the dead one's history for the checker
        procs.push(old);
    }
    Ok(true)
}

/// How long a pause or a partition lasts: two leases and up to `extra_ms` more; one in three
/// lasts 3-4 s instead, longer than the recovery bound, so that only a takeover (the next
/// candidate or node ending the stalled holder's session) recovers in time: a stall shorter
/// than the bound ends by itself when the holder wakes, and would let a broken takeover pass.
/// (Candidates on pools of one connection get the short ones only: the takeover needs a second
/// one, a documented limit.) The first stall of each kind is a short one, so a short run still
/// gets every kind of fault.
fn stall_length(s: &Setup, run: &Faults, kind: &str, rng: &mut Rng, extra_ms: u64) -> Duration {
    let takeover_possible = s.config.pool >= 2 && s.backend != Backend::Sqlite;
    let again = run.counts.contains_key(kind);
    if takeover_possible && again && rng.below(3) == 0 {
        Duration::from_millis(3_000 + rng.below(1_000))
    } else {
        LEASE * 2 + Duration::from_millis(rng.below(extra_ms))
    }
}

/// SIGSTOPs the leader for two leases or more (see [`stall_length`]), then lets it go on (it
/// wakes up believing in its term: the fence must refuse its writes). `false` if no leader was
/// found.
async fn pause_leader(s: &Setup, procs: &[Proc], run: &mut Faults, rng: &mut Rng) -> bool {
    let Some(p) = leader_process(s, procs, rng).await else {
        return false;
    };
    let name = p.name.clone();
    let from = mono_ns();
    signal(p, Signal::SIGSTOP);
    tokio::time::sleep(stall_length(s, run, "pause", rng, 500)).await;
    if let Some(p) = procs.iter().find(|p| p.name == name) {
        signal(p, Signal::SIGCONT);
    }
    let to = mono_ns();
    // Liveness: another candidate takes over, measured from `from`.
    run.applied("pause", Some(name), from, to);
    true
}

/// Cuts the leader off from the database (both directions, no connection closed; see
/// `partition`) for two leases or more, then heals it. Whatever it was doing (idle, renewing,
/// inside a fenced transaction), the others must take over as after a kill.
async fn partition_leader(s: &Setup, procs: &[Proc], run: &mut Faults, rng: &mut Rng) -> bool {
    let Some(p) = leader_process(s, procs, rng).await else {
        return false;
    };
    let name = p.name.clone();
    let from = mono_ns();
    // Half the time, a connection the server ends meanwhile (the takeover's) is left half-open
    // at the candidate: what a partition that outlasts the server's FIN retransmissions leaves.
    s.partitions.set_with(&name, true, rng.below(2) == 0);
    tokio::time::sleep(stall_length(s, run, "partition", rng, 1_500)).await;
    s.partitions.set(&name, false);
    let to = mono_ns();
    run.applied("partition", Some(name), from, to);
    true
}

/// Kills the candidates' server connections (all nodes' on Galera); how many were killed.
async fn kill_connections(s: &Setup) -> Result<u64, Error> {
    match s.backend {
        Backend::Postgres => {
            let sql = format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'orion-torture-{}'",
                std::process::id()
            );
            Ok(s.admin
                .query_all_raw(sea_orm::Statement::from_string(
                    s.admin.get_database_backend(),
                    sql,
                ))
                .await?
                .len() as u64)
        }
        Backend::MySql => {
            let admins = if s.node_admins.is_empty() {
                std::slice::from_ref(&s.admin)
            } else {
                &s.node_admins[..]
            };
            let mut n = 0;
            for admin in admins {
                // A node that is down has no connections to kill.
                let Ok(rows) = admin
                    .query_all_raw(sea_orm::Statement::from_string(
                        admin.get_database_backend(),
                        "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = 'orion_torture' AND ID <> CONNECTION_ID()",
                    ))
                    .await
                else {
                    continue;
                };
                for row in rows {
                    let id: i64 = row
                        .try_get_by_index::<u64>(0)
                        .map(|v| v as i64)
                        .or_else(|_| row.try_get_by_index::<i64>(0))?;
                    if admin
                        .execute_unprepared(&format!("KILL CONNECTION {id}"))
                        .await
                        .is_ok()
                    {
                        n += 1;
                    }
                }
            }
            Ok(n)
        }
        Backend::Sqlite => Ok(0),
    }
}

/// Restarts the private server (a clean stop, then a start on the same port and data), then
/// waits until it answers queries.
async fn restart_server(s: &Setup, probe_url: &str) -> Result<(), Error> {
    match s.backend {
        Backend::Postgres if s.cluster.is_some() => {
            let cluster = s.cluster.clone().ok_or("no cluster")?;
            tokio::task::spawn_blocking(move || {
                let c = cluster.lock().unwrap_or_else(|e| e.into_inner());
                c.primary.restart()
            })
            .await??;
        }
        Backend::Postgres => {
            let pg = private_postgres().await?;
            tokio::task::spawn_blocking(move || pg.restart()).await??;
        }
        Backend::MySql => {
            let db = s.mariadb.ok_or("no private MariaDB")?;
            tokio::task::spawn_blocking(move || db.restart()).await??;
        }
        Backend::Sqlite => return Ok(()),
    }
    for _ in 0..120 {
        if db_answers(probe_url).await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err("the database did not come back within 60 s".into())
}

/// A Galera node fault of `kind` (`nodekill`, `nodestop` or `restart`) on node 1 or 2. After
/// a kill, the node's rejoin goes on in the background: its task is returned.
async fn node_fault(
    g: Arc<orion_beacon_testkit::Galera>,
    kind: &str,
    run: &mut Faults,
    rng: &mut Rng,
) -> Result<Option<JoinHandle<Result<(u64, u64), Error>>>, Error> {
    // Nodes 1 and 2: the harness reads the ledger through node 0.
    let node = 1 + rng.below(2) as usize;
    let stop_for = LEASE + Duration::from_millis(100 + rng.below(100));
    let from = mono_ns();
    let kill_node = kind == "nodekill";
    let restart = kind == "restart";
    let g2 = g.clone();
    tokio::task::spawn_blocking(move || -> Result<(), Error> {
        if restart {
            // Cleanly: it rejoins with an incremental state transfer.
            g2.node(node).restart()?;
            g2.wait_synced(Duration::from_secs(120))?;
            return Ok(());
        }
        if kill_node {
            // The others go on as a cluster of two once they suspect it.
            g2.node(node).kill()?;
        } else {
            // Longer than a lease, shorter than the failure detector: every
            // node's writes wait for it.
            g2.node(node).signal("STOP")?;
            std::thread::sleep(stop_for);
            g2.node(node).signal("CONT")?;
        }
        if g2.wait_synced(Duration::from_secs(30)).is_err() && !kill_node {
            // Evicted after all and stuck outside the cluster: what an
            // operator does, a restart, after which it rejoins.
            g2.node(node).restart()?;
            g2.wait_synced(Duration::from_secs(120))?;
        } else if kill_node && g2.wait_synced(Duration::from_secs(60)).is_err() {
            // The two survivors lost each other too (seen once on 2 busy cores: each alone,
            // non-primary, "Initialized"): bootstrap one of them, as an operator would.
            g2.bootstrap_primary()?;
            g2.wait_synced(Duration::from_secs(120))?;
        }
        Ok(())
    })
    .await??;
    let to = mono_ns();
    run.applied(kind, None, from, to);
    if !kill_node {
        return Ok(None);
    }
    // Back after a while, with a full state transfer (its data after a SIGKILL is not
    // trusted). The state transfer blocks the donor's writes while it runs: a server fault
    // window of its own.
    Ok(Some(tokio::task::spawn_blocking(
        move || -> Result<(u64, u64), Error> {
            std::thread::sleep(Duration::from_secs(2));
            let start = mono_ns();
            g.node(node).start()?;
            g.wait_synced(Duration::from_secs(120))?;
            Ok((start, mono_ns()))
        },
    )))
}

/// A failover of the primary to its standby. With `standby_lag`, the primary stops sending WAL
/// first and the leader is killed inside that lag. The standby rebuild that follows goes on in
/// the background: its task is returned; `None` if there was no standby yet.
async fn fail_over(
    s: &Setup,
    procs: &mut Vec<Proc>,
    cluster: Arc<Mutex<Cluster>>,
    run: &mut Faults,
    rng: &mut Rng,
) -> Result<Option<JoinHandle<Result<(), Error>>>, Error> {
    // Replication lag: the primary stops sending WAL, and a term changes hands (the leader is
    // killed) while the standby is behind, so the writes the failover loses include a grant.
    let mut held = None;
    if let Some(lag) = s.config.standby_lag {
        let lag_end = tokio::time::Instant::now() + lag;
        let c = cluster.clone();
        held = tokio::task::spawn_blocking(move || {
            c.lock().unwrap_or_else(|e| e.into_inner()).hold_sender()
        })
        .await??;
        if let Some(sender) = held {
            match kill_leader(s, procs, run, rng).await {
                Ok(true) => run.lag_kills += 1,
                Ok(false) => {}
                Err(e) => {
                    let _ = kill(Pid::from_raw(sender), Signal::SIGCONT);
                    return Err(e);
                }
            }
            tokio::time::sleep_until(lag_end).await;
        }
    }
    let from = mono_ns();
    let failing = cluster.clone();
    let failed_over = tokio::task::spawn_blocking(move || {
        failing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .fail_over(held)
    })
    .await??;
    if !failed_over {
        return Ok(None);
    }
    let to = mono_ns();
    run.applied("failover", None, from, to);
    // A standby of the new primary, so the run can fail over again.
    Ok(Some(tokio::task::spawn_blocking(move || {
        cluster
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .rebuild_standby()
    })))
}

/// SQLite rollback journal: a reader that holds the file's read lock now and then, sometimes
/// past the candidates' busy timeout, so their commits fail and are rolled back. Runs until the
/// returned guard is dropped; nothing for other configurations.
pub async fn start_long_reader(s: &Setup) -> Result<AbortOnDrop, Error> {
    if !s.config.rollback_journal {
        return Ok(AbortOnDrop(None));
    }
    let db = connect_rollback_journal(&s.url, 1, ROLLBACK_BUSY_TIMEOUT).await?;
    Ok(AbortOnDrop(Some(tokio::spawn(long_reader(
        db,
        s.table.clone(),
    )))))
}

/// Read transactions on the lease table, one after another: 100 ms, and every fifth 450 ms
/// (half as long again as the candidates' busy timeout, so that commit fails and is rolled back).
async fn long_reader(db: DatabaseConnection, table: String) {
    let select = format!("SELECT COUNT(*) FROM \"{table}\"");
    for round in 0u64.. {
        let hold = if round % 5 == 4 { 450 } else { 100 };
        if let Ok(txn) = db.begin().await {
            let read = sea_orm::Statement::from_string(sea_orm::DbBackend::Sqlite, select.clone());
            let _ = txn.query_all_raw(read).await;
            tokio::time::sleep(Duration::from_millis(hold)).await;
            let _ = txn.commit().await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Aborts a background task when the run ends, however it ends.
pub struct AbortOnDrop(Option<JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// Sends `sig` to a candidate process (nothing once it has been reaped).
pub fn signal(p: &Proc, sig: Signal) {
    if let Some(pid) = p.child.id() {
        let _ = kill(Pid::from_raw(pid as i32), sig);
    }
}

/// SIGKILL to `pid` and all its children, children first.
pub fn kill_tree(pid: u32) {
    let children = children(pid);
    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGSTOP);
    for child in children {
        let _ = kill(Pid::from_raw(child), Signal::SIGKILL);
    }
    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
}

/// The process ids whose parent is `pid`.
fn children(pid: u32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|stat| {
                    let rest = &stat[stat.rfind(')')? + 2..];
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}
