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

/// A port on 127.0.0.1 that nobody listened on a moment ago. A server that then finds it
/// taken fails to start with `port_taken`, and the caller tries again with another one.
pub(crate) fn free_port() -> Result<u16, Error> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Error::io("cannot bind a port on 127.0.0.1", e))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::io("no local address", e))
}

/// `n` distinct free ports.
pub(crate) fn free_ports(n: usize) -> Result<Vec<u16>, Error> {
    // Hold all listeners at once, so the kernel hands out distinct ports.
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| {
            TcpListener::bind("127.0.0.1:0")
                .map_err(|e| Error::io("cannot bind a port on 127.0.0.1", e))
        })
        .collect::<Result<_, _>>()?;
    listeners
        .iter()
        .map(|l| {
            l.local_addr()
                .map(|a| a.port())
                .map_err(|e| Error::io("no local address", e))
        })
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
