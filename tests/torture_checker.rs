//! The torture checker must be able to fail: synthetic histories with an overlap, a reused
//! token, a stale ledger write, a missed recovery, a paused leader nobody replaced and an
//! unexplained leaderless stretch are each caught; a clean one passes.

#[path = "torture/checker.rs"]
mod checker;

use checker::{check, Fault, LedgerRow, Record};

const MS: u64 = 1_000_000;
const BOUND: u64 = 1_000 * MS;

fn clean() -> Record {
    let mut r = Record {
        end: 10_000 * MS,
        quiesce: 5_000 * MS,
        ..Record::default()
    };
    r.add_history("start a 0 0\nlead 1 100000000\nwrite 1 1 150000000\nlost 1 900000000 950000000 deadline\nstop 9000000000\n", None)
        .unwrap();
    r.add_history("start b 0 0\nlead 2 1000000000\nwrite 2 1 1100000000\nlost 2 5000000000 5400000000 shutdown\n", None).unwrap();
    r.ledger = vec![
        LedgerRow {
            id: 1,
            token: 1,
            candidate: "a".into(),
            seq: 1,
        },
        LedgerRow {
            id: 2,
            token: 2,
            candidate: "b".into(),
            seq: 1,
        },
    ];
    r.faults = vec![Fault {
        kind: "kill".into(),
        candidate: Some("a".into()),
        start: 900 * MS,
        end: 900 * MS,
    }];
    r
}

#[test]
fn a_clean_history_passes() {
    let v = check(&clean(), BOUND);
    assert!(v.violations.is_empty(), "{:?}", v.violations);
    assert_eq!(v.terms, 2);
    assert_eq!(v.worst_recovery_ns, 100 * MS);
}

#[test]
fn overlapping_leaders_are_caught() {
    let mut r = clean();
    // c believes it leads (token 3) while b still does.
    r.add_history(
        "start c 0 0\nlead 3 2000000000\nlost 3 2500000000 2600000000 denied\n",
        None,
    )
    .unwrap();
    let v = check(&r, BOUND);
    assert!(
        v.violations.iter().any(|m| m.starts_with("overlap")),
        "{:?}",
        v.violations
    );
}

#[test]
fn a_paused_leader_is_bounded_by_its_deadline_not_its_wake_up() {
    let mut r = Record {
        end: 10_000 * MS,
        ..Record::default()
    };
    // a was paused from 0.2 s to 3 s; its deadline was 0.45 s; b led from 0.6 s.
    r.add_history(
        "start a 0 0\nlead 1 100000000\nlost 1 3000000000 450000000 deadline\n",
        None,
    )
    .unwrap();
    r.add_history("start b 0 0\nlead 2 600000000\n", None)
        .unwrap();
    assert!(check(&r, BOUND).violations.is_empty());
    // Had a's deadline been after b's start, that is two leaders.
    let mut bad = Record {
        end: 10_000 * MS,
        ..Record::default()
    };
    bad.add_history(
        "start a 0 0\nlead 1 100000000\nlost 1 3000000000 700000000 deadline\n",
        None,
    )
    .unwrap();
    bad.add_history("start b 0 0\nlead 2 600000000\n", None)
        .unwrap();
    assert!(check(&bad, BOUND)
        .violations
        .iter()
        .any(|m| m.starts_with("overlap")));
}

#[test]
fn a_killed_leader_ends_at_the_kill() {
    let mut r = Record {
        end: 10_000 * MS,
        ..Record::default()
    };
    r.add_history("start a 0 0\nlead 1 100000000\n", Some(500 * MS))
        .unwrap();
    r.add_history("start b 0 0\nlead 2 900000000\n", None)
        .unwrap();
    assert!(check(&r, BOUND).violations.is_empty());
    let mut never_killed = Record {
        end: 10_000 * MS,
        ..Record::default()
    };
    never_killed
        .add_history("start a 0 0\nlead 1 100000000\n", None)
        .unwrap();
    never_killed
        .add_history("start b 0 0\nlead 2 900000000\n", None)
        .unwrap();
    assert!(
        !check(&never_killed, BOUND).violations.is_empty(),
        "an unexplained open term overlaps"
    );
}

#[test]
fn reused_and_backward_tokens_are_caught() {
    let mut r = clean();
    r.add_history(
        "start c 0 0\nlead 2 6000000000\nlost 2 6500000000 6600000000 denied\n",
        None,
    )
    .unwrap();
    let v = check(&r, BOUND);
    assert!(
        v.violations.iter().any(|m| m.contains("reused")),
        "{:?}",
        v.violations
    );
    let mut r = clean();
    r.add_history(
        "start c 0 0\nlead 1 6000000000\nlost 1 6500000000 6600000000 denied\n",
        None,
    )
    .unwrap();
    let v = check(&r, BOUND);
    assert!(
        v.violations.iter().any(|m| m.contains("backwards")),
        "{:?}",
        v.violations
    );
}

#[test]
fn stale_ledger_writes_are_caught() {
    let mut r = clean();
    r.ledger.push(LedgerRow {
        id: 3,
        token: 1,
        candidate: "a".into(),
        seq: 2,
    });
    let v = check(&r, BOUND);
    assert!(
        v.violations.iter().any(|m| m.starts_with("stale write")),
        "{:?}",
        v.violations
    );
    let mut r = clean();
    r.ledger.push(LedgerRow {
        id: 3,
        token: 2,
        candidate: "a".into(),
        seq: 9,
    });
    assert!(check(&r, BOUND)
        .violations
        .iter()
        .any(|m| m.contains("never its term")));
    let mut r = clean();
    r.ledger.push(LedgerRow {
        id: 3,
        token: 2,
        candidate: "b".into(),
        seq: 1,
    });
    assert!(check(&r, BOUND)
        .violations
        .iter()
        .any(|m| m.contains("sequence")));
}

#[test]
fn missed_recovery_is_caught() {
    let mut r = clean();
    r.faults.push(Fault {
        kind: "restart".into(),
        candidate: None,
        start: 5_000 * MS,
        end: 5_500 * MS,
    });
    let v = check(&r, BOUND);
    assert!(
        v.violations.iter().any(|m| m.starts_with("no leader")),
        "{:?}",
        v.violations
    );
}

/// A paused leader still believes it leads until its deadline; what matters is that another
/// candidate takes over. Nobody did here: caught (an interval spanning the pause's end, the
/// paused leader's own, must not count as recovery).
#[test]
fn a_paused_leader_nobody_replaces_is_caught() {
    let history = |r: &mut Record| {
        // a leads from 0.1 s, is paused at 1 s (deadline 1.2 s), wakes at 3 s, leads again.
        r.add_history(
            "start a 0 0\nlead 1 100000000\nlost 1 3000000000 1200000000 deadline\nlead 4 3100000000\n",
            None,
        )
        .unwrap();
        r.faults.push(Fault {
            kind: "pause".into(),
            candidate: Some("a".into()),
            start: 1_000 * MS,
            end: 3_000 * MS,
        });
    };
    let mut alone = Record {
        end: 6_000 * MS,
        ..Record::default()
    };
    history(&mut alone);
    let v = check(&alone, BOUND);
    assert!(
        v.violations
            .iter()
            .any(|m| m.starts_with("no other leader within 1000 ms after pause of a")),
        "{:?}",
        v.violations
    );

    let mut replaced = Record {
        end: 6_000 * MS,
        ..Record::default()
    };
    history(&mut replaced);
    replaced
        .add_history(
            "start b 0 0\nlead 3 1800000000\nlost 3 3050000000 3050000000 denied\n",
            None,
        )
        .unwrap();
    let v = check(&replaced, BOUND);
    assert!(v.violations.is_empty(), "{:?}", v.violations);
    assert_eq!(v.worst_recovery_ns, 800 * MS);
}

/// A leaderless stretch longer than the bound with no fault to explain it is caught; a server
/// restart in it explains it.
#[test]
fn an_unexplained_leaderless_stretch_is_caught() {
    let history = |r: &mut Record| {
        r.add_history(
            "start a 0 0\nlead 1 100000000\nlost 1 900000000 900000000 denied\n",
            None,
        )
        .unwrap();
        r.add_history("start b 0 0\nlead 2 5000000000\n", None)
            .unwrap();
    };
    let mut r = Record {
        end: 8_000 * MS,
        ..Record::default()
    };
    history(&mut r);
    let v = check(&r, BOUND);
    assert!(
        v.violations
            .iter()
            .any(|m| m.starts_with("no leader for 4100 ms from")),
        "{:?}",
        v.violations
    );

    let mut restarted = Record {
        end: 8_000 * MS,
        ..Record::default()
    };
    history(&mut restarted);
    restarted.faults.push(Fault {
        kind: "restart".into(),
        candidate: None,
        start: 1_000 * MS,
        end: 4_500 * MS,
    });
    let v = check(&restarted, BOUND);
    assert!(v.violations.is_empty(), "{:?}", v.violations);

    // The shutdown at the end is not a leaderless stretch.
    let mut stopped = Record {
        end: 8_000 * MS,
        quiesce: 1_500 * MS,
        ..Record::default()
    };
    stopped
        .add_history(
            "start a 0 0\nlead 1 100000000\nlost 1 1600000000 1700000000 shutdown\n",
            None,
        )
        .unwrap();
    assert!(check(&stopped, BOUND).violations.is_empty());
}
