//! `orion-beacon`: see who leads, watch it change, and recover a stuck lease by hand.
//!
//! ```sh
//! orion-beacon --database-url sqlite:///var/lib/app/app.db leases
//! DATABASE_URL=postgres://app@db/app orion-beacon show nightly-report
//! orion-beacon watch nightly-report
//! orion-beacon release nightly-report --holder node-a
//! orion-beacon revoke nightly-report --force
//! ```
//!
//! Exit codes: 0 done, 1 other failure, 2 bad input, 3 database unreachable, 4 lease table
//! missing, 5 unknown resource, 6 nothing changed (release refused, revoke not confirmed).
#![forbid(unsafe_code)]

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use orion_beacon::entity::{validate_table_name, DEFAULT_TABLE};
use orion_beacon::store::{validate_candidate, validate_resource};
use orion_beacon::{LeaseRecord, LeaseStore, SeaOrmLeaseStore, StoreError};
use sea_orm::{DatabaseConnection, DbErr};
use serde_json::json;
use tokio::time::Instant;

/// Exit codes, one per kind of failure, so scripts can tell them apart.
mod exit {
    pub const OTHER: u8 = 1;
    pub const BAD_INPUT: u8 = 2;
    pub const UNREACHABLE: u8 = 3;
    pub const MISSING_TABLE: u8 = 4;
    pub const UNKNOWN_RESOURCE: u8 = 5;
    pub const NOTHING_CHANGED: u8 = 6;
    /// Interrupted (Ctrl-C), as shells report a SIGINT: 128 + 2.
    pub const INTERRUPTED: u8 = 130;
}

/// How `leases`, `show` and `watch` print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    /// Aligned columns for people.
    Table,
    /// The table with every column (the expiry too).
    Wide,
    /// JSON for scripts (an array, an object, or one object per line for `watch`).
    Json,
}

/// `-o FORMAT`, with `--json` kept as the short way to say `-o json`.
#[derive(Debug, Clone, Copy, clap::Args)]
struct Format {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
    output: Output,
    /// Same as `-o json`.
    #[arg(long, conflicts_with = "output")]
    json: bool,
}

impl Format {
    fn get(self) -> Output {
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
/// input, 3 database unreachable, 4 lease table missing, 5 unknown resource, 6 nothing changed
/// (release refused, revoke not confirmed).
#[derive(Debug, Parser)]
#[command(name = "orion-beacon", version, about, long_about)]
struct Cli {
    /// The database: sqlite://PATH, postgres://USER@HOST/DB or mysql://USER@HOST/DB.
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        global = true,
        value_name = "URL"
    )]
    database_url: Option<String>,
    /// The lease table (ASCII letters, digits and '_').
    #[arg(long, global = true, default_value = DEFAULT_TABLE, value_name = "NAME")]
    table: String,
    /// How long to wait for a connection to the database.
    #[arg(long, global = true, default_value = "10s", value_name = "DURATION", value_parser = parse_duration)]
    connect_timeout: Duration,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Every resource: holder, token, live or expired, time left, when acquired and renewed.
    #[command(visible_alias = "ls")]
    Leases {
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
    /// Print a shell completion script (e.g. `orion-beacon completions bash >
    /// /etc/bash_completion.d/orion-beacon`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// A failure with its exit code; the message is printed as `error: ...`.
#[derive(Debug)]
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

type Outcome = Result<(), Failure>;

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
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::from(exit::OTHER);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            if !failure.message.is_empty() {
                eprintln!("error: {}", failure.message);
            }
            ExitCode::from(failure.code)
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

/// What every command needs: the store and how to name the database in messages.
struct Ctx {
    store: SeaOrmLeaseStore,
    /// The URL as messages show it (password redacted).
    url: String,
    /// The URL as given, only to scrub it out of error texts.
    raw_url: String,
}

async fn run(cli: Cli) -> Outcome {
    if let Command::Completions { shell } = cli.command {
        let mut out = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "orion-beacon", &mut out);
        emit(&String::from_utf8_lossy(&out));
        return Ok(());
    }
    validate_table_name(&cli.table).map_err(|e| Failure::new(exit::BAD_INPUT, e.to_string()))?;
    match &cli.command {
        Command::Leases { .. } | Command::Completions { .. } => {}
        Command::Show { resource, .. }
        | Command::Watch { resource, .. }
        | Command::Revoke { resource, .. } => check_resource(resource)?,
        Command::Release { resource, holder } => {
            check_resource(resource)?;
            validate_candidate(holder).map_err(|e| bad_input(&e))?;
        }
    }
    if let Command::Revoke { force: false, .. } = cli.command {
        return Err(Failure::new(
            exit::BAD_INPUT,
            "revoke ends the lease whoever holds it: pass --force to say you mean that \
             (the normal guarded release is `release RESOURCE --holder ID`)",
        ));
    }
    if let Command::Watch { interval, .. } = cli.command {
        if interval.is_zero() {
            return Err(Failure::new(exit::BAD_INPUT, "--interval must not be zero"));
        }
    }
    let Some(url) = cli.database_url.clone() else {
        return Err(Failure::new(
            exit::BAD_INPUT,
            "no database given: pass --database-url URL or set DATABASE_URL \
             (sqlite://PATH, postgres://USER@HOST/DB, mysql://USER@HOST/DB)",
        ));
    };
    let db = connect(&url, cli.connect_timeout).await?;
    let store = SeaOrmLeaseStore::new(db)
        .with_table(&cli.table)
        .map_err(|e| bad_input(&e))?;
    let ctx = Ctx {
        store,
        url: redact(&url),
        raw_url: url,
    };
    match cli.command {
        Command::Leases { format, no_headers } => leases(&ctx, format.get(), !no_headers).await,
        Command::Show { resource, format } => show(&ctx, &resource, format.get()).await,
        Command::Watch {
            resource,
            interval,
            max_changes,
            run_for,
            format,
        } => {
            let json = format.get() == Output::Json;
            watch(&ctx, &resource, interval, max_changes, run_for, json).await
        }
        Command::Release { resource, holder } => release(&ctx, &resource, &holder).await,
        Command::Revoke { resource, yes, .. } => revoke(&ctx, &resource, yes).await,
        Command::Completions { .. } => Ok(()),
    }
}

fn check_resource(resource: &str) -> Outcome {
    validate_resource(resource).map_err(|e| bad_input(&e))
}

fn bad_input(err: &StoreError) -> Failure {
    Failure::new(exit::BAD_INPUT, err.to_string())
}

/// Opens the database, refusing a URL whose backend this build lacks, and (SQLite) a file that
/// does not exist: a typo must not create an empty database.
async fn connect(url: &str, timeout: Duration) -> Result<DatabaseConnection, Failure> {
    let scheme = url.split(':').next().unwrap_or_default();
    let (backend, feature) = match scheme {
        "sqlite" => ("SQLite", "sqlite"),
        "postgres" | "postgresql" => ("PostgreSQL", "postgres"),
        "mysql" | "mariadb" => ("MySQL/MariaDB", "mysql"),
        _ => {
            return Err(Failure::new(
                exit::BAD_INPUT,
                // Only the scheme: an unknown form (an ADO.NET string, say) may hold a password
                // anywhere.
                format!(
                    "unsupported database URL{}: use sqlite://PATH, postgres://... or \
                     mysql://...",
                    if !scheme.is_empty()
                        && scheme.len() <= 20
                        && scheme
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
                    {
                        format!(" scheme {scheme:?}")
                    } else {
                        String::new()
                    }
                ),
            ));
        }
    };
    let compiled = match feature {
        "sqlite" => cfg!(feature = "sqlite"),
        "postgres" => cfg!(feature = "postgres"),
        _ => cfg!(feature = "mysql"),
    };
    if !compiled {
        return Err(Failure::new(
            exit::BAD_INPUT,
            format!("this build of orion-beacon has no {backend} support: rebuild it with `--features cli,{feature}`"),
        ));
    }
    let url = &driver_url(url);
    let mut options = if scheme == "sqlite" {
        sqlite_options(url)?
    } else {
        sea_orm::ConnectOptions::new(url)
    };
    options
        .max_connections(2)
        .min_connections(0)
        .connect_timeout(timeout)
        .acquire_timeout(timeout)
        .sqlx_logging(false);
    match sea_orm::Database::connect(options).await {
        Ok(db) => Ok(db),
        Err(err) => {
            // A pool only says it timed out; one direct connection says why.
            let cause = match direct_error(url, timeout).await {
                Some(cause) => cause,
                None => chain(&err),
            };
            let cause = scrub(&cause, url);
            Err(Failure::new(
                exit::UNREACHABLE,
                format!(
                    "cannot reach the database at {}: {cause} (is the server up and reachable, \
                     and are the host, port, database name and credentials right?)",
                    redact(url),
                ),
            ))
        }
    }
}

/// The error of one direct connection to `url`, without a pool in between (which reports any
/// failure to connect as a time-out).
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn direct_error(url: &str, timeout: Duration) -> Option<String> {
    use sea_orm::sqlx::Connection as _;
    let scheme = url.split(':').next().unwrap_or_default();
    let attempt = async {
        match scheme {
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => sea_orm::sqlx::PgConnection::connect(url)
                .await
                .err()
                .map(|e| database_message(&e)),
            #[cfg(feature = "mysql")]
            "mysql" | "mariadb" => sea_orm::sqlx::MySqlConnection::connect(url)
                .await
                .err()
                .map(|e| database_message(&e)),
            _ => None,
        }
    };
    tokio::time::timeout(timeout, attempt).await.ok().flatten()
}

#[cfg(not(any(feature = "postgres", feature = "mysql")))]
async fn direct_error(_url: &str, _timeout: Duration) -> Option<String> {
    None
}

/// A sqlx error as one line: the server's own message where there is one (without the source
/// file and line sqlx's debug form adds), else the error's text.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn database_message(err: &sea_orm::sqlx::Error) -> String {
    match err.as_database_error() {
        Some(db) => db.message().to_owned(),
        None => err.to_string(),
    }
}

#[cfg(feature = "sqlite")]
fn sqlite_options(url: &str) -> Result<sea_orm::ConnectOptions, Failure> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or_default();
    let path = rest.split('?').next().unwrap_or_default();
    if !path.is_empty() && path != ":memory:" && !std::path::Path::new(path).exists() {
        return Err(Failure::new(
            exit::UNREACHABLE,
            format!(
                "cannot reach the database at {}: no SQLite database file at {path}",
                redact(url)
            ),
        ));
    }
    Ok(orion_beacon::backend::sqlite::connect_options(url))
}

#[cfg(not(feature = "sqlite"))]
fn sqlite_options(_url: &str) -> Result<sea_orm::ConnectOptions, Failure> {
    Err(Failure::new(
        exit::BAD_INPUT,
        "this build of orion-beacon has no SQLite support: rebuild it with `--features cli,sqlite`",
    ))
}

/// `url` as sqlx and sea-orm take it: they know MariaDB only as `mysql://`.
fn driver_url(url: &str) -> String {
    match url.strip_prefix("mariadb://") {
        Some(rest) => format!("mysql://{rest}"),
        None => url.to_owned(),
    }
}

/// How to create a missing lease table: the migration's command line makes only the default
/// table; another name is made by the application's Migrator.
fn migration_hint(table: &str, url: &str) -> String {
    let driver = match url.split(':').next().unwrap_or_default() {
        "postgres" | "postgresql" => "sqlx-postgres",
        "mysql" | "mariadb" => "sqlx-mysql",
        _ => "sqlx-sqlite",
    };
    let url = &driver_url(url);
    if table == DEFAULT_TABLE {
        format!(
            "run the migration first:\n  \
             orion-beacon-migration up -u {url}\n\
             (install it with `cargo install orion-beacon-migration --features cli,{driver}`), \
             or add orion_beacon_migration::CreateLeaseTable::new() to your app's Migrator"
        )
    } else {
        format!(
            "run the migration first: add \
             orion_beacon_migration::CreateLeaseTable::with_table({table:?}) to your app's \
             Migrator and run it (`sea-orm-cli migrate up -d <your migration crate>`); the \
             orion-beacon-migration command line creates only the default table {DEFAULT_TABLE:?}"
        )
    }
}

/// A store error as the operator should read it, with its exit code.
fn store_failure(ctx: &Ctx, err: StoreError) -> Failure {
    match &err {
        StoreError::MissingTable { table, .. } => Failure::new(
            exit::MISSING_TABLE,
            format!(
                "the lease table {table:?} does not exist in {url}\n{hint}",
                url = ctx.url,
                hint = migration_hint(
                    table,
                    if ctx.url == ctx.raw_url {
                        &ctx.url
                    } else {
                        "<DATABASE_URL>"
                    }
                ),
            ),
        ),
        StoreError::InvalidResource { .. }
        | StoreError::InvalidCandidate { .. }
        | StoreError::InvalidLeaseDuration { .. }
        | StoreError::InvalidTableName(_)
        | StoreError::UnsupportedBackend { .. } => bad_input(&err),
        StoreError::Database(DbErr::Conn(_) | DbErr::ConnectionAcquire(_)) => Failure::new(
            exit::UNREACHABLE,
            format!(
                "cannot reach the database at {}: {}",
                ctx.url,
                scrub(&chain(&err), &ctx.raw_url)
            ),
        ),
        _ => Failure::new(exit::OTHER, scrub(&chain(&err), &ctx.raw_url)),
    }
}

async fn unknown_resource(ctx: &Ctx, resource: &str) -> Failure {
    let names: Vec<String> = ctx
        .store
        .list()
        .await
        .map(|all| all.into_iter().map(|r| r.resource).collect())
        .unwrap_or_default();
    let hint = match closest(resource, &names) {
        Some(name) => format!("did you mean {name:?}? "),
        None => String::new(),
    };
    Failure::new(
        exit::UNKNOWN_RESOURCE,
        format!(
            "no lease for resource {resource:?} in table {:?} (it was never acquired there); \
             {hint}`orion-beacon leases` lists the resources",
            ctx.store.table()
        ),
    )
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

/// An error and its sources on one line.
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

/// The URL with its password, if any, replaced by `***`: in the user part (also when the
/// password has characters a URL parser refuses, like an unencoded `#` or `/`) and in a
/// `password=` query parameter.
fn redact(text: &str) -> String {
    match parsed_url(text) {
        Some(mut parsed) => {
            if parsed.password().is_some() && parsed.set_password(Some("***")).is_err() {
                return "<a database URL>".to_owned();
            }
            // Query keys as the driver reads them (percent-decoded, any case).
            let pairs: Vec<(String, String)> = parsed
                .query_pairs()
                .map(|(k, v)| {
                    let v = if is_password_key(&k) {
                        "***".to_owned()
                    } else {
                        v.into_owned()
                    };
                    (k.into_owned(), v)
                })
                .collect();
            if !pairs.is_empty() {
                parsed.query_pairs_mut().clear().extend_pairs(pairs);
            }
            parsed.to_string()
        }
        // Not a URL a parser accepts (an unencoded `#` or `/` in the password, say): mask by
        // hand.
        None => mask_password_parameter(&mask_userinfo(text)),
    }
}

/// `text` as a URL, where it reads as one. Database URLs have no fragment: a `#` means an
/// unencoded `#` in the password, which a URL parser takes for the start of one.
fn parsed_url(text: &str) -> Option<url::Url> {
    url::Url::parse(text)
        .ok()
        .filter(|u| u.fragment().is_none())
}

/// Whether a query parameter carries a password (as sqlx reads them: any case).
fn is_password_key(key: &str) -> bool {
    matches!(key.to_ascii_lowercase().as_str(), "password" | "pwd")
}

/// `(scheme, user, password, rest after the @)` of `scheme://user:password@rest`, taking the
/// last `@` as the end of the user part (for text no URL parser accepts).
fn userinfo(text: &str) -> Option<(&str, &str, &str, &str)> {
    let (scheme, rest) = text.split_once("://")?;
    let at = rest.rfind('@')?;
    let (user, password) = rest[..at].split_once(':')?;
    Some((scheme, user, password, &rest[at + 1..]))
}

/// `scheme://user:***@rest`.
fn mask_userinfo(text: &str) -> String {
    match userinfo(text) {
        Some((scheme, user, _password, rest)) => format!("{scheme}://{user}:***@{rest}"),
        None => text.to_owned(),
    }
}

/// Every `password=...` (or `pwd=`) value, any case, up to the next `&` or `;`, as `***`.
fn mask_password_parameter(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while let Some(found) = ["password=", "pwd="]
        .iter()
        .filter_map(|key| lower[at..].find(key).map(|i| (at + i, key.len())))
        .min()
    {
        let value = found.0 + found.1;
        out.push_str(&text[at..value]);
        out.push_str("***");
        let end = text[value..]
            .find(['&', ';'])
            .map_or(text.len(), |i| value + i);
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

/// `text` (an error's words, which may quote the URL) with the URL and its password taken out.
/// A password is replaced on its own only when it is long enough not to be an ordinary word of
/// the message (a user name, a port).
fn scrub(text: &str, url: &str) -> String {
    let mut text = text.replace(url, &redact(url));
    for password in passwords(url) {
        if password.chars().count() >= 6 {
            text = text.replace(&password, "***");
        }
    }
    text
}

/// The passwords in `url`: the user part's (within the authority) and any password parameter.
fn passwords(url: &str) -> Vec<String> {
    match parsed_url(url) {
        Some(parsed) => parsed
            .password()
            .map(str::to_owned)
            .into_iter()
            .chain(
                parsed
                    .query_pairs()
                    .filter(|(k, _)| is_password_key(k))
                    .map(|(_, v)| v.into_owned()),
            )
            .collect(),
        None => userinfo(url)
            .map(|(_, _, password, _)| vec![password.to_owned()])
            .unwrap_or_default(),
    }
}

/// Parses durations as humantime does (`250ms`, `2s`, `1m 30s`, `1h`); a bare number is
/// seconds (`1.5` too).
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(seconds) = text.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration (like 500ms, 2s, 1m 30s): {e}"))
}

/// A duration as an operator reads it: `14.998s`, `3m05s`, `2h03m`, `4d02h`.
fn human(d: Duration) -> String {
    let secs = d.as_secs();
    if secs < 60 {
        format!("{}.{:03}s", secs, d.subsec_millis())
    } else if secs < 3600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else if secs < 86_400 {
        format!("{}h{:02}m", secs / 3600, secs % 3600 / 60)
    } else {
        format!("{}d{:02}h", secs / 86_400, secs % 86_400 / 3600)
    }
}

fn time(t: Option<DateTime<Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S%.3f").to_string())
        .unwrap_or_else(|| "-".to_owned())
}

fn state(r: &LeaseRecord) -> &'static str {
    if r.live {
        "live"
    } else {
        "expired"
    }
}

fn left(r: &LeaseRecord) -> String {
    if r.live {
        human(r.remaining)
    } else {
        "-".to_owned()
    }
}

/// The record as JSON: its `serde` form (times RFC 3339, `remaining_ms`).
fn record_json(r: &LeaseRecord) -> serde_json::Value {
    serde_json::to_value(r).unwrap_or(serde_json::Value::Null)
}

/// Writes to stdout; false once stdout is gone (a closed pipe), which ends the command quietly.
fn emit(text: &str) -> bool {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .is_ok()
}

async fn leases(ctx: &Ctx, output: Output, headers: bool) -> Outcome {
    let records = ctx.store.list().await.map_err(|e| store_failure(ctx, e))?;
    if output == Output::Json {
        let all: Vec<_> = records.iter().map(record_json).collect();
        emit(&format!("{}\n", serde_json::Value::Array(all)));
        return Ok(());
    }
    if records.is_empty() {
        if headers {
            emit(&format!("no leases in table {:?}\n", ctx.store.table()));
        }
        return Ok(());
    }
    let wide = output == Output::Wide;
    let mut header = vec!["RESOURCE", "HOLDER", "TOKEN", "STATE", "TIME LEFT"];
    if wide {
        header.push("EXPIRES (UTC)");
    }
    header.extend(["ACQUIRED (UTC)", "RENEWED (UTC)"]);
    let rows = records.iter().map(|r| {
        let mut row = vec![
            r.resource.clone(),
            r.holder.clone(),
            r.token.to_string(),
            state(r).to_owned(),
            left(r),
        ];
        if wide {
            row.push(time(r.expires_at));
        }
        row.extend([time(r.acquired_at), time(r.renewed_at)]);
        row
    });
    let mut text = table(headers.then_some(header), rows, &[2, 4]);
    if headers {
        let live = records.iter().filter(|r| r.live).count();
        text.push_str(&format!(
            "{} lease{}, {live} live (time left by the database clock)\n",
            records.len(),
            if records.len() == 1 { "" } else { "s" }
        ));
    }
    emit(&text);
    Ok(())
}

/// Columns two spaces apart, `right` ones right-aligned (numbers), widths counted in
/// terminal columns (wide characters take two), no trailing spaces.
fn table(
    header: Option<Vec<&str>>,
    rows: impl IntoIterator<Item = Vec<String>>,
    right: &[usize],
) -> String {
    use comfy_table::{CellAlignment, ContentArrangement, Table};
    let mut t = Table::new();
    t.load_preset(comfy_table::presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled);
    if let Some(header) = header {
        t.set_header(header);
    }
    for row in rows {
        t.add_row(row);
    }
    let count = t.column_count();
    for (i, column) in t.column_iter_mut().enumerate() {
        column.set_padding((0, if i + 1 < count { 2 } else { 0 }));
        if right.contains(&i) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    t.lines()
        .map(|line| line.trim_end().to_owned() + "\n")
        .collect()
}

async fn read(ctx: &Ctx, resource: &str) -> Result<LeaseRecord, Failure> {
    match ctx.store.current(resource).await {
        Ok(Some(record)) => Ok(record),
        Ok(None) => Err(unknown_resource(ctx, resource).await),
        Err(err) => Err(store_failure(ctx, err)),
    }
}

async fn show(ctx: &Ctx, resource: &str, output: Output) -> Outcome {
    let r = read(ctx, resource).await?;
    if output == Output::Json {
        emit(&format!("{}\n", record_json(&r)));
        return Ok(());
    }
    let left = if r.live {
        format!("{} (database clock)", human(r.remaining))
    } else {
        "-".to_owned()
    };
    emit(&format!(
        "resource     {}\nholder       {}\ntoken        {}\nstate        {}\ntime left    {left}\n\
         expires at   {} UTC\nacquired at  {} UTC\nrenewed at   {} UTC\n",
        r.resource,
        r.holder,
        r.token,
        state(&r),
        time(r.expires_at),
        time(r.acquired_at),
        time(r.renewed_at),
    ));
    Ok(())
}

/// What a change of the watched lease was.
fn change(before: Option<&LeaseRecord>, now: &LeaseRecord) -> Option<&'static str> {
    let Some(before) = before else {
        return Some("now");
    };
    if before.token != now.token {
        Some("new term")
    } else if before.holder != now.holder {
        Some("new holder")
    } else if before.live && !now.live {
        Some("ended")
    } else if !before.live && now.live {
        Some("live again")
    } else {
        None
    }
}

fn watch_line(elapsed: Duration, what: &str, r: &LeaseRecord, json: bool) -> String {
    if json {
        let mut value = record_json(r);
        if let Some(obj) = value.as_object_mut() {
            obj.insert(
                "elapsed_ms".to_owned(),
                json!(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)),
            );
            obj.insert("change".to_owned(), json!(what));
        }
        return format!("{value}\n");
    }
    let left = if r.live {
        format!("live, {} left", human(r.remaining))
    } else {
        "expired".to_owned()
    };
    format!(
        "[{:>8.2}s] {}  holder {}  token {}  {left}  ({what})\n",
        elapsed.as_secs_f64(),
        r.resource,
        r.holder,
        r.token
    )
}

async fn watch(
    ctx: &Ctx,
    resource: &str,
    interval: Duration,
    max_changes: Option<u64>,
    run_for: Option<Duration>,
    json: bool,
) -> Outcome {
    let start = Instant::now();
    let until = run_for.map(|d| start + d);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut last: Option<LeaseRecord> = None;
    let mut changes: u64 = 0;
    loop {
        match ctx.store.current(resource).await {
            Ok(Some(now)) => {
                if let Some(what) = change(last.as_ref(), &now) {
                    if !emit(&watch_line(start.elapsed(), what, &now, json)) {
                        return Ok(());
                    }
                    if last.is_some() {
                        changes += 1;
                    }
                    last = Some(now);
                    if max_changes.is_some_and(|max| changes >= max) {
                        return Ok(());
                    }
                }
            }
            Ok(None) if last.is_none() => return Err(unknown_resource(ctx, resource).await),
            Ok(None) => {
                return Err(Failure::new(
                    exit::UNKNOWN_RESOURCE,
                    format!("the lease row of {resource:?} was deleted"),
                ))
            }
            Err(err) if err.is_retryable() => {
                eprintln!("warning: {} (still watching)", chain(&err));
            }
            Err(err) => return Err(store_failure(ctx, err)),
        }
        let next = Instant::now() + interval;
        let wake = until.map_or(next, |u| u.min(next));
        tokio::select! {
            _ = &mut ctrl_c => return Err(Failure::new(exit::INTERRUPTED, "")),
            () = tokio::time::sleep_until(wake) => {}
        }
        if until.is_some_and(|u| Instant::now() >= u) {
            return Ok(());
        }
    }
}

async fn release(ctx: &Ctx, resource: &str, holder: &str) -> Outcome {
    let released = ctx
        .store
        .release(resource, holder)
        .await
        .map_err(|e| store_failure(ctx, e))?;
    let r = read(ctx, resource).await?;
    if released {
        emit(&format!(
            "released {resource:?}: {holder}'s lease (token {}) ended; the next candidate to ask \
             takes over with token {}\n",
            r.token,
            r.token.get().saturating_add(1)
        ));
        return Ok(());
    }
    let why = if r.live && r.holder != holder {
        format!(
            "{resource:?} is held by {:?} (token {}, {} left), not by {holder:?}",
            r.holder,
            r.token,
            human(r.remaining)
        )
    } else {
        format!(
            "the lease of {resource:?} already ended (last holder {:?}, token {})",
            r.holder, r.token
        )
    };
    Err(Failure::new(
        exit::NOTHING_CHANGED,
        format!("nothing released: {why}"),
    ))
}

async fn revoke(ctx: &Ctx, resource: &str, yes: bool) -> Outcome {
    let before = read(ctx, resource).await?;
    if !before.live {
        emit(&format!(
            "nothing to revoke: the lease of {resource:?} already ended (last holder {:?}, token {})\n",
            before.holder, before.token
        ));
        return Ok(());
    }
    if !yes && !confirm(resource, &before) {
        return Err(Failure::new(
            exit::NOTHING_CHANGED,
            "not revoked: no confirmation (answer y, or pass --yes)",
        ));
    }
    match ctx.store.revoke(resource).await {
        Ok(Some(r)) if r.live => {
            emit(&format!(
                "revoked {resource:?}: the lease of {:?} (token {}, {} left) has ended; the next \
                 candidate to ask takes over with token {}\n",
                r.holder,
                r.token,
                human(r.remaining),
                r.token.get().saturating_add(1)
            ));
            Ok(())
        }
        Ok(Some(r)) => {
            emit(&format!(
                "nothing to revoke: the lease of {resource:?} ended meanwhile (last holder {:?}, token {})\n",
                r.holder, r.token
            ));
            Ok(())
        }
        Ok(None) => Err(unknown_resource(ctx, resource).await),
        Err(err) => Err(store_failure(ctx, err)),
    }
}

/// Asks on stderr, reads one line from stdin: only `y` or `yes` confirms.
fn confirm(resource: &str, r: &LeaseRecord) -> bool {
    eprint!(
        "revoke the lease of {resource:?} held by {:?} (token {}, {} left)? The next candidate to \
         ask takes over with token {}. The holder is not told: it may act as leader until its \
         next renew; only fenced writes stop at once. [y/N] ",
        r.holder,
        r.token,
        human(r.remaining),
        r.token.get().saturating_add(1)
    );
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let stdin = std::io::stdin();
    let read = stdin.read_line(&mut answer);
    if !std::io::IsTerminal::is_terminal(&stdin) {
        // The answer came from a pipe and was not echoed: end the prompt's line.
        eprintln!();
    }
    match read {
        Ok(_) => matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes"),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn migration_hint_names_the_table_and_the_driver() {
        let default = super::migration_hint("orionbeacon_leases", "postgres://app@db/app");
        assert!(
            default.contains("orion-beacon-migration up -u postgres://app@db/app"),
            "{default}"
        );
        assert!(
            default.contains("--features cli,sqlx-postgres"),
            "{default}"
        );
        let custom = super::migration_hint("shard_leases", "mysql://app@db/app");
        assert!(
            custom.contains("CreateLeaseTable::with_table(\"shard_leases\")"),
            "{custom}"
        );
        assert!(!custom.contains("orion-beacon-migration up"), "{custom}");
    }

    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("3m"), Ok(Duration::from_secs(180)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "s", "2x", "-1s", "1e400s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert_eq!(human(Duration::from_millis(14_998)), "14.998s");
        assert_eq!(human(Duration::from_secs(185)), "3m05s");
        assert_eq!(human(Duration::from_secs(7380)), "2h03m");
        assert_eq!(human(Duration::from_secs(2 * 86_400 + 7200)), "2d02h");
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/app"),
            "postgres://app:***@db:5432/app"
        );
        assert_eq!(redact("postgres://app@db/app"), "postgres://app@db/app");
        assert_eq!(redact("sqlite:///tmp/a.db"), "sqlite:///tmp/a.db");
        assert_eq!(
            redact("mysql://root:p@ss@host/x"),
            "mysql://root:***@host/x"
        );
        // Characters a URL parser refuses or reads otherwise, unencoded in the password.
        for (url, shown) in [
            ("postgres://app:p#ss@db/app", "postgres://app:***@db/app"),
            ("postgres://app:123#x@db/app", "postgres://app:***@db/app"),
            ("postgres://app:a/b?c@db/app", "postgres://app:***@db/app"),
            (
                "postgres://app@db/app?password=s3cret&sslmode=require",
                "postgres://app@db/app?password=***&sslmode=require",
            ),
            (
                "postgres://app@db/app?pass%77ord=hunter2",
                "postgres://app@db/app?password=***",
            ),
            (
                "postgres://app@db/app?PASSWORD=hunter2",
                "postgres://app@db/app?PASSWORD=***",
            ),
            (
                "postgres://db:5432/app?application_name=a@b",
                "postgres://db:5432/app?application_name=a%40b",
            ),
        ] {
            assert_eq!(redact(url), shown, "{url}");
        }
        // Error texts quoting the URL or the password lose both.
        let url = "mysql://root:hunter2@db/x";
        let said = scrub(
            &format!("connection string '{url}' has no driver; hunter2"),
            url,
        );
        assert!(!said.contains("hunter2"), "{said}");
    }

    #[test]
    fn cli_shape() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
