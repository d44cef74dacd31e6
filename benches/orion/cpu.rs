//! CPU time: this process's, its waited-for children's (pgbench), and a private database
//! server's (the postmaster and its backends, or `mariadbd`), read from `/proc`.

use std::time::Duration;

use nix::sys::resource::{getrusage, UsageWho};

fn rusage(who: UsageWho) -> Duration {
    match getrusage(who) {
        Ok(u) => {
            let t = |tv: nix::sys::time::TimeVal| {
                Duration::new(tv.tv_sec() as u64, tv.tv_usec() as u32 * 1000)
            };
            t(u.user_time()) + t(u.system_time())
        }
        Err(_) => Duration::ZERO,
    }
}

/// User + system CPU of this process (all threads) so far.
pub fn process() -> Duration {
    rusage(UsageWho::RUSAGE_SELF)
}

/// User + system CPU of this process's children that have exited and been waited for (so a
/// delta around `Command::output()` is that command's CPU).
pub fn children() -> Duration {
    rusage(UsageWho::RUSAGE_CHILDREN)
}

/// `/proc` reports times in USER_HZ, 100 on every Linux this runs on.
const TICK: Duration = Duration::from_millis(10);

/// `(ppid, utime + stime + cutime + cstime)` of `pid`, in ticks.
fn stat(pid: u32) -> Option<(u32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces and parentheses).
    let rest = text.rsplit_once(") ")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state): ppid is field 4, utime..cstime fields 14..17.
    let ppid = f.get(1)?.parse().ok()?;
    let ticks = f
        .get(11..15)?
        .iter()
        .map(|s| s.parse::<u64>().unwrap_or(0))
        .sum();
    Some((ppid, ticks))
}

/// A private server's process tree, for its CPU time: the root (the postmaster, or
/// `mariadbd`) and its direct children (PostgreSQL's backends and background processes).
/// Children that exited were reaped by the root, so their CPU is in its `cutime`/`cstime`.
#[derive(Debug, Clone, Copy)]
pub struct Server {
    root: u32,
}

impl Server {
    /// The server whose root process is `pid` (`None`: a server of your own, not measured).
    pub fn new(pid: Option<u32>) -> Option<Self> {
        pid.map(|root| Self { root })
    }

    /// CPU time the server has used so far (user + system, all its processes and threads).
    pub fn cpu(&self) -> Duration {
        let mut ticks = stat(self.root).map(|(_, t)| t).unwrap_or(0);
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for entry in dir.flatten() {
                let Some(pid) = entry
                    .file_name()
                    .to_str()
                    .and_then(|s| s.parse::<u32>().ok())
                else {
                    continue;
                };
                if let Some((ppid, t)) = stat(pid) {
                    if ppid == self.root {
                        ticks += t;
                    }
                }
            }
        }
        TICK * ticks as u32
    }
}

/// The private PostgreSQL's process tree (`None` when `ORION_BEACON_PG_URL` names a server).
pub fn postgres() -> Option<Server> {
    if super::external("ORION_BEACON_PG_URL") {
        return None;
    }
    Server::new(orion_beacon_testkit::Postgres::shared().pid())
}

/// The private MariaDB's `mariadbd` (`None` when `ORION_BEACON_MYSQL_URL` names a server).
pub fn mariadb() -> Option<Server> {
    if super::external("ORION_BEACON_MYSQL_URL") {
        return None;
    }
    Server::new(orion_beacon_testkit::MariaDb::shared().pid())
}

/// CPU used by `server` since the reading `before` (`None`: not measured).
pub fn delta(server: Option<Server>, before: Option<Duration>) -> Option<Duration> {
    Some(server?.cpu().saturating_sub(before?))
}
