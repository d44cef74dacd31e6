//! The refusals of a `down` of several steps, asked before any step runs.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::ConnectionTrait;

use crate::m20261129_000001_create_leases::{applied_through_on, row_count, table_exists_on};
use crate::m20261201_000001_create_members::live_members;
use crate::m20261206_000001_create_rate_limits::limited_keys;
use crate::{
    AddJobRunKey, AddLeasePayload, CreateJobRunTable, CreateLeaseTable, CreateMemberTable,
    CreateRateLimitTable, DEFAULT_JOB_RUN_TABLE, DEFAULT_MEMBER_TABLE, DEFAULT_RATE_LIMIT_TABLE,
    DEFAULT_TABLE,
};

/// Checks, before anything is rolled back, what `M::down(db, steps)` would refuse in
/// orion-beacon's migrations: a lease table that still holds rows (or that both migrators
/// record), payload columns a live lease uses, a membership table with a live node, and a
/// job-run table that records a finished run. It only reads. sea-orm-migration runs and commits each migration of a `down` on its own, so a
/// refusal met half way leaves the steps before it rolled back; call this first (the
/// `orion-beacon-migration down` command line does) to refuse the whole `down` instead.
/// `steps` is as for `MigratorTrait::down` (`None`: every applied migration).
///
/// Another `down` racing this one, or an elector writing in between, can still be refused by
/// the migration itself; this is a check for the operator's mistake, not a lock.
pub async fn check_down<M, C>(db: &C, steps: Option<u32>) -> Result<(), DbErr>
where
    M: MigratorTrait + ?Sized,
    C: ConnectionTrait,
{
    // What `M::down` would undo: its applied migrations in file order, the last first. Read
    // without `MigratorTrait`'s own helpers, which create the tracking table (DDL, which on
    // MySQL commits a transaction the caller may have open).
    let tracking = M::migration_table_name().to_string();
    let recorded: Vec<String> = if table_exists_on(db, &tracking).await? {
        let versions = Query::select()
            .column(Alias::new("version"))
            .from(Alias::new(&tracking))
            .to_owned();
        db.query_all(&versions)
            .await?
            .iter()
            .map(|row| row.try_get_by_index::<String>(0))
            .collect::<Result<_, _>>()?
    } else {
        Vec::new()
    };
    let applied: Vec<String> = M::migrations()
        .iter()
        .map(|m| m.name().to_owned())
        .filter(|name| recorded.contains(name))
        .collect();
    let take = steps.map_or(applied.len(), |n| usize::try_from(n).unwrap_or(usize::MAX));
    for name in applied.iter().rev().take(take) {
        if let Some(table) = table_of(name, CreateLeaseTable::NAME, DEFAULT_TABLE) {
            let paths = applied_through_on(db, name).await?;
            if paths.len() > 1 {
                return Err(DbErr::Migration(format!(
                    "refusing this `down`: `{name}` is recorded in both {}, so the two \
                     migrators disagree about it. Nothing was rolled back. Delete the record \
                     from the tracking table you no longer use, then run `down` again.",
                    paths.join(" and ")
                )));
            }
            if table_exists_on(db, table).await? {
                let rows = row_count(db, table).await?;
                if rows > 0 {
                    return Err(DbErr::Migration(format!(
                        "refusing this `down`: it would undo `{name}`, whose table {table} \
                         holds {rows} lease row(s) (the live leases and the fencing-token \
                         history). Nothing was rolled back. To drop it anyway, stop every \
                         elector, run `DELETE FROM {table}`, then run `down` again; or ask \
                         for fewer steps."
                    )));
                }
            }
        } else if let Some(table) = table_of(name, AddLeasePayload::NAME, DEFAULT_TABLE) {
            if table_exists_on(db, table).await? {
                if let Some(why) =
                    crate::m20261203_000001_add_lease_payload::refusal(db, table).await?
                {
                    return Err(DbErr::Migration(format!(
                        "refusing this `down`: it would undo `{name}`. {why} Nothing was rolled \
                         back."
                    )));
                }
            }
        } else if let Some(table) = table_of(name, AddJobRunKey::NAME, DEFAULT_JOB_RUN_TABLE) {
            if table_exists_on(db, table).await? {
                if let Some(why) =
                    crate::m20261207_000002_add_job_run_key::refusal(db, table).await?
                {
                    return Err(DbErr::Migration(format!(
                        "refusing this `down`: it would undo `{name}`. {why} Nothing was rolled \
                         back."
                    )));
                }
            }
        } else if let Some(table) = table_of(name, CreateJobRunTable::NAME, DEFAULT_JOB_RUN_TABLE) {
            if table_exists_on(db, table).await? {
                let finished =
                    crate::m20261204_000001_create_job_runs::finished_runs(db, table).await?;
                if finished > 0 {
                    return Err(DbErr::Migration(format!(
                        "refusing this `down`: it would undo `{name}`, whose table {table} \
                         records {finished} finished run(s), which keep their slots from \
                         running again. Nothing was rolled back. Delete them first if the jobs \
                         may run those slots again, then run `down` again."
                    )));
                }
            }
        } else if let Some(table) =
            table_of(name, CreateRateLimitTable::NAME, DEFAULT_RATE_LIMIT_TABLE)
        {
            if table_exists_on(db, table).await? {
                let limited = limited_keys(db, table).await?;
                if limited > 0 {
                    return Err(DbErr::Migration(format!(
                        "refusing this `down`: it would undo `{name}`, and {limited} rate-limit \
                         key(s) in {table} are still limited. Nothing was rolled back. Stop \
                         the callers and wait out the quota's interval, then run `down` again."
                    )));
                }
            }
        } else if let Some(table) = table_of(name, CreateMemberTable::NAME, DEFAULT_MEMBER_TABLE) {
            if table_exists_on(db, table).await? {
                let live = live_members(db, table).await?;
                if live > 0 {
                    return Err(DbErr::Migration(format!(
                        "refusing this `down`: it would undo `{name}`, and {live} shard-set \
                         node(s) are live in {table}. Nothing was rolled back. Stop them \
                         first (or wait a lease), then run `down` again."
                    )));
                }
            }
        }
    }
    Ok(())
}

/// The table a migration named `name` made, if it is the migration `base` (for the default
/// table) or `base_<table>`.
fn table_of<'a>(name: &'a str, base: &str, default: &'a str) -> Option<&'a str> {
    let rest = name.strip_prefix(base)?;
    if rest.is_empty() {
        return Some(default);
    }
    rest.strip_prefix('_').filter(|table| !table.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_from_names() {
        fn lease(name: &str) -> Option<&str> {
            table_of(name, CreateLeaseTable::NAME, DEFAULT_TABLE)
        }
        assert_eq!(lease(CreateLeaseTable::NAME), Some(DEFAULT_TABLE));
        let custom = CreateLeaseTable::with_table("shard_leases").unwrap();
        assert_eq!(lease(custom.name()), Some("shard_leases"));
        assert_eq!(lease("m20240101_000001_create_reports"), None);
        assert_eq!(lease(CreateMemberTable::NAME), None);
        assert_eq!(
            table_of(
                CreateMemberTable::NAME,
                CreateMemberTable::NAME,
                DEFAULT_MEMBER_TABLE
            ),
            Some(DEFAULT_MEMBER_TABLE)
        );
    }
}
