//! `cargo run -p orion-beacon-migration -- up|down`, which is what `sea-orm-cli migrate -d
//! migration` runs, against SQLite and PostgreSQL.
#![cfg(feature = "cli")]

use std::process::Command;

use orion_beacon_migration::{CreateLeaseTable, TRACKING_TABLE};
use sea_orm_migration::sea_orm::{ConnectionTrait, Database, DatabaseConnection, Statement};

fn migrate(url: &str, schema: Option<&str>, command: &str) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_orion-beacon-migration"));
    cmd.arg(command).arg("-u").arg(url);
    if let Some(schema) = schema {
        cmd.arg("-s").arg(schema);
    }
    let out = cmd.output().expect("run the migration binary");
    assert!(
        out.status.success(),
        "`{command}` failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
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

    migrate(url, schema, "up");
    assert_eq!(count(db, &leases).await.expect("table created by `up`"), 0);
    assert_eq!(count(db, &tracked).await.expect("own tracking table"), 1);
    migrate(url, schema, "up"); // idempotent: already applied
    migrate(url, schema, "down");
    assert!(count(db, &leases).await.is_err(), "`down` drops the table");
    assert_eq!(count(db, &tracked).await.unwrap(), 0);
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn up_and_down_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("m.db").display());
    migrate(&url, None, "status");
    let db = Database::connect(&url).await.unwrap();
    check_up_then_down(&url, &db, None).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn up_and_down_on_postgres() {
    let url = std::env::var("ORION_BEACON_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    if std::env::var("ORION_BEACON_SKIP").is_ok_and(|s| s.contains("postgres")) {
        eprintln!("SKIPPED: postgres migration test did not run (ORION_BEACON_SKIP)");
        return;
    }
    let db = Database::connect(&url).await.unwrap_or_else(|e| {
        panic!("cannot reach {url}: {e}; set ORION_BEACON_PG_URL or ORION_BEACON_SKIP=postgres")
    });
    // A schema of its own, so the default table name cannot collide with anything else.
    let schema = format!("obm_{}", std::process::id());
    db.execute_unprepared(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
        .await
        .unwrap();
    check_up_then_down(&url, &db, Some(&schema)).await;
    db.execute_unprepared(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}
