//! A picture of a torture run: one lane per candidate with the terms it believed it held, the
//! faults as shaded bands, and every stretch where two candidates believed they led in red.

use svg::node::element::{Group, Line, Rectangle, Text, Title};
use svg::Document;

use crate::checker::{Fault, Interval, Record};

const WIDTH: f64 = 1400.0;
const LEFT: f64 = 90.0;
const LANE: f64 = 22.0;
const TOP: f64 = 40.0;

/// The run as an SVG document: `label` on top, times in seconds from `start` (ns).
pub fn render(record: &Record, label: &str, start: u64) -> String {
    let end = record.end.max(start + 1);
    let x = |ns: u64| {
        LEFT + (ns.saturating_sub(start)) as f64 / (end - start) as f64 * (WIDTH - LEFT - 10.0)
    };
    let mut lanes: Vec<&str> = record
        .intervals
        .iter()
        .map(|i| i.candidate.as_str())
        .collect();
    lanes.extend(record.faults.iter().filter_map(|f| f.candidate.as_deref()));
    lanes.sort_unstable();
    lanes.dedup();
    let lane = |name: &str| lanes.iter().position(|l| *l == name).unwrap_or(0);
    let height = TOP + LANE * lanes.len() as f64 + 40.0;

    let mut doc = Document::new()
        .set("viewBox", (0, 0, WIDTH, height))
        .set("width", WIDTH)
        .set("height", height)
        .set("font-family", "sans-serif")
        .set("font-size", 11)
        .add(
            Text::new(format!(
                "{label}: who believed it led, per candidate (faults shaded, two leaders in red)"
            ))
            .set("x", 8)
            .set("y", 16)
            .set("font-size", 13),
        );
    // Time axis: a tick every 5 s.
    let seconds = (end - start) / 1_000_000_000;
    for s in (0..=seconds).step_by(5) {
        let at = x(start + s * 1_000_000_000);
        doc = doc
            .add(
                Line::new()
                    .set("x1", at)
                    .set("x2", at)
                    .set("y1", TOP - 6.0)
                    .set("y2", height - 30.0)
                    .set("stroke", "#ddd"),
            )
            .add(
                Text::new(format!("{s}s"))
                    .set("x", at)
                    .set("y", height - 16.0)
                    .set("text-anchor", "middle")
                    .set("fill", "#666"),
            );
    }
    for (i, name) in lanes.iter().enumerate() {
        doc = doc.add(
            Text::new(*name)
                .set("x", 8)
                .set("y", TOP + LANE * i as f64 + 15.0),
        );
    }
    for fault in &record.faults {
        doc = doc.add(fault_band(fault, &x, &lane, lanes.len()));
    }
    for interval in &record.intervals {
        let end_ns = if interval.end == u64::MAX {
            record.end
        } else {
            interval.end
        };
        let y = TOP + LANE * lane(&interval.candidate) as f64 + 3.0;
        doc = doc.add(
            Group::new()
                .add(Title::new(format!(
                    "{} token {}: {:.3}s to {:.3}s",
                    interval.candidate,
                    interval.token,
                    secs(interval.start, start),
                    secs(end_ns, start)
                )))
                .add(
                    Rectangle::new()
                        .set("x", x(interval.start))
                        .set("y", y)
                        .set("width", (x(end_ns) - x(interval.start)).max(1.0))
                        .set("height", LANE - 6.0)
                        .set("fill", color(interval.token)),
                ),
        );
    }
    for (from, to) in overlaps(&record.intervals, record.end) {
        doc = doc.add(
            Group::new()
                .add(Title::new(format!(
                    "two leaders from {:.3}s to {:.3}s",
                    secs(from, start),
                    secs(to, start)
                )))
                .add(
                    Rectangle::new()
                        .set("x", x(from))
                        .set("y", TOP - 4.0)
                        .set("width", (x(to) - x(from)).max(2.0))
                        .set("height", LANE * lanes.len() as f64 + 4.0)
                        .set("fill", "red")
                        .set("fill-opacity", 0.45),
                ),
        );
    }
    doc.to_string()
}

fn secs(ns: u64, start: u64) -> f64 {
    ns.saturating_sub(start) as f64 / 1e9
}

/// A fault as a shaded band: over its candidate's lane, or every lane for a server fault.
fn fault_band(
    fault: &Fault,
    x: &dyn Fn(u64) -> f64,
    lane: &dyn Fn(&str) -> usize,
    lanes: usize,
) -> Group {
    let (y, h) = match fault.candidate.as_deref() {
        Some(c) => (TOP + LANE * lane(c) as f64, LANE),
        None => (TOP, LANE * lanes as f64),
    };
    let color = match fault.kind.as_str() {
        "kill" => "#555",
        "pause" => "#e0a000",
        "partition" => "#b03060",
        "connkill" => "#7a5cff",
        _ => "#1f77b4",
    };
    Group::new()
        .add(Title::new(fault.kind.clone()))
        .add(
            Rectangle::new()
                .set("x", x(fault.start))
                .set("y", y)
                .set("width", (x(fault.end) - x(fault.start)).max(2.0))
                .set("height", h)
                .set("fill", color)
                .set("fill-opacity", 0.25),
        )
        .add(
            Text::new(fault.kind.clone())
                .set("x", x(fault.start) + 2.0)
                .set("y", y - 2.0)
                .set("fill", color)
                .set("font-size", 9),
        )
}

/// A color per token, so consecutive terms are told apart.
fn color(token: i64) -> &'static str {
    const PALETTE: [&str; 6] = [
        "#2ca02c", "#17becf", "#9467bd", "#8c564b", "#bcbd22", "#1f77b4",
    ];
    PALETTE[token.rem_euclid(PALETTE.len() as i64) as usize]
}

/// Stretches where two different candidates' believed terms overlap.
fn overlaps(intervals: &[Interval], run_end: u64) -> Vec<(u64, u64)> {
    let mut sorted: Vec<&Interval> = intervals.iter().collect();
    sorted.sort_by_key(|i| i.start);
    let end = |i: &Interval| if i.end == u64::MAX { run_end } else { i.end };
    let mut found = Vec::new();
    for (n, a) in sorted.iter().enumerate() {
        for b in &sorted[n + 1..] {
            if b.start >= end(a) {
                break;
            }
            if a.candidate != b.candidate {
                found.push((b.start, end(a).min(end(b))));
            }
        }
    }
    found
}
