//! Private MariaDB instances.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Instant;

use crate::process::{
    chown_tree, command, free_port, from_template, new_dir, run, run_as, secs, with_port_retries,
    DirGuard, Instance, Probe, RunAs, Spec,
};
use crate::{report, Error};

/// Bump when the template's contents change (invalidates cached templates).
const TEMPLATE_FORMAT: u32 = 1;

/// The database every instance has.
pub const DATABASE: &str = "test";

const INSTALL_HINT: &str =
    "install Debian's mariadb-server package (`apt-get install -y mariadb-server`)";

/// Options every instance starts with (before the builder's own, which win): Debian's
/// character set, and commits that survive a crash of the server but not of the machine.
const DEFAULTS: &[&str] = &[
    "--bind-address=127.0.0.1",
    "--skip-name-resolve",
    "--character-set-server=utf8mb4",
    "--collation-server=utf8mb4_general_ci",
    "--innodb-buffer-pool-size=64M",
    "--innodb-log-file-size=16M",
    "--innodb-flush-log-at-trx-commit=2",
    "--max-connections=500",
];

pub(crate) struct Binaries {
    pub server: PathBuf,
    pub install_db: PathBuf,
    pub version: String,
}

fn find(name: &str, dirs: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    dirs.iter()
        .map(PathBuf::from)
        .chain(std::env::split_paths(&path))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

pub(crate) fn binaries() -> Result<&'static Binaries, Error> {
    static FOUND: OnceLock<Result<Binaries, Error>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let server = find("mariadbd", &["/usr/sbin"]).ok_or_else(|| {
                Error::new(format!(
                    "the MariaDB server (mariadbd) is not installed: {INSTALL_HINT}"
                ))
            })?;
            let install_db = find("mariadb-install-db", &["/usr/bin"]).ok_or_else(|| {
                Error::new(format!(
                    "mariadb-install-db is not installed: {INSTALL_HINT}"
                ))
            })?;
            // "mariadbd  Ver 10.11.19-MariaDB-0+deb12u1 for debian-linux-gnu on x86_64 (Debian 12)"
            let out = run(
                std::process::Command::new(&server).arg("--version"),
                "mariadbd --version",
            )?;
            let version = out
                .split_whitespace()
                .skip_while(|w| *w != "Ver")
                .nth(1)
                .unwrap_or("unknown")
                .to_owned();
            Ok(Binaries {
                server,
                install_db,
                version,
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

impl Binaries {
    /// `10.11.19` of `10.11.19-MariaDB-0+deb12u1`.
    pub fn short_version(&self) -> &str {
        self.version.split('-').next().unwrap_or(&self.version)
    }
}

/// A temporary directory of the instance's own (`dir/tmp`), as a `--tmpdir=` option. Every
/// `mariadbd` start (the bootstraps too) deletes every `#sql*` file in its tmpdir, so servers
/// that shared `/tmp` deleted each other's temporary tables while starting ("Could not remove
/// temporary table", then a failed `mariadb-install-db`).
fn own_tmpdir(dir: &Path, who: Option<RunAs>) -> Result<String, Error> {
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp)
        .map_err(|e| Error::io(format!("cannot create {}", tmp.display()), e))?;
    chown_tree(&tmp, who)?;
    Ok(format!("--tmpdir={}", tmp.display()))
}

/// `mariadb-install-db` and a `test` database, into `dest`.
pub(crate) fn init_template(bin: &Binaries, who: Option<RunAs>, dest: &Path) -> Result<(), Error> {
    let tmp = own_tmpdir(dest.parent().unwrap_or(dest), who)?;
    run(
        command(&bin.install_db, who)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dest.display()))
            .arg(&tmp)
            .args([
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--innodb-log-file-size=16M",
            ]),
        "mariadb-install-db",
    )?;
    let mut boot = command(&bin.server, who)
        .arg("--no-defaults")
        .arg("--bootstrap")
        .arg(format!("--datadir={}", dest.display()))
        .arg(&tmp)
        .arg("--innodb-log-file-size=16M")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io("cannot run mariadbd --bootstrap", e))?;
    if let Some(mut stdin) = boot.stdin.take() {
        let _ = stdin.write_all(
            format!("CREATE DATABASE IF NOT EXISTS {DATABASE} CHARACTER SET utf8mb4;\n").as_bytes(),
        );
    }
    let out = boot
        .wait_with_output()
        .map_err(|e| Error::io("mariadbd --bootstrap", e))?;
    if !out.status.success() {
        return Err(Error::new(format!(
            "creating the {DATABASE} database failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

/// Configures a private MariaDB instance; see [`MariaDb::builder`].
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct MariaDbBuilder {
    args: Vec<String>,
    env: Vec<(String, String)>,
    cache: Option<PathBuf>,
    /// Tests only: the port to try first (one that is taken, to see the retry).
    first_port: Option<u16>,
}

impl MariaDbBuilder {
    /// A server option, e.g. `--sql-mode=STRICT_TRANS_TABLES,SIMULTANEOUS_ASSIGNMENT` (after
    /// the defaults, so it wins).
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Several server options.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// An environment variable for the server process (e.g. libfaketime's `LD_PRELOAD` and
    /// `FAKETIME` for a server with a skewed clock).
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Where the mariadb-install-db template is cached.
    pub fn template_cache(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache = Some(dir.into());
        self
    }

    fn key(&self) -> String {
        format!("{:?} {:?}", self.args, self.env)
    }

    #[cfg(test)]
    fn first_port(mut self, port: u16) -> Self {
        self.first_port = Some(port);
        self
    }

    /// Starts an instance of its own (stopped and removed on drop).
    pub fn start(self) -> Result<MariaDb, Error> {
        let started = Instant::now();
        let bin = binaries()?;
        let who = run_as("mysql", "mariadb-server")?;
        let mut cached = false;
        let mut first_port = self.first_port;
        let db = with_port_retries(|| {
            let dir = new_dir("mariadb", who)?;
            let guard = DirGuard(Some(dir.clone()));
            let data = dir.join("data");
            cached = from_template(
                self.cache.as_deref(),
                &format!("mariadb-{}-t{TEMPLATE_FORMAT}", bin.short_version()),
                &data,
                |dest| init_template(bin, who, dest),
            )?;
            let port = match first_port.take() {
                Some(port) => port,
                None => free_port()?,
            };
            let db = MariaDb::launch(bin, who, dir, port, &self.args, &self.env, "", "MariaDB")?;
            guard.disarm();
            Ok(db)
        })?;
        report(&format!(
            "MariaDB {} ready on 127.0.0.1:{} in {} ({} template; {})",
            bin.short_version(),
            db.port(),
            secs(started.elapsed()),
            if cached { "cached" } else { "new" },
            db.inst.dir.display()
        ));
        Ok(db)
    }

    /// The instance with this configuration shared by the whole test binary: started on first
    /// use, stopped when the process exits. Panics with the reason if it cannot start.
    pub fn shared(self) -> &'static MariaDb {
        crate::shared(self.key(), || self.start())
    }
}

/// A private MariaDB server: its own data directory, socket and port, `root` without a
/// password, a `test` database.
pub struct MariaDb {
    pub(crate) inst: Instance,
    bin: &'static Binaries,
    data: PathBuf,
    socket: PathBuf,
}

impl std::fmt::Debug for MariaDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MariaDb")
            .field("port", &self.inst.port)
            .field("dir", &self.inst.dir)
            .finish()
    }
}

impl MariaDb {
    /// A builder for an instance with its own options.
    pub fn builder() -> MariaDbBuilder {
        MariaDbBuilder::default()
    }

    /// This test binary's default instance (see [`MariaDbBuilder::shared`]).
    pub fn shared() -> &'static MariaDb {
        Self::builder().shared()
    }

    /// Starts `mariadbd` on `port` with the data directory `dir/data` (filled already).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch(
        bin: &'static Binaries,
        who: Option<RunAs>,
        dir: PathBuf,
        port: u16,
        args: &[String],
        env: &[(String, String)],
        first_start: &str,
        what: &str,
    ) -> Result<MariaDb, Error> {
        let data = dir.join("data");
        let socket = dir.join("mariadbd.sock");
        let mut all: Vec<OsString> = vec![
            "--no-defaults".into(),
            format!("--datadir={}", data.display()).into(),
            format!("--socket={}", socket.display()).into(),
            format!("--pid-file={}", dir.join("mariadbd.pid").display()).into(),
            format!("--port={port}").into(),
            own_tmpdir(&dir, who)?.into(),
        ];
        all.extend(DEFAULTS.iter().map(OsString::from));
        all.extend(args.iter().map(OsString::from));
        let inst = Instance::launch(Spec {
            name: format!("{what} {} on port {port}", bin.short_version()),
            dir,
            port,
            who,
            program: bin.server.clone(),
            args: all,
            env: env.to_vec(),
            stop_signal: "TERM",
            probe: Probe::MysqlGreeting,
            first_start: first_start.to_owned(),
        })?;
        Ok(MariaDb {
            inst,
            bin,
            data,
            socket,
        })
    }

    /// `mysql://root@127.0.0.1:PORT/test`.
    pub fn url(&self) -> String {
        self.url_for(DATABASE)
    }

    /// The URL of another database on this server.
    pub fn url_for(&self, database: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{database}", self.inst.port)
    }

    /// The TCP port (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.inst.port
    }

    /// The Unix socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The server version, e.g. `10.11.19`.
    pub fn version(&self) -> &str {
        self.bin.short_version()
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// The server's log (its standard error).
    pub fn log_file(&self) -> &Path {
        &self.inst.log
    }

    /// The server's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.inst.pid()
    }

    /// Clean shutdown (SIGTERM); waits until the server is gone.
    pub fn stop(&self) -> Result<(), Error> {
        self.inst.stop()
    }

    /// Starts the server again (same port, same data) and waits until it accepts connections.
    pub fn start(&self) -> Result<(), Error> {
        self.inst.start()
    }

    /// [`stop`](Self::stop) then [`start`](Self::start).
    pub fn restart(&self) -> Result<(), Error> {
        self.inst.stop()?;
        self.inst.start()
    }

    /// SIGKILL: a crash. [`start`](Self::start) runs crash recovery.
    pub fn kill(&self) -> Result<(), Error> {
        self.inst.kill()
    }

    /// Sends a signal to the server (`STOP`/`CONT` freeze and thaw it).
    pub fn signal(&self, signal: &str) -> Result<(), Error> {
        self.inst.signal(signal)
    }

    /// Runs SQL with the `mariadb` command-line client as root (for setup steps in tests that
    /// have no connection at hand); returns its tab-separated output.
    pub fn sql(&self, sql: &str) -> Result<String, Error> {
        run(
            std::process::Command::new("mariadb")
                .arg("--no-defaults")
                .arg(format!("--socket={}", self.socket.display()))
                .args(["-u", "root", "-N", "-B", "-e", sql]),
            "mariadb",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_port_is_retried_with_another() {
        let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken = squatter.local_addr().unwrap().port();
        let db = MariaDb::builder().first_port(taken).start().unwrap();
        assert_ne!(db.port(), taken);
        assert_eq!(db.sql("SELECT 1").unwrap().trim(), "1");
    }
}
