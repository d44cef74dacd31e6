//! The ranked-election check (`ranked-*` configurations): candidate `cN` (and each of its
//! replacements `cN-rM`) has rank N. Whenever one candidate has been the highest-ranked
//! healthy one (alive, and neither paused nor cut off) for the handover's bound, and no fault
//! has begun for the lapse's bound plus that, it must be the one that leads. That there are
//! never two leaders, and that tokens rise, is the elector check's (`checker.rs`).

use std::time::Duration;

use super::checker::{Fault, Interval};
use super::{LEASE, RENEW, RETRY, TAKEOVER_BOUND};

/// How long a higher-ranked candidate must be live before the leader hands over to it.
pub const PREFER_AFTER: Duration = Duration::from_millis(400);
/// Slack for a loaded 2-core machine on top of the protocol's own bound.
const MARGIN: Duration = Duration::from_millis(700);
/// The least checked time for the run to count (else the faults left no quiet spell).
const LEAST_CHECKED: Duration = Duration::from_secs(2);
/// Short stretches without the top candidate leading, tolerated per run (renews held up).
const MOST_SHORT: usize = 3;
/// How finely the run is looked at.
const STEP_NS: u64 = 10_000_000;

/// The rank of candidate `name`: its number.
pub fn rank_of(name: &str) -> i64 {
    name.trim_start_matches('c')
        .split("-r")
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(-1)
}

/// From the top candidate's becoming it to its leading: its candidacy live for `prefer_after`
/// (a heartbeat first), the leader's next look (a renew interval), the leader work's grace
/// (200 ms), the offer taken at the successor's next attempt (the offer window: two retry
/// intervals with jitter), and the margin.
pub fn handover_bound() -> Duration {
    PREFER_AFTER + RENEW + Duration::from_millis(200) + RETRY.mul_f64(2.2) + MARGIN
}

/// After a fault on the leader: its lease lapses (or its stalled session is ended) before
/// anyone leads again.
pub fn lapse_bound() -> Duration {
    LEASE + RETRY + TAKEOVER_BOUND
}

/// One process of a candidate: its name, when it started and when it was killed.
#[derive(Debug, Clone)]
pub struct Incarnation {
    pub name: String,
    pub start: u64,
    pub killed: Option<u64>,
}

/// What the check found.
#[derive(Debug, Default)]
pub struct RankVerdict {
    pub checked_ns: u64,
    pub violations: Vec<String>,
}

/// Checks `intervals` (believed leaderships) between `from` and `to` (ns).
pub fn check(
    intervals: &[Interval],
    faults: &[Fault],
    incarnations: &[Incarnation],
    from: u64,
    to: u64,
) -> RankVerdict {
    let handover = handover_bound().as_nanos() as u64;
    let lapse = lapse_bound().as_nanos() as u64;
    let healthy = |rank: i64, t: u64| {
        incarnations
            .iter()
            .any(|i| rank_of(&i.name) == rank && i.start <= t && i.killed.is_none_or(|k| t < k))
            && !faults.iter().any(|f| {
                f.candidate.as_deref().is_some_and(|c| rank_of(c) == rank)
                    && f.start <= t
                    && t <= f.end
            })
    };
    let ranks: Vec<i64> = {
        let mut r: Vec<i64> = incarnations.iter().map(|i| rank_of(&i.name)).collect();
        r.sort_unstable();
        r.dedup();
        r
    };
    let top_at = |t: u64| ranks.iter().rev().copied().find(|&r| healthy(r, t));
    let leader_at = |t: u64| {
        intervals
            .iter()
            .find(|i| i.start <= t && t < i.end)
            .map(|i| i.candidate.clone())
    };
    let mut verdict = RankVerdict::default();
    // The current top candidate and since when; the latest fault begun (a server-wide one's
    // end counts too: everyone was cut off until then).
    let mut top: Option<(i64, u64)> = None;
    let mut wrong_since: Option<(u64, Option<String>, i64)> = None;
    // A stretch no longer than a handover is a term lost and given back (a renew held up on a
    // loaded machine), not a leader left in place; but only a few of them: more would be
    // leadership moving away from the top and back again.
    let mut short = 0usize;
    let mut report = |verdict: &mut RankVerdict, at: u64, until: u64, who: Option<String>, want| {
        if until - at <= handover {
            short += 1;
            if short == MOST_SHORT + 1 {
                verdict.violations.push(format!(
                    "the highest-ranked healthy candidate lost the lead more than {MOST_SHORT} \
                     times for less than a handover (the last from {at} ns): leadership moves \
                     away from the top and back"
                ));
            }
        }
        if until - at > handover {
            verdict.violations.push(format!(
                "c{want} (the highest-ranked healthy candidate) did not lead for {:.0} ms from \
                 {at} ns (leader: {who:?})",
                (until - at) as f64 / 1e6
            ));
        }
    };
    let mut t = from;
    while t < to {
        let now_top = top_at(t);
        top = match (top, now_top) {
            (Some((r, since)), Some(n)) if r == n => Some((r, since)),
            (_, Some(n)) => Some((n, t)),
            (_, None) => None,
        };
        let last_fault = faults
            .iter()
            .filter(|f| f.start <= t)
            .map(|f| {
                if f.candidate.is_none() {
                    f.end.max(f.start)
                } else {
                    f.start
                }
            })
            .max();
        let settled = |since: u64| {
            t >= since + handover && last_fault.is_none_or(|f| t >= f + lapse + handover)
        };
        match top {
            Some((rank, since)) if settled(since) => {
                verdict.checked_ns += STEP_NS;
                let leader = leader_at(t);
                if leader.as_deref().map(rank_of) == Some(rank) {
                    if let Some((at, who, want)) = wrong_since.take() {
                        report(&mut verdict, at, t, who, want);
                    }
                } else if wrong_since.is_none() {
                    wrong_since = Some((t, leader, rank));
                }
            }
            _ => {
                if let Some((at, who, want)) = wrong_since.take() {
                    report(&mut verdict, at, t, who, want);
                }
            }
        }
        t += STEP_NS;
    }
    if let Some((at, who, want)) = wrong_since {
        report(&mut verdict, at, to, who, want);
    }
    if verdict.checked_ns < LEAST_CHECKED.as_nanos() as u64 {
        verdict.violations.push(format!(
            "the ranked check covered only {} ms of the run (at least {LEAST_CHECKED:?} \
             expected): the faults left no quiet spell",
            verdict.checked_ns / 1_000_000
        ));
    }
    verdict
}
