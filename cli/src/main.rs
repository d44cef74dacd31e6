//! `orion-beacon`: see who leads, watch it change, and recover a stuck lease by hand.
//!
//! ```sh
//! orion-beacon --database-url sqlite:///var/lib/app/app.db leases
//! orion-beacon leases --by-holder -o wide
//! orion-beacon members --shard-set orders
//! orion-beacon candidates nightly-report
//! DATABASE_URL=postgres://app@db/app orion-beacon show nightly-report
//! orion-beacon watch nightly-report
//! orion-beacon release nightly-report --holder node-a
//! orion-beacon revoke nightly-report --force
//! orion-beacon jobs
//! orion-beacon jobs runs nightly-report --limit 5
//! orion-beacon jobs rerun nightly-report 2026-12-04T02:00:00Z
//! ```
//!
//! Exit codes: 0 done, 1 other failure, 2 bad input, 3 database unreachable, 4 lease table (or
//! membership or job-run table) missing, 5 unknown resource (or job, or run record), 6 nothing
//! changed (release refused, revoke not confirmed, a run mark refused).
#![forbid(unsafe_code)]

mod args;
mod commands;
mod connect;
mod exit;
mod render;

use std::process::ExitCode;

use clap::Parser;
use orion_beacon::entity::validate_table_name;
use orion_beacon::membership::validate_shard_set;
use orion_beacon::store::{validate_candidate, validate_resource};
use orion_beacon::{SeaOrmLeaseStore, StoreError};

use crate::args::{Cli, Command, JobsCommand, Output};
use crate::commands::Ctx;
use crate::connect::{connect, redact};
use crate::exit::{exit_code, CliError, Outcome};

fn main() -> ExitCode {
    // Usage errors exit with 2, like bad input; clap quotes the offending argument, which may be
    // a database URL given in the wrong place.
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            let text = err.render().to_string();
            let shown: String = text
                .split_inclusive(char::is_whitespace)
                .map(|word| {
                    if word.contains("://") {
                        redact(word)
                    } else {
                        word.to_owned()
                    }
                })
                .collect();
            if err.use_stderr() {
                eprint!("{shown}");
            } else {
                print!("{shown}");
            }
            return ExitCode::from(u8::try_from(err.exit_code()).unwrap_or(exit::BAD_INPUT));
        }
    };
    init_tracing();
    let outcome = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(run(cli)),
        Err(err) => Err(CliError::Other(format!(
            "cannot start the async runtime: {err}"
        ))),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let message = err.message();
            if !message.is_empty() {
                eprintln!("error: {message}");
            }
            ExitCode::from(exit_code(&err))
        }
    }
}

/// Logs (the revoke's audit line among them) go to stderr; `RUST_LOG` overrides the level.
fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("warn,orion_beacon=info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

async fn run(cli: Cli) -> Outcome {
    if let Command::Completions { shell } = cli.command {
        commands::completions::run(shell);
        return Ok(());
    }
    validate_table_name(&cli.table).map_err(|e| CliError::BadInput(e.to_string()))?;
    match &cli.command {
        Command::Leases { .. } | Command::Completions { .. } => {}
        Command::Members {
            shard_set,
            member_table,
            ..
        } => {
            validate_table_name(member_table).map_err(|e| CliError::BadInput(e.to_string()))?;
            if let Some(set) = shard_set {
                validate_shard_set(set).map_err(|e| bad_input(&e))?;
            }
        }
        Command::Candidates {
            resource,
            member_table,
            ..
        } => {
            validate_table_name(member_table).map_err(|e| CliError::BadInput(e.to_string()))?;
            check_resource(resource)?;
        }
        Command::Show { resource, .. }
        | Command::Watch { resource, .. }
        | Command::Revoke { resource, .. } => check_resource(resource)?,
        Command::Release { resource, holder } => {
            check_resource(resource)?;
            validate_candidate(holder).map_err(|e| bad_input(&e))?;
        }
        Command::Jobs {
            command,
            runs_table,
            ..
        } => {
            validate_table_name(runs_table).map_err(|e| CliError::BadInput(e.to_string()))?;
            match command {
                Some(
                    JobsCommand::Runs { job, .. }
                    | JobsCommand::Rerun { job, .. }
                    | JobsCommand::GiveUp { job, .. },
                ) => check_job(job)?,
                Some(JobsCommand::Check {
                    jobs, stale_after, ..
                }) => {
                    for job in jobs {
                        check_job(job)?;
                    }
                    if stale_after.is_zero() {
                        return Err(CliError::BadInput(
                            "--stale-after must not be zero".to_owned(),
                        ));
                    }
                }
                Some(JobsCommand::List { .. }) | None => {}
            }
        }
    }
    if let Command::Revoke { force: false, .. } = cli.command {
        return Err(CliError::BadInput(
            "revoke ends the lease whoever holds it: pass --force to say you mean that \
             (the normal guarded release is `release RESOURCE --holder ID`)"
                .to_owned(),
        ));
    }
    if let Command::Watch { interval, .. } = cli.command {
        if interval.is_zero() {
            return Err(CliError::BadInput("--interval must not be zero".to_owned()));
        }
    }
    let Some(url) = cli.database_url.clone() else {
        return Err(CliError::BadInput(
            "no database given: pass --database-url URL or set DATABASE_URL \
             (sqlite://PATH, postgres://USER@HOST/DB, mysql://USER@HOST/DB)"
                .to_owned(),
        ));
    };
    let db = connect(&url, cli.connect_timeout).await?;
    let mut store = SeaOrmLeaseStore::new(db)
        .with_table(&cli.table)
        .map_err(|e| bad_input(&e))?;
    if let Command::Members { member_table, .. } | Command::Candidates { member_table, .. } =
        &cli.command
    {
        store = store
            .with_member_table(member_table)
            .map_err(|e| bad_input(&e))?;
    }
    let ctx = Ctx {
        store,
        url: redact(&url),
        raw_url: url,
    };
    match cli.command {
        Command::Leases {
            by_holder: false,
            format,
            no_headers,
        } => commands::leases::run(&ctx, format.get(), !no_headers).await,
        Command::Leases {
            by_holder: true,
            format,
            no_headers,
        } => commands::leases::by_holder(&ctx, format.get(), !no_headers).await,
        Command::Members {
            shard_set,
            format,
            no_headers,
            ..
        } => commands::members::run(&ctx, shard_set.as_deref(), format.get(), !no_headers).await,
        Command::Candidates {
            resource,
            format,
            no_headers,
            ..
        } => commands::candidates::run(&ctx, &resource, format.get(), !no_headers).await,
        Command::Show { resource, format } => {
            commands::show::run(&ctx, &resource, format.get()).await
        }
        Command::Watch {
            resource,
            interval,
            max_changes,
            run_for,
            format,
        } => {
            let json = format.get() == Output::Json;
            commands::watch::run(&ctx, &resource, interval, max_changes, run_for, json).await
        }
        Command::Release { resource, holder } => {
            commands::release::run(&ctx, &resource, &holder).await
        }
        Command::Revoke { resource, yes, .. } => commands::revoke::run(&ctx, &resource, yes).await,
        Command::Jobs {
            command,
            list,
            runs_table,
        } => commands::jobs::run(&ctx, &runs_table, command, list).await,
        Command::Completions { .. } => Ok(()),
    }
}

fn check_resource(resource: &str) -> Outcome {
    validate_resource(resource).map_err(|e| bad_input(&e))
}

/// A job name: the rules of resource names (the scheduler checks them so).
fn check_job(job: &str) -> Outcome {
    validate_resource(job).map_err(|e| match e {
        StoreError::InvalidResource { reason, .. } => {
            CliError::BadInput(format!("invalid job name {job:?}: {reason}"))
        }
        other => bad_input(&other),
    })
}

/// A refused argument, in the store's words.
fn bad_input(err: &StoreError) -> CliError {
    CliError::BadInput(err.to_string())
}
