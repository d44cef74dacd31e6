//! Clock skew through libfaketime: where the library is, and whether a skewed candidate's
//! wall clock really moved.

use crate::clock::mono_ns;

/// Whether a skewed candidate's wall clock really ran at `offset` (e.g. `-3h`): its history's
/// `start` line has its monotonic and wall-clock times; ours, read now, give the true offset
/// between the two clocks. `None` if it did, else what is wrong.
pub fn skew_problem(history: &str, offset: &str) -> Option<String> {
    let start = history.lines().find(|l| l.starts_with("start "))?;
    let parts: Vec<&str> = start.split_whitespace().collect();
    let (mono, wall): (u64, u128) = match (parts.get(2)?.parse(), parts.get(3)?.parse()) {
        (Ok(m), Ok(w)) => (m, w),
        _ => return Some(format!("unreadable start line {start:?}")),
    };
    let unit = |c: char| match c {
        'h' => Some(3_600_000i128),
        'm' => Some(60_000),
        's' => Some(1_000),
        'd' => Some(86_400_000),
        _ => None,
    };
    let expected_ms = offset
        .strip_suffix(|c: char| c.is_ascii_alphabetic())
        .and_then(|n| n.parse::<i128>().ok())
        .zip(offset.chars().last().and_then(unit))
        .map(|(n, u)| n * u)?;
    let now_wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_millis() as i128;
    let now_mono = mono_ns() as i128;
    // Our wall clock at the candidate's start instant.
    let true_wall = now_wall - (now_mono - mono as i128) / 1_000_000;
    let seen = wall as i128 - true_wall;
    if (seen - expected_ms).abs() > 5_000 {
        Some(format!(
            "its wall clock was {seen} ms off, not {offset} ({expected_ms} ms): libfaketime did not take effect"
        ))
    } else {
        None
    }
}

/// libfaketime, from Debian's `faketime` package (or `ORION_TORTURE_FAKETIME_LIB`).
pub fn faketime_lib() -> Option<String> {
    if let Ok(path) = std::env::var("ORION_TORTURE_FAKETIME_LIB") {
        return Some(path);
    }
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
    ]
    .iter()
    .find(|p| std::path::Path::new(p).exists())
    .map(|p| p.to_string())
}
