//! Private PostgreSQL instances, streaming standbys and primary/standby clusters.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use crate::process::{
    chown_tree, command, free_port, from_template, new_dir, run, run_as, secs, with_port_retries,
    DirGuard, Instance, Probe, RunAs, Spec,
};
use crate::{report, Error};

/// Bump when the template's contents change (invalidates cached templates).
const TEMPLATE_FORMAT: u32 = 1;

/// The database every instance has (besides `postgres`).
pub const DATABASE: &str = "test";

/// Settings every instance starts with (before the builder's own, which win). `fsync = off`
/// and `full_page_writes = off`: data survive a crash or SIGKILL of the server (the OS keeps
/// what was written), not of the machine, which is all a test needs.
const DEFAULTS: &[(&str, &str)] = &[
    ("listen_addresses", "127.0.0.1"),
    ("unix_socket_directories", ""),
    ("fsync", "off"),
    ("full_page_writes", "off"),
    ("max_connections", "200"),
    ("log_line_prefix", "%m [%p] "),
    ("timezone", "UTC"),
    // Dynamic shared memory in the data directory (removed with it), not in /dev/shm, where a
    // SIGKILLed server (the tests' failovers and crashes) would leave its segments behind.
    ("dynamic_shared_memory_type", "mmap"),
];

struct Binaries {
    dir: PathBuf,
    version: String,
}

/// The PostgreSQL server binaries: `ORION_TESTKIT_PG_BINDIR`, `pg_config --bindir`, or the
/// newest `/usr/lib/postgresql/*/bin`.
fn binaries() -> Result<&'static Binaries, Error> {
    static FOUND: OnceLock<Result<Binaries, Error>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let complete = |dir: &Path| {
                ["initdb", "postgres", "pg_ctl"]
                    .iter()
                    .all(|b| dir.join(b).is_file())
            };
            let mut candidates: Vec<PathBuf> = Vec::new();
            if let Some(dir) = std::env::var_os("ORION_TESTKIT_PG_BINDIR") {
                candidates.push(dir.into());
            }
            if let Ok(out) = std::process::Command::new("pg_config")
                .arg("--bindir")
                .output()
            {
                candidates.push(String::from_utf8_lossy(&out.stdout).trim().into());
            }
            let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| {
                    let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
                    Some((v, e.path().join("bin")))
                })
                .collect();
            versions.sort();
            candidates.extend(versions.into_iter().rev().map(|(_, p)| p));
            let dir = candidates
                .into_iter()
                .find(|d| complete(d))
                .ok_or_else(|| {
                    Error::new(
                        "PostgreSQL server binaries (initdb, postgres, pg_ctl) not found through \
                     ORION_TESTKIT_PG_BINDIR, `pg_config --bindir` or /usr/lib/postgresql/*/bin: \
                     install Debian's postgresql package (`apt-get install -y postgresql`)",
                    )
                })?;
            let out = run(
                std::process::Command::new(dir.join("postgres")).arg("--version"),
                "postgres --version",
            )?;
            // "postgres (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)"
            let version = out
                .split_whitespace()
                .nth(2)
                .unwrap_or("unknown")
                .to_owned();
            Ok(Binaries { dir, version })
        })
        .as_ref()
        .map_err(Clone::clone)
}

fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

/// Appends `name = 'value'` lines to `postgresql.conf` (later lines win).
fn append_conf(data: &Path, settings: &[(String, String)]) -> Result<(), Error> {
    let path = data.join("postgresql.conf");
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .map_err(|e| Error::io(format!("cannot open {}", path.display()), e))?;
    let mut text = String::new();
    for (k, v) in settings {
        text += &format!("{k} = {}\n", quote(v));
    }
    file.write_all(text.as_bytes())
        .map_err(|e| Error::io(format!("cannot write {}", path.display()), e))
}

/// `initdb` and a `test` database, into `dest`.
fn init_template(bin: &Binaries, who: Option<RunAs>, dest: &Path) -> Result<(), Error> {
    run(
        command(bin.dir.join("initdb"), who)
            .arg("-D")
            .arg(dest)
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
                "--no-instructions",
            ]),
        "initdb",
    )?;
    let mut single = command(bin.dir.join("postgres"), who)
        .arg("--single")
        .arg("-D")
        .arg(dest)
        .args(["-c", "fsync=off", "postgres"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io("cannot run postgres --single", e))?;
    if let Some(mut stdin) = single.stdin.take() {
        let _ = stdin.write_all(format!("CREATE DATABASE {DATABASE};\n").as_bytes());
    }
    let out = single
        .wait_with_output()
        .map_err(|e| Error::io("postgres --single", e))?;
    let text = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || text.contains("ERROR") {
        return Err(Error::new(format!(
            "creating the {DATABASE} database failed:\n{text}"
        )));
    }
    Ok(())
}

/// How standbys follow the primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// Commits on the primary wait for a synchronous standby (`synchronous_standby_names`).
    Synchronous,
    /// Commits return at once; standbys may lag.
    Asynchronous,
}

/// Configures a private PostgreSQL instance; see [`Postgres::builder`].
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct PostgresBuilder {
    settings: Vec<(String, String)>,
    cache: Option<PathBuf>,
    /// Tests only: the port to try first (one that is taken, to see the retry).
    first_port: Option<u16>,
}

impl PostgresBuilder {
    /// A server setting, as `-c name=value` would set it (written to `postgresql.conf`, so
    /// [`Postgres::configure`] can change it later).
    pub fn setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((name.into(), value.into()));
        self
    }

    /// Where the initdb template is cached (default: `ORION_TESTKIT_CACHE`, else
    /// `<target>/testkit`).
    pub fn template_cache(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache = Some(dir.into());
        self
    }

    fn key(&self) -> String {
        format!("{:?}", self.settings)
    }

    #[cfg(test)]
    fn first_port(mut self, port: u16) -> Self {
        self.first_port = Some(port);
        self
    }

    /// Starts an instance of its own (stopped and removed on drop).
    pub fn start(self) -> Result<Postgres, Error> {
        let started = Instant::now();
        let bin = binaries()?;
        let who = run_as("postgres", "postgresql")?;
        let mut cached = false;
        let mut first_port = self.first_port;
        let pg = with_port_retries(|| {
            let dir = new_dir("postgres", who)?;
            let guard = DirGuard(Some(dir.clone()));
            let data = dir.join("data");
            cached = from_template(
                self.cache.as_deref(),
                &format!("postgresql-{}-t{TEMPLATE_FORMAT}", bin.version),
                &data,
                |dest| init_template(bin, who, dest),
            )?;
            let port = match first_port.take() {
                Some(port) => port,
                None => free_port()?,
            };
            let mut settings: Vec<(String, String)> = DEFAULTS
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            settings.push(("port".into(), port.to_string()));
            settings.extend(self.settings.iter().cloned());
            append_conf(&data, &settings)?;
            chown_tree(&data.join("postgresql.conf"), who)?;
            let pg = Postgres::launch(bin, who, dir, port, "PostgreSQL")?;
            guard.disarm();
            Ok(pg)
        })?;
        report(&format!(
            "PostgreSQL {} ready on 127.0.0.1:{} in {} ({} template; {})",
            bin.version,
            pg.port(),
            secs(started.elapsed()),
            if cached { "cached" } else { "new" },
            pg.inst.dir.display()
        ));
        Ok(pg)
    }

    /// The instance with this configuration shared by the whole test binary: started on first
    /// use, stopped when the process exits. Panics with the reason if it cannot start.
    pub fn shared(self) -> &'static Postgres {
        crate::shared(self.key(), || self.start())
    }

    /// A primary and `standbys` streaming standbys (named `standby1`, `standby2`, ...).
    pub fn cluster(self, standbys: usize, replication: Replication) -> Result<PgCluster, Error> {
        let primary = self.start()?;
        let mut list = Vec::with_capacity(standbys);
        for _ in 0..standbys {
            list.push(
                primary
                    .standby()
                    .synchronous(replication == Replication::Synchronous)
                    .start()?,
            );
        }
        Ok(PgCluster {
            standbys: list,
            primary,
        })
    }
}

/// A private PostgreSQL server: its own data directory and port, superuser `postgres` with
/// trust authentication, a `test` database.
pub struct Postgres {
    inst: Instance,
    bin: &'static Binaries,
    data: PathBuf,
    /// Synchronous standbys' application names (for `synchronous_standby_names`).
    sync_standbys: Mutex<Vec<String>>,
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postgres")
            .field("port", &self.inst.port)
            .field("dir", &self.inst.dir)
            .finish()
    }
}

impl Postgres {
    /// A builder for an instance with its own settings.
    pub fn builder() -> PostgresBuilder {
        PostgresBuilder::default()
    }

    /// This test binary's default instance (see [`PostgresBuilder::shared`]).
    pub fn shared() -> &'static Postgres {
        Self::builder().shared()
    }

    fn launch(
        bin: &'static Binaries,
        who: Option<RunAs>,
        dir: PathBuf,
        port: u16,
        what: &str,
    ) -> Result<Postgres, Error> {
        let data = dir.join("data");
        let inst = Instance::launch(Spec {
            name: format!("{what} {} on port {port}", bin.version),
            dir,
            port,
            who,
            program: bin.dir.join("postgres"),
            args: vec!["-D".into(), data.clone().into()],
            env: Vec::new(),
            stop_signal: "INT", // fast shutdown
            probe: Probe::Postmaster(data.clone()),
            first_start: String::new(),
        })?;
        Ok(Postgres {
            inst,
            bin,
            data,
            sync_standbys: Mutex::new(Vec::new()),
        })
    }

    /// `postgres://postgres@127.0.0.1:PORT/test`.
    pub fn url(&self) -> String {
        self.url_for(DATABASE)
    }

    /// The URL of another database on this server.
    pub fn url_for(&self, database: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{database}",
            self.inst.port
        )
    }

    /// The TCP port (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.inst.port
    }

    /// The server version, e.g. `15.20`.
    pub fn version(&self) -> &str {
        &self.bin.version
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// The server's log (its standard error; `log_line_prefix = '%m [%p] '`).
    pub fn log_file(&self) -> &Path {
        &self.inst.log
    }

    /// The postmaster's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.inst.pid()
    }

    /// Fast shutdown (clients are disconnected); waits until the server is gone.
    pub fn stop(&self) -> Result<(), Error> {
        self.inst.stop()
    }

    /// Starts the server again (same port, same data) and waits until it accepts connections.
    pub fn start(&self) -> Result<(), Error> {
        // After a kill the old backends exit on their own, a moment later; until they have,
        // the postmaster refuses to start on the shared memory they still hold.
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match self.inst.start() {
                Err(e)
                    if e.message.contains("pre-existing shared memory block")
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                other => return other,
            }
        }
    }

    /// [`stop`](Self::stop) then [`start`](Self::start).
    pub fn restart(&self) -> Result<(), Error> {
        self.inst.stop()?;
        self.start()
    }

    /// SIGKILL to the postmaster: a crash (its backends exit on their own).
    /// [`start`](Self::start) runs crash recovery.
    pub fn kill(&self) -> Result<(), Error> {
        self.inst.kill()
    }

    /// Sends a signal to the postmaster (`HUP` reloads the configuration).
    pub fn signal(&self, signal: &str) -> Result<(), Error> {
        self.inst.signal(signal)
    }

    /// Changes a setting in `postgresql.conf` and reloads; settings that need a restart take
    /// effect at the next [`restart`](Self::restart).
    pub fn configure(&self, name: &str, value: &str) -> Result<(), Error> {
        append_conf(&self.data, &[(name.to_owned(), value.to_owned())])?;
        if self.pid().is_some() {
            self.inst.signal("HUP")?;
        }
        Ok(())
    }

    /// Runs SQL with `psql` as `postgres` on the `test` database (for setup steps and checks
    /// in tests that have no connection at hand); returns its unaligned, tuples-only output.
    pub fn sql(&self, sql: &str) -> Result<String, Error> {
        run(
            std::process::Command::new(self.bin.dir.join("psql"))
                .args([
                    "-X",
                    "-q",
                    "-A",
                    "-t",
                    "-v",
                    "ON_ERROR_STOP=1",
                    "-h",
                    "127.0.0.1",
                ])
                .arg("-p")
                .arg(self.port().to_string())
                .args(["-U", "postgres", "-d", DATABASE, "-c", sql]),
            "psql",
        )
    }

    /// A streaming standby of this server, made with `pg_basebackup -R`.
    pub fn standby(&self) -> StandbyBuilder<'_> {
        StandbyBuilder {
            primary: self,
            synchronous: false,
            name: None,
            settings: Vec::new(),
        }
    }

    /// Promotes this standby to a primary (`pg_ctl promote -w`).
    pub fn promote(&self) -> Result<(), Error> {
        run(
            command(self.bin.dir.join("pg_ctl"), self.inst.who)
                .arg("promote")
                .arg("-D")
                .arg(&self.data)
                .args(["-w", "-t", "60"]),
            "pg_ctl promote",
        )
        .map(|_| ())
    }
}

/// Configures a standby; see [`Postgres::standby`].
#[must_use]
pub struct StandbyBuilder<'a> {
    primary: &'a Postgres,
    synchronous: bool,
    name: Option<String>,
    settings: Vec<(String, String)>,
}

impl StandbyBuilder<'_> {
    /// Synchronous: the primary's commits wait for this standby (or another synchronous one:
    /// `synchronous_standby_names = 'ANY 1 (...)'`). Default: asynchronous.
    pub fn synchronous(mut self, yes: bool) -> Self {
        self.synchronous = yes;
        self
    }

    /// Its `application_name` on the primary (default `standby<N>`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// A setting of the standby's own (after those copied from the primary).
    pub fn setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((name.into(), value.into()));
        self
    }

    /// Clones the primary and starts the standby; returns once it accepts read-only
    /// connections.
    pub fn start(self) -> Result<Postgres, Error> {
        static N: AtomicU32 = AtomicU32::new(1);
        let started = Instant::now();
        let primary = self.primary;
        let name = self
            .name
            .clone()
            .unwrap_or_else(|| format!("standby{}", N.fetch_add(1, Ordering::Relaxed)));
        let who = primary.inst.who;
        let standby = with_port_retries(|| {
            let dir = new_dir("postgres-standby", who)?;
            let guard = DirGuard(Some(dir.clone()));
            let data = dir.join("data");
            run(
                command(primary.bin.dir.join("pg_basebackup"), who)
                    .env("HOME", &dir)
                    .arg("-d")
                    .arg(format!(
                        "host=127.0.0.1 port={} user=postgres application_name={name}",
                        primary.port()
                    ))
                    .arg("-D")
                    .arg(&data)
                    .args(["-R", "-X", "stream", "-c", "fast", "--no-sync"]),
                "pg_basebackup",
            )?;
            let port = free_port()?;
            let mut settings = vec![("port".to_owned(), port.to_string())];
            settings.extend(self.settings.iter().cloned());
            append_conf(&data, &settings)?;
            let pg = Postgres::launch(primary.bin, who, dir, port, "PostgreSQL standby")?;
            guard.disarm();
            Ok(pg)
        })?;
        if self.synchronous {
            let mut names = primary
                .sync_standbys
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            names.push(name.clone());
            let list: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
            primary.configure(
                "synchronous_standby_names",
                &format!("ANY 1 ({})", list.join(", ")),
            )?;
        }
        report(&format!(
            "PostgreSQL standby {name} ({}) of port {} ready on 127.0.0.1:{} in {}",
            if self.synchronous {
                "synchronous"
            } else {
                "asynchronous"
            },
            primary.port(),
            standby.port(),
            secs(started.elapsed())
        ));
        Ok(standby)
    }
}

/// A primary with streaming standbys (standbys are stopped first on drop).
pub struct PgCluster {
    /// The standbys, in the order they were made.
    pub standbys: Vec<Postgres>,
    /// The primary.
    pub primary: Postgres,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Someone else listens on the port the first attempt picks: the server fails to bind,
    /// its directory goes, and the second attempt runs on another port.
    #[test]
    fn a_taken_port_is_retried_with_another() {
        let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken = squatter.local_addr().unwrap().port();
        let pg = Postgres::builder().first_port(taken).start().unwrap();
        assert_ne!(pg.port(), taken);
        assert_eq!(pg.sql("SELECT 1").unwrap().trim(), "1");
        let leftovers: Vec<_> = std::fs::read_dir(crate::process::base_dir())
            .unwrap()
            .flatten()
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with(&format!("orion-testkit-postgres-{}-", std::process::id()))
                    && e.path() != pg.data_dir().parent().unwrap()
            })
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}
