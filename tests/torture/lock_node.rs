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

/// The lease rows of the run's lock and its pair lock (`permits` 0) or of its semaphore of
/// `permits`.
pub fn resources(name: &str, permits: u32) -> Vec<String> {
    if permits == 0 {
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
                    client_ledger
                        .write_all(&holds, open, marker.as_deref())
                        .await;
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
