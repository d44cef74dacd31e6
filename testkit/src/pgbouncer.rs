//! Debian's `pgbouncer` in front of a private PostgreSQL instance.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use crate::postgres::Postgres;
use crate::process::{
    chown_tree, free_port, new_dir, run_as, secs, with_port_retries, DirGuard, Instance, Probe,
    Spec,
};
use crate::{report, Error};

const BINARY: &str = "/usr/sbin/pgbouncer";

/// pgbouncer's `pool_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// A server connection per client connection.
    Session,
    /// A server connection per transaction (what most deployments in front of an elector
    /// use, and what breaks session state such as LISTEN and advisory locks).
    Transaction,
    /// A server connection per statement.
    Statement,
}

impl PoolMode {
    fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
            PoolMode::Statement => "statement",
        }
    }
}

/// Configures a pgbouncer; see [`Pgbouncer::builder`].
#[must_use]
pub struct PgbouncerBuilder<'a> {
    target: &'a Postgres,
    pool_mode: PoolMode,
    settings: Vec<(String, String)>,
}

impl PgbouncerBuilder<'_> {
    /// The pool mode (default: transaction).
    pub fn pool_mode(mut self, mode: PoolMode) -> Self {
        self.pool_mode = mode;
        self
    }

    /// Any other `[pgbouncer]` setting, e.g. `default_pool_size`, `server_reset_query`.
    pub fn setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((name.into(), value.into()));
        self
    }

    /// Starts it; returns once it accepts connections.
    pub fn start(self) -> Result<Pgbouncer, Error> {
        let started = Instant::now();
        if !Path::new(BINARY).is_file() {
            return Err(Error::new(
                "pgbouncer is not installed: install Debian's pgbouncer package \
                 (`apt-get install -y pgbouncer`)",
            ));
        }
        let who = run_as("postgres", "postgresql")?;
        let bouncer = with_port_retries(|| {
            let dir = new_dir("pgbouncer", who)?;
            let guard = DirGuard(Some(dir.clone()));
            let port = free_port()?;
            let mut settings: Vec<(String, String)> = vec![
                ("listen_addr".into(), "127.0.0.1".into()),
                ("listen_port".into(), port.to_string()),
                ("unix_socket_dir".into(), String::new()),
                ("auth_type".into(), "trust".into()),
                (
                    "auth_file".into(),
                    dir.join("userlist.txt").display().to_string(),
                ),
                ("admin_users".into(), "postgres".into()),
                ("pool_mode".into(), self.pool_mode.as_str().into()),
                ("max_client_conn".into(), "500".into()),
                ("default_pool_size".into(), "20".into()),
                (
                    "ignore_startup_parameters".into(),
                    "extra_float_digits,options".into(),
                ),
            ];
            // A setting given to the builder replaces the default of that name.
            settings.retain(|(k, _)| !self.settings.iter().any(|(name, _)| name == k));
            settings.extend(self.settings.iter().cloned());
            let b = Pgbouncer {
                config: dir.join("pgbouncer.ini"),
                settings: Mutex::new(settings),
                inst: None,
            };
            b.write_config(self.target.port())?;
            std::fs::write(dir.join("userlist.txt"), "\"postgres\" \"\"\n")
                .map_err(|e| Error::io("cannot write userlist.txt", e))?;
            chown_tree(&dir, who)?;
            let inst = Instance::launch(Spec {
                name: format!("pgbouncer on port {port}"),
                dir,
                port,
                who,
                program: BINARY.into(),
                args: vec![b.config.clone().into()],
                env: Vec::new(),
                stop_signal: "TERM", // immediate shutdown (SIGINT would wait for clients)
                probe: Probe::Tcp,
                first_start: String::new(),
            })?;
            guard.disarm();
            Ok(Pgbouncer {
                inst: Some(inst),
                ..b
            })
        })?;
        report(&format!(
            "pgbouncer ({} pooling) in front of port {} ready on 127.0.0.1:{} in {}",
            self.pool_mode.as_str(),
            self.target.port(),
            bouncer.port(),
            secs(started.elapsed())
        ));
        Ok(bouncer)
    }
}

/// A private pgbouncer: clients connect to it as `postgres` (trust) and reach any database of
/// the PostgreSQL instance behind it.
pub struct Pgbouncer {
    config: PathBuf,
    settings: Mutex<Vec<(String, String)>>,
    inst: Option<Instance>,
}

impl Pgbouncer {
    /// A pgbouncer in front of `target`.
    pub fn builder(target: &Postgres) -> PgbouncerBuilder<'_> {
        PgbouncerBuilder {
            target,
            pool_mode: PoolMode::Transaction,
            settings: Vec::new(),
        }
    }

    fn inst(&self) -> &Instance {
        self.inst.as_ref().expect("started")
    }

    fn write_config(&self, server_port: u16) -> Result<(), Error> {
        let settings = self.settings.lock().unwrap_or_else(|e| e.into_inner());
        let mut text =
            format!("[databases]\n* = host=127.0.0.1 port={server_port}\n\n[pgbouncer]\n");
        for (k, v) in settings.iter() {
            text += &format!("{k} = {v}\n");
        }
        std::fs::write(&self.config, text)
            .map_err(|e| Error::io(format!("cannot write {}", self.config.display()), e))
    }

    /// Points it at another server (e.g. a promoted standby) and reloads (`SIGHUP`); new
    /// server connections go there.
    pub fn point_to(&self, target: &Postgres) -> Result<(), Error> {
        self.write_config(target.port())?;
        self.inst().signal("HUP")
    }

    /// `postgres://postgres@127.0.0.1:PORT/test` through the pooler.
    pub fn url(&self) -> String {
        self.url_for(crate::postgres::DATABASE)
    }

    /// The URL of another database through the pooler.
    pub fn url_for(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port())
    }

    /// Its TCP port (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.inst().port
    }

    /// Its log.
    pub fn log_file(&self) -> &Path {
        &self.inst().log
    }

    /// Immediate shutdown (SIGTERM).
    pub fn stop(&self) -> Result<(), Error> {
        self.inst().stop()
    }

    /// Starts it again on the same port.
    pub fn start(&self) -> Result<(), Error> {
        self.inst().start()
    }

    /// SIGKILL.
    pub fn kill(&self) -> Result<(), Error> {
        self.inst().kill()
    }

    /// Sends a signal (`HUP` reloads, `USR1` pauses, `USR2` resumes).
    pub fn signal(&self, signal: &str) -> Result<(), Error> {
        self.inst().signal(signal)
    }
}
