//! MySQL and MariaDB wake-ups: a release in any process wakes this process's waiters within
//! milliseconds, instead of at their next poll, through the server's named locks.
//!
//! The servers have no notification channel, but a named lock (`GET_LOCK`) held by one session
//! can be waited for by another, and is freed the moment its session lets go or ends. So:
//!
//! - **A holder signals.** While this store holds a lease (a grant or renew answered it), it
//!   holds the named lock of that lease (`orionbeacon/` and the SHA-1 of the database, table and
//!   resource) on one connection of its own, the *signal* connection, made from the application
//!   pool's connect options (not one of the pool's connections). It lets go of the name after
//!   the lease's release committed, when a grant or batch renew says the lease is no longer
//!   this store's, and when the lease's time as last answered is up.
//! - **A waiter waits on it.** While an elector or a lock waiter of this process waits between
//!   two attempts (and has subscribed to
//!   [`LeaseStore::release_events`](crate::LeaseStore::release_events)), it tells the store
//!   which resources it waits for and until when; the store watches each (at most
//!   [`MAX_WATCHES`] at once) on a connection of a small pool of its own: it asks who holds the
//!   name (`IS_USED_LOCK`) and, if a holder's signal connection does, waits for it (`GET_LOCK`
//!   with a timeout), lets go of it at once and tells the waiters, who then ask the store as at
//!   any poll. A watch ends when nobody waits any more. A name nobody holds (a holder that
//!   crashed, an older version, a store with notifications off) is looked at four more times
//!   within about 1.6 s, then left to the poll: no waiting loop on a lease whose holder signals
//!   nothing. A `try_acquire` that is denied starts no watch. A name a watch finds free before
//!   it saw any holder's signal may also mean the holder let go between the waiter's denial
//!   and the watch's first look: the waiters are then woken at once, once per term that denied them, so such a release is not
//!   missed, and a holder that signals nothing costs one more attempt per term.
//!
//! It is only a wake-up: a grant is decided by the lease row alone, as always. A signal
//! connection that drops (its locks go with it) wakes the waiters early, who are denied and
//! poll; a lost wake-up costs one poll interval, never correctness. A watcher tells a holder's
//! signal from another watcher that holds the name for a moment (between its wait and its
//! letting go) by the name each signal connection holds for itself
//! (`orionbeacon/signal/<connection id>`), and waits only behind a holder's.
//!
//! Named locks are node-local on a Galera cluster (and MariaDB refuses `GET_LOCK` there), and a
//! proxy may send two sessions' statements to different servers. So before the first use the
//! store checks, on its own connections, that a name taken on one connection shows as held by
//! that connection's id from another; where it does not (Galera, a proxy that spreads
//! sessions), or `@@wsrep_on` is set, wake-ups are off and waiters poll. A check that could not
//! tell (the server unreachable) is tried again later.
//!
//! What wakes: electors, lock waiters and semaphore waiters (each permit they wait for is
//! watched). Shard sets poll as before. A holder whose store has notifications off takes no
//! names, so its releases reach other processes' waiters at their next poll.
//!
//! Cost, while any clone of the store lives: from this process's first grant on, one server
//! connection (the signal connection, pinged every [`PING_EVERY`] while it holds names), and
//! up to [`MAX_WATCHES`] more while it waits for held leases (closed after [`WATCH_IDLE`]
//! idle); one `GET_LOCK` when a lease is first held and one `RELEASE_LOCK` when it ends (none
//! per renew); at most [`MAX_HELD`] leases signalled per store. The store's own sessions end
//! on the server after [`SESSION_IDLE_SECS`] seconds idle, so one the network cut off does not
//! keep its names.

use crate::mutex::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sea_orm::sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
use sea_orm::sqlx::{ConnectOptions, Connection, Row};
use sea_orm::{DatabaseConnection, DatabaseConnectionType};
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::store::ReleaseEvents;

/// The most resources one store watches at once (each wait holds a connection); waiters for
/// more poll.
pub(crate) const MAX_WATCHES: usize = 8;
/// The most leases one store signals at once; leases beyond are held without a signal (their
/// waiters poll).
pub(crate) const MAX_HELD: usize = 1_000;
/// How long any one statement on the store's own connections may take.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);
/// How soon a name that another session holds (a waiter letting go of it, an old holder) is
/// first tried again; each further try waits twice as long, up to [`RETAKE_MOST`].
const RETAKE: Duration = Duration::from_millis(20);
const RETAKE_MOST: Duration = Duration::from_secs(2);
/// The store's own sessions end on the server after this long idle (`wait_timeout`, in
/// seconds): one the network cut off does not keep its names for the server's default hours.
/// The signal connection is pinged far more often, and a watch connection idles at most
/// [`WATCH_IDLE`] in its pool.
const SESSION_IDLE_SECS: u32 = 30;
const WATCH_IDLE: Duration = Duration::from_secs(20);
/// The longest single wait for a name: servers and proxies cut long statements
/// (`max_statement_time`, `max_execution_time`, idle timeouts); a longer watch waits again.
const LONGEST_WAIT_SECS: u64 = 15;
/// How often a name held by another watcher (a session that is no holder's signal connection,
/// letting go of the name a moment after it got it) is looked at again, at most.
const WATCHER_LOOKS: usize = 20;
const WATCHER_PAUSE: Duration = Duration::from_millis(5);
/// How often the signal connection is checked while it holds names: one that died (its names
/// went with it) is replaced within this.
const PING_EVERY: Duration = Duration::from_secs(2);
/// The longest a watch lasts, whatever the holder's lease.
const LONGEST_WATCH: Duration = Duration::from_secs(120);
/// A name nobody holds is looked at again after these pauses before the watch ends (a new
/// holder takes its name just after its grant, on a connection of its own that a loaded
/// machine may take a moment to open).
const UNHELD_LOOKS: [Duration; 4] = [
    Duration::from_millis(25),
    Duration::from_millis(100),
    Duration::from_millis(500),
    Duration::from_millis(1000),
];

/// The lock name of a lease: fixed length (52 characters, under the servers' 64), computed by
/// the server from the connection's database, the table and the resource.
const NAME: &str = "CONCAT('orionbeacon/', SHA1(CONCAT_WS('/', DATABASE(), ?, ?)))";
/// The name every signal connection holds while it lives, by which a watcher tells a holder's
/// signal from another watcher: `orionbeacon/signal/` and the connection's id.
const SIGNAL_PREFIX: &str = "orionbeacon/signal/";

/// What the store's grants, renews and releases tell the signal connection.
#[derive(Debug)]
enum Signal {
    /// `candidate` holds `resource` until `until` (local, from the answer's time left).
    Hold {
        resource: Arc<str>,
        candidate: Arc<str>,
        until: Instant,
    },
    /// `candidate`'s hold of `resource` ended (released, or found lost).
    Let {
        resource: Arc<str>,
        candidate: Arc<str>,
    },
}

/// A resource waited for.
#[derive(Debug, Default)]
struct Wanted {
    /// The end of each live waiter's wait (one entry per guard).
    ends: Vec<Instant>,
    /// The watch task running for it, by its number.
    task: Option<u64>,
}

impl Wanted {
    /// The latest end of a live wait.
    fn until(&self) -> Option<Instant> {
        self.ends.iter().copied().max()
    }
}

/// Waits shorter than this start no watch (the waiter asks again sooner than a watch helps).
const SHORTEST_WAIT: Duration = Duration::from_millis(50);

/// A waiter's interest in wake-ups for some resources (see [`HubCell::waiting`]); dropped when
/// it stops waiting.
#[derive(Debug)]
pub(crate) struct Waiting {
    hub: Weak<Hub>,
    resources: Vec<Arc<str>>,
    until: Instant,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let Some(hub) = self.hub.upgrade() else {
            return;
        };
        let mut watches = lock(&hub.watches);
        for resource in &self.resources {
            if let Some(wanted) = watches.get_mut(resource) {
                if let Some(i) = wanted.ends.iter().position(|end| *end == self.until) {
                    wanted.ends.swap_remove(i);
                }
                // A running task ends its own entry; one without a task goes now.
                if wanted.ends.is_empty() && wanted.task.is_none() {
                    watches.remove(resource);
                }
            }
        }
    }
}

/// Whether named locks work as wake-ups through this store's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Usable {
    Unknown,
    Yes,
    No,
}

/// The wake-ups of one store and table, shared by its clones; stops when the last goes.
#[derive(Debug)]
pub(crate) struct Hub {
    table: Arc<str>,
    tx: broadcast::Sender<Arc<str>>,
    signals: mpsc::UnboundedSender<Signal>,
    /// The resources waited for here: until when, by how many waiters, and whether a watch
    /// task runs for it.
    watches: Mutex<HashMap<Arc<str>, Wanted>>,
    /// The number of the next watch task.
    next_task: std::sync::atomic::AtomicU64,
    usable: tokio::sync::watch::Sender<Usable>,
    watch_pool: MySqlPool,
    stop: CancellationToken,
    /// The term that last denied each resource here, and whether a watch already woke its
    /// waiters for finding that term's name free (see [`Hub::denied_by`]).
    denials: Mutex<HashMap<Arc<str>, DeniedBy>>,
}

/// The term a resource was last denied by here.
#[derive(Debug)]
struct DeniedBy {
    holder: Option<String>,
    token: Option<crate::fencing::FencingToken>,
    /// A watch found nobody signalling since this denial and woke the waiters once.
    woken: bool,
}

/// The most denials remembered per store; past it they are forgotten at once (the cost: one
/// more attempt by a waiter whose holder does not signal).
const MAX_DENIALS: usize = 10_000;

impl Drop for Hub {
    fn drop(&mut self) {
        self.stop.cancel();
        // Idle watch connections quit properly (a watch still running closes its own).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let pool = self.watch_pool.clone();
            runtime.spawn(async move { pool.close().await });
        }
    }
}

#[derive(Debug, Default)]
enum State {
    #[default]
    Untried,
    Running(Arc<Hub>),
    Off,
}

/// The wake-ups of one store, started at the first subscription or grant.
#[derive(Debug, Clone, Default)]
pub(crate) struct HubCell(Arc<Mutex<State>>);

impl HubCell {
    /// The running hub, starting it if it was never tried; `None` when wake-ups are off, the
    /// connection is not a MySQL pool, or there is no tokio runtime.
    fn hub(&self, db: &DatabaseConnection, table: &Arc<str>) -> Option<Arc<Hub>> {
        if !matches!(db.inner, DatabaseConnectionType::SqlxMySqlPoolConnection(_)) {
            return None;
        }
        let mut state = lock(&self.0);
        match &*state {
            State::Running(hub) => return Some(Arc::clone(hub)),
            State::Off => return None,
            State::Untried => {}
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let options = (*db.get_mysql_connection_pool().connect_options()).clone();
        let hub = start(&runtime, options, table);
        *state = State::Running(Arc::clone(&hub));
        Some(hub)
    }

    /// Wake-ups are off for good (a Galera node).
    pub(crate) fn turn_off(&self) {
        let mut state = lock(&self.0);
        if !matches!(*state, State::Off) {
            tracing::debug!("MySQL wake-ups off: a Galera node");
        }
        *state = State::Off;
    }

    /// A subscription to the wake-ups (see the module notes).
    pub(crate) fn subscribe(
        &self,
        db: &DatabaseConnection,
        table: &Arc<str>,
    ) -> Option<ReleaseEvents> {
        Some(self.hub(db, table)?.tx.subscribe())
    }

    /// `candidate` holds `resource` for `remaining`: its name is taken (kept) on the signal
    /// connection.
    pub(crate) fn holding(
        &self,
        db: &DatabaseConnection,
        table: &Arc<str>,
        resource: &str,
        candidate: &str,
        remaining: Duration,
    ) {
        if let Some(hub) = self.hub(db, table) {
            hub.hold(resource, candidate, remaining);
        }
    }

    /// `candidate` was denied `resource` by `by`: a name it held goes, and the holder that
    /// denied it is noted for the watches (see [`Hub::denied_by`]).
    pub(crate) fn denied(
        &self,
        db: &DatabaseConnection,
        table: &Arc<str>,
        resource: &str,
        candidate: &str,
        by: &crate::lease::Denial,
    ) {
        if let Some(hub) = self.hub(db, table) {
            hub.let_go(resource, candidate);
            hub.denied_by(resource, by);
        }
    }

    /// A waiter here waits for `resources` until `until` (its next attempt): each is watched
    /// (at most [`MAX_WATCHES`] per store) while a waiter's guard lives and its wait lasts.
    pub(crate) fn waiting(
        &self,
        db: &DatabaseConnection,
        table: &Arc<str>,
        resources: &[Arc<str>],
        until: Instant,
    ) -> Option<Waiting> {
        self.hub(db, table)?.wait_for(resources, until)
    }

    /// `candidate`'s lease of `resource` ended here (its release committed, or a renew found
    /// it lost).
    pub(crate) fn ended(
        &self,
        db: &DatabaseConnection,
        table: &Arc<str>,
        resource: &str,
        candidate: &str,
    ) {
        if let Some(hub) = self.hub(db, table) {
            hub.let_go(resource, candidate);
        }
    }
}

fn start(
    runtime: &tokio::runtime::Handle,
    options: MySqlConnectOptions,
    table: &Arc<str>,
) -> Arc<Hub> {
    let (signals, rx) = mpsc::unbounded_channel();
    let watch_pool = MySqlPoolOptions::new()
        .max_connections(u32::try_from(MAX_WATCHES).unwrap_or(u32::MAX))
        .min_connections(0)
        .idle_timeout(WATCH_IDLE)
        .acquire_timeout(STATEMENT_TIMEOUT)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sea_orm::sqlx::query(sea_orm::sqlx::AssertSqlSafe(format!(
                    "SET SESSION wait_timeout = {SESSION_IDLE_SECS}"
                )))
                .execute(conn)
                .await
                .map(drop)
            })
        })
        .connect_lazy_with(options.clone());
    let hub = Arc::new(Hub {
        table: Arc::clone(table),
        tx: broadcast::channel(256).0,
        signals,
        watches: Mutex::default(),
        next_task: std::sync::atomic::AtomicU64::new(0),
        usable: tokio::sync::watch::Sender::new(Usable::Unknown),
        watch_pool,
        stop: CancellationToken::new(),
        denials: Mutex::default(),
    });
    runtime.spawn(signal_task(
        Arc::downgrade(&hub),
        options,
        rx,
        hub.stop.clone(),
    ));
    hub
}

impl Hub {
    fn hold(&self, resource: &str, candidate: &str, remaining: Duration) {
        let now = crate::clock::now();
        let until = now.checked_add(remaining).unwrap_or(now);
        let _ = self.signals.send(Signal::Hold {
            resource: Arc::from(resource),
            candidate: Arc::from(candidate),
            until,
        });
    }

    fn let_go(&self, resource: &str, candidate: &str) {
        let _ = self.signals.send(Signal::Let {
            resource: Arc::from(resource),
            candidate: Arc::from(candidate),
        });
    }

    /// A waiter here was denied `resource` by the term `by` names. A release can come between
    /// that answer and the moment a watch first asks who holds the name: the watch then finds
    /// the name free, as it does for a holder that does not signal (crashed, notifications
    /// off). It cannot tell the two apart, so it wakes the waiters once per denying term: a
    /// release just missed is then taken at once, and a holder that signals nothing costs each
    /// waiting process one more attempt per term, not one per poll.
    fn denied_by(&self, resource: &str, by: &crate::lease::Denial) {
        let mut denials = lock(&self.denials);
        if let Some(last) = denials.get(resource) {
            if last.holder == by.holder && last.token == by.token {
                return;
            }
        }
        if denials.len() >= MAX_DENIALS {
            denials.clear();
        }
        denials.insert(
            Arc::from(resource),
            DeniedBy {
                holder: by.holder.clone(),
                token: by.token,
                woken: false,
            },
        );
    }

    /// Whether a watch that first finds `resource`'s name free wakes its waiters: once per
    /// denying term (see [`Hub::denied_by`]).
    fn free_since_denial(&self, resource: &str) -> bool {
        let mut denials = lock(&self.denials);
        match denials.get_mut(resource) {
            Some(last) if !last.woken => {
                last.woken = true;
                true
            }
            _ => false,
        }
    }

    /// Registers a waiter for `resources` until `until`, starting a watch for each that has
    /// none (while fewer than [`MAX_WATCHES`] run). A wait shorter than [`SHORTEST_WAIT`]
    /// starts nothing.
    fn wait_for(self: &Arc<Self>, resources: &[Arc<str>], until: Instant) -> Option<Waiting> {
        let now = crate::clock::now();
        let until = until.min(now.checked_add(LONGEST_WATCH).unwrap_or(until));
        if until.saturating_duration_since(now) < SHORTEST_WAIT
            || *self.usable.borrow() == Usable::No
        {
            return None;
        }
        let mut start = Vec::new();
        {
            let mut watches = lock(&self.watches);
            let mut running = watches.values().filter(|w| w.task.is_some()).count();
            for resource in resources {
                let wanted = watches.entry(Arc::clone(resource)).or_default();
                wanted.ends.push(until);
                if wanted.task.is_none() && running < MAX_WATCHES {
                    let task = self
                        .next_task
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    wanted.task = Some(task);
                    running += 1;
                    start.push((Arc::clone(resource), task));
                }
            }
        }
        for (resource, task) in start {
            tokio::spawn(watch_task(
                Arc::downgrade(self),
                resource,
                task,
                self.watch_pool.clone(),
                self.stop.clone(),
            ));
        }
        Some(Waiting {
            hub: Arc::downgrade(self),
            resources: resources.to_vec(),
            until,
        })
    }

    /// The end of the live waits for `resource` while watch `task` is still its watch and a
    /// waiter waits; otherwise the task's watch ends here (under the same lock as every
    /// registration, so a new waiter either extends this watch or starts a new one).
    fn watched_until(&self, resource: &Arc<str>, task: u64) -> Option<Instant> {
        let mut watches = lock(&self.watches);
        let wanted = watches.get_mut(resource)?;
        if wanted.task != Some(task) {
            return None;
        }
        let now = crate::clock::now();
        // Waits that are over (their guards not dropped yet) do not hold the watch.
        if let Some(until) = wanted.until().filter(|until| *until > now) {
            return Some(until);
        }
        wanted.task = None;
        if wanted.ends.is_empty() {
            watches.remove(resource);
        }
        None
    }

    /// Watch `task` of `resource` ended (if it still was its watch).
    fn unwatch(&self, resource: &Arc<str>, task: u64) {
        let mut watches = lock(&self.watches);
        if let Some(wanted) = watches.get_mut(resource) {
            if wanted.task == Some(task) {
                wanted.task = None;
                if wanted.ends.is_empty() {
                    watches.remove(resource);
                }
            }
        }
    }
}

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
async fn signal_task(
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
async fn bounded<T>(
    fut: impl std::future::Future<Output = Result<T, sea_orm::sqlx::Error>>,
) -> Result<T, sea_orm::sqlx::Error> {
    tokio::time::timeout(STATEMENT_TIMEOUT, fut)
        .await
        .unwrap_or_else(|_| Err(timed_out()))
}

fn timed_out() -> sea_orm::sqlx::Error {
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

/// Waits for `resource`'s holder to let go of its name, then tells the waiters.
async fn watch_task(
    hub: Weak<Hub>,
    resource: Arc<str>,
    task: u64,
    pool: MySqlPool,
    stop: CancellationToken,
) {
    let Some((table, mut usable)) = hub
        .upgrade()
        .map(|h| (Arc::clone(&h.table), h.usable.subscribe()))
    else {
        return;
    };
    // The named-lock check first (bounded: it gives its answer within its own timeouts).
    let checked = tokio::select! {
        () = stop.cancelled() => None,
        answer = usable.wait_for(|u| *u != Usable::Unknown) => answer.ok().map(|u| *u),
    };
    // Still waited for (the check may have taken a while): only then a connection.
    let wanted = hub
        .upgrade()
        .and_then(|h| h.watched_until(&resource, task))
        .is_some();
    if checked != Some(Usable::Yes) || !wanted {
        if let Some(hub) = hub.upgrade() {
            hub.unwatch(&resource, task);
        }
        return;
    }
    let mut conn = match tokio::select! {
        () = stop.cancelled() => None,
        conn = pool.acquire() => conn.ok(),
    } {
        Some(conn) => conn,
        None => {
            if let Some(hub) = hub.upgrade() {
                hub.unwatch(&resource, task);
            }
            return;
        }
    };
    let body = watch_on(&mut conn, &hub, &resource, task, &table);
    let ended = tokio::select! {
        () = stop.cancelled() => Err(None),
        ended = body => ended,
    };
    if let Some(hub) = hub.upgrade() {
        hub.unwatch(&resource, task);
    }
    match ended {
        // Back to the pool only after a complete answer.
        Ok(released) => {
            drop(conn);
            if released {
                if let Some(hub) = hub.upgrade() {
                    tracing::trace!(%resource, "woken by the holder's named lock");
                    let _ = hub.tx.send(resource);
                }
            }
        }
        Err(error) => {
            if let Some(error) = error {
                tracing::debug!(%error, %resource, "MySQL wake-up watch failed; the waiter polls");
            }
            // Cut off mid-statement (or failed): closed, not handed back.
            drop(conn.detach());
        }
    }
}

/// The watch itself: whether the holder let go (`Ok(true)`), or the watch ended without (the
/// lease's time is up, nobody holds the name).
async fn watch_on(
    conn: &mut MySqlConnection,
    hub: &Weak<Hub>,
    resource: &Arc<str>,
    task: u64,
    table: &str,
) -> Result<bool, Option<sea_orm::sqlx::Error>> {
    let mut unheld = 0;
    let mut watchers = 0;
    // Whether this watch saw a holder's signal connection hold the name yet.
    let mut signalled = false;
    loop {
        let Some(until) = hub.upgrade().and_then(|h| h.watched_until(resource, task)) else {
            return Ok(false);
        };
        // Who holds the name, and whether that session is a holder's signal connection (it
        // holds its own signal name) or another watcher letting go of it a moment later.
        let sql = format!(
            "SELECT CAST(o AS SIGNED), CAST(IS_USED_LOCK(CONCAT('{SIGNAL_PREFIX}', o)) AS SIGNED) \
             FROM (SELECT IS_USED_LOCK({NAME}) AS o) AS owner"
        );
        let row = bounded(
            sea_orm::sqlx::query(sea_orm::sqlx::AssertSqlSafe(sql))
                .bind(table)
                .bind(&**resource)
                .fetch_one(&mut *conn),
        )
        .await
        .map_err(Some)?;
        let owner: Option<i64> = row.try_get(0).map_err(Some)?;
        let signal: Option<i64> = row.try_get(1).map_err(Some)?;
        match owner {
            // Free before any signal was seen: possibly released since the waiter's denial
            // (the name may also have passed through another watcher's hands meanwhile).
            None if !signalled && hub.upgrade().is_some_and(|h| h.free_since_denial(resource)) => {
                tracing::trace!(%resource, "the name is free since the denial: waking the waiters once");
                return Ok(true);
            }
            None => {
                // Nothing signals this lease (yet): look a few more times, then poll.
                let Some(pause) = UNHELD_LOOKS.get(unheld) else {
                    return Ok(false);
                };
                unheld += 1;
                tokio::time::sleep(*pause).await;
                continue;
            }
            Some(o) if signal != Some(o) => {
                // Another watcher's moment: look again shortly.
                watchers += 1;
                if watchers > WATCHER_LOOKS {
                    return Ok(false);
                }
                tokio::time::sleep(WATCHER_PAUSE).await;
                continue;
            }
            Some(_) => signalled = true,
        }
        let left = until.saturating_duration_since(crate::clock::now());
        // Whole seconds (every server version takes them), at least one, at most a chunk.
        let secs = left.as_secs().saturating_add(1).min(LONGEST_WAIT_SECS);
        let sql = format!("SELECT CAST(GET_LOCK({NAME}, ?) AS SIGNED)");
        let wait = sea_orm::sqlx::query(sea_orm::sqlx::AssertSqlSafe(sql))
            .bind(table)
            .bind(&**resource)
            .bind(i64::try_from(secs).unwrap_or(i64::MAX))
            .fetch_one(&mut *conn);
        let limit = Duration::from_secs(secs).saturating_add(STATEMENT_TIMEOUT);
        let got: Option<i64> = match tokio::time::timeout(limit, wait).await {
            Ok(row) => row.and_then(|row| row.try_get(0)).map_err(Some)?,
            Err(_) => return Err(Some(timed_out())),
        };
        match got {
            Some(1) => {
                // Ours for a moment: let go at once, so the next holder can take it.
                let sql = format!("SELECT CAST(RELEASE_LOCK({NAME}) AS SIGNED)");
                bounded(
                    sea_orm::sqlx::query(sea_orm::sqlx::AssertSqlSafe(sql))
                        .bind(table)
                        .bind(&**resource)
                        .fetch_one(&mut *conn),
                )
                .await
                .map_err(Some)?;
                return Ok(true);
            }
            // Timed out: wait again while the watch lasts.
            Some(_) => {
                unheld = 0;
                watchers = 0;
            }
            // An error the server reports as NULL (the session killed, say).
            None => return Ok(false),
        }
    }
}
