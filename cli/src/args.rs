//! The command line as clap reads it: global options, the subcommands and their flags.

use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use orion_beacon::entity::{DEFAULT_JOB_RUN_TABLE, DEFAULT_MEMBER_TABLE, DEFAULT_TABLE};

/// How `leases`, `members`, `candidates`, `show`, `watch` and `jobs` print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned columns for people.
    Table,
    /// The table with every column (the expiry too).
    Wide,
    /// JSON for scripts (an array, an object, or one object per line for `watch`).
    Json,
}

/// `-o FORMAT`, with `--json` kept as the short way to say `-o json`.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct Format {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
    output: Output,
    /// Same as `-o json`.
    #[arg(long, conflicts_with = "output")]
    json: bool,
}

impl Format {
    pub fn get(self) -> Output {
        if self.json {
            Output::Json
        } else {
            self.output
        }
    }
}

/// See who leads, watch it change, and recover a stuck lease by hand.
///
/// Times left are judged by the database clock. Exit codes: 0 done, 1 other failure, 2 bad
/// input, 3 database unreachable, 4 lease table (or membership or job-run table) missing, 5
/// unknown resource (or job, or run record), 6 nothing changed (release refused, revoke not
/// confirmed, a run mark refused), 7 a job is stale (`jobs check`).
#[derive(Debug, Parser)]
#[command(name = "orion-beacon", version, about, long_about)]
pub struct Cli {
    /// The database: sqlite://PATH, postgres://USER@HOST/DB or mysql://USER@HOST/DB.
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        global = true,
        value_name = "URL"
    )]
    pub database_url: Option<String>,
    /// The lease table (ASCII letters, digits and '_').
    #[arg(long, global = true, default_value = DEFAULT_TABLE, value_name = "NAME")]
    pub table: String,
    /// How long to wait for a connection to the database.
    #[arg(long, global = true, default_value = "10s", value_name = "DURATION", value_parser = parse_duration)]
    pub connect_timeout: Duration,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Every resource: holder, token, live or expired, time left, when acquired and renewed.
    #[command(visible_alias = "ls")]
    Leases {
        /// One row per holder instead: how many live (and expired) leases it has, and (wide,
        /// JSON) which resources. Holders whose leases all lapsed are shown with 0 live.
        #[arg(long)]
        by_holder: bool,
        #[command(flatten)]
        format: Format,
        /// Leave out the header line (and the summary line) of the table.
        #[arg(long)]
        no_headers: bool,
    },
    /// The live members of shard sets: shard set, member, active or draining, time left, when
    /// they joined and last heartbeated.
    Members {
        /// Only this shard set's members.
        #[arg(long, value_name = "NAME")]
        shard_set: Option<String>,
        /// The membership table (ASCII letters, digits and '_').
        #[arg(long, default_value = DEFAULT_MEMBER_TABLE, value_name = "NAME")]
        member_table: String,
        #[command(flatten)]
        format: Format,
        /// Leave out the header line (and the summary line) of the table.
        #[arg(long)]
        no_headers: bool,
    },
    /// The live candidates of a ranked election (electors built with a rank): candidate,
    /// rank, whether it leads, how long it has been live, time left; highest rank first.
    Candidates {
        /// The resource elected for.
        resource: String,
        /// The membership table (ASCII letters, digits and '_').
        #[arg(long, default_value = DEFAULT_MEMBER_TABLE, value_name = "NAME")]
        member_table: String,
        #[command(flatten)]
        format: Format,
        /// Leave out the header line (and the summary line) of the table.
        #[arg(long)]
        no_headers: bool,
    },
    /// One resource's lease.
    Show {
        /// The resource.
        resource: String,
        #[command(flatten)]
        format: Format,
    },
    /// Print each change of a resource's holder, token or liveness until interrupted (Ctrl-C:
    /// exit code 130).
    Watch {
        /// The resource.
        resource: String,
        /// How often to read the lease.
        #[arg(long, default_value = "1s", value_name = "DURATION", value_parser = parse_duration)]
        interval: Duration,
        /// Stop after this many changes (the first line is not a change).
        #[arg(long, value_name = "N")]
        max_changes: Option<u64>,
        /// Stop after this long.
        #[arg(long = "for", value_name = "DURATION", value_parser = parse_duration)]
        run_for: Option<Duration>,
        #[command(flatten)]
        format: Format,
    },
    /// The normal guarded release: ends the lease only if HOLDER holds it live.
    Release {
        /// The resource.
        resource: String,
        /// The candidate that holds the lease.
        #[arg(long, value_name = "ID")]
        holder: String,
    },
    /// An operator's override: ends the live lease whoever holds it (needs --force).
    ///
    /// The lease's expiry moves back to its last renew (database clock); the holder and token
    /// are kept and nothing else changes, so the next candidate to ask (the old holder at its
    /// next renew included) starts a new term with a higher token. Asks for confirmation on
    /// stdin unless --yes, and logs what it did (old holder and token).
    ///
    /// The holder is not told: it may go on acting as leader until its next renew (fenced
    /// writes of its term are refused at once). Meant for a lease whose holder is gone or
    /// wedged; to move leadership off a healthy leader, shut that process down instead.
    Revoke {
        /// The resource.
        resource: String,
        /// Required: revoking overrides the holder.
        #[arg(long)]
        force: bool,
        /// Do not ask for confirmation.
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Scheduled jobs: each job's latest slot, its state and its next slot (`jobs list`, the
    /// default), one job's run records, and an operator's marks on a slot.
    #[command(args_conflicts_with_subcommands = true)]
    Jobs {
        #[command(subcommand)]
        command: Option<JobsCommand>,
        #[command(flatten)]
        list: ListArgs,
        /// The run table of the jobs (ASCII letters, digits and '_').
        #[arg(long, global = true, default_value = DEFAULT_JOB_RUN_TABLE, value_name = "NAME")]
        runs_table: String,
    },
    /// Print a shell completion script (e.g. `orion-beacon completions bash >
    /// /etc/bash_completion.d/orion-beacon`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// `jobs list`'s options (also `jobs`'s own, list being the default).
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub format: Format,
    /// Leave out the header line (and the summary line) of the table.
    #[arg(long)]
    pub no_headers: bool,
}

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// One row per job: its latest slot (UTC), that slot's state, duration, who ran it and
    /// with which token, attempts, and the next slot by the database clock (the default).
    #[command(visible_alias = "ls")]
    List {
        #[command(flatten)]
        list: ListArgs,
    },
    /// The latest run records of one job, newest first.
    Runs {
        /// The job.
        job: String,
        /// How many records.
        #[arg(long, short = 'n', default_value_t = 20, value_name = "N",
              value_parser = clap::value_parser!(u64).range(1..=100_000))]
        limit: u64,
        #[command(flatten)]
        list: ListArgs,
    },
    /// For monitoring: every job (or the ones named) with no slot finished within
    /// `--stale-after`, by the database clock. Exits 7 when one is stale, 0 when none is.
    Check {
        /// The jobs to check (default: every job with a record in the run table).
        jobs: Vec<String>,
        /// How stale is too stale: the longest time since a job's last finished slot.
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        stale_after: Duration,
        #[command(flatten)]
        list: ListArgs,
    },
    /// Mark a slot to run again (any record but a running one): the leader runs it at its next
    /// look. A finished slot runs again, and its writes are made a second time.
    Rerun {
        /// The job.
        job: String,
        /// The slot: milliseconds since the Unix epoch, or a time (RFC 3339, or
        /// `YYYY-MM-DD HH:MM:SS[.fff]` in UTC as the tables print it).
        #[arg(
            value_parser = parse_slot,
            allow_hyphen_values = true,
            required_unless_present = "key"
        )]
        slot: Option<i64>,
        /// A keyed job's key, instead of a slot.
        #[arg(long, conflicts_with = "slot", allow_hyphen_values = true)]
        key: Option<String>,
    },
    /// Give a slot up: it never runs again (any record but a finished one). A running
    /// attempt's commit is then refused and its fenced writes roll back.
    GiveUp {
        /// The job.
        job: String,
        /// The slot: milliseconds since the Unix epoch, or a time (RFC 3339, or
        /// `YYYY-MM-DD HH:MM:SS[.fff]` in UTC as the tables print it).
        #[arg(
            value_parser = parse_slot,
            allow_hyphen_values = true,
            required_unless_present = "key"
        )]
        slot: Option<i64>,
        /// A keyed job's key, instead of a slot.
        #[arg(long, conflicts_with = "slot", allow_hyphen_values = true)]
        key: Option<String>,
    },
}

/// The longest duration an option takes: a timer set that far ahead still fits the clock's
/// range (an `Instant` plus 1e19 s overflows).
const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

/// Parses durations as humantime does (`250ms`, `2s`, `1m 30s`, `1h`); a bare number is
/// seconds (`1.5` too). At most a year ([`MAX_DURATION`]).
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let parsed = if let Ok(seconds) = text.parse::<f64>() {
        Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))?
    } else {
        humantime::parse_duration(text)
            .map_err(|e| format!("{text:?} is not a duration (like 500ms, 2s, 1m 30s): {e}"))?
    };
    if parsed > MAX_DURATION {
        return Err(format!("{text:?} is longer than 366 days"));
    }
    Ok(parsed)
}

/// A slot: milliseconds since the Unix epoch, an RFC 3339 time, or a UTC time as the tables
/// print it (`2026-12-04 02:00:00.000`). Slots are whole milliseconds.
pub fn parse_slot(text: &str) -> Result<i64, String> {
    use chrono::{DateTime, NaiveDateTime, Utc};
    let text = text.trim();
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    let time: Option<DateTime<Utc>> = DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .ok()
        .or_else(|| {
            [
                "%Y-%m-%d %H:%M:%S%.f",
                "%Y-%m-%dT%H:%M:%S%.f",
                "%Y-%m-%d %H:%M",
            ]
            .iter()
            .find_map(|f| NaiveDateTime::parse_from_str(text, f).ok())
            .map(|t| t.and_utc())
        });
    let Some(time) = time else {
        return Err(format!(
            "{text:?} is not a slot: give milliseconds since the Unix epoch (1796349600000), an \
             RFC 3339 time (2026-12-04T02:00:00Z) or a UTC time as the tables print it \
             (\"2026-12-04 02:00:00.000\")"
        ));
    };
    if time.timestamp_subsec_nanos() % 1_000_000 != 0 {
        return Err(format!(
            "{text:?} is not a slot: slots are whole milliseconds"
        ));
    }
    Ok(time.timestamp_millis())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("3m"), Ok(Duration::from_secs(180)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "s", "2x", "-1s", "1e400s", "1e19", "367days", "1e19s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn slots() {
        let ms = 1_796_349_600_000; // 2026-12-04T02:00:00Z
        for text in [
            "1796349600000",
            " 1796349600000 ",
            "2026-12-04T02:00:00Z",
            "2026-12-04T03:00:00+01:00",
            "2026-12-04T02:00:00.000Z",
            "2026-12-04 02:00:00.000",
            "2026-12-04 02:00:00",
            "2026-12-04T02:00:00",
            "2026-12-04 02:00",
        ] {
            assert_eq!(parse_slot(text), Ok(ms), "{text:?}");
        }
        assert_eq!(parse_slot("2026-12-04 02:00:00.250"), Ok(ms + 250));
        assert_eq!(parse_slot("-1000"), Ok(-1000));
        for bad in [
            "",
            "yesterday",
            "2026-12-04",
            "2026-13-04T02:00:00Z",
            "1.5",
            "2026-12-04T02:00:00.0005Z",
        ] {
            assert!(parse_slot(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn cli_shape() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
