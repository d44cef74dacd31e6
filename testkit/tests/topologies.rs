//! The building blocks for replicated and pooled setups: a primary with synchronous and
//! asynchronous standbys and a promotion, pgbouncer in front of an instance (and repointed at a
//! promoted standby), a three-node Galera cluster that loses and regains a node.

use std::time::{Duration, Instant};

use orion_beacon_testkit::{Galera, Pgbouncer, PoolMode, Postgres, Replication};

fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    check()
}

#[test]
fn primary_with_standbys_then_promotion() {
    let cluster = Postgres::builder()
        .cluster(1, Replication::Synchronous)
        .unwrap();
    let primary = &cluster.primary;
    let sync = &cluster.standbys[0];
    let lagging = primary.standby().name("async1").start().unwrap();
    assert_eq!(
        primary
            .sql("SHOW synchronous_standby_names")
            .unwrap()
            .trim(),
        "ANY 1 (\"standby1\")"
    );
    assert!(eventually(Duration::from_secs(10), || primary
        .sql("SELECT application_name || ':' || sync_state FROM pg_stat_replication ORDER BY 1")
        .is_ok_and(
            |s| s.split_whitespace().collect::<Vec<_>>() == ["async1:async", "standby1:quorum"]
        )));
    primary
        .sql("CREATE TABLE r (x int); INSERT INTO r VALUES (1)")
        .unwrap();
    // A synchronous commit has reached the standby's WAL; replay follows at once.
    for standby in [sync, &lagging] {
        assert!(eventually(Duration::from_secs(10), || standby
            .sql("SELECT count(*) FROM r")
            .is_ok_and(|n| n.trim() == "1")));
        assert_eq!(
            standby.sql("SELECT pg_is_in_recovery()").unwrap().trim(),
            "t"
        );
        assert!(
            standby.sql("INSERT INTO r VALUES (2)").is_err(),
            "read-only"
        );
    }
    primary.stop().unwrap();
    sync.promote().unwrap();
    assert_eq!(sync.sql("SELECT pg_is_in_recovery()").unwrap().trim(), "f");
    sync.sql("INSERT INTO r VALUES (2)").unwrap();
    assert_eq!(sync.sql("SELECT count(*) FROM r").unwrap().trim(), "2");
}

#[test]
fn pgbouncer_in_front_and_repointed() {
    let a = Postgres::builder().start().unwrap();
    let b = Postgres::builder().start().unwrap();
    a.sql("CREATE TABLE which (name text); INSERT INTO which VALUES ('a')")
        .unwrap();
    b.sql("CREATE TABLE which (name text); INSERT INTO which VALUES ('b')")
        .unwrap();
    let bouncer = Pgbouncer::builder(&a)
        .pool_mode(PoolMode::Transaction)
        .setting("server_lifetime", "1")
        .start()
        .unwrap();
    let psql = |sql: &str| {
        std::process::Command::new("psql")
            .args([
                "-X",
                "-A",
                "-t",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-d",
                "test",
            ])
            .arg("-p")
            .arg(bouncer.port().to_string())
            .args(["-c", sql])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    assert_eq!(psql("SELECT name FROM which"), "a");
    assert!(bouncer.url().ends_with("/test"));
    bouncer.point_to(&b).unwrap();
    // Server connections to `a` are closed once released and past their lifetime.
    assert!(eventually(Duration::from_secs(10), || psql(
        "SELECT name FROM which"
    ) == "b"));
    bouncer.kill().unwrap();
    assert_eq!(psql("SELECT 1"), "");
    bouncer.start().unwrap();
    assert_eq!(psql("SELECT name FROM which"), "b");
}

#[test]
fn galera_cluster_of_three_loses_and_regains_a_node() {
    let cluster = Galera::builder(3).start().unwrap();
    let [n0, n1, n2] = [cluster.node(0), cluster.node(1), cluster.node(2)];
    n0.sql("CREATE TABLE test.g (id INT PRIMARY KEY, v INT)")
        .unwrap();
    n1.sql("INSERT INTO test.g VALUES (1, 10)").unwrap();
    assert_eq!(
        n2.sql("SET SESSION wsrep_sync_wait = 1; SELECT v FROM test.g WHERE id = 1")
            .unwrap()
            .trim(),
        "10"
    );
    n2.kill().unwrap();
    cluster.wait_synced(Duration::from_secs(30)).unwrap();
    n0.sql("INSERT INTO test.g VALUES (2, 20)").unwrap();
    n2.start().unwrap(); // rejoins (a full state transfer after SIGKILL)
    cluster.wait_synced(Duration::from_secs(60)).unwrap();
    assert_eq!(
        n2.sql("SET SESSION wsrep_sync_wait = 1; SELECT COUNT(*) FROM test.g")
            .unwrap()
            .trim(),
        "2"
    );
    assert!(n1.url().starts_with("mysql://root@127.0.0.1:"));
}
