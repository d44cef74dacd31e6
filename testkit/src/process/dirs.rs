//! Instance directories and free ports.

use std::net::TcpListener;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::Error;

use super::*;

pub(super) fn nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Where instance directories go: `ORION_TESTKIT_TMPDIR`; else `/dev/shm` (memory) when it is
/// writable with at least 2 GiB free, since creating the ~1,300 files of a PostgreSQL data
/// directory on disk costs about a second each time; else the temporary directory (`TMPDIR`).
pub(crate) fn base_dir() -> &'static Path {
    static BASE: OnceLock<PathBuf> = OnceLock::new();
    BASE.get_or_init(|| {
        if let Some(dir) = std::env::var_os("ORION_TESTKIT_TMPDIR") {
            return PathBuf::from(dir);
        }
        let shm = Path::new("/dev/shm");
        let free_kib = Command::new("df")
            .arg("-Pk")
            .arg(shm)
            .output()
            .ok()
            .and_then(|out| {
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .nth(1)?
                    .split_whitespace()
                    .nth(3)?
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or(0);
        let probe = shm.join(format!("{DIR_PREFIX}probe-{}", std::process::id()));
        let writable = std::fs::create_dir(&probe).is_ok() && std::fs::remove_dir(&probe).is_ok();
        if writable && free_kib >= 2 * 1024 * 1024 {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        }
    })
}

/// Every place instance directories may be (for the sweep).
pub(super) fn base_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![base_dir().to_path_buf(), std::env::temp_dir()];
    if Path::new("/dev/shm").is_dir() {
        dirs.push("/dev/shm".into());
    }
    dirs.sort();
    dirs.dedup();
    dirs
}

/// A fresh, empty directory of our own under [`base_dir`] (mode 0700, owned by the service
/// user).
pub(crate) fn new_dir(kind: &str, who: Option<RunAs>) -> Result<PathBuf, Error> {
    static N: AtomicU32 = AtomicU32::new(0);
    sweep_once();
    let base = base_dir();
    loop {
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!(
            "{DIR_PREFIX}{kind}-{}-{n}-{:x}",
            std::process::id(),
            nanos() & 0xffff_ffff
        ));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {
                chown_tree(&dir, who)?;
                return Ok(dir);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Error::io(format!("cannot create {}", dir.display()), e)),
        }
    }
}

/// A port on 127.0.0.1 that nobody listened on a moment ago, and that stays this process's
/// for as long as it runs. A server that then finds it taken fails to start with
/// `port_taken`, and the caller tries again with another one.
///
/// The port comes from outside the kernel's ephemeral range (`ip_local_port_range`), so no
/// `bind(0)` and no outgoing connection is ever given it, and a file lock on it (in
/// `$TMPDIR/orion-testkit-ports-<uid>`, held until this process exits) keeps every other
/// test process from choosing it too. So a server stopped and started again (a restart, a
/// crash) finds its port still free.
pub(crate) fn free_port() -> Result<u16, Error> {
    Ok(free_ports(1)?.remove(0))
}

/// `n` distinct free ports (see [`free_port`]).
pub(crate) fn free_ports(n: usize) -> Result<Vec<u16>, Error> {
    let mut claimed = CLAIMS.lock().unwrap_or_else(|e| e.into_inner());
    let range = outside_ephemeral();
    let span = range.len();
    if span == 0 {
        return Err(Error::new(
            "no port outside the ephemeral range to give a server",
        ));
    }
    // A different start in each process, so processes starting together rarely meet.
    let start = (nanos() as usize ^ (std::process::id() as usize).wrapping_mul(7919)) % span;
    let mut ports = Vec::with_capacity(n);
    for i in 0..span {
        if ports.len() == n {
            break;
        }
        let port = range[(start + i) % span];
        if claimed.contains_key(&port) {
            continue;
        }
        let Some(lock) = claim(port) else { continue };
        // Nobody (a server of another kind, another user's process) listens there.
        if TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        claimed.insert(port, lock);
        ports.push(port);
    }
    if ports.len() < n {
        return Err(Error::new(format!(
            "only {} of {n} free ports outside the ephemeral range",
            ports.len()
        )));
    }
    Ok(ports)
}

/// The name of the directory of port locks, before the user id. Every test process of the
/// user shares it for as long as any runs, so the sweep of crashed runs' directories leaves
/// it alone.
pub(crate) const PORTS_DIR_PREFIX: &str = "orion-testkit-ports-";

/// The ports this process claimed, with the locks that keep them its own.
static CLAIMS: std::sync::Mutex<std::collections::BTreeMap<u16, std::fs::File>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// `port`'s lock file, locked by this process (`None`: another process holds it).
fn claim(port: u16) -> Option<std::fs::File> {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!(
            "{PORTS_DIR_PREFIX}{}",
            nix::unistd::getuid().as_raw()
        ));
        let _ = std::fs::create_dir_all(&dir);
        dir
    });
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(port.to_string()))
        .ok()?;
    file.try_lock().ok()?;
    Some(file)
}

/// The ports a server may be given: from 10000 up to the ephemeral range, and above it.
fn outside_ephemeral() -> Vec<u16> {
    let (low, high) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            let mut it = text.split_whitespace().map(|n| n.parse::<u32>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999));
    (10_000u32..low.min(65_536))
        .chain(high.saturating_add(1).max(10_000)..65_536)
        .filter_map(|p| u16::try_from(p).ok())
        .collect()
}

/// Removes a directory unless disarmed (for errors before an [`Instance`] owns it).
pub(crate) struct DirGuard(pub Option<PathBuf>);
impl DirGuard {
    pub fn disarm(mut self) {
        self.0 = None;
    }
}
impl Drop for DirGuard {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Runs `attempt` with fresh ports until the server does not find its port taken (at most
/// five times).
pub(crate) fn with_port_retries<T>(
    mut attempt: impl FnMut() -> Result<T, Error>,
) -> Result<T, Error> {
    let mut tries = 0;
    loop {
        match attempt() {
            Err(e) if e.port_taken && tries < 5 => tries += 1,
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ports come from outside the ephemeral range, never twice, and each stays locked: a
    /// second look at its lock file (as another test process would take) finds it held.
    #[test]
    fn claimed_ports_stay_ours_and_out_of_the_ephemeral_range() {
        let range = outside_ephemeral();
        let ports = free_ports(6).unwrap_or_default();
        let one = free_port().unwrap_or_default();
        assert_eq!(ports.len(), 6);
        let mut all = ports.clone();
        all.push(one);
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 7, "a port was given twice: {ports:?} {one}");
        for port in all {
            assert!(range.contains(&port), "{port} is in the ephemeral range");
            assert!(claim(port).is_none(), "{port}'s lock is not held");
        }
        // Another test process's sweep of crashed runs' directories keeps the locks, also once
        // the directory has not changed for a while (what the sweep takes for abandoned).
        let dir = std::env::temp_dir().join(format!(
            "{PORTS_DIR_PREFIX}{}",
            nix::unistd::getuid().as_raw()
        ));
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(600);
        std::fs::File::open(&dir)
            .and_then(|d| d.set_modified(old))
            .expect("age the port locks' directory");
        super::super::sweep::sweep();
        for port in ports {
            assert!(
                dir.join(port.to_string()).exists() && claim(port).is_none(),
                "{port}'s lock is gone after a sweep"
            );
        }
    }
}
