//! The private instances themselves: startup time, control, cleanup after drop and after the
//! owning process dies, leftovers of crashed runs.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use orion_beacon_testkit::{MariaDb, Postgres};

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
        .unwrap_or(false)
}

fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    done()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "orion-beacon-testkit-scratch-{name}-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// What a fresh machine pays: both templates built from scratch (initdb,
/// mariadb-install-db), both servers started, in parallel as two test threads would.
#[test]
fn both_servers_ready_within_ten_seconds_from_a_cold_cache() {
    let cache = scratch("cache");
    let t0 = Instant::now();
    let c1 = cache.clone();
    let pg = std::thread::spawn(move || Postgres::builder().template_cache(c1).start());
    let c2 = cache.clone();
    let my = std::thread::spawn(move || MariaDb::builder().template_cache(c2).start());
    let (pg, my) = (pg.join().unwrap().unwrap(), my.join().unwrap().unwrap());
    let cold = t0.elapsed();
    drop((pg, my));
    // And again, from the cached templates: what every later test binary pays.
    let t1 = Instant::now();
    let c1 = cache.clone();
    let pg = std::thread::spawn(move || Postgres::builder().template_cache(c1).start());
    let c2 = cache.clone();
    let my = std::thread::spawn(move || MariaDb::builder().template_cache(c2).start());
    let (pg, my) = (pg.join().unwrap().unwrap(), my.join().unwrap().unwrap());
    let warm = t1.elapsed();
    drop((pg, my));
    let _ = std::fs::remove_dir_all(&cache);
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "both private servers ready together in {:.2} s from a cold cache, {:.2} s from the cached templates",
        cold.as_secs_f64(),
        warm.as_secs_f64()
    );
    assert!(cold < Duration::from_secs(10), "cold start took {cold:?}");
    assert!(warm < Duration::from_secs(10), "warm start took {warm:?}");
}

#[test]
fn postgres_stop_start_restart_kill_and_settings() {
    let pg = Postgres::builder()
        .setting("application_name", "from-builder")
        .start()
        .unwrap();
    assert_eq!(pg.sql("SHOW application_name").unwrap().trim(), "psql");
    assert_eq!(pg.sql("SELECT current_database()").unwrap().trim(), "test");
    pg.sql("CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
        .unwrap();
    let first = pg.pid().unwrap();
    pg.restart().unwrap();
    assert_ne!(pg.pid().unwrap(), first);
    assert_eq!(pg.sql("SELECT count(*) FROM t").unwrap().trim(), "1");
    pg.configure("work_mem", "7MB").unwrap();
    assert!(wait_until(Duration::from_secs(5), || pg
        .sql("SHOW work_mem")
        .is_ok_and(|v| v.trim() == "7MB")));
    let pid = pg.pid().unwrap();
    pg.kill().unwrap();
    assert!(!alive(pid));
    assert!(pg.pid().is_none());
    assert!(pg.sql("SELECT 1").is_err());
    pg.start().unwrap(); // crash recovery
    assert_eq!(pg.sql("SELECT count(*) FROM t").unwrap().trim(), "1");
    pg.stop().unwrap();
    assert!(pg.sql("SELECT 1").is_err());
    pg.start().unwrap();
    assert!(pg.log_file().is_file());
}

#[test]
fn mariadb_options_restart_kill() {
    let db = MariaDb::builder()
        .arg("--sql-mode=STRICT_TRANS_TABLES,SIMULTANEOUS_ASSIGNMENT")
        .start()
        .unwrap();
    let mode = db.sql("SELECT @@GLOBAL.sql_mode").unwrap();
    assert!(mode.contains("SIMULTANEOUS_ASSIGNMENT"), "{mode}");
    assert_eq!(
        db.sql("SELECT @@character_set_server, DATABASE()")
            .unwrap()
            .trim(),
        "utf8mb4\tNULL"
    );
    db.sql("CREATE TABLE test.t (x int); INSERT INTO test.t VALUES (1)")
        .unwrap();
    db.restart().unwrap();
    assert_eq!(db.sql("SELECT COUNT(*) FROM test.t").unwrap().trim(), "1");
    db.kill().unwrap();
    db.start().unwrap();
    assert_eq!(db.sql("SELECT COUNT(*) FROM test.t").unwrap().trim(), "1");
    assert!(db.url().starts_with("mysql://root@127.0.0.1:"));
}

#[test]
fn dropping_an_instance_stops_it_and_removes_its_directory() {
    let pg = Postgres::builder().start().unwrap();
    let my = MariaDb::builder().start().unwrap();
    let dirs: Vec<PathBuf> = [pg.data_dir(), my.data_dir()]
        .iter()
        .map(|d| d.parent().unwrap().to_path_buf())
        .collect();
    let pids = [pg.pid().unwrap(), my.pid().unwrap()];
    drop(pg);
    drop(my);
    for dir in &dirs {
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
    for pid in pids {
        assert!(!alive(pid), "server {pid} still running");
    }
}

/// The owning process is SIGKILLed: its supervisors stop the servers and remove the
/// directories.
#[test]
fn servers_go_away_when_their_process_is_killed() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_orion-testkit"))
        .args(["postgres", "mariadb"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut held = Vec::new();
    for _ in 0..2 {
        let line = lines.next().unwrap().unwrap();
        let fields: Vec<&str> = line.split_whitespace().collect();
        let dir = PathBuf::from(fields[2]);
        let pid: u32 = fields[3].parse().unwrap();
        assert!(dir.is_dir() && alive(pid), "{line}");
        held.push((dir, pid));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    for (dir, pid) in &held {
        assert!(
            wait_until(Duration::from_secs(20), || !alive(*pid) && !dir.exists()),
            "server {pid} in {} outlived its process",
            dir.display()
        );
    }
}

/// A directory whose supervisor is gone (say, killed along with everything else) is removed
/// by the next run, and only a server that runs in that directory is killed.
#[test]
fn leftovers_of_crashed_runs_are_removed() {
    let mut dead = Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let mut bystander = Command::new("sleep").arg("30").spawn().unwrap();
    let dir = std::env::temp_dir().join(format!(
        "orion-testkit-postgres-{dead_pid}-0-{:x}",
        std::process::id()
    ));
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(dir.join("supervisor.pid"), dead_pid.to_string()).unwrap();
    std::fs::write(dir.join("server.pid"), bystander.id().to_string()).unwrap();
    std::fs::write(dir.join("data/postmaster.pid"), "1\n").unwrap();
    orion_beacon_testkit::sweep_leftovers();
    assert!(!dir.exists());
    assert!(
        bystander.try_wait().unwrap().is_none(),
        "an unrelated process was killed"
    );
    let _ = bystander.kill();
    let _ = bystander.wait();
}

#[test]
fn shared_instances_are_one_per_configuration() {
    let a = Postgres::shared();
    let b = Postgres::shared();
    assert!(std::ptr::eq(a, b));
    let c = Postgres::builder().setting("work_mem", "8MB").shared();
    assert!(!std::ptr::eq(a, c));
    assert_eq!(c.sql("SHOW work_mem").unwrap().trim(), "8MB");
    assert!(Path::new(a.data_dir()).is_dir());
}
