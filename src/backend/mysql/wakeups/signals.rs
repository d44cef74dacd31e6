//! The signal connection: the named locks of the leases this store holds, taken and let go of
//! in the order the store's answers came.

use super::*;

/// One signalled lease.
#[derive(Debug)]
struct Held {
    candidate: Arc<str>,
    until: Instant,
    /// Whether the signal connection holds the name now.
    taken: bool,
    /// When to try to take the name (again).
    retry_at: Option<Instant>,
    /// Tries that found the name held by another session, in a row.
    refused: u32,
}

/// Owns the signal connection: takes and lets go of the names of the leases held here, in the
/// order the store's answers came.
pub(super) async fn signal_task(
    hub: Weak<Hub>,
    options: MySqlConnectOptions,
    mut rx: mpsc::UnboundedReceiver<Signal>,
    stop: CancellationToken,
) {
    let mut held: HashMap<Arc<str>, Held> = HashMap::new();
    let mut conn: Option<MySqlConnection> = None;
    let mut backoff = Duration::from_millis(100);
    let mut reconnect_at: Option<Instant> = None;
    let mut ping_at: Option<Instant> = None;
    let table: Arc<str> = match hub.upgrade() {
        Some(hub) => Arc::clone(&hub.table),
        None => return,
    };
    // First, whether named locks work through these connections at all. A passing failure
    // (the server unreachable, out of connections) is tried again; a definite answer stays.
    let mut test_backoff = Duration::from_secs(1);
    let usable = loop {
        let answer = tokio::select! {
            () = stop.cancelled() => return,
            answer = self_test(&options, &hub) => answer,
        };
        match answer {
            Some(usable) => break usable,
            None => {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(test_backoff) => {}
                }
                test_backoff = (test_backoff * 2).min(Duration::from_secs(30));
            }
        }
    };
    if let Some(hub) = hub.upgrade() {
        hub.usable
            .send_replace(if usable { Usable::Yes } else { Usable::No });
    }
    if !usable {
        return;
    }
    loop {
        let now = crate::clock::now();
        // While waiting to reconnect, no retake is due before the reconnect.
        let next = held
            .values()
            .flat_map(|h| {
                [
                    Some(h.until),
                    h.retry_at.map(|at| at.max(reconnect_at.unwrap_or(at))),
                ]
            })
            .flatten()
            .chain(reconnect_at)
            .chain(ping_at.filter(|_| held.values().any(|h| h.taken)))
            .min();
        let sleep = async {
            match next {
                Some(at) if at > now => crate::clock::sleep_until(at).await,
                Some(_) => {}
                None => std::future::pending().await,
            }
        };
        let mut to_release = Vec::new();
        tokio::select! {
            () = stop.cancelled() => break,
            signal = rx.recv() => match signal {
                Some(signal) => apply(&mut held, signal, &mut to_release),
                None => break,
            },
            () = sleep => {}
        }
        // Every signal already queued, in order, before any statement.
        while let Ok(signal) = rx.try_recv() {
            apply(&mut held, signal, &mut to_release);
        }
        let now = crate::clock::now();
        held.retain(|resource, h| {
            if h.until <= now {
                if h.taken {
                    to_release.push(Arc::clone(resource));
                }
                return false;
            }
            true
        });
        if reconnect_at.is_some_and(|at| at > now) {
            continue;
        }
        reconnect_at = None;
        let ping = ping_at.is_none_or(|at| at <= now) && held.values().any(|h| h.taken);
        let result = tokio::select! {
            () = stop.cancelled() => break,
            result = step(&mut conn, &options, &table, &mut held, &to_release, ping) => result,
        };
        if ping || ping_at.is_none() {
            ping_at = now.checked_add(PING_EVERY);
        }
        match result {
            Ok(()) => backoff = Duration::from_millis(100),
            Err(error) => {
                let now = crate::clock::now();
                // Its names went with the connection: taken again on a new one.
                tracing::debug!(%error, retry_in = ?backoff, "MySQL wake-up signal connection failed; waiters poll meanwhile");
                conn = None;
                reconnect_at = now.checked_add(backoff);
                for h in held.values_mut() {
                    h.taken = false;
                    h.retry_at = reconnect_at;
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
    if let Some(conn) = conn {
        // Closing lets go of every name at once.
        let _ = tokio::time::timeout(STATEMENT_TIMEOUT, conn.close()).await;
    }
}

/// Applies one signal; a hold that ended whose name is taken goes to `to_release`.
fn apply(held: &mut HashMap<Arc<str>, Held>, signal: Signal, to_release: &mut Vec<Arc<str>>) {
    match signal {
        Signal::Hold {
            resource,
            candidate,
            until,
        } => {
            let room = held.len() < MAX_HELD;
            match held.get_mut(&resource) {
                Some(h) => {
                    h.candidate = candidate;
                    h.until = until;
                }
                None if room => {
                    held.insert(
                        resource,
                        Held {
                            candidate,
                            until,
                            taken: false,
                            retry_at: Some(crate::clock::now()),
                            refused: 0,
                        },
                    );
                }
                None => {}
            }
        }
        Signal::Let {
            resource,
            candidate,
        } => {
            if held
                .get(&resource)
                .is_some_and(|h| h.candidate == candidate)
            {
                if let Some(h) = held.remove(&resource) {
                    if h.taken {
                        to_release.push(resource);
                    }
                }
            }
        }
    }
}

/// Lets go of `to_release` and takes the names due, on the signal connection (made first if
/// needed).
async fn step(
    conn: &mut Option<MySqlConnection>,
    options: &MySqlConnectOptions,
    table: &str,
    held: &mut HashMap<Arc<str>, Held>,
    to_release: &[Arc<str>],
    ping: bool,
) -> Result<(), sea_orm::sqlx::Error> {
    let now = crate::clock::now();
    let due: Vec<Arc<str>> = held
        .iter()
        .filter(|(_, h)| !h.taken && h.retry_at.is_some_and(|at| at <= now))
        .map(|(r, _)| Arc::clone(r))
        .collect();
    if ping {
        if let Some(c) = conn.as_mut() {
            bounded(c.ping()).await?;
        }
    }
    if to_release.is_empty() && due.is_empty() {
        return Ok(());
    }
    let c = match conn {
        Some(c) => c,
        None => conn.insert(signal_connection(options).await?),
    };
    for resource in to_release {
        let sql = format!("SELECT CAST(RELEASE_LOCK({NAME}) AS SIGNED)");
        let query = sea_orm::sqlx::query(sea_orm::sqlx::AssertSqlSafe(sql))
            .bind(table)
            .bind(&**resource);
        match bounded(query.fetch_one(&mut *c)).await {
            Ok(_) => {}
            // Refused for this name alone: the connection is fine.
            Err(sea_orm::sqlx::Error::Database(error)) => {
                tracing::debug!(%error, %resource, "RELEASE_LOCK refused");
            }
            Err(error) => return Err(error),
        }
    }
    for resource in due {
        let sql = format!("SELECT CAST(GET_LOCK({NAME}, 0) AS SIGNED)");
        let query = sea_orm::sqlx::query(sea_orm::sqlx::AssertSqlSafe(sql))
            .bind(table)
            .bind(&*resource);
        let got: Option<i64> = match bounded(query.fetch_one(&mut *c)).await {
            Ok(row) => row.try_get(0)?,
            Err(sea_orm::sqlx::Error::Database(error)) => {
                tracing::debug!(%error, %resource, "GET_LOCK refused");
                None
            }
            Err(error) => return Err(error),
        };
        if let Some(h) = held.get_mut(&resource) {
            if got == Some(1) {
                h.taken = true;
                h.retry_at = None;
                h.refused = 0;
            } else {
                // Another session has it (a waiter letting go, an old holder's session the
                // server has not ended yet): try again, less often each time, while the lease
                // lasts.
                let wait = RETAKE
                    .saturating_mul(1 << h.refused.min(10))
                    .min(RETAKE_MOST);
                h.refused = h.refused.saturating_add(1);
                h.retry_at = crate::clock::now().checked_add(wait);
            }
        }
    }
    Ok(())
}

/// A new signal connection: its sessions end after [`SESSION_IDLE_SECS`] idle, and it holds
/// its own signal name (see [`SIGNAL_PREFIX`]).
async fn signal_connection(
    options: &MySqlConnectOptions,
) -> Result<MySqlConnection, sea_orm::sqlx::Error> {
    let mut c = bounded(options.connect()).await?;
    bounded(
        sea_orm::sqlx::query(sea_orm::sqlx::AssertSqlSafe(format!(
            "SET SESSION wait_timeout = {SESSION_IDLE_SECS}"
        )))
        .execute(&mut c),
    )
    .await?;
    let got: Option<i64> = bounded(
        sea_orm::sqlx::query(sea_orm::sqlx::AssertSqlSafe(format!(
            "SELECT CAST(GET_LOCK(CONCAT('{SIGNAL_PREFIX}', CONNECTION_ID()), 0) AS SIGNED)"
        )))
        .fetch_one(&mut c),
    )
    .await?
    .try_get(0)?;
    if got != Some(1) {
        return Err(sea_orm::sqlx::Error::Protocol(
            "the signal connection could not take its own name".into(),
        ));
    }
    Ok(c)
}

/// `fut`, or a timeout error after [`STATEMENT_TIMEOUT`].
pub(super) async fn bounded<T>(
    fut: impl std::future::Future<Output = Result<T, sea_orm::sqlx::Error>>,
) -> Result<T, sea_orm::sqlx::Error> {
    tokio::time::timeout(STATEMENT_TIMEOUT, fut)
        .await
        .unwrap_or_else(|_| Err(timed_out()))
}

pub(super) fn timed_out() -> sea_orm::sqlx::Error {
    sea_orm::sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no answer from the server in time",
    ))
}

/// Whether a name taken on one connection shows as held by that connection from another: not
/// on a Galera node (which refuses `GET_LOCK`) or behind a proxy that spreads a client's
/// sessions over servers. `None` when it could not tell (the server unreachable, say).
async fn self_test(options: &MySqlConnectOptions, hub: &Weak<Hub>) -> Option<bool> {
    let pool = hub.upgrade().map(|h| h.watch_pool.clone())?;
    let name = format!("orionbeacon/check/{:016x}", crate::random::random_u64());
    let test = async {
        let mut signal = options.connect().await?;
        let row = sea_orm::sqlx::query(
            "SELECT CAST(GET_LOCK(?, 0) AS SIGNED), CAST(CONNECTION_ID() AS SIGNED)",
        )
        .bind(&name)
        .fetch_one(&mut signal)
        .await?;
        let (got, id): (Option<i64>, i64) = (row.try_get(0)?, row.try_get(1)?);
        let mut other = pool.acquire().await?;
        let owner: Option<i64> = sea_orm::sqlx::query("SELECT CAST(IS_USED_LOCK(?) AS SIGNED)")
            .bind(&name)
            .fetch_one(&mut *other)
            .await?
            .try_get(0)?;
        drop(other);
        signal.close().await?;
        Ok::<_, sea_orm::sqlx::Error>(got == Some(1) && owner == Some(id))
    };
    match tokio::time::timeout(STATEMENT_TIMEOUT * 2, test).await {
        Ok(Ok(true)) => {
            tracing::debug!("MySQL wake-ups on (named locks)");
            Some(true)
        }
        Ok(Ok(false)) => {
            tracing::info!("MySQL wake-ups off: a named lock taken on one connection is not seen from another (a proxy?); waiters poll");
            Some(false)
        }
        // The server answered, and refused (a Galera node: "GET_LOCK in cluster").
        Ok(Err(sea_orm::sqlx::Error::Database(error))) => {
            tracing::info!(%error, "MySQL wake-ups off: named locks are refused here (a Galera node?); waiters poll");
            Some(false)
        }
        Ok(Err(error)) => {
            tracing::debug!(%error, "MySQL wake-ups: the named-lock check failed; trying again later");
            None
        }
        Err(_) => {
            tracing::debug!(
                "MySQL wake-ups: the named-lock check did not answer; trying again later"
            );
            None
        }
    }
}
