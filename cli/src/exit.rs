//! Why a command failed, and the one function that turns that into the process's exit code.

use orion_beacon::{BackendError, ErrorKind, StoreError};
use sea_orm::DbErr;

const OTHER: u8 = 1;
/// Also the fallback for a usage error whose code clap reports out of range.
pub const BAD_INPUT: u8 = 2;
const UNREACHABLE: u8 = 3;
const MISSING_TABLE: u8 = 4;
const UNKNOWN_RESOURCE: u8 = 5;
const NOTHING_CHANGED: u8 = 6;
const STALE: u8 = 7;
/// Interrupted (Ctrl-C), as shells report a SIGINT: 128 + 2.
const INTERRUPTED: u8 = 130;

/// A failed command; its message is printed as `error: ...`.
#[derive(Debug)]
pub enum CliError {
    /// An argument was refused: a name, a flag combination, a URL this build cannot use.
    BadInput(String),
    /// The database could not be opened.
    Unreachable(String),
    /// A store call failed; `message` is its text for the operator (URL scrubbed, hints added).
    /// Boxed: a `StoreError` would make every `Result` of the CLI large.
    Store {
        source: Box<StoreError>,
        message: String,
    },
    /// The resource has no lease row.
    UnknownResource(String),
    /// The command did nothing: a release refused, a revoke not confirmed.
    NothingChanged(String),
    /// `jobs check` found a job with no slot finished recently enough; what it printed says
    /// which.
    Stale(String),
    /// Ctrl-C while watching; nothing more to say.
    Interrupted,
    /// Anything else (the async runtime would not start).
    Other(String),
}

impl CliError {
    /// What follows `error: `; empty when nothing is printed.
    pub fn message(&self) -> &str {
        match self {
            Self::BadInput(message)
            | Self::Unreachable(message)
            | Self::Store { message, .. }
            | Self::UnknownResource(message)
            | Self::NothingChanged(message)
            | Self::Stale(message)
            | Self::Other(message) => message,
            Self::Interrupted => "",
        }
    }
}

/// What a command returns.
pub type Outcome = Result<(), CliError>;

/// The exit code of a failure, one per kind so scripts can tell them apart (documented in
/// `--help`): the only place that picks one.
pub fn exit_code(err: &CliError) -> u8 {
    match err {
        CliError::BadInput(_) => BAD_INPUT,
        CliError::Unreachable(_) => UNREACHABLE,
        CliError::Store { source, .. } => match source.kind() {
            ErrorKind::MissingTable => MISSING_TABLE,
            ErrorKind::InvalidInput | ErrorKind::Unsupported => BAD_INPUT,
            _ if unreachable(source) => UNREACHABLE,
            _ => OTHER,
        },
        CliError::UnknownResource(_) => UNKNOWN_RESOURCE,
        CliError::NothingChanged(_) => NOTHING_CHANGED,
        CliError::Stale(_) => STALE,
        CliError::Interrupted => INTERRUPTED,
        CliError::Other(_) => OTHER,
    }
}

/// Whether a store error says the database could not be reached at all (no connection).
pub fn unreachable(err: &StoreError) -> bool {
    matches!(
        err,
        StoreError::Database(BackendError::SeaOrm(
            DbErr::Conn(_) | DbErr::ConnectionAcquire(_)
        ))
    )
}

/// An error and its sources on one line.
pub fn chain(err: &dyn std::error::Error) -> String {
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
