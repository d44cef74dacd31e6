//! The supervisor process that owns a server, and the instance it runs.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::Error;

use super::*;

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
