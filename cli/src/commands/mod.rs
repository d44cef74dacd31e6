//! What the commands share: the opened store, reading one lease, and a store error or an
//! unknown resource put in the operator's words.

pub mod candidates;
pub mod completions;
pub mod jobs;
pub mod leases;
pub mod members;
pub mod release;
pub mod revoke;
pub mod show;
pub mod watch;

use orion_beacon::entity::{DEFAULT_JOB_RUN_TABLE, DEFAULT_MEMBER_TABLE, DEFAULT_TABLE};
use orion_beacon::{ErrorKind, LeaseRecord, LeaseStore, SeaOrmLeaseStore, StoreError};

use crate::connect::{driver_url, scrub};
use crate::exit::{chain, unreachable, CliError};

/// What every command needs: the store and how to name the database in messages.
pub struct Ctx {
    pub store: SeaOrmLeaseStore,
    /// The URL as messages show it (password redacted).
    pub url: String,
    /// The URL as given, only to scrub it out of error texts.
    pub raw_url: String,
}

/// The resource's lease; no row is an unknown resource.
pub async fn read_lease(ctx: &Ctx, resource: &str) -> Result<LeaseRecord, CliError> {
    match ctx.store.current(resource).await {
        Ok(Some(record)) => Ok(record),
        Ok(None) => Err(unknown_resource(ctx, resource).await),
        Err(err) => Err(store_failure(ctx, err)),
    }
}

/// Which of orion-beacon's tables a command reads: what a missing one is called and which
/// migration creates it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// The lease table (`--table`).
    Leases,
    /// The membership table of shard sets (`--member-table`).
    Members,
    /// The run table of scheduled jobs (`--runs-table`).
    JobRuns,
}

impl Table {
    fn noun(self) -> &'static str {
        match self {
            Table::Leases => "lease table",
            Table::Members => "membership table",
            Table::JobRuns => "job-run table",
        }
    }

    fn migration(self) -> &'static str {
        match self {
            Table::Leases => "CreateLeaseTable",
            Table::Members => "CreateMemberTable",
            Table::JobRuns => "CreateJobRunTable",
        }
    }

    fn default_name(self) -> &'static str {
        match self {
            Table::Leases => DEFAULT_TABLE,
            Table::Members => DEFAULT_MEMBER_TABLE,
            Table::JobRuns => DEFAULT_JOB_RUN_TABLE,
        }
    }
}

/// How to create a missing table: first through the application's own Migrator (the path the
/// docs lead with), else, for the default tables only, with the migration's command line.
fn migration_hint(which: Table, table: &str, url: &str) -> String {
    let driver = match url.split(':').next().unwrap_or_default() {
        "postgres" | "postgresql" => "postgres",
        "mysql" | "mariadb" => "mysql",
        _ => "sqlite",
    };
    let url = &driver_url(url);
    let migration = which.migration();
    let default = which.default_name();
    if table == default {
        format!(
            "run the migration first: add orion_beacon_migration::{migration}::new() to your \
             app's Migrator and run it (`sea-orm-cli migrate up`).\n\
             Without a Migrator of your own: orion-beacon-migration up -u {url}\n\
             (install it with `cargo install orion-beacon-migration --features cli,{driver}`)"
        )
    } else {
        format!(
            "run the migration first: add \
             orion_beacon_migration::{migration}::with_table({table:?}) to your app's \
             Migrator and run it (`sea-orm-cli migrate up`); the orion-beacon-migration \
             command line creates only the default table {default:?}"
        )
    }
}

/// A store error of a lease command as the operator should read it;
/// [`crate::exit::exit_code`] gives its code.
pub fn store_failure(ctx: &Ctx, err: StoreError) -> CliError {
    store_failure_in(ctx, Table::Leases, err)
}

/// A store error of a command that reads `which` table, in the operator's words.
pub fn store_failure_in(ctx: &Ctx, which: Table, err: StoreError) -> CliError {
    let message = match &err {
        StoreError::MissingTable { table, .. } => format!(
            "the {noun} {table:?} does not exist in {url}\n{hint}",
            noun = which.noun(),
            url = ctx.url,
            hint = migration_hint(
                which,
                table,
                if ctx.url == ctx.raw_url {
                    &ctx.url
                } else {
                    "<DATABASE_URL>"
                }
            ),
        ),
        // Refused input: the store's own words, as for a refused argument.
        _ if matches!(err.kind(), ErrorKind::InvalidInput | ErrorKind::Unsupported) => {
            err.to_string()
        }
        _ if unreachable(&err) => format!(
            "cannot reach the database at {}: {}",
            ctx.url,
            scrub(&chain(&err), &ctx.raw_url)
        ),
        _ => scrub(&chain(&err), &ctx.raw_url),
    };
    CliError::Store {
        source: Box::new(err),
        message,
    }
}

/// No lease row for `resource`, with the closest name there is as a hint (a typo, likely).
pub async fn unknown_resource(ctx: &Ctx, resource: &str) -> CliError {
    let all = ctx.store.list().await.unwrap_or_default();
    // A job's name is no lease: its scheduler's lease names it in its payload.
    let scheduler = all.iter().find(|r| {
        job_set(r.payload.as_deref()).is_some_and(|(_, jobs)| jobs.iter().any(|j| j == resource))
    });
    if let Some(scheduler) = scheduler {
        return CliError::UnknownResource(format!(
            "{resource:?} is a scheduled job, not a lease: its scheduler's lease is {:?} \
             (`orion-beacon show {}`); its runs: `orion-beacon jobs runs {resource}`",
            scheduler.resource, scheduler.resource
        ));
    }
    let names: Vec<String> = all.into_iter().map(|r| r.resource).collect();
    let hint = match closest(resource, &names) {
        Some(name) => format!("did you mean {name:?}? "),
        None => String::new(),
    };
    CliError::UnknownResource(format!(
        "no lease for resource {resource:?} in table {:?} (it was never acquired there); \
         {hint}`orion-beacon leases` lists the resources",
        ctx.store.table()
    ))
}

/// A scheduler's job set, from its leader's lease payload (`orion_beacon::jobs::JOB_SET_PREFIX`,
/// a digest, how many, the names as a JSON array): how many as written (`2 jobs`), and the
/// names it lists (all that fit in a payload).
pub fn job_set(payload: Option<&str>) -> Option<(String, Vec<String>)> {
    let rest = payload?.strip_prefix(orion_beacon::jobs::JOB_SET_PREFIX)?;
    let (_digest, rest) = rest.split_once(" (")?;
    let (count, names) = rest.split_once(") ")?;
    let names: Vec<String> = serde_json::from_str(names).ok()?;
    Some((count.to_owned(), names))
}

/// The name closest to `typed`, if one is close enough to be a typo of it.
fn closest<'a>(typed: &str, names: &'a [String]) -> Option<&'a str> {
    let limit = (typed.chars().count() / 3).clamp(1, 3);
    names
        .iter()
        .map(|name| (strsim::damerau_levenshtein(typed, name), name))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| name.as_str())
}

#[cfg(test)]
mod tests {
    #[test]
    fn migration_hint_names_the_table_and_the_driver() {
        use super::{migration_hint, Table};
        let default = migration_hint(Table::Leases, "orionbeacon_leases", "postgres://app@db/app");
        // The app's Migrator comes first; the command line is the fallback.
        let migrator = default.find("CreateLeaseTable::new() to your app's Migrator");
        let command_line = default.find("orion-beacon-migration up -u postgres://app@db/app");
        assert!(
            matches!((migrator, command_line), (Some(m), Some(c)) if m < c),
            "{default}"
        );
        assert!(default.contains("--features cli,postgres`"), "{default}");
        let custom = migration_hint(Table::Leases, "shard_leases", "mysql://app@db/app");
        assert!(
            custom.contains("CreateLeaseTable::with_table(\"shard_leases\")"),
            "{custom}"
        );
        assert!(!custom.contains("orion-beacon-migration up"), "{custom}");
        let members = migration_hint(Table::Members, "orionbeacon_members", "sqlite:///a.db");
        assert!(
            members.contains("orion-beacon-migration up -u sqlite:///a.db")
                && members.contains("CreateMemberTable::new()"),
            "{members}"
        );
        let custom = migration_hint(Table::Members, "shard_members", "sqlite:///a.db");
        assert!(
            custom.contains("CreateMemberTable::with_table(\"shard_members\")")
                && custom.contains("only the default table \"orionbeacon_members\""),
            "{custom}"
        );
        let runs = migration_hint(Table::JobRuns, "orionbeacon_job_runs", "mysql://app@db/app");
        assert!(
            runs.contains("CreateJobRunTable::new()")
                && runs.contains("orion-beacon-migration up -u mysql://app@db/app"),
            "{runs}"
        );
        let custom = migration_hint(Table::JobRuns, "nightly_runs", "sqlite:///a.db");
        assert!(
            custom.contains("CreateJobRunTable::with_table(\"nightly_runs\")")
                && custom.contains("only the default table \"orionbeacon_job_runs\""),
            "{custom}"
        );
    }
}
