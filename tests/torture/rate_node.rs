//! A rate-limit client process: one `RateLimiter` over the real store, asking for a permit of
//! the run's key again and again (at once after a permit, after the time the store says the
//! next one is due otherwise), every client idle in the same second one second in four. Each answer goes to its history: `permit <number> <granted_at
//! µs, database clock> <asked ns> <answered ns>`, `limited <retry_after µs> <answered ns>`, or
//! `error <answered ns>`; `rate_checker.rs` judges the permits of every client together.

use std::time::Duration;

use orion_beacon::rate_limit::{Quota, RateLimiter, RateOutcome};
use orion_beacon::SeaOrmLeaseStore;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::clock::mono_ns;
use crate::shard_node::{connect_pools, line, open_history};
use crate::{Args, Error, RETRY};

/// The run's quota: 20 permits a second, 4 at once (one every 50 ms).
pub const INTERVAL: Duration = Duration::from_millis(1_000);
pub const PERMITS: u32 = 20;
pub const BURST: u32 = 4;

pub fn quota() -> Result<Quota, Error> {
    Ok(Quota::per(INTERVAL, PERMITS)?.with_burst(BURST)?)
}

/// The clients stand still one second in this many (see `run`).
const IDLE_EVERY: u64 = 4;

/// The rate-limit table of the run whose lease table is `table`.
pub fn rate_table(table: &str) -> String {
    format!("{table}_r")
}

/// Runs one client until the harness writes `shutdown` to its standard input.
pub async fn run(args: Args) -> Result<(), Error> {
    let name = args.candidate.clone().unwrap_or_default();
    let history = open_history(&args, &name)?;
    let (db, _) = connect_pools(&args).await?;
    let store = SeaOrmLeaseStore::new(db)
        .with_table(&args.table)?
        .with_rate_limit_table(rate_table(&args.table))?;
    let limiter = RateLimiter::new(store, quota()?);
    let key = args.resource.clone();
    let client_history = history.clone();
    let client = tokio::spawn(async move {
        loop {
            // Every client stands still in every fourth second of the host's monotonic clock
            // (one clock for every process), so the key's burst refills and all of them ask
            // at once when it ends: the spans where a burst too large would show.
            let now = mono_ns();
            if now / 1_000_000_000 % IDLE_EVERY == IDLE_EVERY - 1 {
                let next = (now / 1_000_000_000 + 1) * 1_000_000_000;
                tokio::time::sleep(Duration::from_nanos(next - now)).await;
                continue;
            }
            let asked = mono_ns();
            match limiter.try_acquire(&key).await {
                Ok(RateOutcome::Granted(p)) => line(
                    &client_history,
                    &format!(
                        "permit {} {} {asked} {}",
                        p.number,
                        p.granted_at.timestamp_micros(),
                        mono_ns()
                    ),
                ),
                Ok(RateOutcome::Limited(l)) => {
                    line(
                        &client_history,
                        &format!("limited {} {}", l.retry_after.as_micros(), mono_ns()),
                    );
                    let wait = l.retry_after.min(Duration::from_millis(200));
                    tokio::time::sleep(wait + Duration::from_millis(fastrand::u64(0..10))).await;
                }
                Ok(_) => tokio::time::sleep(RETRY).await,
                Err(e) => {
                    tracing::debug!(error = %e, "rate-limit call failed");
                    line(&client_history, &format!("error {}", mono_ns()));
                    tokio::time::sleep(RETRY).await;
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
    client.abort();
    let _ = client.await;
    line(&history, &format!("stop {}", mono_ns()));
    Ok(())
}
