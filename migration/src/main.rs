//! `orion-beacon-migration`: orion-beacon's tables without an application `Migrator`, with the
//! options of `sea-orm-cli migrate` (`-u URL` or `DATABASE_URL`, `-s SCHEMA`, `-v`):
//!
//! `up [-n N]`, `down [-n N]` (default one step) and `status` run our own migrator, tracked in
//! `seaql_migrations_orionbeacon`; `down` checks every step's refusal before it rolls anything
//! back. An application `Migrator` that later carries `CreateLeaseTable` takes the tables over
//! by itself (its `up` moves the record; the rows stay).
//!
//! `fresh`, `refresh` and `reset` are refused: they drop every table of the database (or undo
//! every migration), and these tables live in the application's database.
#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};
use orion_beacon_migration::{check_down, Migrator, MigratorTrait};
use sea_orm_migration::sea_orm::{ConnectOptions, Database};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(version, about = "orion-beacon's tables: up, down, status")]
struct Cli {
    /// Show debug messages.
    #[arg(short = 'v', long, global = true)]
    verbose: bool,
    /// Database schema (PostgreSQL; default `public`).
    #[arg(short = 's', long, global = true, env = "DATABASE_SCHEMA")]
    database_schema: Option<String>,
    /// Database URL.
    #[arg(short = 'u', long, global = true, env = "DATABASE_URL")]
    database_url: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Apply pending migrations (the default).
    Up {
        /// Number of pending migrations to apply.
        #[arg(short, long)]
        num: Option<u32>,
    },
    /// Roll back applied migrations, after checking that none of them would be refused.
    Down {
        /// Number of applied migrations to roll back.
        #[arg(short, long, default_value = "1")]
        num: u32,
    },
    /// Show which migrations are applied.
    Status,
    // sea-orm-cli's commands that act on more than these migrations: refused, with why.
    #[command(hide = true)]
    Fresh,
    #[command(hide = true)]
    Refresh,
    #[command(hide = true)]
    Reset,
    #[command(hide = true)]
    Init,
    #[command(hide = true)]
    Generate,
}

#[tokio::main]
async fn main() {
    dotenvy::dotenv().ok();
    let cli = Cli::parse();
    let filter = if cli.verbose {
        "debug"
    } else {
        "sea_orm_migration=info"
    };
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .without_time()
        .with_target(false)
        .with_level(false)
        .init();
    if let Err(message) = run(cli).await {
        eprintln!("{message}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    let command = cli.command.unwrap_or(Command::Up { num: None });
    if let Some(name) = refused(&command) {
        return Err(format!(
            "orion-beacon-migration: `{name}` is not offered. orion-beacon's tables live in \
             your application's database, where `fresh`, `refresh` and `reset` would drop or \
             undo your own tables and migrations too. Use `up`, `down` or `status` here, and \
             your application's migrator for the rest."
        ));
    }
    let Some(url) = cli.database_url else {
        return Err("no database: pass -u URL or set DATABASE_URL".to_owned());
    };
    let mut options = ConnectOptions::new(url);
    options
        .set_schema_search_path(cli.database_schema.unwrap_or_else(|| "public".to_owned()))
        .sqlx_logging(cli.verbose);
    let db = Database::connect(options)
        .await
        .map_err(|e| format!("cannot connect to the database: {e}"))?;
    let done = match command {
        Command::Up { num } => Migrator::up(&db, num).await,
        Command::Down { num } => match check_down::<Migrator, _>(&db, Some(num)).await {
            Ok(()) => Migrator::down(&db, Some(num)).await,
            Err(refused) => Err(refused),
        },
        Command::Status => Migrator::status(&db).await,
        Command::Fresh | Command::Refresh | Command::Reset | Command::Init | Command::Generate => {
            Ok(())
        } // refused above
    };
    done.map_err(|e| e.to_string())
}

/// The name of a refused command.
fn refused(command: &Command) -> Option<&'static str> {
    match command {
        Command::Fresh => Some("fresh"),
        Command::Refresh => Some("refresh"),
        Command::Reset => Some("reset"),
        Command::Init => Some("init"),
        Command::Generate => Some("generate"),
        _ => None,
    }
}
