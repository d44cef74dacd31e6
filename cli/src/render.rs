//! How leases are printed: the table (comfy-table), the JSON form (serde_json), durations and
//! times as operators read them, and writing to stdout.

use std::io::Write as _;
use std::time::Duration;

use chrono::{DateTime, Utc};
use orion_beacon::LeaseRecord;

/// Columns two spaces apart, `right` ones right-aligned (numbers), widths counted in
/// terminal columns (wide characters take two), no trailing spaces.
pub fn table(
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

/// A duration as an operator reads it: `14.998s`, `3m05s`, `2h03m`, `4d02h`.
pub fn human(d: Duration) -> String {
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

pub fn time(t: Option<DateTime<Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S%.3f").to_string())
        .unwrap_or_else(|| "-".to_owned())
}

pub fn state(r: &LeaseRecord) -> &'static str {
    if r.live {
        "live"
    } else {
        "expired"
    }
}

pub fn left(r: &LeaseRecord) -> String {
    if r.live {
        human(r.remaining)
    } else {
        "-".to_owned()
    }
}

/// A lease's payload on one line of a terminal (control characters escaped, nothing else), or
/// `-`.
pub fn payload(r: &LeaseRecord) -> String {
    match &r.payload {
        Some(p) => one_line(p),
        None => "-".to_owned(),
    }
}

/// Text from the database on one line of a terminal: control characters escaped, nothing else.
pub fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The record as JSON: its `serde` form (times RFC 3339, `remaining_ms`).
pub fn record_json(r: &LeaseRecord) -> serde_json::Value {
    serde_json::to_value(r).unwrap_or(serde_json::Value::Null)
}

/// Writes to stdout; false once stdout is gone (a closed pipe), which ends the command quietly.
pub fn emit(text: &str) -> bool {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations() {
        assert_eq!(human(Duration::from_millis(14_998)), "14.998s");
        assert_eq!(human(Duration::from_secs(185)), "3m05s");
        assert_eq!(human(Duration::from_secs(7380)), "2h03m");
        assert_eq!(human(Duration::from_secs(2 * 86_400 + 7200)), "2d02h");
    }
}
