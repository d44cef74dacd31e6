//! The `orion-beacon` command line, run as a real binary against SQLite and PostgreSQL: its
//! output and its exit codes, bad input included.
// The crate's shared test support (private servers, tables, harnesses).
#[path = "../../tests/common/mod.rs"]
mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use orion_beacon::{store::LeaseOutcome, LeaseStore, MembershipStore, SeaOrmLeaseStore};

const BIN: &str = env!("CARGO_BIN_EXE_orion-beacon");
const LONG: Duration = Duration::from_secs(120);

/// Exit codes, as documented.
const BAD_INPUT: i32 = 2;
const UNREACHABLE: i32 = 3;
const MISSING_TABLE: i32 = 4;
const UNKNOWN_RESOURCE: i32 = 5;
const NOTHING_CHANGED: i32 = 6;

#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("DATABASE_URL")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn finish(child: std::process::Child) -> Run {
    let out = child.wait_with_output().expect("wait for orion-beacon");
    Run {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs the binary with `stdin` as its input (none: /dev/null), off the async runtime.
async fn run_with(args: &[&str], stdin: Option<&str>, env: &[(&str, &str)]) -> Run {
    let mut cmd = command(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let stdin = stdin.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        let mut child = cmd.spawn().expect("start orion-beacon");
        if let Some(text) = stdin {
            let mut pipe = child.stdin.take().expect("stdin");
            pipe.write_all(text.as_bytes()).expect("write stdin");
        }
        finish(child)
    })
    .await
    .expect("join")
}

async fn run(args: &[&str]) -> Run {
    run_with(args, None, &[]).await
}

fn assert_code(run: &Run, code: i32) {
    assert_eq!(run.code, code, "{run:#?}");
}

/// A resource's line in `leases`: its cells split on white space.
fn row<'a>(stdout: &'a str, resource: &str) -> Vec<&'a str> {
    stdout
        .lines()
        .find(|l| l.starts_with(&format!("{resource} ")))
        .unwrap_or_else(|| panic!("no row for {resource} in\n{stdout}"))
        .split_whitespace()
        .collect()
}

/// One database with a migrated lease table and membership table, and the arguments that point
/// the CLI at them.
struct Target {
    store: SeaOrmLeaseStore,
    args: Vec<String>,
    /// A membership table other than the default (`--member-table` for `members`).
    member_table: Option<String>,
    /// The run table of scheduled jobs (`--runs-table` for `jobs` when not the default).
    runs_table: String,
    _dir: Option<tempfile::TempDir>,
    cleanup: Option<(sea_orm::DatabaseConnection, String)>,
}

impl Target {
    /// `args` followed by the database (and table) arguments.
    fn with(&self, args: &[&str]) -> Vec<String> {
        args.iter()
            .map(|s| s.to_string())
            .chain(self.args.iter().cloned())
            .collect()
    }

    async fn run(&self, args: &[&str]) -> Run {
        let all = self.with(args);
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        run(&refs).await
    }

    async fn run_with(&self, args: &[&str], stdin: Option<&str>) -> Run {
        let all = self.with(args);
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        run_with(&refs, stdin, &[]).await
    }

    /// `members` with `args`, on this target's membership table.
    async fn members(&self, args: &[&str]) -> Run {
        let mut all = vec!["members"];
        all.extend(args);
        if let Some(table) = &self.member_table {
            all.extend(["--member-table", table]);
        }
        self.run(&all).await
    }

    /// `jobs` with `args`, on this target's run table.
    async fn jobs(&self, args: &[&str]) -> Run {
        let mut all = vec!["jobs"];
        all.extend(args);
        if self.runs_table != orion_beacon::entity::DEFAULT_JOB_RUN_TABLE {
            all.extend(["--runs-table", &self.runs_table]);
        }
        self.run(&all).await
    }

    async fn teardown(self) {
        if let Some((db, table)) = self.cleanup {
            if let Some(members) = &self.member_table {
                drop_member_table(&db, members).await;
            }
            if self.runs_table != orion_beacon::entity::DEFAULT_JOB_RUN_TABLE {
                drop_runs_table(&db, &self.runs_table).await;
            }
            common::drop_table(&db, &table).await;
        }
    }
}

#[cfg(feature = "sqlite")]
async fn sqlite() -> (Target, String) {
    use orion_beacon_migration::{Migrator, MigratorTrait};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let db = common::connect_sqlite(&path, 2).await;
    Migrator::up(&db, None).await.unwrap();
    let url = format!("sqlite://{}", path.display());
    let target = Target {
        store: SeaOrmLeaseStore::new(db),
        args: vec!["--database-url".into(), url.clone()],
        member_table: None,
        runs_table: orion_beacon::entity::DEFAULT_JOB_RUN_TABLE.to_owned(),
        _dir: Some(dir),
        cleanup: None,
    };
    (target, url)
}

/// Creates the membership table `table` with the real migrations (its counts too).
#[cfg(feature = "postgres")]
async fn migrate_member_table(db: &sea_orm::DatabaseConnection, table: &str) {
    use orion_beacon_migration::{
        AddMemberHolding, AddMemberRank, CreateMemberTable, MigrationTrait, SchemaManager,
    };
    CreateMemberTable::with_table(table)
        .expect("valid table name")
        .up(&SchemaManager::new(db))
        .await
        .expect("member migration up");
    AddMemberHolding::with_table(table)
        .expect("valid table name")
        .up(&SchemaManager::new(db))
        .await
        .expect("member counts migration up");
    AddMemberRank::with_table(table)
        .expect("valid table name")
        .up(&SchemaManager::new(db))
        .await
        .expect("member rank migration up");
}

/// Creates the job-run table `table` with the real migration.
#[cfg(feature = "postgres")]
async fn migrate_runs_table(db: &sea_orm::DatabaseConnection, table: &str) {
    use orion_beacon_migration::{
        AddJobRunKey, CreateJobAttemptTable, CreateJobRunTable, MigrationTrait, SchemaManager,
    };
    CreateJobRunTable::with_table(table)
        .expect("valid table name")
        .up(&SchemaManager::new(db))
        .await
        .expect("job-run migration up");
    AddJobRunKey::with_table(table)
        .expect("valid table name")
        .up(&SchemaManager::new(db))
        .await
        .expect("job-run key migration up");
    CreateJobAttemptTable::with_table(table)
        .expect("valid table name")
        .up(&SchemaManager::new(db))
        .await
        .expect("job-attempt migration up");
}

/// Drops the job-run table `table` with the migration's `down`, once its (test) records are
/// gone: `down` refuses a table that records a finished run.
async fn drop_runs_table(db: &sea_orm::DatabaseConnection, table: &str) {
    use orion_beacon_migration::{
        CreateJobAttemptTable, CreateJobRunTable, MigrationTrait, SchemaManager,
    };
    use sea_orm::ConnectionTrait;
    CreateJobAttemptTable::with_table(table)
        .expect("valid table name")
        .down(&SchemaManager::new(db))
        .await
        .expect("job-attempt migration down");
    db.execute_unprepared(&format!("DELETE FROM \"{table}\""))
        .await
        .expect("delete the test runs");
    CreateJobRunTable::with_table(table)
        .expect("valid table name")
        .down(&SchemaManager::new(db))
        .await
        .expect("job-run migration down");
}

/// Drops the membership table `table` with the migration's `down`, once its (test) members
/// are gone: `down` refuses a table in which a node is live.
async fn drop_member_table(db: &sea_orm::DatabaseConnection, table: &str) {
    use orion_beacon_migration::{
        AddMemberHolding, AddMemberRank, CreateMemberTable, MigrationTrait, SchemaManager,
    };
    use sea_orm::ConnectionTrait;
    db.execute_unprepared(&format!("DELETE FROM \"{table}\""))
        .await
        .expect("delete the test members");
    AddMemberRank::with_table(table)
        .expect("valid table name")
        .down(&SchemaManager::new(db))
        .await
        .expect("member rank migration down");
    AddMemberHolding::with_table(table)
        .expect("valid table name")
        .down(&SchemaManager::new(db))
        .await
        .expect("member counts migration down");
    CreateMemberTable::with_table(table)
        .expect("valid table name")
        .down(&SchemaManager::new(db))
        .await
        .expect("member migration down");
}

#[cfg(feature = "postgres")]
async fn postgres() -> Option<Target> {
    let server = common::Server::Postgres;
    if server.skipped() {
        return None;
    }
    let db = server.connect(2).await;
    let table = common::unique("obcli");
    common::migrate(&db, &table).await;
    let members = common::unique("obclim");
    migrate_member_table(&db, &members).await;
    let runs = common::unique("obclir");
    migrate_runs_table(&db, &runs).await;
    Some(Target {
        store: SeaOrmLeaseStore::new(db.clone())
            .with_table(&table)
            .unwrap()
            .with_member_table(&members)
            .unwrap(),
        args: vec![
            "--database-url".into(),
            server.url(),
            "--table".into(),
            table.clone(),
        ],
        member_table: Some(members),
        runs_table: runs,
        _dir: None,
        cleanup: Some((db, table)),
    })
}

// ---- the scenarios, for any target ----

async fn leases_lists_every_resource(t: &Target) {
    let empty = t.run(&["leases"]).await;
    assert_code(&empty, 0);
    assert!(empty.stdout.starts_with("no leases in table"), "{empty:#?}");
    assert_eq!(t.run(&["ls", "--json"]).await.stdout.trim(), "[]");

    t.store
        .acquire_or_renew("report", "node-a", LONG)
        .await
        .unwrap();
    t.store
        .acquire_or_renew("billing", "node-b", LONG)
        .await
        .unwrap();
    t.store
        .acquire_or_renew("cleanup", "node-c", LONG)
        .await
        .unwrap();
    assert!(t.store.release("cleanup", "node-c").await.unwrap());
    t.store
        .acquire_or_renew("cleanup", "node-a", LONG)
        .await
        .unwrap();
    assert!(t.store.release("cleanup", "node-a").await.unwrap());

    let out = t.run(&["leases"]).await;
    assert_code(&out, 0);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [
            "RESOURCE", "HOLDER", "TOKEN", "STATE", "TIME", "LEFT", "ACQUIRED", "(UTC)", "RENEWED",
            "(UTC)"
        ]
    );
    // Ordered by resource.
    assert!(lines[1].starts_with("billing ") && lines[2].starts_with("cleanup "));
    assert!(lines[3].starts_with("report "));
    assert_eq!(
        lines[4],
        "3 leases, 2 live (time left by the database clock)"
    );
    let billing = row(&out.stdout, "billing");
    assert_eq!(&billing[..4], ["billing", "node-b", "1", "live"]);
    let left: f64 = billing[4].trim_end_matches('s').parse().unwrap_or(0.0);
    assert!(billing[4].contains('m') || left > 0.0, "{billing:?}");
    let cleanup = row(&out.stdout, "cleanup");
    assert_eq!(&cleanup[..5], ["cleanup", "node-a", "2", "expired", "-"]);
    // acquired and renewed: a date and a time each.
    assert_eq!(cleanup.len(), 9, "{cleanup:?}");

    // The alias, and JSON for scripts.
    let json = t.run(&["ls", "--json"]).await;
    assert_code(&json, 0);
    let all: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let all = all.as_array().unwrap();
    assert_eq!(all.len(), 3);
    assert_eq!(all[0]["resource"], "billing");
    assert_eq!(all[0]["holder"], "node-b");
    assert_eq!(all[0]["token"], 1);
    assert_eq!(all[0]["live"], true);
    let remaining = all[0]["remaining_ms"].as_u64().unwrap();
    assert!(remaining > 100_000 && remaining <= 120_000, "{remaining}");
    assert_eq!(all[1]["token"], 2);
    assert_eq!(all[1]["live"], false);
    assert_eq!(all[1]["remaining_ms"], 0);
    for key in ["expires_at", "acquired_at", "renewed_at"] {
        let text = all[1][key].as_str().unwrap();
        assert!(
            chrono::DateTime::parse_from_rfc3339(text).is_ok(),
            "{key}: {text}"
        );
    }
}

async fn show_one_and_unknown(t: &Target) {
    t.store
        .acquire_or_renew("shown", "node-a", LONG)
        .await
        .unwrap();
    let out = t.run(&["show", "shown"]).await;
    assert_code(&out, 0);
    for line in [
        "resource     shown",
        "holder       node-a",
        "token        1",
        "state        live",
    ] {
        assert!(out.stdout.contains(line), "{line:?} in {out:#?}");
    }
    assert!(out.stdout.contains("(database clock)"), "{out:#?}");
    let json = t.run(&["show", "shown", "--json"]).await;
    let value: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(value["holder"], "node-a");
    assert_eq!(value["live"], true);

    let unknown = t.run(&["show", "no-such-resource"]).await;
    assert_code(&unknown, UNKNOWN_RESOURCE);
    assert!(
        unknown
            .stderr
            .contains("error: no lease for resource \"no-such-resource\""),
        "{unknown:#?}"
    );
    assert!(unknown.stdout.is_empty());
}

async fn release_is_guarded(t: &Target) {
    t.store
        .acquire_or_renew("released", "node-a", LONG)
        .await
        .unwrap();
    let wrong = t.run(&["release", "released", "--holder", "node-b"]).await;
    assert_code(&wrong, NOTHING_CHANGED);
    assert!(
        wrong
            .stderr
            .contains("nothing released: \"released\" is held by \"node-a\" (token 1"),
        "{wrong:#?}"
    );
    assert!(t.store.current("released").await.unwrap().unwrap().live);

    let ok = t.run(&["release", "released", "--holder", "node-a"]).await;
    assert_code(&ok, 0);
    assert!(
        ok.stdout
            .contains("released \"released\": node-a's lease (token 1) ended")
            && ok.stdout.contains("with token 2"),
        "{ok:#?}"
    );
    assert!(!t.store.current("released").await.unwrap().unwrap().live);

    let again = t.run(&["release", "released", "--holder", "node-a"]).await;
    assert_code(&again, NOTHING_CHANGED);
    assert!(again.stderr.contains("already ended"), "{again:#?}");
    assert_code(
        &t.run(&["release", "nope", "--holder", "node-a"]).await,
        UNKNOWN_RESOURCE,
    );
    let next = t
        .store
        .acquire_or_renew("released", "node-b", LONG)
        .await
        .unwrap();
    assert!(matches!(next, LeaseOutcome::Acquired(ref l) if l.token.get() == 2));
}

async fn revoke_needs_force_and_confirmation(t: &Target) {
    t.store
        .acquire_or_renew("stuck", "node-a", LONG)
        .await
        .unwrap();

    let no_force = t.run(&["revoke", "stuck"]).await;
    assert_code(&no_force, BAD_INPUT);
    assert!(no_force.stderr.contains("pass --force"), "{no_force:#?}");

    // Declined, or no answer at all: nothing changes.
    for answer in [Some("n\n"), Some(""), None] {
        let declined = t.run_with(&["revoke", "stuck", "--force"], answer).await;
        assert_code(&declined, NOTHING_CHANGED);
        assert!(
            declined.stderr.contains("held by \"node-a\" (token 1")
                && declined.stderr.contains("[y/N]")
                && declined.stderr.contains("not revoked"),
            "{declined:#?}"
        );
        assert!(t.store.current("stuck").await.unwrap().unwrap().live);
    }

    let before = t.store.current("stuck").await.unwrap().unwrap();
    let done = t
        .run_with(&["revoke", "stuck", "--force"], Some("y\n"))
        .await;
    assert_code(&done, 0);
    assert!(
        done.stdout
            .contains("revoked \"stuck\": the lease of \"node-a\" (token 1,")
            && done.stdout.contains("takes over with token 2"),
        "{done:#?}"
    );
    // The audit log line, on stderr: what was revoked, from whom.
    assert!(
        done.stderr.contains("lease revoked by an operator")
            && done.stderr.contains("holder=node-a")
            && done.stderr.contains("token=1"),
        "{done:#?}"
    );
    let after = t.store.current("stuck").await.unwrap().unwrap();
    assert!(!after.live);
    assert_eq!(
        (
            &after.holder,
            after.token,
            after.acquired_at,
            after.renewed_at
        ),
        (
            &before.holder,
            before.token,
            before.acquired_at,
            before.renewed_at
        ),
        "only the expiry moved"
    );
    let next = t
        .store
        .acquire_or_renew("stuck", "node-b", LONG)
        .await
        .unwrap();
    assert!(matches!(next, LeaseOutcome::Acquired(ref l) if l.token.get() == 2));

    // --yes skips the prompt; an ended lease has nothing to revoke; unknown resources fail.
    let yes = t.run(&["revoke", "stuck", "--force", "--yes"]).await;
    assert_code(&yes, 0);
    assert!(
        yes.stdout.contains("the lease of \"node-b\" (token 2"),
        "{yes:#?}"
    );
    assert!(!yes.stderr.contains("[y/N]"));
    let ended = t.run(&["revoke", "stuck", "--force", "--yes"]).await;
    assert_code(&ended, 0);
    assert!(ended.stdout.starts_with("nothing to revoke"), "{ended:#?}");
    assert_code(
        &t.run(&["revoke", "nope", "--force", "--yes"]).await,
        UNKNOWN_RESOURCE,
    );
}

async fn watch_prints_each_change(t: &Target) {
    t.store
        .acquire_or_renew("watched", "node-a", LONG)
        .await
        .unwrap();
    let all = t.with(&[
        "watch",
        "watched",
        "--interval",
        "50ms",
        "--max-changes",
        "2",
        "--for",
        "30s",
    ]);
    let child = command(&all.iter().map(String::as_str).collect::<Vec<_>>())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(t.store.release("watched", "node-a").await.unwrap());
    tokio::time::sleep(Duration::from_millis(700)).await;
    t.store
        .acquire_or_renew("watched", "node-b", LONG)
        .await
        .unwrap();
    let out = tokio::task::spawn_blocking(move || finish(child))
        .await
        .unwrap();
    assert_code(&out, 0);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{out:#?}");
    assert!(
        lines[0].contains("watched  holder node-a  token 1  live, ") && lines[0].ends_with("(now)"),
        "{out:#?}"
    );
    assert!(
        lines[1].contains("holder node-a  token 1  expired  (ended)"),
        "{out:#?}"
    );
    assert!(
        lines[2].contains("holder node-b  token 2  live, ") && lines[2].ends_with("(new term)"),
        "{out:#?}"
    );

    // --for ends it; --json prints one object per line.
    let timed = t
        .run(&[
            "watch",
            "watched",
            "--interval",
            "100ms",
            "--for",
            "500ms",
            "--json",
        ])
        .await;
    assert_code(&timed, 0);
    let first: serde_json::Value =
        serde_json::from_str(timed.stdout.lines().next().unwrap()).unwrap();
    assert_eq!(first["change"], "now");
    assert_eq!(first["holder"], "node-b");
    assert_eq!(first["token"], 2);
    assert_eq!(timed.stdout.lines().count(), 1, "{timed:#?}");

    assert_code(
        &t.run(&["watch", "nope", "--for", "1s"]).await,
        UNKNOWN_RESOURCE,
    );
}

async fn missing_table_says_how_to_migrate(t: &Target, url: &str) {
    let table = common::unique("never_migrated");
    for args in [
        vec!["leases", "--table", &table],
        vec!["show", "x", "--table", &table],
        vec!["revoke", "x", "--force", "--yes", "--table", &table],
    ] {
        let mut all = args.clone();
        all.extend(["--database-url", url]);
        let out = run(&all).await;
        assert_code(&out, MISSING_TABLE);
        assert!(
            out.stderr
                .contains(&format!("the lease table \"{table}\" does not exist"))
                && out.stderr.contains(&format!(
                    "add orion_beacon_migration::CreateLeaseTable::with_table(\"{table}\") to your app's Migrator"
                )),
            "{out:#?}"
        );
    }
    let _ = t;
}

/// `leases --by-holder` on a fresh target: one row per holder, live and expired counts, the
/// resources in wide and JSON, holders whose leases all lapsed with 0 live.
async fn leases_by_holder(t: &Target) {
    let empty = t.run(&["leases", "--by-holder"]).await;
    assert_code(&empty, 0);
    assert!(empty.stdout.starts_with("no leases in table"), "{empty:#?}");
    assert_eq!(
        t.run(&["leases", "--by-holder", "--json"])
            .await
            .stdout
            .trim(),
        "[]"
    );

    for (resource, holder) in [
        ("res-c", "node-a"),
        ("res-a", "node-b"),
        ("res-b", "node-a"),
        ("res-d", "node-c"),
        ("res-e", "node-a"),
    ] {
        t.store
            .acquire_or_renew(resource, holder, LONG)
            .await
            .unwrap();
    }
    // node-c's only lease and one of node-a's end: their rows keep the holder, expired.
    assert!(t.store.release("res-d", "node-c").await.unwrap());
    assert!(t.store.release("res-e", "node-a").await.unwrap());

    let out = t.run(&["leases", "--by-holder"]).await;
    assert_code(&out, 0);
    let lines: Vec<Vec<&str>> = out
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines.len(), 5, "{out:#?}");
    assert_eq!(lines[0], ["HOLDER", "LIVE", "EXPIRED"]);
    // Sorted by holder; node-c holds nothing live any more but is shown, with 0.
    assert_eq!(lines[1], ["node-a", "2", "1"]);
    assert_eq!(lines[2], ["node-b", "1", "0"]);
    assert_eq!(lines[3], ["node-c", "0", "1"]);
    assert_eq!(
        out.stdout.lines().nth(4).unwrap(),
        "3 holders, 2 with live leases; 5 leases, 3 live (by the database clock)"
    );
    assert!(out.stdout.lines().all(|l| !l.ends_with(' ')), "{out:#?}");

    let wide = t.run(&["ls", "--by-holder", "-o", "wide"]).await;
    assert_code(&wide, 0);
    let lines: Vec<Vec<&str>> = wide
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        ["HOLDER", "LIVE", "EXPIRED", "RESOURCES", "(LIVE)"]
    );
    assert_eq!(lines[1], ["node-a", "2", "1", "res-b,res-c"]);
    assert_eq!(lines[2], ["node-b", "1", "0", "res-a"]);
    assert_eq!(lines[3], ["node-c", "0", "1", "-"]);

    let bare = t.run(&["leases", "--by-holder", "--no-headers"]).await;
    assert_code(&bare, 0);
    assert_eq!(bare.stdout.lines().count(), 3, "{bare:#?}");
    assert!(bare.stdout.starts_with("node-a "), "{bare:#?}");

    let json = t.run(&["leases", "--by-holder", "--json"]).await;
    assert_code(&json, 0);
    let all: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(
        all,
        serde_json::json!([
            {"holder": "node-a", "live_leases": 2, "expired_leases": 1,
             "resources": ["res-b", "res-c"], "expired_resources": ["res-e"]},
            {"holder": "node-b", "live_leases": 1, "expired_leases": 0,
             "resources": ["res-a"], "expired_resources": []},
            {"holder": "node-c", "live_leases": 0, "expired_leases": 1,
             "resources": [], "expired_resources": ["res-d"]},
        ])
    );
    assert_eq!(
        t.run(&["ls", "--by-holder", "-o", "json"]).await.stdout,
        json.stdout
    );
}

/// A member's row in `members`: its cells split on white space.
fn member_row<'a>(stdout: &'a str, shard_set: &str, member: &str) -> Vec<&'a str> {
    stdout
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.len() > 2 && cells[0] == shard_set && cells[1] == member)
        .unwrap_or_else(|| panic!("no row for {shard_set}/{member} in\n{stdout}"))
}

/// `members`: the live members of every set or of one, in every format; a lapsed member is
/// not shown, one that left neither.
async fn members_lists_live_members(t: &Target) {
    let table = t.store.member_table().to_owned();
    let empty = t.members(&[]).await;
    assert_code(&empty, 0);
    assert_eq!(
        empty.stdout,
        format!("no live members in table {table:?}\n"),
        "{empty:#?}"
    );
    assert_eq!(t.members(&["--json"]).await.stdout.trim(), "[]");
    let none = t.members(&["--shard-set", "orders"]).await;
    assert_code(&none, 0);
    assert_eq!(
        none.stdout,
        format!("no live members of shard set \"orders\" in table {table:?}\n")
    );
    assert_eq!(t.members(&["--no-headers"]).await.stdout, "");

    let ttl = Duration::from_secs(60);
    t.store
        .heartbeat("orders", "node-b", ttl, false)
        .await
        .unwrap();
    t.store
        .heartbeat("orders", "node-a", ttl, true)
        .await
        .unwrap();
    t.store
        .heartbeat("billing", "node-a", ttl, false)
        .await
        .unwrap();
    // Lapsed long before the command reads.
    t.store
        .heartbeat("orders", "gone", Duration::from_millis(1), false)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;

    let out = t.members(&[]).await;
    assert_code(&out, 0);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{out:#?}");
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [
            "SHARD",
            "SET",
            "MEMBER",
            "STATE",
            "TIME",
            "LEFT",
            "JOINED",
            "(UTC)",
            "HEARTBEAT",
            "(UTC)"
        ]
    );
    // Sorted by shard set, then member; the lapsed member is not there.
    assert!(lines[1].starts_with("billing  ") && lines[1].contains(" node-a "));
    assert!(lines[2].starts_with("orders ") && lines[2].contains(" node-a "));
    assert!(lines[3].starts_with("orders ") && lines[3].contains(" node-b "));
    assert!(!out.stdout.contains("gone"), "{out:#?}");
    assert_eq!(
        lines[4],
        "3 live members in 2 shard sets, 1 draining (time left by the database clock)"
    );
    assert!(out.stdout.lines().all(|l| !l.ends_with(' ')), "{out:#?}");
    let a = member_row(&out.stdout, "orders", "node-a");
    assert_eq!(a[2], "draining");
    // Time left, then joined and heartbeat: a date and a time each.
    assert_eq!(a.len(), 8, "{a:?}");
    assert!(a[3].ends_with('s'), "{a:?}");
    assert!(a[4].len() == 10 && a[6].len() == 10, "{a:?}");
    assert_eq!(member_row(&out.stdout, "orders", "node-b")[2], "active");

    // Wide has the same columns; one shard set; no headers.
    let wide = t.members(&["-o", "wide"]).await;
    assert_code(&wide, 0);
    assert_eq!(
        wide.stdout.lines().next(),
        out.stdout.lines().next(),
        "{wide:#?}"
    );
    let orders = t.members(&["--shard-set", "orders"]).await;
    assert_code(&orders, 0);
    let lines: Vec<&str> = orders.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{orders:#?}");
    assert!(lines[1].starts_with("orders ") && lines[2].starts_with("orders "));
    assert_eq!(
        lines[3],
        "2 live members in 1 shard set, 1 draining (time left by the database clock)"
    );
    let bare = t.members(&["--no-headers"]).await;
    assert_eq!(bare.stdout.lines().count(), 3, "{bare:#?}");
    assert!(bare.stdout.starts_with("billing "), "{bare:#?}");

    let json = t.members(&["--json"]).await;
    assert_code(&json, 0);
    let all: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let all = all.as_array().unwrap();
    let ids: Vec<(&str, &str)> = all
        .iter()
        .map(|m| {
            (
                m["shard_set"].as_str().unwrap(),
                m["member"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ids,
        [
            ("billing", "node-a"),
            ("orders", "node-a"),
            ("orders", "node-b")
        ]
    );
    assert_eq!(all[1]["draining"], true);
    assert_eq!(all[2]["draining"], false);
    let remaining = all[2]["remaining_ms"].as_u64().unwrap();
    assert!(remaining > 40_000 && remaining <= 60_000, "{remaining}");
    for key in ["joined_at", "heartbeat_at"] {
        let text = all[2][key].as_str().unwrap();
        assert!(
            chrono::DateTime::parse_from_rfc3339(text).is_ok(),
            "{key}: {text}"
        );
    }
    // `-o json` is `--json` (remaining_ms moves on between the two reads).
    let again: serde_json::Value =
        serde_json::from_str(&t.members(&["-o", "json"]).await.stdout).unwrap();
    let again = again.as_array().unwrap();
    assert_eq!(again.len(), all.len());
    for (a, b) in again.iter().zip(all) {
        for key in [
            "shard_set",
            "member",
            "draining",
            "joined_at",
            "heartbeat_at",
        ] {
            assert_eq!(a[key], b[key], "{key}");
        }
    }
    let one: serde_json::Value = serde_json::from_str(
        &t.members(&["--shard-set", "billing", "--json"])
            .await
            .stdout,
    )
    .unwrap();
    assert_eq!(one.as_array().unwrap().len(), 1);

    // A member that leaves is gone at once.
    assert!(t.store.leave("orders", "node-b").await.unwrap());
    let after = t.members(&["--shard-set", "orders", "--no-headers"]).await;
    assert_eq!(after.stdout.lines().count(), 1, "{after:#?}");
    assert!(!after.stdout.contains("node-b"), "{after:#?}");

    // Bad names are refused before connecting, like the other commands'.
    let bad = t.members(&["--shard-set", " orders"]).await;
    assert_code(&bad, BAD_INPUT);
    assert!(bad.stderr.contains("invalid shard set name"), "{bad:#?}");
    let bad = t.run(&["members", "--member-table", "x;y"]).await;
    assert_code(&bad, BAD_INPUT);
    assert!(bad.stderr.starts_with("error: table name"), "{bad:#?}");

    // A membership table that is not there: the usual exit code, and how to create it.
    let missing = common::unique("never_migrated_members");
    let out = t.run(&["members", "--member-table", &missing]).await;
    assert_code(&out, MISSING_TABLE);
    assert!(
        out.stderr
            .contains(&format!("the membership table \"{missing}\" does not exist"))
            && out.stderr.contains(&format!(
                "add orion_beacon_migration::CreateMemberTable::with_table(\"{missing}\") to your app's Migrator"
            )),
        "{out:#?}"
    );
}

/// `candidates`: a ranked election's live candidates, highest rank first (the smallest id
/// among equals), with the leader marked, in every format; an election without candidates;
/// bad input.
async fn candidates_lists_ranks_and_the_leader(t: &Target) {
    use orion_beacon::{LeaseStore, MembershipStore};
    let resource = common::unique("ranked");
    let candidates = |args: &[&str]| {
        let mut all = vec!["candidates", resource.as_str()];
        all.extend(args);
        if let Some(table) = &t.member_table {
            all.extend(["--member-table", table]);
        }
        all.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let run = |args: Vec<String>| async move {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        t.run(&refs).await
    };
    let empty = run(candidates(&[])).await;
    assert_code(&empty, 0);
    assert!(
        empty
            .stdout
            .starts_with(&format!("no live candidates of {resource:?}")),
        "{empty:#?}"
    );
    let ttl = Duration::from_secs(60);
    for (id, rank) in [("a", 1), ("c", 5), ("b", 5)] {
        t.store
            .candidate_heartbeat(&resource, id, ttl, rank)
            .await
            .unwrap();
    }
    t.store.acquire_or_renew(&resource, "b", ttl).await.unwrap();
    let out = run(candidates(&[])).await;
    assert_code(&out, 0);
    let lines: Vec<Vec<&str>> = out
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        ["CANDIDATE", "RANK", "LEADER", "LIVE", "FOR", "TIME", "LEFT"],
        "{out:#?}"
    );
    assert_eq!(&lines[1][..3], ["b", "5", "yes"], "{out:#?}");
    assert_eq!(&lines[2][..2], ["c", "5"], "{out:#?}");
    assert_eq!(&lines[3][..2], ["a", "1"], "{out:#?}");
    assert!(
        out.stdout
            .contains("3 live candidates, led by b (times by the database clock)"),
        "{out:#?}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&run(candidates(&["--json"])).await.stdout).unwrap();
    let rows = json.as_array().unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0]["candidate"], "b");
    assert_eq!(rows[0]["leader"], true);
    assert_eq!(rows[2]["leader"], false);
    assert_eq!(rows[2]["rank"], 1);
    assert!(rows[0]["remaining_ms"].as_u64().unwrap() > 50_000, "{json}");
    assert!(rows[0]["live_for_ms"].as_u64().is_some(), "{json}");
    // A leader that is no candidate is said so.
    t.store.release(&resource, "b").await.unwrap();
    t.store.acquire_or_renew(&resource, "x", ttl).await.unwrap();
    let out = run(candidates(&["--no-headers"])).await;
    assert!(
        !out.stdout.contains("yes") && !out.stdout.contains("live candidates"),
        "{out:#?}"
    );
    let out = run(candidates(&[])).await;
    assert!(
        out.stdout
            .contains("led by x, which is not a live candidate"),
        "{out:#?}"
    );
    for id in ["a", "b", "c"] {
        t.store.candidate_leave(&resource, id).await.unwrap();
    }
    t.store.release(&resource, "x").await.unwrap();
    let bad = t.run(&["candidates", " x"]).await;
    assert_code(&bad, BAD_INPUT);
}

/// One run record, as a scheduler would have written it: `(candidate, token)` that claimed
/// it, `(token, duration ms)` that ended it.
struct Record<'a> {
    job: &'a str,
    slot: i64,
    state: &'a str,
    attempts: i32,
    schedule: &'a str,
    claimed: (&'a str, i64),
    ended: Option<(i64, i64)>,
    error: Option<&'a str>,
}

async fn insert_run(t: &Target, r: Record<'_>) {
    use orion_beacon::entity::job_run::Column;
    use sea_orm::sea_query::{Alias, Query};
    use sea_orm::ConnectionTrait;
    let now = chrono::Utc::now();
    let insert = Query::insert()
        .into_table(Alias::new(&t.runs_table))
        .columns([
            Column::Job,
            Column::Slot,
            Column::State,
            Column::Attempts,
            Column::Schedule,
            Column::ClaimedBy,
            Column::ClaimedToken,
            Column::ClaimedAt,
            Column::FinishedToken,
            Column::FinishedAt,
            Column::DurationMs,
            Column::Error,
        ])
        .values_panic([
            r.job.into(),
            r.slot.into(),
            r.state.into(),
            r.attempts.into(),
            r.schedule.into(),
            r.claimed.0.into(),
            r.claimed.1.into(),
            now.into(),
            r.ended.map(|e| e.0).into(),
            r.ended.map(|_| now).into(),
            r.ended.map(|e| e.1).into(),
            r.error.into(),
        ])
        .to_owned();
    t.store.connection().execute(&insert).await.unwrap();
}

/// The `state` of a record, read directly.
async fn run_state(t: &Target, job: &str, slot: i64) -> String {
    use orion_beacon::entity::job_run::Column;
    use sea_orm::sea_query::{Alias, Expr, ExprTrait, Query};
    use sea_orm::ConnectionTrait;
    let select = Query::select()
        .column(Column::State)
        .from(Alias::new(&t.runs_table))
        .and_where(Expr::col(Column::Job).eq(job))
        .and_where(Expr::col(Column::Slot).eq(slot))
        .to_owned();
    let row = t.store.connection().query_one(&select).await.unwrap();
    row.expect("the record").try_get_by_index(0).unwrap()
}

/// `jobs` on a fresh run table: each job's latest slot and next slot, one job's records, the
/// operator's marks, and the errors of each.
async fn jobs_list_runs_and_marks(t: &Target) {
    let empty = t.jobs(&[]).await;
    assert_code(&empty, 0);
    assert_eq!(
        empty.stdout,
        format!("no job runs in table {:?}\n", t.runs_table),
        "{empty:#?}"
    );
    assert_eq!(t.jobs(&["--json"]).await.stdout.trim(), "[]");

    // On a one-minute grid, ten minutes back: two slots of "report", one of "cleanup".
    let minute = 60_000;
    let now_ms = chrono::Utc::now().timestamp_millis();
    let first = (now_ms / minute - 10) * minute;
    let second = first + minute;
    let every = "every 60000ms";
    let (report, cleanup) = ("report", "cleanup");
    for r in [
        Record {
            job: report,
            slot: first,
            state: "finished",
            attempts: 1,
            schedule: every,
            claimed: ("node-a", 3),
            ended: Some((3, 1234)),
            error: None,
        },
        Record {
            job: report,
            slot: second,
            state: "failed",
            attempts: 2,
            schedule: every,
            claimed: ("node-b", 4),
            ended: Some((4, 20)),
            error: Some("boom\nat line 2"),
        },
        Record {
            job: cleanup,
            slot: first,
            state: "running",
            attempts: 1,
            schedule: "cron 0 2 * * * UTC",
            claimed: ("node-c", 5),
            ended: None,
            error: None,
        },
    ] {
        insert_run(t, r).await;
    }
    let time_of = |ms: i64| chrono::DateTime::from_timestamp_millis(ms).unwrap();

    let out = t.jobs(&[]).await;
    assert_code(&out, 0);
    let lines: Vec<Vec<&str>> = out
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines.len(), 4, "{out:#?}");
    assert_eq!(
        lines[0],
        [
            "JOB", "LAST", "SLOT", "(UTC)", "STATE", "ATTEMPTS", "DURATION", "RUN", "BY", "TOKEN",
            "NEXT", "SLOT", "(UTC)"
        ]
    );
    // Sorted by job; the slot and the next slot are a date and a time each.
    let slot_text = time_of(second).format("%Y-%m-%d %H:%M:%S%.3f").to_string();
    let (date, clock) = slot_text.split_once(' ').unwrap();
    assert_eq!(
        &lines[2][..8],
        [report, date, clock, "failed", "2", "0.020s", "node-b", "4"],
        "{out:#?}"
    );
    assert_eq!(lines[2].len(), 10, "{out:#?}");
    assert_eq!(lines[1][0], cleanup, "{out:#?}");
    assert_eq!(
        &lines[1][3..8],
        ["running", "1", "-", "node-c", "5"],
        "{out:#?}"
    );
    assert!(
        out.stdout
            .lines()
            .nth(3)
            .unwrap()
            .starts_with("2 jobs (next slots by the database clock, now "),
        "{out:#?}"
    );
    assert!(out.stdout.lines().all(|l| !l.ends_with(' ')), "{out:#?}");
    // `list` (and `ls`) is the default.
    for list in [&["list"][..], &["ls"]] {
        let again = t.jobs(list).await;
        assert_code(&again, 0);
        assert_eq!(
            again.stdout.lines().take(3).collect::<Vec<_>>(),
            out.stdout.lines().take(3).collect::<Vec<_>>()
        );
    }
    let wide = t.jobs(&["-o", "wide"]).await;
    assert_code(&wide, 0);
    assert!(
        wide.stdout.lines().next().unwrap().ends_with("ERROR")
            && wide.stdout.contains("boom\\nat line 2")
            && wide.stdout.contains(every),
        "{wide:#?}"
    );
    let bare = t.jobs(&["--no-headers"]).await;
    assert_eq!(bare.stdout.lines().count(), 2, "{bare:#?}");

    // JSON: the latest record of each job and its next slot, by the database clock.
    let json = t.jobs(&["--json"]).await;
    assert_code(&json, 0);
    let all: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let all = all.as_array().unwrap();
    assert_eq!(all.len(), 2);
    let (c, r) = (&all[0], &all[1]);
    assert_eq!(r["job"], report);
    assert_eq!(r["slot_ms"], second);
    assert_eq!(
        chrono::DateTime::parse_from_rfc3339(r["slot"].as_str().unwrap())
            .unwrap()
            .timestamp_millis(),
        second
    );
    assert_eq!(r["state"], "failed");
    assert_eq!(r["attempts"], 2);
    assert_eq!(r["claimed_by"], "node-b");
    assert_eq!(r["claimed_token"], 4);
    assert_eq!(r["finished_token"], 4);
    assert_eq!(r["duration_ms"], 20);
    assert_eq!(r["error"], "boom\nat line 2");
    let next = r["next_slot_ms"].as_i64().unwrap();
    let now_ms = chrono::Utc::now().timestamp_millis();
    assert!(
        next % minute == 0 && next > now_ms - 10_000 && next <= now_ms + minute,
        "{next} against {now_ms}"
    );
    assert_eq!(c["job"], cleanup);
    assert_eq!(c["state"], "running");
    assert!(
        c["finished_at"].is_null() && c["duration_ms"].is_null(),
        "{c}"
    );
    // 02:00 UTC, the next one.
    let next = c["next_slot_ms"].as_i64().unwrap();
    assert_eq!(next % 86_400_000, 2 * 3_600_000, "{c}");
    assert!(next > now_ms - 10_000 && next <= now_ms + 86_400_000, "{c}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&t.jobs(&["list", "-o", "json"]).await.stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // `check`: "report" finished a slot just now; "cleanup" never did, its first claim is
    // just now too.
    let check = t.jobs(&["check", "--stale-after", "1h"]).await;
    assert_code(&check, 0);
    let lines: Vec<Vec<&str>> = check
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines.len(), 4, "{check:#?}");
    assert_eq!(
        (lines[1][0], lines[1][1], *lines[1].last().unwrap()),
        (cleanup, "-", "ok"),
        "{check:#?}"
    );
    assert_eq!(
        (lines[2][0], *lines[2].last().unwrap()),
        (report, "ok"),
        "{check:#?}"
    );
    assert!(
        check
            .stdout
            .lines()
            .nth(3)
            .unwrap()
            .starts_with("0 of 2 jobs stale"),
        "{check:#?}"
    );
    let json = t
        .jobs(&["check", report, "--stale-after", "1h", "--json"])
        .await;
    let json: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(json.as_array().map(Vec::len), Some(1), "{json}");
    assert_eq!(
        (json[0]["job"].as_str(), json[0]["stale"].as_bool()),
        (Some(report), Some(false))
    );
    // Older than a limit of one second, once a second has passed: both.
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    let check = t.jobs(&["check", "--stale-after", "1s"]).await;
    assert_code(&check, 7);
    assert!(
        check.stderr.contains(&format!(
            "stale: no slot finished within 1.000s for {cleanup}, {report}"
        )),
        "{check:#?}"
    );
    assert_code(&t.jobs(&["check", report, "--stale-after", "1s"]).await, 7);
    assert_code(
        &t.jobs(&["check", "nosuch", "--stale-after", "1h"]).await,
        5,
    );
    assert_code(&t.jobs(&["check"]).await, 2);
    assert_code(&t.jobs(&["check", "--stale-after", "0s"]).await, 2);

    // One job's records, newest first.
    let runs = t.jobs(&["runs", report]).await;
    assert_code(&runs, 0);
    let lines: Vec<&str> = runs.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{runs:#?}");
    assert!(lines[0].starts_with("SLOT (UTC) "), "{runs:#?}");
    assert!(lines[1].starts_with(&slot_text) && lines[1].contains(" failed "));
    assert!(lines[2].contains(" finished ") && lines[2].contains(" 1.234s "));
    assert_eq!(lines[3], "2 run records of job \"report\", newest first");
    // The failed slot's first attempt, kept in the attempt history: shown under its latest.
    {
        use orion_beacon::entity::job_attempt::Column as K;
        use sea_orm::sea_query::{Alias, Query};
        use sea_orm::ConnectionTrait;
        let kept = Query::insert()
            .into_table(Alias::new(orion_beacon::entity::job_attempt_table(
                &t.runs_table,
            )))
            .columns([
                K::Job,
                K::Slot,
                K::Attempt,
                K::State,
                K::ClaimedBy,
                K::ClaimedToken,
                K::FinishedToken,
                K::FinishedAt,
                K::DurationMs,
                K::Error,
                K::RecordedAt,
            ])
            .values_panic([
                report.into(),
                second.into(),
                1.into(),
                "failed".into(),
                "node-a".into(),
                3i64.into(),
                3i64.into(),
                chrono::Utc::now().into(),
                7i64.into(),
                "first try".into(),
                chrono::Utc::now().into(),
            ])
            .to_owned();
        t.store.connection().execute(&kept).await.unwrap();
    }
    let runs = t.jobs(&["runs", report]).await;
    assert_code(&runs, 0);
    let lines: Vec<&str> = runs.stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{runs:#?}");
    assert!(lines[0].contains(" ATTEMPT "), "{runs:#?}");
    let attempt = |l: &str| l.split_whitespace().nth(3).map(str::to_owned);
    assert!(lines[1].starts_with(&slot_text) && lines[1].contains(" failed "));
    assert_eq!(attempt(lines[1]).as_deref(), Some("2"), "{runs:#?}");
    assert!(
        lines[2].starts_with(&slot_text)
            && lines[2].contains(" failed ")
            && lines[2].contains(" node-a "),
        "{runs:#?}"
    );
    assert_eq!(attempt(lines[2]).as_deref(), Some("1"), "{runs:#?}");
    assert!(lines[3].contains(" finished "), "{runs:#?}");
    assert_eq!(
        lines[4],
        "2 run records of job \"report\", newest first, with 1 earlier attempt"
    );
    let json = t.jobs(&["runs", report, "--json"]).await;
    let json: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let earlier = &json[0]["earlier_attempts"];
    assert_eq!(earlier.as_array().map(Vec::len), Some(1), "{json}");
    assert_eq!(
        (
            earlier[0]["attempt"].as_i64(),
            earlier[0]["outcome"].as_str(),
            earlier[0]["error"].as_str()
        ),
        (Some(1), Some("failed"), Some("first try")),
        "{json}"
    );
    assert_eq!(
        json[1]["earlier_attempts"].as_array().map(Vec::len),
        Some(0)
    );
    let one = t.jobs(&["runs", report, "--limit", "1", "--json"]).await;
    assert_code(&one, 0);
    let one: serde_json::Value = serde_json::from_str(&one.stdout).unwrap();
    assert_eq!(one.as_array().unwrap().len(), 1);
    assert_eq!(one[0]["slot_ms"], second);
    assert_code(&t.jobs(&["runs", report, "--limit", "0"]).await, BAD_INPUT);
    let unknown = t.jobs(&["runs", "nope"]).await;
    assert_code(&unknown, UNKNOWN_RESOURCE);
    assert!(
        unknown.stderr.contains("no runs of job \"nope\""),
        "{unknown:#?}"
    );
    let typo = t.jobs(&["runs", "reprot"]).await;
    assert_code(&typo, UNKNOWN_RESOURCE);
    assert!(
        typo.stderr.contains("did you mean \"report\"?"),
        "{typo:#?}"
    );

    // rerun: a failed slot runs again; marking it twice changes nothing.
    let second_ms = second.to_string();
    let rerun = t.jobs(&["rerun", report, &second_ms]).await;
    assert_code(&rerun, 0);
    assert!(
        rerun.stdout.starts_with(&format!(
            "marked \"report\" slot {slot_text} UTC ({second}) to run again: it was failed"
        )),
        "{rerun:#?}"
    );
    assert_eq!(run_state(t, report, second).await, "rerun");
    let again = t.jobs(&["rerun", report, &second_ms]).await;
    assert_code(&again, 0);
    assert!(again.stdout.starts_with("no record changed"), "{again:#?}");
    // give-up: refused for a finished slot (slot as RFC 3339), done for the rerun mark (slot as
    // the tables print it).
    let finished = t
        .jobs(&["give-up", report, &time_of(first).to_rfc3339()])
        .await;
    assert_code(&finished, NOTHING_CHANGED);
    assert!(
        finished.stderr.contains("nothing changed") && finished.stderr.contains("it finished"),
        "{finished:#?}"
    );
    assert_eq!(run_state(t, report, first).await, "finished");
    let gave_up = t.jobs(&["give-up", report, &slot_text]).await;
    assert_code(&gave_up, 0);
    assert!(
        gave_up.stdout.starts_with("gave up \"report\" slot"),
        "{gave_up:#?}"
    );
    assert_eq!(run_state(t, report, second).await, "given_up");
    // A running slot: no rerun, but it can be given up.
    let first_ms = first.to_string();
    let running = t.jobs(&["rerun", cleanup, &first_ms]).await;
    assert_code(&running, NOTHING_CHANGED);
    assert!(running.stderr.contains("it is running"), "{running:#?}");
    assert_eq!(run_state(t, cleanup, first).await, "running");
    assert_code(&t.jobs(&["give-up", cleanup, &first_ms]).await, 0);
    assert_eq!(run_state(t, cleanup, first).await, "given_up");
    // ... and a given-up slot can run again.
    assert_code(&t.jobs(&["rerun", report, &second_ms]).await, 0);
    assert_eq!(run_state(t, report, second).await, "rerun");

    // No record for the slot; no job of that name; a slot that does not read as one; a bad
    // job name.
    let no_slot = t.jobs(&["rerun", report, "1000"]).await;
    assert_code(&no_slot, UNKNOWN_RESOURCE);
    assert!(
        no_slot.stderr.contains("no run record for \"report\" slot"),
        "{no_slot:#?}"
    );
    let no_job = t.jobs(&["give-up", "nope", &first_ms]).await;
    assert_code(&no_job, UNKNOWN_RESOURCE);
    assert!(
        no_job.stderr.contains("no runs of job \"nope\""),
        "{no_job:#?}"
    );
    for bad in ["yesterday", "2026-13-01T00:00:00Z", "12.5"] {
        let out = t.jobs(&["rerun", report, bad]).await;
        assert_code(&out, BAD_INPUT);
        assert!(out.stderr.contains("is not a slot"), "{out:#?}");
    }
    let out = t.jobs(&["give-up", " report", &first_ms]).await;
    assert_code(&out, BAD_INPUT);
    assert!(out.stderr.contains("invalid job name"), "{out:#?}");

    // The run table: a bad name is refused before connecting, a missing one says how to make it.
    let out = t.run(&["jobs", "--runs-table", "x;y"]).await;
    assert_code(&out, BAD_INPUT);
    assert!(out.stderr.starts_with("error: table name"), "{out:#?}");
    let missing = common::unique("never_migrated_runs");
    for args in [
        vec!["jobs", "--runs-table", &missing],
        vec!["jobs", "runs", report, "--runs-table", &missing],
        vec!["jobs", "rerun", report, &first_ms, "--runs-table", &missing],
    ] {
        let out = t.run(&args).await;
        assert_code(&out, MISSING_TABLE);
        assert!(
            out.stderr
                .contains(&format!("the job-run table \"{missing}\" does not exist"))
                && out.stderr.contains(&format!(
                    "add orion_beacon_migration::CreateJobRunTable::with_table(\"{missing}\") to your app's Migrator"
                )),
            "{out:#?}"
        );
    }

    // A scheduler's lease (its leader's payload names its job set): `jobs` shows who leads
    // with which jobs, and `show` on a job's name points at that lease.
    use orion_beacon::LeaseStore;
    let scheduler = common::unique("sched");
    let set = format!(
        "{}0123456789abcdef (2 jobs) [\"{cleanup}\",\"{report}\"]",
        orion_beacon::jobs::JOB_SET_PREFIX
    );
    t.store
        .acquire_or_renew_with(
            &scheduler,
            "node-a",
            std::time::Duration::from_secs(60),
            Some(&set),
        )
        .await
        .unwrap();
    let out = t.jobs(&[]).await;
    assert_code(&out, 0);
    assert!(
        out.stdout.contains(&format!(
            "scheduler lease {scheduler:?}: led by node-a (token 1, "
        )) && out.stdout.contains("; 2 jobs: cleanup, report\n"),
        "{out:#?}"
    );
    let show = t.run(&["show", report]).await;
    assert_code(&show, UNKNOWN_RESOURCE);
    assert!(
        show.stderr.contains(&format!(
            "\"report\" is a scheduled job, not a lease: its scheduler's lease is {scheduler:?}"
        )),
        "{show:#?}"
    );
    t.store.release(&scheduler, "node-a").await.unwrap();

    // A keyed job's record: shown under its key, newest first, the key in the JSON.
    insert_run(
        t,
        Record {
            job: "backfill",
            slot: orion_beacon::jobs::key_slot("tenant-42"),
            state: "queued",
            attempts: 0,
            schedule: "keyed",
            claimed: ("", 0),
            ended: None,
            error: None,
        },
    )
    .await;
    let db = t.store.connection();
    use sea_orm::ConnectionTrait;
    let set_key = format!(
        "UPDATE {} SET run_key = 'tenant-42' WHERE job = 'backfill'",
        t.runs_table
    );
    db.execute_unprepared(&set_key).await.unwrap();
    let keyed = t.jobs(&["runs", "backfill"]).await;
    assert_code(&keyed, 0);
    assert!(
        keyed
            .stdout
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("key tenant-42 ") && l.contains(" queued ")),
        "{keyed:#?}"
    );
    let json = t.jobs(&["runs", "backfill", "--json"]).await;
    let json: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(json[0]["key"], "tenant-42", "{json}");
    assert_eq!(json[0]["slot"], serde_json::Value::Null, "{json}");
    let list = t.jobs(&[]).await;
    assert!(
        list.stdout
            .lines()
            .any(|l| l.starts_with("backfill ") && l.contains(" key tenant-42 ")),
        "{list:#?}"
    );
    // Marked by its key.
    let gave_up = t.jobs(&["give-up", "backfill", "--key", "tenant-42"]).await;
    assert_code(&gave_up, 0);
    assert!(
        gave_up
            .stdout
            .starts_with("gave up \"backfill\" key \"tenant-42\": it was queued"),
        "{gave_up:#?}"
    );
    assert_eq!(
        run_state(t, "backfill", orion_beacon::jobs::key_slot("tenant-42")).await,
        "given_up"
    );
    assert_code(&t.jobs(&["rerun", "backfill"]).await, BAD_INPUT);
    assert_code(
        &t.jobs(&["rerun", "backfill", "--key", "nope"]).await,
        UNKNOWN_RESOURCE,
    );
    assert_code(
        &t.jobs(&["rerun", "backfill", "--key", ""]).await,
        BAD_INPUT,
    );
    assert_code(
        &t.jobs(&["rerun", "backfill", "5000", "--key", "tenant-42"])
            .await,
        BAD_INPUT,
    );
    // A run table from before the key column (`AddJobRunKey` not run, or undone): read as it
    // is, its records without keys.
    let drop_keyed = format!("DELETE FROM {} WHERE job = 'backfill'", t.runs_table);
    db.execute_unprepared(&drop_keyed).await.unwrap();
    use orion_beacon_migration::{AddJobRunKey, MigrationTrait, SchemaManager};
    let step = AddJobRunKey::with_table(&t.runs_table).unwrap();
    step.down(&SchemaManager::new(db)).await.unwrap();
    let old = t.jobs(&["runs", report]).await;
    assert_code(&old, 0);
    assert_eq!(
        old.stdout.lines().last(),
        Some("2 run records of job \"report\", newest first, with 1 earlier attempt"),
        "{old:#?}"
    );
    assert_code(&t.jobs(&[]).await, 0);
    // And without the attempt history (its step not run): the latest attempts, and why.
    let history = orion_beacon_migration::CreateJobAttemptTable::with_table(&t.runs_table).unwrap();
    history.down(&SchemaManager::new(db)).await.unwrap();
    let older = t.jobs(&["runs", report]).await;
    assert_code(&older, 0);
    assert_eq!(older.stdout.lines().count(), 4, "{older:#?}");
    assert_eq!(
        older.stdout.lines().last().map(str::to_owned),
        Some(format!(
            "2 run records of job \"report\", newest first; earlier attempts are not kept: {} \
             is missing (CreateJobAttemptTable)",
            orion_beacon::entity::job_attempt_table(&t.runs_table)
        )),
        "{older:#?}"
    );
    history.up(&SchemaManager::new(db)).await.unwrap();
    step.up(&SchemaManager::new(db)).await.unwrap();
}

// ---- SQLite ----

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn leases_show_release_revoke_watch() {
        let (t, url) = sqlite().await;
        leases_lists_every_resource(&t).await;
        show_one_and_unknown(&t).await;
        release_is_guarded(&t).await;
        revoke_needs_force_and_confirmation(&t).await;
        watch_prints_each_change(&t).await;
        missing_table_says_how_to_migrate(&t, &url).await;
        t.teardown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn leases_by_holder_and_members() {
        let (t, _url) = sqlite().await;
        leases_by_holder(&t).await;
        members_lists_live_members(&t).await;
        candidates_lists_ranks_and_the_leader(&t).await;
        t.teardown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_list_runs_and_marks() {
        let (t, _url) = sqlite().await;
        super::jobs_list_runs_and_marks(&t).await;
        t.teardown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn database_url_from_the_environment() {
        let (t, url) = sqlite().await;
        t.store
            .acquire_or_renew("env", "node-a", LONG)
            .await
            .unwrap();
        let out = run_with(&["ls"], None, &[("DATABASE_URL", &url)]).await;
        assert_code(&out, 0);
        assert_eq!(
            &row(&out.stdout, "env")[..4],
            ["env", "node-a", "1", "live"]
        );
    }

    /// A lease's payload: the last column of `ls -o wide` (control characters escaped, `-`
    /// for none), a line of `show`, a field of the JSON.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn payloads_are_shown() {
        let (t, _url) = sqlite().await;
        t.store
            .acquire_or_renew_with("api", "node-a", LONG, Some("http://10.0.0.7:8080\n"))
            .await
            .unwrap();
        t.store
            .acquire_or_renew("plain", "node-b", LONG)
            .await
            .unwrap();
        let wide = t.run(&["leases", "-o", "wide"]).await;
        assert_code(&wide, 0);
        let header = wide.stdout.lines().next().unwrap();
        assert!(header.trim_end().ends_with("PAYLOAD"), "{wide:#?}");
        assert_eq!(
            row(&wide.stdout, "api").last(),
            Some(&"http://10.0.0.7:8080\\n"),
            "{wide:#?}"
        );
        assert_eq!(row(&wide.stdout, "plain").last(), Some(&"-"), "{wide:#?}");
        let table = t.run(&["leases"]).await;
        assert!(!table.stdout.contains("PAYLOAD"), "{table:#?}");
        let show = t.run(&["show", "api"]).await;
        assert_code(&show, 0);
        assert!(
            show.stdout
                .contains("payload      http://10.0.0.7:8080\\n\n"),
            "{show:#?}"
        );
        let json = t.run(&["show", "api", "-o", "json"]).await;
        let json: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
        assert_eq!(json["payload"], "http://10.0.0.7:8080\n");
        let plain = t.run(&["show", "plain", "-o", "json"]).await;
        let plain: serde_json::Value = serde_json::from_str(&plain.stdout).unwrap();
        assert!(plain["payload"].is_null(), "{plain}");
        t.teardown().await;
    }

    /// `-o table|wide|json` (`--json` kept), `--no-headers`, wide characters aligned, "did you
    /// mean" for a typo, shell completions, Ctrl-C on `watch` exits 130.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn output_formats_and_command_line_habits() {
        let (t, _url) = sqlite().await;
        for (r, who) in [("nightly-report", "node-a"), ("日本-shard", "ノード")] {
            t.store.acquire_or_renew(r, who, LONG).await.unwrap();
        }
        let table = t.run(&["leases"]).await;
        let wide = t.run(&["leases", "-o", "wide"]).await;
        assert_code(&wide, 0);
        let header = wide.stdout.lines().next().unwrap();
        assert!(header.contains("EXPIRES (UTC)"), "{wide:#?}");
        assert!(!table.stdout.contains("EXPIRES"), "{table:#?}");
        // Columns line up in terminal columns: the token column ends at the same place.
        let ends: Vec<usize> = table
            .stdout
            .lines()
            .take(3)
            .map(|line| {
                let token_end = line.find(" live").or_else(|| line.find(" STATE")).unwrap();
                line[..token_end]
                    .chars()
                    .map(|c| if c.is_ascii() { 1 } else { 2 })
                    .sum()
            })
            .collect();
        assert!(
            ends.windows(2).all(|w| w[0] == w[1]),
            "{ends:?}\n{}",
            table.stdout
        );
        assert!(
            table.stdout.lines().all(|l| !l.ends_with(' ')),
            "trailing spaces"
        );
        let bare = t.run(&["leases", "--no-headers"]).await;
        assert_eq!(bare.stdout.lines().count(), 2, "{bare:#?}");
        assert!(bare.stdout.starts_with("nightly-report "), "{bare:#?}");
        let names = |text: &str| -> Vec<String> {
            let all: serde_json::Value = serde_json::from_str(text).unwrap();
            let all = all.as_array().unwrap().iter();
            all.map(|r| r["resource"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(
            names(&t.run(&["ls", "-o", "json"]).await.stdout),
            names(&t.run(&["ls", "--json"]).await.stdout)
        );
        assert_code(&t.run(&["ls", "--json", "-o", "wide"]).await, BAD_INPUT);

        let typo = t.run(&["show", "nightly-reprot"]).await;
        assert_code(&typo, UNKNOWN_RESOURCE);
        assert!(
            typo.stderr.contains("did you mean \"nightly-report\"?"),
            "{typo:#?}"
        );
        let far = t.run(&["show", "billing"]).await;
        assert!(!far.stderr.contains("did you mean"), "{far:#?}");

        let completions = run(&["completions", "bash"]).await;
        assert_code(&completions, 0);
        assert!(
            completions.stdout.contains("orion-beacon"),
            "{completions:#?}"
        );

        // Ctrl-C on watch: exit 130, like any program stopped by SIGINT in a shell.
        let all = t.with(&["watch", "nightly-report", "--interval", "100ms"]);
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        let child = command(&refs).spawn().unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        )
        .unwrap();
        let out = tokio::task::spawn_blocking(move || finish(child))
            .await
            .unwrap();
        assert_code(&out, 130);
        assert!(out.stdout.contains("holder node-a"), "{out:#?}");
        t.teardown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bad_input_and_unreachable_databases() {
        let (_t, url) = sqlite().await;
        let dir = tempfile::tempdir().unwrap();

        // A file that is not there: unreachable, and not created behind the operator's back.
        let missing = dir.path().join("typo.db");
        let out = run(&[
            "leases",
            "--database-url",
            &format!("sqlite://{}", missing.display()),
        ])
        .await;
        assert_code(&out, UNREACHABLE);
        assert!(
            out.stderr.contains("no SQLite database file at"),
            "{out:#?}"
        );
        assert!(!missing.exists());

        // An empty database: the table is missing.
        let empty = dir.path().join("empty.db");
        std::fs::File::create(&empty).unwrap();
        let out = run(&[
            "leases",
            "--database-url",
            &format!("sqlite://{}", empty.display()),
        ])
        .await;
        assert_code(&out, MISSING_TABLE);
        assert!(
            out.stderr.contains("\"orionbeacon_leases\" does not exist"),
            "{out:#?}"
        );
        // The default membership table, missing too: the migration's command line creates it.
        let out = run(&[
            "members",
            "--database-url",
            &format!("sqlite://{}", empty.display()),
        ])
        .await;
        assert_code(&out, MISSING_TABLE);
        assert!(
            out.stderr
                .contains("the membership table \"orionbeacon_members\" does not exist")
                && out
                    .stderr
                    .contains("orion-beacon-migration up -u sqlite://")
                && out.stderr.contains("CreateMemberTable::new()"),
            "{out:#?}"
        );
        // And the default job-run table.
        let out = run(&[
            "jobs",
            "--database-url",
            &format!("sqlite://{}", empty.display()),
        ])
        .await;
        assert_code(&out, MISSING_TABLE);
        assert!(
            out.stderr
                .contains("the job-run table \"orionbeacon_job_runs\" does not exist")
                && out
                    .stderr
                    .contains("orion-beacon-migration up -u sqlite://")
                && out.stderr.contains("CreateJobRunTable::new()"),
            "{out:#?}"
        );

        // Bad table names, checked before connecting.
        for bad in ["x; DROP TABLE y", "1x", "a\"b", ""] {
            let out = run(&["leases", "--database-url", &url, "--table", bad]).await;
            assert_code(&out, BAD_INPUT);
            assert!(out.stderr.starts_with("error: table name"), "{out:#?}");
        }
        // Bad resource and holder names.
        let out = run(&["show", " padded", "--database-url", &url]).await;
        assert_code(&out, BAD_INPUT);
        assert!(out.stderr.contains("invalid resource name"), "{out:#?}");
        let out = run(&["release", "r", "--holder", "", "--database-url", &url]).await;
        assert_code(&out, BAD_INPUT);
        assert!(out.stderr.contains("invalid candidate id"), "{out:#?}");
        // No database; an unknown scheme; usage errors (clap's, also 2).
        let out = run(&["leases"]).await;
        assert_code(&out, BAD_INPUT);
        assert!(
            out.stderr
                .contains("pass --database-url URL or set DATABASE_URL"),
            "{out:#?}"
        );
        let out = run(&["leases", "--database-url", "redis://localhost"]).await;
        assert_code(&out, BAD_INPUT);
        assert!(out.stderr.contains("unsupported database URL"), "{out:#?}");
        assert_code(&run(&["frobnicate"]).await, BAD_INPUT);
        // A URL in the wrong place: clap's message quotes it, without the password.
        let out = run(&["leases", "postgres://app:hunter2@db/app"]).await;
        assert_code(&out, BAD_INPUT);
        assert!(
            !out.stderr.contains("hunter2") && out.stderr.contains("postgres://app:***@db/app"),
            "{out:#?}"
        );
        let out = run(&[
            "leases",
            "--database-url",
            "Server=db;User Id=sa;Password=S3cret;",
        ])
        .await;
        assert_code(&out, BAD_INPUT);
        assert!(!out.stderr.contains("S3cret"), "{out:#?}");
        assert_code(
            &run(&[
                "watch",
                "r",
                "--interval",
                "5parsecs",
                "--database-url",
                &url,
            ])
            .await,
            BAD_INPUT,
        );
        assert_code(
            &run(&["watch", "r", "--interval", "0s", "--database-url", &url]).await,
            BAD_INPUT,
        );
        let help = run(&["--help"]).await;
        assert_code(&help, 0);
        assert!(help.stdout.contains("leases") && help.stdout.contains("revoke"));
        assert!(help.stdout.contains("members"), "{help:#?}");
        assert!(help.stdout.contains("jobs"), "{help:#?}");
    }
}

// ---- PostgreSQL ----

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn leases_show_release_revoke_watch() {
        let Some(t) = postgres().await else {
            return;
        };
        let url = common::Server::Postgres.url();
        leases_lists_every_resource(&t).await;
        show_one_and_unknown(&t).await;
        release_is_guarded(&t).await;
        revoke_needs_force_and_confirmation(&t).await;
        watch_prints_each_change(&t).await;
        missing_table_says_how_to_migrate(&t, &url).await;
        t.teardown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn leases_by_holder_and_members() {
        let Some(t) = postgres().await else {
            return;
        };
        leases_by_holder(&t).await;
        members_lists_live_members(&t).await;
        candidates_lists_ranks_and_the_leader(&t).await;
        t.teardown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_list_runs_and_marks() {
        let Some(t) = postgres().await else {
            return;
        };
        super::jobs_list_runs_and_marks(&t).await;
        t.teardown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unreachable_server() {
        // Nothing listens on port 1.
        let out = run(&[
            "leases",
            "--database-url",
            "postgres://postgres:secret@127.0.0.1:1/test",
            "--connect-timeout",
            "3s",
        ])
        .await;
        assert_code(&out, UNREACHABLE);
        assert!(
            out.stderr
                .contains("cannot reach the database at postgres://postgres:***@127.0.0.1:1/test"),
            "{out:#?}"
        );
        assert!(
            !out.stderr.contains("secret"),
            "the password is not printed"
        );
        // The real cause, not the pool's "timed out".
        assert!(
            out.stderr.contains("Connection refused") && !out.stderr.contains("timed out"),
            "{out:#?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_missing_database_is_named() {
        if common::Server::Postgres.skipped() {
            return;
        }
        let url = common::Server::Postgres.url();
        let base = url.rsplit_once('/').map(|(b, _)| b).unwrap_or(&url);
        let out = run(&[
            "leases",
            "--database-url",
            &format!("{base}/no_such_db_here"),
        ])
        .await;
        assert_code(&out, UNREACHABLE);
        assert!(
            out.stderr
                .contains("database \"no_such_db_here\" does not exist")
                && !out.stderr.contains("line"),
            "{out:#?}"
        );
    }
}
