//! The `orion-beacon-migration` command line (`up`, `down`, `status`; the rest refused) and the
//! two migration paths (that command line's own migrator, or `CreateLeaseTable` in the
//! application's `Migrator`), against SQLite, PostgreSQL and MariaDB: private server instances
//! (`orion-beacon-testkit`) unless `ORION_BEACON_PG_URL` / `ORION_BEACON_MYSQL_URL` name others.
#![cfg(feature = "cli")]

use std::process::Command;

use orion_beacon_migration::{
    check_down, CheckDown, CreateLeaseTable, CreateMemberTable, MigrationTrait, MigratorTrait,
    TRACKING_TABLE,
};
use sea_orm_migration::sea_orm::{ConnectionTrait, Database, DatabaseConnection, Statement};

/// An application's own migrator that carries every step, as the crate's docs say to
/// (`migrations()`; tracking table `seaql_migrations`).
struct AppMigrator;

#[orion_beacon_migration::async_trait::async_trait]
impl MigratorTrait for AppMigrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        orion_beacon_migration::migrations()
    }
}

/// An application's migrator that carries only the lease migration (no shard sets).
struct LeaseOnlyMigrator;

#[orion_beacon_migration::async_trait::async_trait]
impl MigratorTrait for LeaseOnlyMigrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![Box::new(CreateLeaseTable::new())]
    }
}

/// A lease row with token 9.
async fn lease_row(db: &DatabaseConnection, prefix: &str) {
    db.execute_unprepared(&format!(
        "INSERT INTO {prefix}orionbeacon_leases (resource, holder, fencing_token, expires_at, acquired_at, renewed_at) \
         VALUES ('nightly', 'node-a', 9, '2026-01-01 00:00:00', '2026-01-01 00:00:00', '2026-01-01 00:00:00')"
    ))
    .await
    .unwrap();
}

/// A shard-set member whose heartbeat lasts for centuries.
async fn live_member(db: &DatabaseConnection, prefix: &str) {
    db.execute_unprepared(&format!(
        "INSERT INTO {prefix}orionbeacon_members (shard_set, member, draining, joined_at, heartbeat_at, expires_at) \
         VALUES ('orders', 'node-a', false, '2026-01-01 00:00:00', '2026-01-01 00:00:00', '2999-01-01 00:00:00.000')"
    ))
    .await
    .unwrap();
}

/// Both paths on one database: whichever comes second is refused with a message naming the
/// first, and nothing is recorded twice. `db` is connected inside `schema` (if any).
async fn one_path_per_database(url: &str, db: &DatabaseConnection, schema: Option<&str>) {
    let app_tracked = format!(
        "SELECT COUNT(*) FROM seaql_migrations WHERE version = '{}'",
        CreateLeaseTable::NAME
    );
    // Our migrator first, then the app's Migrator takes the tables over: each migration
    // moves its record, the rows and their tokens stay. A Migrator that carries only the
    // lease migration moves only that one (the other record stays with our migrator, and the
    // app's Migrator finds no record it lacks a file for).
    migrate(url, schema, "up");
    lease_row(db, "").await;
    LeaseOnlyMigrator::up(db, None)
        .await
        .expect("a lease-only Migrator takes the lease table over");
    assert_eq!(count(db, &app_tracked).await.unwrap(), 1);
    let ours =
        |name: &str| format!("SELECT COUNT(*) FROM {TRACKING_TABLE} WHERE version = '{name}'");
    assert_eq!(
        count(db, &ours(CreateLeaseTable::NAME)).await.unwrap(),
        0,
        "moved"
    );
    assert_eq!(
        count(db, &ours(CreateMemberTable::NAME)).await.unwrap(),
        1,
        "not moved"
    );
    LeaseOnlyMigrator::status(db)
        .await
        .expect("no record without its file");
    let token = "SELECT fencing_token FROM orionbeacon_leases WHERE resource = 'nightly'";
    assert_eq!(
        count(db, token).await.unwrap(),
        9,
        "the row and its token stay"
    );
    // Our migrator now refuses the lease table the app records (and keeps its members).
    let said = refused(url, schema, "up");
    assert!(
        said.contains("created by your application's Migrator"),
        "{said}"
    );
    // The full Migrator takes the membership table over too.
    AppMigrator::up(db, None)
        .await
        .expect("the app's Migrator takes the membership table over");
    let all_ours = format!("SELECT COUNT(*) FROM {TRACKING_TABLE}");
    assert_eq!(count(db, &all_ours).await.unwrap(), 0, "every record moved");
    assert_eq!(count(db, token).await.unwrap(), 9);

    // A live shard-set node: the membership table's own `down` refuses (after the attempt
    // history, key, rank, rate-limit, count, job-run and payload steps, which commit on their
    // own: the jobs' attempt history, the run records' key column, the rank column, the
    // rate-limit table, the count columns, the job-run table and the payload columns go).
    let members = "SELECT COUNT(*) FROM orionbeacon_members";
    live_member(db, "").await;
    let err = AppMigrator::down(db, Some(8))
        .await
        .expect_err("a live member");
    assert!(
        err.to_string().contains("1 shard-set node(s) are live"),
        "{err}"
    );
    assert_eq!(count(db, members).await.expect("not dropped"), 1);
    assert_eq!(count(db, token).await.unwrap(), 9, "the lease stays");
    AppMigrator::up(db, None)
        .await
        .expect("`up` adds the payload columns again");
    db.execute_unprepared("DELETE FROM orionbeacon_members")
        .await
        .unwrap();

    // `down -n 9` with lease rows: `check_down` refuses before any step runs...
    let err = check_down::<AppMigrator, _>(db, Some(9))
        .await
        .expect_err("lease rows");
    assert!(
        err.to_string().contains("Nothing was rolled back")
            && err.to_string().contains("1 lease row"),
        "{err}"
    );
    assert_eq!(count(db, members).await.expect("nothing dropped"), 0);
    assert!(check_down::<AppMigrator, _>(db, Some(8)).await.is_ok());
    // ...and so does the app's Migrator wrapped in `CheckDown`, what `sea-orm-cli migrate down
    // -n 9` runs (also for `reset` and `refresh`, which undo every step)...
    let checked = CheckDown(AppMigrator);
    let err = orion_beacon_migration::MigratorTraitSelf::down(&checked, db, Some(9))
        .await
        .expect_err("lease rows");
    assert!(err.to_string().contains("Nothing was rolled back"), "{err}");
    assert_eq!(count(db, members).await.expect("nothing dropped"), 0);
    let err = orion_beacon_migration::MigratorTraitSelf::reset(&checked, db)
        .await
        .expect_err("lease rows");
    assert!(err.to_string().contains("Nothing was rolled back"), "{err}");
    let err = orion_beacon_migration::MigratorTraitSelf::refresh(&checked, db)
        .await
        .expect_err("lease rows");
    assert!(err.to_string().contains("Nothing was rolled back"), "{err}");
    assert_eq!(count(db, members).await.expect("nothing dropped"), 0);
    // ...while sea-orm-migration alone commits the payload and membership steps first, and
    // says so.
    let err = AppMigrator::down(db, Some(9))
        .await
        .expect_err("lease rows");
    assert!(err.to_string().contains("`up` applies them again"), "{err}");
    assert!(
        count(db, members).await.is_err(),
        "the member step committed"
    );
    AppMigrator::up(db, None)
        .await
        .expect("and `up` brings it back");
    assert_eq!(count(db, members).await.unwrap(), 0);
    db.execute_unprepared("DELETE FROM orionbeacon_leases")
        .await
        .unwrap();
    // With nothing to refuse, the wrapped migrator's `down` is the migrator's own.
    orion_beacon_migration::MigratorTraitSelf::down(&checked, db, None)
        .await
        .expect("app path down");
    assert!(count(db, members).await.is_err(), "rolled back");

    // The app's Migrator first: ours is refused.
    AppMigrator::up(db, None).await.expect("app path up");
    let said = refused(url, schema, "up");
    assert!(
        said.contains("created by your application's Migrator"),
        "{said}"
    );

    // A database that already has both records (from before this check): `down` refuses.
    let fake = format!(
        "INSERT INTO {TRACKING_TABLE} (version, applied_at) VALUES ('{}', 0)",
        CreateLeaseTable::NAME
    );
    db.execute_unprepared(&fake).await.unwrap();
    let err = AppMigrator::down(db, None)
        .await
        .expect_err("down with both records");
    assert!(err.to_string().contains("recorded in both"), "{err}");
    db.execute_unprepared(&format!("DELETE FROM {TRACKING_TABLE}"))
        .await
        .unwrap();
    AppMigrator::down(db, None).await.expect("app path down");

    // A table made by hand (or left by an interrupted run): neither path adopts it silently.
    db.execute_unprepared("CREATE TABLE orionbeacon_leases (resource VARCHAR(255) PRIMARY KEY)")
        .await
        .unwrap();
    let err = AppMigrator::up(db, None)
        .await
        .expect_err("hand-made table");
    assert!(err.to_string().contains("no migrator records it"), "{err}");
    let said = refused(url, schema, "up");
    assert!(said.contains("no migrator records it"), "{said}");
    db.execute_unprepared("DROP TABLE orionbeacon_leases")
        .await
        .unwrap();
    db.execute_unprepared("DROP TABLE seaql_migrations")
        .await
        .unwrap();
}

/// The variable's URL when set, else this test binary's private instance.
fn server_url(var: &str, private: impl FnOnce() -> String) -> String {
    match std::env::var(var) {
        Ok(url) if !url.trim().is_empty() => url,
        _ => private(),
    }
}

/// Runs the migration binary with `args`; whether it succeeded, and what it said.
fn run_bin(url: &str, schema: Option<&str>, args: &[&str]) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_orion-beacon-migration"));
    cmd.args(args).arg("-u").arg(url);
    if let Some(schema) = schema {
        cmd.arg("-s").arg(schema);
    }
    let out = cmd.output().expect("run the migration binary");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// Runs a command that must succeed; returns what it said.
fn run_ok(url: &str, schema: Option<&str>, args: &[&str]) -> String {
    let (ok, said) = run_bin(url, schema, args);
    assert!(ok, "`{args:?}` failed:\n{said}");
    said
}

fn migrate(url: &str, schema: Option<&str>, command: &str) {
    run_ok(url, schema, &[command]);
}

/// Runs a command that must be refused; returns what it said.
fn refused(url: &str, schema: Option<&str>, command: &str) -> String {
    refused_args(url, schema, &[command])
}

fn refused_args(url: &str, schema: Option<&str>, args: &[&str]) -> String {
    let (ok, said) = run_bin(url, schema, args);
    assert!(!ok, "`{args:?}` should be refused:\n{said}");
    said
}

async fn count(db: &DatabaseConnection, sql: &str) -> Result<i64, sea_orm_migration::DbErr> {
    let row = db
        .query_one_raw(Statement::from_string(
            db.get_database_backend(),
            sql.to_owned(),
        ))
        .await?
        .expect("one row");
    row.try_get_by_index::<i64>(0)
}

async fn check_up_then_down(url: &str, db: &DatabaseConnection, schema: Option<&str>) {
    let prefix = schema.map(|s| format!("{s}.")).unwrap_or_default();
    let leases = format!("SELECT COUNT(*) FROM {prefix}orionbeacon_leases");
    let tracked = format!(
        "SELECT COUNT(*) FROM {prefix}{TRACKING_TABLE} WHERE version = '{}'",
        CreateLeaseTable::NAME
    );
    let members = format!("SELECT COUNT(*) FROM {prefix}orionbeacon_members");
    let holding = format!(
        "SELECT COUNT(*) FROM {prefix}orionbeacon_members WHERE leases_held IS NOT NULL OR set_hash IS NOT NULL"
    );
    let payloads = format!(
        "SELECT COUNT(*) FROM {prefix}orionbeacon_leases WHERE payload IS NOT NULL OR payload_token IS NOT NULL"
    );
    let payload_tracked = format!(
        "SELECT COUNT(*) FROM {prefix}{TRACKING_TABLE} WHERE version = '{}'",
        orion_beacon_migration::AddLeasePayload::NAME
    );
    let token_7 =
        format!("SELECT COUNT(*) FROM {prefix}orionbeacon_leases WHERE fencing_token = 7");
    let members_tracked = format!(
        "SELECT COUNT(*) FROM {prefix}{TRACKING_TABLE} WHERE version = '{}'",
        orion_beacon_migration::CreateMemberTable::NAME
    );

    // An application table next to the lease table, which no command here may touch.
    let app = format!("{prefix}job_runs");
    db.execute_unprepared(&format!("CREATE TABLE {app} (id INTEGER PRIMARY KEY)"))
        .await
        .unwrap();
    migrate(url, schema, "up");
    assert_eq!(count(db, &leases).await.expect("table created by `up`"), 0);
    assert_eq!(count(db, &tracked).await.expect("own tracking table"), 1);
    assert_eq!(count(db, &members).await.expect("membership table too"), 0);
    assert_eq!(count(db, &members_tracked).await.unwrap(), 1);
    assert_eq!(count(db, &payloads).await.expect("payload columns too"), 0);
    assert_eq!(count(db, &payload_tracked).await.unwrap(), 1);
    migrate(url, schema, "up"); // idempotent: already applied

    // Commands that drop or undo everything in the database are not offered.
    for command in ["fresh", "refresh", "reset"] {
        let said = refused(url, schema, command);
        assert!(said.contains("is not offered"), "{said}");
    }
    let app_rows = format!("SELECT COUNT(*) FROM {app}");
    assert_eq!(
        count(db, &app_rows)
            .await
            .expect("the app's table survives"),
        0
    );

    // `down` keeps a table that holds leases (and their token history).
    db.execute_unprepared(&format!(
        "INSERT INTO {prefix}orionbeacon_leases (resource, holder, fencing_token, expires_at, acquired_at, renewed_at) \
         VALUES ('nightly', 'node-a', 7, '2026-01-01 00:00:00', '2026-01-01 00:00:00', '2026-01-01 00:00:00')"
    ))
    .await
    .unwrap();
    // Nine steps back would stop at the leases: refused before anything is dropped.
    let said = refused_args(url, schema, &["down", "-n", "9"]);
    assert!(
        said.contains("Nothing was rolled back") && said.contains("1 lease row"),
        "{said}"
    );
    assert_eq!(count(db, &members).await.expect("nothing dropped"), 0);
    assert_eq!(count(db, &payloads).await.expect("nothing dropped"), 0);
    // One step back drops the jobs' attempt history (a history: nothing refuses it).
    let attempts = format!("SELECT COUNT(*) FROM {prefix}orionbeacon_job_runs_attempts");
    assert_eq!(count(db, &attempts).await.expect("the attempt history"), 0);
    migrate(url, schema, "down");
    assert!(
        count(db, &attempts).await.is_err(),
        "`down` drops the attempt history"
    );
    // The key column is kept while a record carries a key (it keeps the key from running
    // twice); without one, a step back drops it, and the records stay.
    let key = format!("SELECT COUNT(run_key) FROM {prefix}orionbeacon_job_runs");
    assert_eq!(count(db, &key).await.expect("the key column"), 0);
    db.execute_unprepared(&format!(
        "INSERT INTO {prefix}orionbeacon_job_runs (job, slot, state, attempts, schedule, run_key) VALUES ('backfill', 7, 'queued', 0, 'keyed', 'tenant-1')"
    ))
    .await
    .unwrap();
    let said = refused(url, schema, "down");
    assert!(
        said.contains("1 record(s) carry a keyed job's key")
            && said.contains("Nothing was rolled back"),
        "{said}"
    );
    db.execute_unprepared(&format!(
        "DELETE FROM {prefix}orionbeacon_job_runs WHERE run_key IS NOT NULL"
    ))
    .await
    .unwrap();
    migrate(url, schema, "down");
    assert!(
        count(db, &key).await.is_err(),
        "`down` drops the key column"
    );
    // One step back removes the candidates' rank column; the members stay.
    let rank = format!("SELECT COUNT(candidate_rank) FROM {prefix}orionbeacon_members");
    assert_eq!(count(db, &rank).await.expect("the rank column"), 0);
    migrate(url, schema, "down");
    assert!(
        count(db, &rank).await.is_err(),
        "`down` drops the rank column"
    );
    assert_eq!(count(db, &members).await.expect("the members stay"), 0);
    // The rate-limit table is kept while a key is still limited (dropping it would hand the
    // key a fresh burst); once none is, a step back drops it.
    let rates = format!("{prefix}orionbeacon_rate_limits");
    db.execute_unprepared(&format!(
        "INSERT INTO {rates} (limit_key, tat_us, permits, granted, decided_us, decision_id) VALUES ('api', 32503680000000000, 1, {}, 0, 7)",
        if url.starts_with("postgres") { "TRUE" } else { "1" }
    ))
    .await
    .unwrap();
    let said = refused(url, schema, "down");
    assert!(
        said.contains("1 rate-limit key(s)") && said.contains("Nothing was rolled back"),
        "{said}"
    );
    db.execute_unprepared(&format!("UPDATE {rates} SET tat_us = 0"))
        .await
        .unwrap();
    migrate(url, schema, "down");
    assert!(
        count(db, &format!("SELECT COUNT(*) FROM {rates}"))
            .await
            .is_err(),
        "`down` drops the rate-limit table"
    );
    // One step back removes the members' count columns; the members stay.
    assert_eq!(count(db, &holding).await.expect("the count columns"), 0);
    migrate(url, schema, "down");
    assert!(
        count(db, &holding).await.is_err(),
        "`down` drops the count columns"
    );
    assert_eq!(count(db, &members).await.expect("the members stay"), 0);
    // The job-run table is kept while it records a finished run (it keeps the slot from
    // running again); without one, a step back drops it.
    let runs = format!("{prefix}orionbeacon_job_runs");
    db.execute_unprepared(&format!(
        "INSERT INTO {runs} (job, slot, state, attempts, schedule) VALUES ('nightly', 0, 'finished', 1, 'every 1000ms')"
    ))
    .await
    .unwrap();
    let said = refused(url, schema, "down");
    assert!(
        said.contains("1 finished run") && said.contains("Nothing was rolled back"),
        "{said}"
    );
    db.execute_unprepared(&format!("DELETE FROM {runs}"))
        .await
        .unwrap();
    migrate(url, schema, "down");
    assert!(
        count(db, &format!("SELECT COUNT(*) FROM {runs}"))
            .await
            .is_err(),
        "`down` drops the job-run table"
    );
    // One step back removes the payload columns only: the row and its token stay; `up` adds
    // them again to the deployment from before them, in place.
    db.execute_unprepared(&format!(
        "UPDATE {prefix}orionbeacon_leases SET payload = 'p', payload_token = 7, expires_at = '2999-01-01 00:00:00'"
    ))
    .await
    .unwrap();
    // Not while a live lease carries a payload: its holder would fail every acquire.
    let said = refused(url, schema, "down");
    assert!(
        said.contains("1 live lease(s) carry a payload")
            && said.contains("Nothing was rolled back"),
        "{said}"
    );
    db.execute_unprepared(&format!(
        "UPDATE {prefix}orionbeacon_leases SET expires_at = '2026-01-01 00:00:00'"
    ))
    .await
    .unwrap();
    migrate(url, schema, "down");
    assert!(
        count(db, &payloads).await.is_err(),
        "`down` drops the payload columns"
    );
    assert_eq!(count(db, &payload_tracked).await.unwrap(), 0);
    assert_eq!(count(db, &token_7).await.expect("the lease stays"), 1);
    migrate(url, schema, "up");
    assert_eq!(count(db, &payload_tracked).await.unwrap(), 1);
    assert_eq!(count(db, &token_7).await.expect("row and token kept"), 1);
    assert_eq!(
        count(db, &payloads).await.expect("the columns are back"),
        0,
        "added empty"
    );
    assert_eq!(count(db, &holding).await.expect("`up` adds them again"), 0);
    migrate(url, schema, "down"); // the jobs' attempt history, added again by `up`
    migrate(url, schema, "down"); // the run records' key column, too
    migrate(url, schema, "down"); // the rank column, too
    migrate(url, schema, "down"); // the rate-limit table, too
    migrate(url, schema, "down"); // the count columns, too
    migrate(url, schema, "down"); // the job-run table, too
    migrate(url, schema, "down");
    // A live shard-set node keeps the membership table too.
    live_member(db, &prefix).await;
    let said = refused(url, schema, "down");
    assert!(said.contains("1 shard-set node(s) are live"), "{said}");
    db.execute_unprepared(&format!("DELETE FROM {prefix}orionbeacon_members"))
        .await
        .unwrap();
    // One step back is the membership table only: the leases stay.
    migrate(url, schema, "down");
    assert!(
        count(db, &members).await.is_err(),
        "`down` drops the membership table"
    );
    assert_eq!(count(db, &members_tracked).await.unwrap(), 0);
    assert_eq!(count(db, &leases).await.expect("the leases stay"), 1);
    // A deployment from before the membership table upgrades with `up`: the table is added
    // next to its leases.
    migrate(url, schema, "up");
    assert_eq!(count(db, &members).await.expect("added by `up`"), 0);
    assert_eq!(count(db, &members_tracked).await.unwrap(), 1);
    assert_eq!(count(db, &payload_tracked).await.unwrap(), 1);
    assert_eq!(count(db, &leases).await.unwrap(), 1);
    migrate(url, schema, "down"); // the jobs' attempt history
    migrate(url, schema, "down"); // the run records' key column
    migrate(url, schema, "down"); // the rank column
    migrate(url, schema, "down"); // the rate-limit table
    migrate(url, schema, "down"); // the count columns
    migrate(url, schema, "down"); // the job-run table
    migrate(url, schema, "down"); // the payload columns
    migrate(url, schema, "down"); // the membership table
    let said = refused(url, schema, "down");
    assert!(
        said.contains("Nothing was rolled back") && said.contains("1 lease row"),
        "{said}"
    );
    assert_eq!(count(db, &leases).await.expect("still there"), 1);
    assert_eq!(
        count(db, &tracked).await.unwrap(),
        1,
        "still recorded as applied"
    );
    db.execute_unprepared(&format!("DELETE FROM {prefix}orionbeacon_leases"))
        .await
        .unwrap();
    migrate(url, schema, "down");
    // Gone, not unreadable for some other reason: each backend's "no such table" error.
    let gone = count(db, &leases)
        .await
        .expect_err("`down` drops the table");
    let message = gone.to_string();
    assert!(
        ["does not exist", "doesn't exist", "no such table"]
            .iter()
            .any(|m| message.contains(m)),
        "`down` should have dropped the table: {message}"
    );
    assert_eq!(count(db, &tracked).await.unwrap(), 0);
    db.execute_unprepared(&format!("DROP TABLE {app}"))
        .await
        .unwrap();
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn up_and_down_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("m.db").display());
    migrate(&url, None, "status");
    let db = Database::connect(&url).await.unwrap();
    check_up_then_down(&url, &db, None).await;
    one_path_per_database(&url, &db, None).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn up_and_down_on_postgres() {
    if std::env::var("ORION_BEACON_SKIP").is_ok_and(|s| s.contains("postgres")) {
        eprintln!("SKIPPED: postgres migration test did not run (ORION_BEACON_SKIP)");
        return;
    }
    let url = server_url("ORION_BEACON_PG_URL", || {
        orion_beacon_testkit::Postgres::shared().url()
    });
    let db = Database::connect(&url).await.unwrap_or_else(|e| {
        panic!("cannot reach {url}: {e}; set ORION_BEACON_PG_URL or ORION_BEACON_SKIP=postgres")
    });
    // A schema of its own, so the default table name cannot collide with anything else.
    let schema = format!("obm_{}", std::process::id());
    db.execute_unprepared(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
        .await
        .unwrap();
    check_up_then_down(&url, &db, Some(&schema)).await;
    let mut inside = sea_orm_migration::sea_orm::ConnectOptions::new(url.clone());
    inside.set_schema_search_path(schema.clone());
    let in_schema = Database::connect(inside).await.unwrap();
    one_path_per_database(&url, &in_schema, Some(&schema)).await;
    db.execute_unprepared(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn up_and_down_on_mariadb() {
    if std::env::var("ORION_BEACON_SKIP").is_ok_and(|s| s.contains("mysql")) {
        eprintln!("SKIPPED: mysql migration test did not run (ORION_BEACON_SKIP)");
        return;
    }
    let url = server_url("ORION_BEACON_MYSQL_URL", || {
        orion_beacon_testkit::MariaDb::shared().url()
    });
    let admin = Database::connect(&url).await.unwrap_or_else(|e| {
        panic!("cannot reach {url}: {e}; set ORION_BEACON_MYSQL_URL or ORION_BEACON_SKIP=mysql")
    });
    // A database of its own, so the default table name cannot collide with anything else.
    let name = format!("obm_{}", std::process::id());
    admin
        .execute_unprepared(&format!("CREATE DATABASE IF NOT EXISTS {name}"))
        .await
        .unwrap();
    let base = url.rsplit_once('/').map(|(b, _)| b).unwrap_or(&url);
    let own_url = format!("{base}/{name}");
    let db = Database::connect(&own_url).await.unwrap();
    migrate(&own_url, None, "up");
    // Binary collation (names compare exactly) and microsecond UTC datetimes.
    let columns = db
        .query_all_raw(Statement::from_string(
            db.get_database_backend(),
            format!(
                "SELECT COLUMN_NAME, COLUMN_TYPE, IFNULL(COLLATION_NAME, '') FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = '{name}' AND TABLE_NAME = 'orionbeacon_leases' ORDER BY ORDINAL_POSITION"
            ),
        ))
        .await
        .unwrap();
    let columns: Vec<(String, String, String)> = columns
        .iter()
        .map(|r| {
            (
                r.try_get_by_index(0).unwrap(),
                r.try_get_by_index(1).unwrap(),
                r.try_get_by_index(2).unwrap(),
            )
        })
        .collect();
    let expected = [
        ("resource", "varchar(255)", "utf8mb4_bin"),
        ("holder", "varchar(255)", "utf8mb4_bin"),
        ("fencing_token", "bigint(20)", ""),
        ("expires_at", "datetime(6)", ""),
        ("acquired_at", "datetime(6)", ""),
        ("renewed_at", "datetime(6)", ""),
        ("payload", "varchar(1024)", "utf8mb4_bin"),
        ("payload_token", "bigint(20)", ""),
    ];
    // MariaDB says bigint(20), MySQL 8 just bigint.
    let got: Vec<(&str, &str, &str)> = columns
        .iter()
        .map(|(a, b, c)| {
            (
                a.as_str(),
                if b.starts_with("bigint") {
                    "bigint(20)"
                } else {
                    b.as_str()
                },
                c.as_str(),
            )
        })
        .collect();
    assert_eq!(got, expected);
    migrate(&own_url, None, "down");
    check_up_then_down(&own_url, &db, None).await;
    one_path_per_database(&own_url, &db, None).await;
    admin
        .execute_unprepared(&format!("DROP DATABASE {name}"))
        .await
        .unwrap();
}
