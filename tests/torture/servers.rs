//! The run's own database servers: private PostgreSQL, PgBouncer and MariaDB instances, a
//! three-node Galera cluster, and a PostgreSQL primary with a standby to fail over to.

use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::faults::kill_tree;
use crate::skew::faketime_lib;
use crate::{Error, GaleraTopology};

/// This binary's private PostgreSQL instance (started on first use, off the async threads).
pub async fn private_postgres() -> Result<&'static orion_beacon_testkit::Postgres, Error> {
    Ok(tokio::task::spawn_blocking(orion_beacon_testkit::Postgres::shared).await?)
}

/// This binary's PgBouncer (`pool_mode = transaction`) in front of its private PostgreSQL.
pub async fn private_pgbouncer() -> Result<&'static orion_beacon_testkit::Pgbouncer, Error> {
    static BOUNCER: tokio::sync::OnceCell<orion_beacon_testkit::Pgbouncer> =
        tokio::sync::OnceCell::const_new();
    let pg = private_postgres().await?;
    BOUNCER
        .get_or_try_init(|| async move {
            tokio::task::spawn_blocking(move || {
                orion_beacon_testkit::Pgbouncer::builder(pg)
                    .pool_mode(orion_beacon_testkit::PoolMode::Transaction)
                    // After one failed server login (a restart, killed connections), PgBouncer
                    // turns every client away for this long (default 15 s): no leader then.
                    .setting("server_login_retry", "1")
                    .start()
            })
            .await?
            .map_err(Error::from)
        })
        .await
}

/// This binary's private MariaDB instance, one per server-wide `sql_mode`.
pub async fn private_mariadb(
    sql_mode: Option<&'static str>,
) -> Result<&'static orion_beacon_testkit::MariaDb, Error> {
    Ok(tokio::task::spawn_blocking(move || match sql_mode {
        Some(mode) => orion_beacon_testkit::MariaDb::builder()
            .arg(format!("--sql-mode={mode}"))
            .shared(),
        None => orion_beacon_testkit::MariaDb::shared(),
    })
    .await?)
}

/// A three-node Galera cluster for the torture run. Galera's failure detector is tuned down
/// from its 5 s defaults (a silent node stalls every node's writes until it is suspected), as
/// deployments that need fast failover do.
pub fn start_galera(topology: GaleraTopology) -> Result<orion_beacon_testkit::Galera, Error> {
    let mut builder = orion_beacon_testkit::Galera::builder(3)
        .provider_option("evs.keepalive_period", "PT0.3S")
        .provider_option("evs.suspect_timeout", "PT1.5S")
        .provider_option("evs.inactive_check_period", "PT0.5S")
        .provider_option("evs.inactive_timeout", "PT3S")
        .provider_option("evs.install_timeout", "PT3S");
    if let Some(offset) = topology.node2_skew {
        let lib =
            faketime_lib().ok_or("libfaketime is not installed (apt-get install faketime)")?;
        builder = builder
            .node_env(2, "LD_PRELOAD", lib)
            .node_env(2, "FAKETIME", offset)
            .node_env(2, "FAKETIME_DONT_FAKE_MONOTONIC", "1");
    }
    Ok(builder.start()?)
}

/// A primary, its streaming standby (none while one is being rebuilt after a failover) and
/// the one address candidates use: a PgBouncer in session pooling, re-pointed at failover the
/// way HAProxy or Patroni move a service address.
pub struct Cluster {
    pub primary: orion_beacon_testkit::Postgres,
    standby: Option<orion_beacon_testkit::Postgres>,
    pub bouncer: orion_beacon_testkit::Pgbouncer,
    replication: orion_beacon_testkit::Replication,
}

impl Cluster {
    pub fn start(replication: orion_beacon_testkit::Replication) -> Result<Self, Error> {
        use orion_beacon_testkit::{Pgbouncer, PoolMode, Postgres};
        let primary = Postgres::builder().start()?;
        let standby = Self::standby_of(&primary, replication)?;
        let bouncer = Pgbouncer::builder(&primary)
            .pool_mode(PoolMode::Session)
            .setting("server_login_retry", "1")
            // One server connection per client (session pooling): enough for every
            // candidate's pool and the harness's looks, which would otherwise wait in
            // PgBouncer's queue past their timeout and find no leader to fault.
            .setting("default_pool_size", "150")
            .start()?;
        Ok(Self {
            primary,
            standby: Some(standby),
            bouncer,
            replication,
        })
    }

    /// The primary's machine dies: SIGKILL to the postmaster and every backend at once (a
    /// backend left running could still answer). Then the standby is promoted and the address
    /// moves to it. `false` if there was no standby to fail over to.
    pub fn fail_over(&mut self, held_sender: Option<i32>) -> Result<bool, Error> {
        let Some(standby) = self.standby.take() else {
            return Ok(false);
        };
        if let Some(sender) = held_sender {
            // The lag must be real: the primary has committed WAL the standby never received.
            let behind = (|| -> Result<bool, Error> {
                let sent = lsn(&self.primary.sql("SELECT pg_current_wal_lsn()")?)?;
                let received =
                    lsn(&standby.sql("SELECT COALESCE(pg_last_wal_receive_lsn(), '0/0')")?)?;
                Ok(received < sent)
            })();
            if !matches!(behind, Ok(true)) {
                // Let the sender go, so the servers shut down normally, then fail the run.
                let _ = kill(Pid::from_raw(sender), Signal::SIGCONT);
                self.standby = Some(standby);
                return Err(match behind {
                    Err(e) => format!("could not compare WAL positions: {e}").into(),
                    _ => "the standby was not behind: the lag was not applied".into(),
                });
            }
        }
        if let Some(pid) = self.primary.pid() {
            kill_tree(pid);
        }
        self.primary.kill()?;
        standby.promote()?;
        self.bouncer.point_to(&standby)?;
        // Server connections to the dead primary are gone; PgBouncer opens new ones there.
        let old = std::mem::replace(&mut self.primary, standby);
        drop(old);
        Ok(true)
    }

    /// Stops the primary's WAL sender (SIGSTOP): the primary goes on committing (replication
    /// is asynchronous) while the standby receives nothing, as across a slow network.
    /// [`fail_over`](Self::fail_over) then kills the primary with it. `None` if there is no
    /// standby yet (it is being rebuilt).
    pub fn hold_sender(&self) -> Result<Option<i32>, Error> {
        if self.standby.is_none() {
            return Ok(None);
        }
        // The sender that streams to the standby (not one of a base backup just ending).
        // Right after a restart the standby takes a moment to reconnect.
        let give_up = std::time::Instant::now() + Duration::from_secs(3);
        let sender = loop {
            let pid = self
                .primary
                .sql("SELECT pid FROM pg_stat_replication WHERE state = 'streaming' LIMIT 1")
                .ok()
                .and_then(|out| out.trim().parse::<i32>().ok());
            if let Some(pid) = pid {
                break pid;
            }
            if std::time::Instant::now() > give_up {
                return Err("the primary streams to no standby: the lag cannot be applied".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        kill(Pid::from_raw(sender), Signal::SIGSTOP)?;
        Ok(Some(sender))
    }

    /// A new standby of the current primary, so the run can fail over again.
    pub fn rebuild_standby(&mut self) -> Result<(), Error> {
        self.standby = Some(Self::standby_of(&self.primary, self.replication)?);
        Ok(())
    }

    /// A streaming standby that reconnects 200 ms after losing its primary (default 5 s):
    /// under synchronous replication every commit waits for it, so after a primary restart no
    /// lease statement commits until it is back.
    fn standby_of(
        primary: &orion_beacon_testkit::Postgres,
        replication: orion_beacon_testkit::Replication,
    ) -> Result<orion_beacon_testkit::Postgres, Error> {
        Ok(primary
            .standby()
            .synchronous(replication == orion_beacon_testkit::Replication::Synchronous)
            .setting("wal_retrieve_retry_interval", "200ms")
            .start()?)
    }
}

/// A PostgreSQL LSN (`16/B374D848`) as a number.
fn lsn(text: &str) -> Result<u64, Error> {
    let (high, low) = text
        .trim()
        .split_once('/')
        .ok_or_else(|| format!("not an LSN: {text:?}"))?;
    Ok((u64::from_str_radix(high, 16)? << 32) | u64::from_str_radix(low, 16)?)
}
