//! MariaDB Galera clusters on loopback (Debian's `galera-4`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::mariadb::{binaries, init_template, MariaDb};
use crate::process::{
    free_ports, from_template, new_dir, run_as, secs, with_port_retries, DirGuard,
};
use crate::{report, Error};

const PROVIDERS: &[&str] = &[
    "/usr/lib/galera/libgalera_smm.so",
    "/usr/lib/libgalera_smm.so",
    "/usr/lib/galera-4/libgalera_smm.so",
];

/// Configures a Galera cluster; see [`Galera::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct GaleraBuilder {
    nodes: usize,
    args: Vec<String>,
    provider_options: Vec<(String, String)>,
    node_env: Vec<(usize, String, String)>,
    cache: Option<PathBuf>,
}

impl GaleraBuilder {
    /// A server option for every node (after the Galera options, so it wins).
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// A Galera provider option for every node, appended to `wsrep_provider_options` (e.g.
    /// `evs.suspect_timeout` = `PT1S`: how long a silent node stalls the others' writes).
    pub fn provider_option(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.provider_options.push((name.into(), value.into()));
        self
    }

    /// An environment variable for node `index` only (e.g. libfaketime's `LD_PRELOAD`,
    /// `FAKETIME=+3s` and `FAKETIME_DONT_FAKE_MONOTONIC=1` for a node with a skewed clock).
    pub fn node_env(
        mut self,
        index: usize,
        name: impl Into<String>,
        value: impl Into<String>,
    ) -> Self {
        self.node_env.push((index, name.into(), value.into()));
        self
    }

    /// Where the mariadb-install-db template is cached.
    pub fn template_cache(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache = Some(dir.into());
        self
    }

    /// Bootstraps node 0, joins the others one by one (rsync state transfer) and returns when
    /// every node says `Synced` in a cluster of all of them.
    pub fn start(self) -> Result<Galera, Error> {
        let started = Instant::now();
        let bin = binaries()?;
        let provider = PROVIDERS
            .iter()
            .map(Path::new)
            .find(|p| p.is_file())
            .ok_or_else(|| {
                Error::new(
                    "the Galera provider (libgalera_smm.so) is not installed: install Debian's \
                     galera-4 package (`apt-get install -y galera-4 rsync`)",
                )
            })?;
        if !Path::new("/usr/bin/rsync").is_file() {
            return Err(Error::new(
                "Galera's rsync state transfer needs rsync: `apt-get install -y rsync`",
            ));
        }
        let who = run_as("mysql", "mariadb-server")?;
        let n = self.nodes.max(1);
        let name = format!("orion{}", std::process::id());
        let galera = with_port_retries(|| {
            // Per node: SQL, group communication, incremental and full state transfer.
            let ports = free_ports(4 * n)?;
            let (sql, rest) = ports.split_at(n);
            let (group, rest) = rest.split_at(n);
            let (ist, sst) = rest.split_at(n);
            let address = group
                .iter()
                .map(|g| format!("127.0.0.1:{g}"))
                .collect::<Vec<_>>()
                .join(",");
            let mut nodes: Vec<MariaDb> = Vec::with_capacity(n);
            for i in 0..n {
                let dir = new_dir(&format!("galera{i}"), who)?;
                let guard = DirGuard(Some(dir.clone()));
                from_template(
                    self.cache.as_deref(),
                    &format!("mariadb-{}-t1", bin.short_version()),
                    &dir.join("data"),
                    |dest| init_template(bin, who, dest),
                )?;
                let mut args = vec![
                    "--binlog-format=ROW".to_owned(),
                    "--default-storage-engine=InnoDB".to_owned(),
                    "--innodb-autoinc-lock-mode=2".to_owned(),
                    "--wsrep-on=ON".to_owned(),
                    format!("--wsrep-provider={}", provider.display()),
                    format!("--wsrep-cluster-name={name}"),
                    format!("--wsrep-cluster-address=gcomm://{address}"),
                    format!("--wsrep-node-address=127.0.0.1:{}", group[i]),
                    format!("--wsrep-node-name=node{i}"),
                    format!(
                        "--wsrep-provider-options=base_port={g};gmcast.listen_addr=tcp://127.0.0.1:{g};ist.recv_addr=127.0.0.1:{};gcache.size=64M{extra}",
                        ist[i],
                        g = group[i],
                        extra = self
                            .provider_options
                            .iter()
                            .map(|(k, v)| format!(";{k}={v}"))
                            .collect::<String>()
                    ),
                    "--wsrep-sst-method=rsync".to_owned(),
                    format!("--wsrep-sst-receive-address=127.0.0.1:{}", sst[i]),
                ];
                args.extend(self.args.iter().cloned());
                let env: Vec<(String, String)> = self
                    .node_env
                    .iter()
                    .filter(|(j, _, _)| *j == i)
                    .map(|(_, k, v)| (k.clone(), v.clone()))
                    .collect();
                let first = if i == 0 { "--wsrep-new-cluster" } else { "" };
                let node = MariaDb::launch(
                    bin,
                    who,
                    dir,
                    sql[i],
                    &args,
                    &env,
                    first,
                    &format!("Galera node{i}"),
                )?;
                guard.disarm();
                nodes.push(node);
                let g = Galera { nodes };
                g.wait_synced(Duration::from_secs(120))?;
                nodes = g.into_nodes();
            }
            Ok(Galera { nodes })
        })?;
        report(&format!(
            "Galera cluster of {n} MariaDB {} nodes ready (ports {:?}) in {}",
            bin.short_version(),
            galera.nodes.iter().map(MariaDb::port).collect::<Vec<_>>(),
            secs(started.elapsed())
        ));
        Ok(galera)
    }
}

/// A MariaDB Galera cluster: every node a [`MariaDb`] of its own (stop, kill, start a node to
/// make it leave and rejoin).
pub struct Galera {
    nodes: Vec<MariaDb>,
}

impl Galera {
    /// A cluster of `nodes` nodes.
    pub fn builder(nodes: usize) -> GaleraBuilder {
        GaleraBuilder {
            nodes,
            args: Vec::new(),
            provider_options: Vec::new(),
            node_env: Vec::new(),
            cache: None,
        }
    }

    /// The nodes, node 0 first (the one that bootstrapped the cluster).
    pub fn nodes(&self) -> &[MariaDb] {
        &self.nodes
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> &MariaDb {
        &self.nodes[i]
    }

    fn into_nodes(self) -> Vec<MariaDb> {
        self.nodes
    }

    /// Makes the first running node's component the primary one (`pc.bootstrap`), as an
    /// operator does when the survivors of a node loss each ended up alone in a non-primary
    /// component: the others then join it.
    pub fn bootstrap_primary(&self) -> Result<(), Error> {
        let node = self
            .nodes
            .iter()
            .find(|n| n.pid().is_some())
            .ok_or_else(|| Error::new("no running Galera node to bootstrap"))?;
        node.sql("SET GLOBAL wsrep_provider_options = 'pc.bootstrap=YES'")
            .map(|_| ())
    }

    /// Waits until every running node says `Synced` and counts all running nodes in its
    /// cluster.
    pub fn wait_synced(&self, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        loop {
            let running: Vec<&MariaDb> = self.nodes.iter().filter(|n| n.pid().is_some()).collect();
            let mut last = String::new();
            let synced = running.iter().all(|node| {
                match node.sql(
                    "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME \
                     IN ('WSREP_LOCAL_STATE_COMMENT', 'WSREP_CLUSTER_SIZE') ORDER BY VARIABLE_NAME",
                ) {
                    Ok(out) => {
                        let values: Vec<&str> = out.split_whitespace().collect();
                        last = format!("node on port {}: {values:?}", node.port());
                        values == [running.len().to_string().as_str(), "Synced"]
                    }
                    Err(e) => {
                        last = e.to_string();
                        false
                    }
                }
            });
            if synced {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::new(format!(
                    "the Galera cluster did not sync within {timeout:?}; last: {last}"
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}
