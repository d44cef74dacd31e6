//! What every kind of server shares: directories, ports, the OS user, the template cache and
//! the supervisor process that owns the server.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::Error;

/// Instance directories are `<tmp>/orion-testkit-<kind>-<pid>-<n>-<nanos>`.
pub(crate) const DIR_PREFIX: &str = "orion-testkit-";

/// How long a server may take to become ready.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The OS user a server runs as when the tests run as root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RunAs {
    pub uid: u32,
    pub gid: u32,
}

/// `None` when not root (servers run as the current user); the service user otherwise.
pub(crate) fn run_as(user: &str, package: &str) -> Result<Option<RunAs>, Error> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    match nix::unistd::User::from_name(user) {
        Ok(Some(u)) => Ok(Some(RunAs {
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
        })),
        _ => Err(Error::new(format!(
            "the tests run as root, so the server must run as the `{user}` OS user, which does \
             not exist: install Debian's {package} package (`apt-get install -y {package}`), \
             which creates it, or run the tests as a normal user"
        ))),
    }
}

/// A command for a helper program (initdb, pg_basebackup, ...) run as the service user.
pub(crate) fn command(program: impl AsRef<std::ffi::OsStr>, who: Option<RunAs>) -> Command {
    let mut cmd = Command::new(program);
    cmd.current_dir("/")
        .stdin(Stdio::null())
        .env_remove("LD_PRELOAD")
        .env_remove("FAKETIME");
    if let Some(r) = who {
        cmd.uid(r.uid).gid(r.gid);
    }
    cmd
}

/// Runs `cmd`, failing with its output when it fails.
pub(crate) fn run(cmd: &mut Command, what: &str) -> Result<String, Error> {
    let out = cmd
        .output()
        .map_err(|e| Error::io(format!("cannot run {what}"), e))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(Error::new(format!(
            "{what} failed ({}):\n{text}",
            out.status
        )))
    }
}

/// Changes the owner of a whole tree (no-op when not root).
pub(crate) fn chown_tree(path: &Path, who: Option<RunAs>) -> Result<(), Error> {
    let Some(r) = who else { return Ok(()) };
    std::os::unix::fs::lchown(path, Some(r.uid), Some(r.gid))
        .map_err(|e| Error::io(format!("chown {}", path.display()), e))?;
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
    if meta.is_dir() {
        let entries = std::fs::read_dir(path)
            .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(format!("read {}", path.display()), e))?;
            chown_tree(&entry.path(), who)?;
        }
    }
    Ok(())
}

/// `cp -a` (with reflinks where the file system has them): keeps modes and owners.
pub(crate) fn copy_tree(from: &Path, to: &Path) -> Result<(), Error> {
    run(
        Command::new("cp")
            .arg("-a")
            .arg("--reflink=auto")
            .arg(from)
            .arg(to),
        &format!("copying {} to {}", from.display(), to.display()),
    )
    .map(|_| ())
}

fn nanos() -> u128 {
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
fn base_dirs() -> Vec<PathBuf> {
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

/// True while `pid` is a live process (not gone, not a zombie).
pub(crate) fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path)
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// Removes what crashed runs left behind: instance directories whose supervisor is gone
/// (a server still running in one is killed first) and half-built template directories.
fn sweep_once() {
    static SWEPT: OnceLock<()> = OnceLock::new();
    SWEPT.get_or_init(sweep);
}

pub(crate) fn sweep() {
    for base in base_dirs() {
        let Ok(entries) = std::fs::read_dir(base) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with(DIR_PREFIX) || name.starts_with("orion-testkit-cache") {
                continue;
            }
            let dir = entry.path();
            let dir_text = dir.display().to_string();
            let supervised = read_pid(&dir.join("supervisor.pid"))
                .is_some_and(|pid| alive(pid) && cmdline(pid).contains(&dir_text));
            if supervised {
                continue;
            }
            let age = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .unwrap_or_default();
            if !dir.join("supervisor.pid").exists() && age < Duration::from_secs(60) {
                continue; // being set up right now by another process
            }
            if dir.join("keep").exists() {
                continue; // kept on purpose (ORION_TESTKIT_KEEP)
            }
            if let Some(pid) = read_pid(&dir.join("server.pid")) {
                if alive(pid) && cmdline(pid).contains(&dir_text) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
            if std::fs::remove_dir_all(&dir).is_ok() {
                crate::report(&format!("removed {dir_text}, left behind by a crashed run"));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The template cache.

/// Where templates live: `ORION_TESTKIT_CACHE`, else `<cargo target dir>/testkit` (found from
/// the running executable), else the temporary directory.
fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("ORION_TESTKIT_CACHE") {
        return PathBuf::from(dir);
    }
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1) {
            if dir.join("CACHEDIR.TAG").is_file() {
                return dir.join("testkit");
            }
        }
    }
    std::env::temp_dir().join(format!(
        "orion-testkit-cache-{}",
        nix::unistd::geteuid().as_raw()
    ))
}

/// Fills `dest` (which must not exist yet) from the cached template `key`; on a miss, `build`
/// creates `dest` from scratch and the result is published to the cache (atomically, by
/// rename, so concurrent test binaries never see half a template). Returns whether the
/// template was cached.
pub(crate) fn from_template(
    cache: Option<&Path>,
    key: &str,
    dest: &Path,
    build: impl FnOnce(&Path) -> Result<(), Error>,
) -> Result<bool, Error> {
    let root = cache.map(Path::to_path_buf).unwrap_or_else(cache_root);
    let key = format!("{key}-u{}", nix::unistd::geteuid().as_raw());
    let cached = root.join(&key);
    if cached.join("READY").is_file() {
        if copy_tree(&cached.join("data"), dest).is_ok() {
            return Ok(true);
        }
        // A damaged template: rebuild it below.
        let _ = std::fs::remove_dir_all(dest);
        let _ = std::fs::remove_dir_all(&cached);
    }
    build(dest)?;
    let publish = || -> Result<(), Error> {
        std::fs::create_dir_all(&root)
            .map_err(|e| Error::io(format!("cannot create {}", root.display()), e))?;
        // Half-built templates of processes that died.
        if let Ok(entries) = std::fs::read_dir(&root) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                // `.{key}.{pid}.{nanos}`; the key has dots of its own (versions).
                let pid = name.strip_prefix('.').and_then(|n| {
                    let mut parts = n.rsplitn(3, '.');
                    parts.next()?;
                    parts.next()?.parse::<u32>().ok()
                });
                if pid.is_some_and(|p| !alive(p)) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let staging = root.join(format!(".{key}.{}.{:x}", std::process::id(), nanos()));
        std::fs::create_dir(&staging)
            .map_err(|e| Error::io(format!("cannot create {}", staging.display()), e))?;
        let result = copy_tree(dest, &staging.join("data")).and_then(|()| {
            std::fs::write(staging.join("READY"), b"")
                .map_err(|e| Error::io("cannot write READY", e))
        });
        if result.is_err() || std::fs::rename(&staging, &cached).is_err() {
            // Another process published the same template first (or the cache is not
            // writable): ours is not needed.
            let _ = std::fs::remove_dir_all(&staging);
        }
        result
    };
    if let Err(e) = publish() {
        crate::report(&format!("template not cached ({e})"));
    }
    Ok(false)
}

// ---------------------------------------------------------------------------------------------
// The supervisor and the instance.

/// The supervisor: the server's parent. It reads one command per line from the test process
/// and answers one line; at end of input (the test process is gone, or dropped the instance)
/// it stops the server and removes the directory.
const SUPERVISOR: &str = r#"
dir=$1; sig=$2; log=$3; keep=$4; shift 4
pid=
alive() {
  [ -n "$pid" ] || return 1
  s=$(cat /proc/"$pid"/stat 2>/dev/null) || return 1
  s=${s##*) }
  [ "${s%% *}" != Z ]
}
halt() {
  [ -n "$pid" ] || return 0
  kill -"$1" "$pid" 2>/dev/null
  i=0
  while alive && [ "$i" -lt 150 ]; do sleep 0.1; i=$((i+1)); done
  alive && kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  pid=
}
while read -r cmd arg; do
  case $cmd in
    start) halt KILL; "$@" $arg </dev/null >>"$log" 2>&1 & pid=$!; echo "ok $pid" ;;
    stop) halt "$sig"; echo ok ;;
    kill) halt KILL; echo ok ;;
    signal) if alive; then kill -"$arg" "$pid" && echo ok || echo "error: kill failed"; else echo "error: not running"; fi ;;
    *) echo "error: unknown command $cmd" ;;
  esac
done
halt "$sig"
[ "$keep" = 1 ] || rm -rf "$dir" 2>/dev/null || { sleep 1; rm -rf "$dir"; }
"#;

/// How to tell that a server accepts connections.
#[derive(Debug, Clone)]
pub(crate) enum Probe {
    /// PostgreSQL: `postmaster.pid` names our process and says `ready` (or `standby`).
    Postmaster(PathBuf),
    /// MySQL protocol: the server sends a handshake (protocol 10) on connect.
    MysqlGreeting,
    /// Anything that accepts TCP connections.
    Tcp,
}

/// What to run, as whom, and how to stop it.
pub(crate) struct Spec {
    /// For messages: "PostgreSQL 15.20".
    pub name: String,
    pub dir: PathBuf,
    pub port: u16,
    pub who: Option<RunAs>,
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub env: Vec<(String, String)>,
    /// The signal for a graceful stop (`INT` for PostgreSQL's fast shutdown).
    pub stop_signal: &'static str,
    pub probe: Probe,
    /// Extra arguments for the first start only (e.g. `--wsrep-new-cluster`).
    pub first_start: String,
}

struct Supervisor {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

/// A running (or stopped) server with its supervisor and directory.
pub(crate) struct Instance {
    pub name: String,
    pub dir: PathBuf,
    pub port: u16,
    pub log: PathBuf,
    pub who: Option<RunAs>,
    probe: Probe,
    pid: AtomicU32,
    supervisor: Mutex<Supervisor>,
}

impl Instance {
    /// Starts the supervisor and, through it, the server; waits until it accepts connections.
    pub fn launch(spec: Spec) -> Result<Self, Error> {
        let log = spec.dir.join("server.log");
        let keep =
            std::env::var_os("ORION_TESTKIT_KEEP").is_some_and(|v| v != "0" && !v.is_empty());
        if keep {
            let _ = std::fs::write(spec.dir.join("keep"), b"");
        }
        let mut cmd = command("sh", spec.who);
        cmd.arg("-c")
            .arg(SUPERVISOR)
            .arg("orion-testkit-supervisor")
            .arg(&spec.dir)
            .arg(spec.stop_signal)
            .arg(&log)
            .arg(if keep { "1" } else { "0" })
            .arg(&spec.program)
            .args(&spec.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .env("HOME", &spec.dir);
        for (k, v) in &spec.env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| Error::io("cannot start the supervisor (sh)", e))?;
        let _ = std::fs::write(spec.dir.join("supervisor.pid"), child.id().to_string());
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let instance = Self {
            name: spec.name,
            dir: spec.dir,
            port: spec.port,
            log,
            who: spec.who,
            probe: spec.probe,
            pid: AtomicU32::new(0),
            supervisor: Mutex::new(Supervisor {
                child,
                stdin,
                stdout,
            }),
        };
        instance.start_with(&spec.first_start)?;
        Ok(instance)
    }

    fn request(&self, line: &str) -> Result<String, Error> {
        let mut s = self.supervisor.lock().unwrap_or_else(|e| e.into_inner());
        let stdin = s
            .stdin
            .as_mut()
            .ok_or_else(|| Error::new("the instance was shut down"))?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .map_err(|e| Error::io(format!("{}: supervisor gone", self.name), e))?;
        let mut answer = String::new();
        s.stdout
            .read_line(&mut answer)
            .map_err(|e| Error::io(format!("{}: supervisor gone", self.name), e))?;
        let answer = answer.trim();
        match answer.strip_prefix("ok") {
            Some(rest) => Ok(rest.trim().to_owned()),
            None if answer.is_empty() => Err(Error::new(format!(
                "{}: the supervisor exited (see {})",
                self.name,
                self.log.display()
            ))),
            None => Err(Error::new(format!("{}: {answer}", self.name))),
        }
    }

    /// The server's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        match self.pid.load(Ordering::SeqCst) {
            0 => None,
            pid if alive(pid) => Some(pid),
            _ => None,
        }
    }

    /// Starts the server (again) and waits until it accepts connections.
    pub fn start(&self) -> Result<(), Error> {
        self.start_with("")
    }

    /// [`start`](Self::start) with extra arguments for this start only (split at spaces).
    pub fn start_with(&self, extra: &str) -> Result<(), Error> {
        let offset = std::fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0);
        let pid: u32 = self
            .request(&format!("start {extra}"))?
            .parse()
            .map_err(|_| Error::new(format!("{}: bad answer from supervisor", self.name)))?;
        self.pid.store(pid, Ordering::SeqCst);
        let _ = std::fs::write(self.dir.join("server.pid"), pid.to_string());
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if self.ready(pid) {
                return Ok(());
            }
            if !alive(pid) {
                let log = self.log_since(offset);
                let mut e = Error::new(format!(
                    "{} exited while starting (log {}):\n{log}",
                    self.name,
                    self.log.display()
                ));
                e.port_taken = log.contains("Address already in use");
                return Err(e);
            }
            if Instant::now() > deadline {
                let _ = self.request("kill");
                return Err(Error::new(format!(
                    "{} was not ready within {READY_TIMEOUT:?} (log {}):\n{}",
                    self.name,
                    self.log.display(),
                    self.log_since(offset)
                )));
            }
            std::thread::sleep(Duration::from_millis(15));
        }
    }

    fn ready(&self, pid: u32) -> bool {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        match &self.probe {
            Probe::Postmaster(data) => {
                let Ok(text) = std::fs::read_to_string(data.join("postmaster.pid")) else {
                    return false;
                };
                let lines: Vec<&str> = text.lines().collect();
                lines.first().map(|l| l.trim()) == Some(pid.to_string().as_str())
                    && lines
                        .get(7)
                        .is_some_and(|s| matches!(s.trim(), "ready" | "standby"))
            }
            Probe::MysqlGreeting => {
                let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(500))
                else {
                    return false;
                };
                let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                let mut head = [0u8; 5];
                stream.read_exact(&mut head).is_ok() && head[4] == 10
            }
            Probe::Tcp => TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok(),
        }
    }

    fn log_since(&self, offset: u64) -> String {
        let text = std::fs::read(&self.log).unwrap_or_default();
        let tail = &text[(offset as usize).min(text.len())..];
        let tail = String::from_utf8_lossy(tail);
        // The last 40 lines are plenty.
        let lines: Vec<&str> = tail.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Graceful stop; waits for the process to exit (SIGKILL after 15 s).
    pub fn stop(&self) -> Result<(), Error> {
        self.request("stop")?;
        self.pid.store(0, Ordering::SeqCst);
        Ok(())
    }

    /// SIGKILL: a crash.
    pub fn kill(&self) -> Result<(), Error> {
        self.request("kill")?;
        self.pid.store(0, Ordering::SeqCst);
        Ok(())
    }

    /// Sends a signal (`HUP`, `STOP`, `CONT`, `USR1`, ...) to the server process.
    pub fn signal(&self, signal: &str) -> Result<(), Error> {
        self.request(&format!("signal {signal}")).map(|_| ())
    }

    /// Stops the server, ends the supervisor and removes the directory.
    fn shutdown(&self) {
        let _ = self.request("stop");
        let mut s = self.supervisor.lock().unwrap_or_else(|e| e.into_inner());
        s.stdin.take();
        let _ = s.child.wait();
        if self.dir.exists() && !self.dir.join("keep").exists() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.shutdown();
    }
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

/// `Some(seconds)` formatted for reports.
pub(crate) fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}
