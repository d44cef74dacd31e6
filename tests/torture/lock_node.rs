//! A lock client process: one `Locks` over the real store, one client loop that takes the
//! run's lock (or a permit of its semaphore), half the time a second one too (the run's pair
//! lock, or a second permit), writes fenced ledger rows while it holds them, in transactions
//! fenced by every hold it has and kept open 50-250 ms for the application's work (the fault
//! scheduler aims its pauses and partitions at holders inside one), and lets go (a release, a
//! dropped guard, or now and then a hold left to be lost), again and again. Its history has the shard node's lines (`shard_node.rs`), one
//! resource per permit, so the per-resource checker judges it: one holder per permit at a time,
//! tokens strictly increasing per permit, every committed ledger row in token order and written
//! by a hold its writer believed in.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use orion_beacon::locks::{LockError, Locks};
use orion_beacon::{LeaderTerm, SeaOrmLeaseStore};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::shard_node::{connect_pools, open_history, Done, Ledger, Terms};
use crate::{Args, Error, LEASE, RENEW, RETRY};

/// How long a client holds what it took (ms, drawn per hold), writing every 50-150 ms.
const HOLD_MS: std::ops::Range<u64> = 200..800;
const WRITE_EVERY_MS: std::ops::Range<u64> = 50..150;
/// How long a client waits for the lock before it gives up and asks again.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a client holding one waits for its second hold.
const SECOND_TIMEOUT: Duration = Duration::from_millis(300);
/// How long a fenced transaction stays open after its inserts (ms, drawn per write).
const IN_TRANSACTION_MS: std::ops::Range<u64> = 50..250;
/// How long a write may go on once its hold is lost: past the longest transaction, so that a
/// woken client's write reaches the fence (and is refused), while one stuck in a cut-off
/// connection is dropped, as an application drops work whose hold is lost (the fence makes it
/// harmless, but the checker counts running work as holding).
const STRAGGLER: Duration = Duration::from_millis(300);

/// Runs `write` to its end, or, once `lost` fires, for at most [`STRAGGLER`] more.
async fn finish_or_drop(
    write: impl std::future::Future<Output = ()>,
    lost: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(write);
    tokio::select! {
        _ = &mut write => {}
        _ = lost => {
            let _ = tokio::time::timeout(STRAGGLER, &mut write).await;
        }
    }
}

/// The lease rows of the run's lock and its pair lock (`permits` 0) or of its semaphore of
/// `permits`; for a reader-writer lock (`rw`), its read slots (its gate is not checked per
/// row: it only orders writers).
pub fn resources(name: &str, permits: u32, rw: bool) -> Vec<String> {
    if rw {
        (0..permits).map(|i| format!("{name}#r{i}")).collect()
    } else if permits == 0 {
        vec![name.to_owned(), pair(name)]
    } else {
        (0..permits).map(|i| format!("{name}#{i}")).collect()
    }
}

/// The second lock of a lock run: clients that hold both fence one transaction with both.
fn pair(name: &str) -> String {
    format!("{name}-pair")
}

/// The file that exists while this client's fenced transaction is open (see
/// `Ledger::write_all`): next to its history.
pub fn marker(history: &std::path::Path) -> std::path::PathBuf {
    history.with_extension("txn")
}

/// Runs one client until the harness writes `shutdown` to its standard input.
pub async fn run(args: Args) -> Result<(), Error> {
    let name = args.candidate.clone().unwrap_or_default();
    let history = open_history(&args, &name)?;
    let (db, ledger_db) = connect_pools(&args).await?;
    let store = SeaOrmLeaseStore::new(db).with_table(&args.table)?;
    let locks = Locks::builder(store)
        .owner(&name)
        .lease_duration(LEASE)
        .renew_interval(RENEW)
        .retry_interval(RETRY)
        .build()?;
    let (lock, semaphore) = if args.permits == 0 {
        (Some(locks.lock(&args.resource)?), None)
    } else {
        (None, Some(locks.semaphore(&args.resource, args.permits)?))
    };
    let pair_lock = locks.lock(pair(&args.resource))?;
    let marker = args.history.as_deref().map(marker);
    let terms = Terms::new(history.clone());
    let ledger = Ledger {
        db: ledger_db,
        history: history.clone(),
        table: args.ledger.clone(),
        me: name.clone(),
        sequences: Default::default(),
    };
    // The hold the client has now, for the stale writer below.
    let current: Arc<Mutex<Option<LeaderTerm>>> = Arc::default();
    if args.rw {
        let rw = locks.rw_lock(&args.resource, args.permits)?;
        let client = tokio::spawn(rw_client(
            rw,
            terms.clone(),
            ledger.clone(),
            marker,
            current.clone(),
        ));
        return finish(history, locks, terms, ledger, current, client).await;
    }

    let (client_terms, client_ledger, client_current) =
        (terms.clone(), ledger.clone(), current.clone());
    let client = tokio::spawn(async move {
        loop {
            let got = match (&lock, &semaphore) {
                (Some(lock), _) => lock.acquire(ACQUIRE_TIMEOUT).await,
                (_, Some(sem)) => sem.acquire(ACQUIRE_TIMEOUT).await,
                _ => return,
            };
            let guard = match got {
                Ok(guard) => guard,
                Err(LockError::Timeout { .. }) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "acquire failed");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            let term = guard.term().clone();
            client_terms.work(&term);
            *client_current.lock().unwrap_or_else(|p| p.into_inner()) = Some(term.clone());
            // Half the time a second hold: the pair lock, or a second permit.
            let second = if fastrand::bool() {
                let got = match (&lock, &semaphore) {
                    (Some(_), _) => pair_lock.acquire(SECOND_TIMEOUT).await,
                    (_, Some(sem)) => sem.acquire(SECOND_TIMEOUT).await,
                    _ => return,
                };
                got.ok()
            } else {
                None
            };
            let second_term = second.as_ref().map(|g| g.term().clone());
            if let Some(t) = &second_term {
                client_terms.work(t);
            }
            {
                let _done = Done {
                    terms: client_terms.clone(),
                    term: term.clone(),
                };
                let _second_done = second_term.clone().map(|term| Done {
                    terms: client_terms.clone(),
                    term,
                });
                let until =
                    tokio::time::Instant::now() + Duration::from_millis(fastrand::u64(HOLD_MS));
                while term.is_current() && tokio::time::Instant::now() < until {
                    let mut holds = vec![&term];
                    holds.extend(second_term.as_ref().filter(|t| t.is_current()));
                    let open = Duration::from_millis(fastrand::u64(IN_TRANSACTION_MS));
                    let write = client_ledger.write_all(&holds, open, marker.as_deref());
                    finish_or_drop(write, guard.lost()).await;
                    let pause = Duration::from_millis(fastrand::u64(WRITE_EVERY_MS));
                    tokio::select! {
                        _ = guard.lost() => {}
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
            }
            if let (Some(second), Some(t)) = (second, &second_term) {
                client_terms.lost(t);
                let _ = second.release().await;
            }
            let how = fastrand::u8(0..10);
            if how == 9 {
                // Held on idle for two leases (renewed meanwhile, or lost).
                let _ = tokio::time::timeout(LEASE * 2, guard.lost()).await;
            }
            // The client stops believing in the hold before it lets go (a `lost` line logged
            // by the watcher after the release could come after the next holder's `lead`).
            client_terms.lost(&term);
            match how {
                // Released and waited for.
                0..=6 => {
                    let _ = guard.release().await;
                }
                // Dropped: released in the background.
                _ => drop(guard),
            }
            tokio::time::sleep(Duration::from_millis(fastrand::u64(0..100))).await;
        }
    });

    finish(history, locks, terms, ledger, current, client).await
}

/// Runs the stale writer below beside `client` until the harness writes `shutdown` to the
/// standard input, then stops both and logs the end.
async fn finish(
    history: crate::shard_node::History,
    locks: Locks,
    terms: Arc<Terms>,
    ledger: Ledger,
    current: Arc<Mutex<Option<LeaderTerm>>>,
    client: tokio::task::JoinHandle<()>,
) -> Result<(), Error> {
    // The write fencing exists for: a client paused (GC, SIGSTOP) past its lease wakes up and
    // writes with the hold it had. After any stall longer than the lease, this task sends one
    // fenced write with that hold if it is no longer current; the fence must refuse it.
    let zombie = tokio::spawn(async move {
        loop {
            let before = current.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let tick = std::time::Instant::now();
            tokio::time::sleep(Duration::from_millis(50)).await;
            if tick.elapsed() > LEASE {
                if let Some(term) = before.filter(|t| !t.is_current()) {
                    ledger.write(&term).await;
                }
            }
        }
    });

    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(text)) = stdin.next_line().await {
        if text.trim() == "shutdown" {
            break;
        }
    }
    zombie.abort();
    client.abort();
    let _ = client.await;
    // The aborted client's guard is released in the background: give it a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    terms.close_all();
    crate::shard_node::line(&history, &format!("stop {}", crate::clock::mono_ns()));
    drop(locks);
    Ok(())
}

/// A reader-writer lock client: a third of its holds are writes (the gate and every read slot,
/// its fenced transactions fenced by every slot and writing a row per slot), the rest reads
/// (one slot). Each write hold's line `rwwrite <token> <at> <slot>=<token> ...` lets the
/// checker see that it held every slot and that its token exceeds every earlier hold's.
async fn rw_client(
    rw: orion_beacon::locks::RwLock,
    terms: Arc<Terms>,
    ledger: Ledger,
    marker: Option<std::path::PathBuf>,
    current: Arc<Mutex<Option<LeaderTerm>>>,
) {
    loop {
        let write = fastrand::u8(0..3) == 0;
        let (read, written) = if write {
            match rw.write(ACQUIRE_TIMEOUT).await {
                Ok(w) => (None, Some(w)),
                Err(LockError::Timeout { .. }) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "write acquire failed");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            }
        } else {
            match rw.read(ACQUIRE_TIMEOUT).await {
                Ok(r) => (Some(r), None),
                Err(LockError::Timeout { .. }) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "read acquire failed");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            }
        };
        let held: Vec<LeaderTerm> = match (&read, &written) {
            (Some(r), _) => vec![r.term().clone()],
            (_, Some(w)) => w.terms().cloned().collect(),
            _ => continue,
        };
        for t in &held {
            terms.work(t);
        }
        let still_held = || match (&read, &written) {
            (Some(r), _) => r.is_held(),
            (_, Some(w)) => w.is_held(),
            _ => false,
        };
        if let Some(w) = &written {
            // Recorded only if still held after the instant is taken: a stall in between must
            // not date the hold past its rows' terms.
            let at = crate::clock::mono_ns();
            if still_held() {
                let slots: Vec<String> = held
                    .iter()
                    .map(|t| format!("{}={}", t.resource(), t.token()))
                    .collect();
                crate::shard_node::line(
                    &ledger.history,
                    &format!("rwwrite {} {at} {}", w.token(), slots.join(" ")),
                );
            }
        }
        *current.lock().unwrap_or_else(|p| p.into_inner()) = held.first().cloned();
        {
            let _done: Vec<Done> = held
                .iter()
                .map(|term| Done {
                    terms: terms.clone(),
                    term: term.clone(),
                })
                .collect();
            let until = tokio::time::Instant::now() + Duration::from_millis(fastrand::u64(HOLD_MS));
            while still_held() && tokio::time::Instant::now() < until {
                let refs: Vec<&LeaderTerm> = held.iter().collect();
                let open = Duration::from_millis(fastrand::u64(IN_TRANSACTION_MS));
                let lost = async {
                    match (&read, &written) {
                        (Some(r), _) => r.lost().await,
                        (_, Some(w)) => w.lost().await,
                        _ => std::future::pending().await,
                    }
                };
                finish_or_drop(ledger.write_all(&refs, open, marker.as_deref()), lost).await;
                let pause = Duration::from_millis(fastrand::u64(WRITE_EVERY_MS));
                // A new `lost` future each time round: one that completed is not polled again.
                let lost = async {
                    match (&read, &written) {
                        (Some(r), _) => r.lost().await,
                        (_, Some(w)) => w.lost().await,
                        _ => {}
                    }
                };
                tokio::select! {
                    _ = lost => {}
                    _ = tokio::time::sleep(pause) => {}
                }
            }
        }
        for t in &held {
            terms.lost(t);
        }
        match (read, written) {
            (Some(r), _) if fastrand::bool() => {
                let _ = r.release().await;
            }
            (_, Some(w)) if fastrand::bool() => {
                let _ = w.release().await;
            }
            // Dropped: released in the background.
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..100))).await;
    }
}
