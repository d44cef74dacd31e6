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

use crate::backend::context::Context;
use crate::store::ReleaseEvents;

mod watch;
use watch::watch_task;

mod signals;
use signals::signal_task;

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

/// The wake-ups as the engine holds them: the hub of the table's named locks, off once the
/// server turned out to be a Galera node (named locks are local to one node there).
pub(crate) struct NamedLocks {
    cell: HubCell,
    galera: Arc<tokio::sync::OnceCell<bool>>,
}

impl NamedLocks {
    pub(crate) fn new(cell: HubCell, galera: Arc<tokio::sync::OnceCell<bool>>) -> Self {
        Self { cell, galera }
    }

    fn cell(&self) -> Option<&HubCell> {
        (self.galera.get() != Some(&true)).then_some(&self.cell)
    }
}

impl crate::backend::wakeups::ReleaseSource for NamedLocks {
    fn subscribe(&self, cx: &Context) -> Option<ReleaseEvents> {
        self.cell()?.subscribe(&cx.db, &cx.table)
    }
}

impl crate::backend::wakeups::FollowsLeases for NamedLocks {
    fn holding(&self, cx: &Context, resource: &str, candidate: &str, remaining: Duration) {
        if let Some(cell) = self.cell() {
            cell.holding(&cx.db, &cx.table, resource, candidate, remaining);
        }
    }

    fn denied(&self, cx: &Context, resource: &str, candidate: &str, by: &crate::lease::Denial) {
        if let Some(cell) = self.cell() {
            cell.denied(&cx.db, &cx.table, resource, candidate, by);
        }
    }

    fn ended(&self, cx: &Context, resource: &str, candidate: &str) {
        if let Some(cell) = self.cell() {
            cell.ended(&cx.db, &cx.table, resource, candidate);
        }
    }

    fn waiting(
        &self,
        cx: &Context,
        resources: &[Arc<str>],
        until: Instant,
    ) -> Option<Box<dyn Send>> {
        let waiting = self.cell()?.waiting(&cx.db, &cx.table, resources, until)?;
        Some(Box::new(waiting))
    }
}
