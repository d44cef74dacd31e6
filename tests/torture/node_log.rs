//! Each candidate's and node's own log (the crate's `tracing` events at info and above), one
//! line per event stamped with the histories' monotonic nanoseconds, in `<history>.log`: a
//! failed run prints the lines around its first unexplained leaderless stretch, so a failure
//! seen once (in CI, say) says what the nodes were doing.

use std::fmt;
use std::path::{Path, PathBuf};

use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;

use crate::clock::mono_ns;

/// The `CLOCK_MONOTONIC` nanoseconds of the histories.
struct Mono;

impl FormatTime for Mono {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        write!(w, "{}", mono_ns())
    }
}

/// Where the process with history `history` logs.
pub fn path(history: &Path) -> PathBuf {
    let mut name = history.as_os_str().to_owned();
    name.push(".log");
    PathBuf::from(name)
}

/// Sends this process's `tracing` events to [`path`]`(history)`; nothing if it cannot.
pub fn install(history: &Path) {
    let Ok(file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path(history))
    else {
        return;
    };
    let _ = tracing_subscriber::fmt()
        .with_writer(std::sync::Mutex::new(file))
        .with_ansi(false)
        .with_timer(Mono)
        .with_env_filter(tracing_subscriber::EnvFilter::new("orion_beacon=info"))
        .try_init();
}

/// The lines of `logs` (per process: its name and log file) stamped within `from..=to` that
/// mention `resource` or are warnings or errors, the first `limit` in time order.
pub fn around(
    logs: &[(String, PathBuf)],
    resource: &str,
    from: u64,
    to: u64,
    limit: usize,
) -> Vec<String> {
    let mut lines: Vec<(u64, String)> = Vec::new();
    for (name, file) in logs {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for l in text.lines() {
            let Some((at, rest)) = l.split_once(' ') else {
                continue;
            };
            let Ok(at) = at.parse::<u64>() else {
                continue;
            };
            let named = rest.contains(&format!("resource={resource} "))
                || rest.ends_with(&format!("resource={resource}"));
            let loud =
                rest.trim_start().starts_with("WARN") || rest.trim_start().starts_with("ERROR");
            if (from..=to).contains(&at) && (named || loud) {
                lines.push((at, format!("{name} {at} {}", rest.trim_start())));
            }
        }
    }
    lines.sort();
    lines.into_iter().take(limit).map(|(_, l)| l).collect()
}
