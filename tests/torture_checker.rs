//! The torture checker must be able to fail: synthetic histories with an overlap, a reused
//! token, a term begun again on its candidate's earlier token, a stale ledger write, a missed recovery, a paused leader nobody replaced and an
//! unexplained leaderless stretch are each caught, as are a takeover too late after a stopped
//! term's lapse and a candidate that never answers again after its partition heals; a clean
//! one passes. The same per resource
//! for shard sets: tokens and ledger order are judged per resource (a node's term of a shard
//! begun again on its earlier token is caught), an overlap of one shard's
//! work with its next holder and a stale row of one shard are caught and named, a node over
//! `ceil(N / M) + slack` at a steady point fails, and the recovery figure is measured. The lock
//! runs: safety only, an overlap on a permit still caught, the holds at once counted. A kill
//! inside a server outage is measured from the outage's end, and still caught past the bound.
//! A load job's slot skipped after its previous run ended is caught, unless another run of the
//! job (a retry of an older slot) was under way when the skip was recorded. The rate-limit
//! runs: a permit number given twice, one above the table's count, a span of the
//! interval over the quota and a stretch without permits are each caught; a clean run passes.
//! The ranked runs: a top candidate left out of the lead past the handover bound is caught (a
//! shorter stretch, a term lost and given back, is not), the bound counts from a fault or the
//! candidate's coming back, and a run with no quiet spell fails.

#[path = "torture/checker.rs"]
mod checker;
// Only the records' checks are used here, not the histories' parsing.
#[allow(dead_code)]
#[path = "torture/jobs_checker.rs"]
mod jobs_checker;
#[path = "torture/rank_checker.rs"]
mod rank_checker;
#[path = "torture/rate_checker.rs"]
mod rate_checker;
#[path = "torture/shard_checker.rs"]
mod shard_checker;

use checker::{check, Fault, LedgerRow, Record};

const MS: u64 = 1_000_000;
const BOUND: u64 = 1_000 * MS;

// The torture run's timing (tests/torture/main.rs), which the rank checker's bounds are made
// of.
const LEASE: std::time::Duration = std::time::Duration::from_millis(500);
const RENEW: std::time::Duration = std::time::Duration::from_millis(150);
const RETRY: std::time::Duration = std::time::Duration::from_millis(150);
const TAKEOVER_BOUND: std::time::Duration = std::time::Duration::from_secs(1);

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

/// The elector's old rule: a term lost at its deadline while the lease was still live, then a
/// new term on the `Renewed` lease, with the same token (`term #1 token 1 lost (Deadline) ...
/// elected: term #2 token 1`). Each term of a candidate must have a token above all its earlier
/// terms': fencing by token (`last <= token`) would admit the first term's late writes after
/// the second's. Nothing else is wrong with this history.
#[test]
fn a_term_begun_again_on_an_earlier_token_is_caught() {
    let history = |second: i64| {
        format!(
            "start a 0 0\nlead 1 100000000\nlost 1 900000000 900000000 deadline\n\
             lead {second} 950000000\nlost {second} 1500000000 1600000000 shutdown\nstop 1600000000\n"
        )
    };
    let record = |second: i64| {
        let mut r = Record {
            end: 2_000 * MS,
            quiesce: 1_500 * MS,
            ..Record::default()
        };
        r.add_history(&history(second), None).unwrap();
        r
    };
    let v = check(&record(1), BOUND);
    assert_eq!(
        v.violations,
        ["token not above an earlier term's: a began a term with token 1 at 950000000, after its term with token 1 from 100000000"],
    );
    // With the next token it is fine.
    let v = check(&record(2), BOUND);
    assert!(v.violations.is_empty(), "{:?}", v.violations);
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

mod shards {
    use super::checker::LedgerRow;
    use super::shard_checker::{check, ShardRecord};
    use super::MS;

    const BOUND: u64 = 1_000 * MS;
    const SETTLE: u64 = 500 * MS;

    /// Node a leads shard-0 (token 1) and then shard-1 (token 6); node b leads shard-1 (token 5)
    /// and then shard-0 (token 2): each handover's work returns before the next holder's term.
    const A: &str = "start a 0 0
assign 100000000 1 2 1 0
lead shard-0 1 100000000 1
work shard-0 1 110000000 1
write shard-0 1 1 150000000
lost shard-0 1 900000000 2000000000 handed_over 1
done shard-0 1 950000000 2000000000 1
lead shard-1 6 1000000000 2
work shard-1 6 1000000000 2
write shard-1 6 1 1100000000
lost shard-1 6 5000000000 5400000000 shutdown 2
done shard-1 6 5000000000 5400000000 2
stop 5100000000
";
    const B: &str = "start b 0 0
assign 100000000 1 2 1 0
lead shard-1 5 100000000 1
work shard-1 5 100000000 1
write shard-1 5 1 200000000
lost shard-1 5 900000000 950000000 handed_over 1
done shard-1 5 920000000 950000000 1
lead shard-0 2 1000000000 2
work shard-0 2 1000000000 2
write shard-0 2 1 1200000000
lost shard-0 2 5000000000 5400000000 shutdown 2
done shard-0 2 5000000000 5400000000 2
stop 5100000000
";

    fn row(id: i64, token: i64, candidate: &str, seq: i64) -> LedgerRow {
        LedgerRow {
            id,
            token,
            candidate: candidate.into(),
            seq,
        }
    }

    fn record(a: &str, b: &str) -> ShardRecord {
        let mut r = ShardRecord::new(&["shard-0".to_owned(), "shard-1".to_owned()]);
        r.end = 5_500 * MS;
        r.quiesce = 5_000 * MS;
        r.add_history(a, None).unwrap();
        r.add_history(b, None).unwrap();
        // In commit order the tokens go 1, 5, 6, 2: backwards across resources, in order per
        // resource.
        for (resource, row) in [
            ("shard-0", row(1, 1, "a", 1)),
            ("shard-1", row(2, 5, "b", 1)),
            ("shard-1", row(3, 6, "a", 1)),
            ("shard-0", row(4, 2, "b", 1)),
        ] {
            r.add_ledger_row(resource, row).unwrap();
        }
        r
    }

    #[test]
    fn a_clean_shard_history_passes() {
        let mut r = record(A, B);
        let v = check(&mut r, BOUND, SETTLE, 0);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert_eq!((v.terms, v.led_resources), (4, 2));
        // Steady every 100 ms from 0.6 s (500 ms after the last view change) to the quiesce at
        // 5 s, one shard per node at each (the handovers' gaps fall between the points).
        assert_eq!((v.fairness.samples, v.fairness.all_led), (44, 44));
        assert_eq!(
            (v.fairness.min, v.fairness.max, v.fairness.bound),
            (1, 1, 1)
        );
    }

    #[test]
    fn work_running_on_past_the_next_holders_grant_is_an_overlap() {
        // b's term of shard-0 starts at 0.93 s, while a's handed-over work returns at 0.95 s.
        let b = B.replace("lead shard-0 2 1000000000 2", "lead shard-0 2 930000000 2");
        let mut r = record(A, &b);
        let v = check(&mut r, BOUND, SETTLE, 0);
        assert_eq!(v.failed_resources, 1);
        assert!(
            v.violations.iter().any(|m| m.starts_with(
                "shard-0: overlap: a (token 1) believed it led until 950000000 but b (token 2) led from 930000000"
            )),
            "{:?}",
            v.violations
        );
    }

    #[test]
    fn a_stale_row_of_one_shard_is_caught_and_named() {
        let mut r = record(A, B);
        r.add_ledger_row("shard-1", row(5, 5, "b", 2)).unwrap();
        let v = check(&mut r, BOUND, SETTLE, 0);
        assert_eq!(v.failed_resources, 1);
        assert!(
            v.violations
                .iter()
                .any(|m| m.starts_with("shard-1: stale write committed: row 5 with token 5")),
            "{:?}",
            v.violations
        );
    }

    /// A node's term of a shard that ended at its deadline, then a new term of that shard on
    /// the same token: caught per shard (the shard set refuses such a `Renewed`; this checks
    /// that the run would notice if it did not).
    #[test]
    fn a_shard_term_begun_again_on_an_earlier_token_is_caught() {
        let a = "start a 0 0
lead shard-0 1 100000000 1
lost shard-0 1 900000000 900000000 deadline 1
lead shard-0 1 950000000 2
lost shard-0 1 1500000000 1600000000 shutdown 2
stop 1600000000
";
        let mut r = ShardRecord::new(&["shard-0".to_owned()]);
        r.end = 2_000 * MS;
        r.quiesce = 1_500 * MS;
        r.add_history(a, None).unwrap();
        let v = check(&mut r, BOUND, SETTLE, 0);
        assert_eq!(v.failed_resources, 1);
        assert_eq!(
            v.violations,
            ["shard-0: token not above an earlier term's: a began a term with token 1 at 950000000, after its term with token 1 from 100000000"],
        );
        let mut r = ShardRecord::new(&["shard-0".to_owned()]);
        r.end = 2_000 * MS;
        r.quiesce = 1_500 * MS;
        r.add_history(
            &a.replace("shard-0 1 950000000 2", "shard-0 2 950000000 2")
                .replace("lost shard-0 1 1500000000", "lost shard-0 2 1500000000"),
            None,
        )
        .unwrap();
        let v = check(&mut r, BOUND, SETTLE, 0);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
    }

    #[test]
    fn more_than_ceiling_plus_slack_at_a_steady_point_fails() {
        // a leads both shards from 0.1 s to the end; b is live and sees two members.
        let a = "start a 0 0
assign 100000000 2 2 2 0
lead shard-0 1 100000000 1
lead shard-1 1 100000000 2
stop 5100000000
";
        let b = "start b 0 0\nassign 100000000 1 2 0 0\nstop 5100000000\n";
        let mut r = ShardRecord::new(&["shard-0".to_owned(), "shard-1".to_owned()]);
        r.end = 5_500 * MS;
        r.quiesce = 5_000 * MS;
        r.add_history(a, None).unwrap();
        r.add_history(b, None).unwrap();
        let v = check(&mut r, BOUND, SETTLE, 0);
        assert!(
            v.violations.iter().any(|m| m.starts_with(
                "fairness: a led 2 resources at 600000000, a steady point with 2 live nodes (bound ceil(2/2) + 0 = 1)"
            )),
            "{:?}",
            v.violations
        );
        // With a slack of one, the same is fair.
        let v = check(&mut r, BOUND, SETTLE, 1);
        assert!(v.fairness.over.is_empty(), "{:?}", v.fairness.over);
        assert_eq!((v.fairness.min, v.fairness.max), (0, 2));
    }

    /// The lock configurations: safety only (a free permit for a long while is no violation),
    /// an overlap on one permit still is, and the holds believed at once are counted over all
    /// permits (the run fails more than N).
    #[test]
    fn lock_runs_are_judged_on_safety_and_count_holds_at_once() {
        let mut r = record(A, B);
        r.safety_only = true;
        // Nobody holds shard-1 from 5 s on (after a's shutdown): not a finding for a lock run.
        r.end = 60_000 * MS;
        r.quiesce = 59_000 * MS;
        let v = check(&mut r, BOUND, SETTLE, 0);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert_eq!(v.most_at_once, 2, "one hold per permit, both at once");
        let mut r = record(A, B);
        r.end = 60_000 * MS;
        r.quiesce = 59_000 * MS;
        let v = check(&mut r, BOUND, SETTLE, 0);
        assert!(
            v.violations.iter().any(|m| m.contains("no leader for")),
            "the same gap fails an election run: {:?}",
            v.violations
        );
        let b = B.replace("lead shard-0 2 1000000000 2", "lead shard-0 2 930000000 2");
        let mut r = record(A, &b);
        r.safety_only = true;
        let v = check(&mut r, BOUND, SETTLE, 0);
        assert!(
            v.violations
                .iter()
                .any(|m| m.starts_with("shard-0: overlap:")),
            "{:?}",
            v.violations
        );
        // Three holds of three permits at 0.5 s.
        let c = "start c 0 0\nlead shard-2 1 400000000 1\nlost shard-2 1 600000000 900000000 released 1\nstop 5100000000\n";
        let mut r = ShardRecord::new(&["shard-0".into(), "shard-1".into(), "shard-2".into()]);
        r.end = 5_500 * MS;
        r.quiesce = 5_000 * MS;
        r.safety_only = true;
        r.add_history(A, None).unwrap();
        r.add_history(B, None).unwrap();
        r.add_history(c, None).unwrap();
        assert_eq!(check(&mut r, BOUND, SETTLE, 0).most_at_once, 3);
    }

    #[test]
    fn a_killed_nodes_shards_are_measured_until_another_node_leads_them() {
        // a leads shard-0 and is killed at 2 s; b leads it from 2.6 s.
        let a = "start a 0 0\nlead shard-0 1 100000000 1\nwork shard-0 1 100000000 1\n";
        let b = "start b 0 0\nlead shard-0 2 2600000000 1\nstop 5100000000\n";
        let mut r = ShardRecord::new(&["shard-0".to_owned()]);
        r.end = 5_500 * MS;
        r.quiesce = 5_000 * MS;
        r.add_history(a, Some(2_000 * MS)).unwrap();
        r.add_history(b, None).unwrap();
        r.faults.push(super::Fault {
            kind: "kill".into(),
            candidate: Some("a".into()),
            start: 2_000 * MS,
            end: 2_000 * MS,
        });
        let v = check(&mut r, BOUND, SETTLE, 0);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert_eq!((v.kills.faults, v.kills.resources), (1, 1));
        assert_eq!(v.kills.worst_ns, 600 * MS);
        assert_eq!(v.worst_recovery_ns, 600 * MS);
    }
}

/// After a pause or a partition, recovery is also judged from the stopped term's end (its
/// lapse): a takeover later than the lapse bound is caught even when the bound from the fault's
/// start would let it pass.
#[test]
fn a_late_takeover_after_the_lapse_is_caught() {
    // `outage`: a Galera node rejoining (its donor blocked) from 0.8 s to 1.6 s.
    let run = |b_leads_at_ms: u64, outage: bool| {
        let mut r = Record {
            end: 6_000 * MS,
            lapse_bound_ns: 500 * MS,
            ..Record::default()
        };
        // a leads from 0.1 s, is cut off at 1 s (deadline 1.2 s), healed at 3 s.
        r.add_history(
            "start a 0 0\nlead 1 100000000\nlost 1 3000000000 1200000000 deadline\n",
            None,
        )
        .unwrap();
        let b_leads = b_leads_at_ms * MS;
        r.add_history(
            &format!("start b 0 0\nlead 3 {b_leads}\nlost 3 5000000000 5000000000 shutdown\n"),
            None,
        )
        .unwrap();
        r.faults.push(Fault {
            kind: "partition".into(),
            candidate: Some("a".into()),
            start: 1_000 * MS,
            end: 3_000 * MS,
        });
        if outage {
            r.faults.push(Fault {
                kind: "noderejoin".into(),
                candidate: None,
                start: 800 * MS,
                end: 1_600 * MS,
            });
        }
        check(&r, 3_000 * MS)
    };
    let v = run(1_500, false);
    assert!(v.violations.is_empty(), "{:?}", v.violations);
    assert_eq!(v.worst_after_lapse_ns, 300 * MS);
    let v = run(1_900, false);
    assert!(
        v.violations
            .iter()
            .any(|m| m.starts_with("no other leader within 500 ms of the end of a's term 1")),
        "{:?}",
        v.violations
    );
    // The same late takeover while a Galera node rejoined until 1.6 s: counted from the
    // outage's end, 300 ms.
    let v = run(1_900, true);
    assert!(v.violations.is_empty(), "{:?}", v.violations);
    assert_eq!(v.worst_after_lapse_ns, 300 * MS);
}

/// A candidate whose partition healed must answer again: one whose store only fails (or never
/// returns) after the heal is caught; one that is denied soon after passes, and its wait is the
/// heal figure.
#[test]
fn a_healed_candidate_that_never_answers_again_is_caught() {
    let run = |a_calls: &str| {
        let mut r = Record {
            end: 8_000 * MS,
            ..Record::default()
        };
        r.add_history(
            &format!(
                "start a 0 0\nlead 1 100000000\nlost 1 3000000000 1200000000 deadline\n{a_calls}"
            ),
            None,
        )
        .unwrap();
        r.add_history(
            "start b 0 0\nlead 3 1500000000\nlost 3 7000000000 7000000000 shutdown\n",
            None,
        )
        .unwrap();
        r.faults.push(Fault {
            kind: "partition".into(),
            candidate: Some("a".into()),
            start: 1_000 * MS,
            end: 3_000 * MS,
        });
        check(&r, BOUND)
    };
    let stuck = run("call 1000000000 1500000000 error pool timed out\ncall 3100000000 5000000000 error pool timed out\n");
    assert!(
        stuck
            .violations
            .iter()
            .any(|m| m
                .starts_with("a's store did not answer within 1000 ms after its partition healed")),
        "{:?}",
        stuck.violations
    );
    let healthy = run("call 1000000000 1500000000 error pool timed out\ncall 3100000000 3200000000 denied Some(\"b\") Some(3) rem=Some(400ms)\n");
    assert!(healthy.violations.is_empty(), "{:?}", healthy.violations);
    assert_eq!((healthy.heals, healthy.worst_heal_ns), (1, 200 * MS));
}

/// A candidate killed while a server could not write (a Galera donor blocked by a node's state
/// transfer): the recovery counts from the outage's end, and is still caught when the next
/// leader comes later than the bound after it.
#[test]
fn a_kill_inside_a_server_outage_is_measured_from_the_outage_end() {
    let with_takeover_at = |at_ms: u64, outage: bool| {
        let mut r = Record {
            end: 10_000 * MS,
            quiesce: 9_000 * MS,
            ..Record::default()
        };
        r.add_history("start a 0 0\nlead 1 100000000\n", Some(900 * MS))
            .unwrap();
        r.add_history(
            &format!(
                "start b 0 0\nlead 2 {}\nlost 2 9500000000 9500000000 shutdown\n",
                at_ms * MS
            ),
            None,
        )
        .unwrap();
        r.faults = vec![Fault {
            kind: "kill".into(),
            candidate: Some("a".into()),
            start: 900 * MS,
            end: 900 * MS,
        }];
        if outage {
            r.faults.push(Fault {
                kind: "noderejoin".into(),
                candidate: None,
                start: 500 * MS,
                end: 3_000 * MS,
            });
        }
        check(&r, BOUND)
    };
    let v = with_takeover_at(3_400, true);
    assert!(v.violations.is_empty(), "{:?}", v.violations);
    assert_eq!(v.worst_recovery_ns, 400 * MS);
    let v = with_takeover_at(3_400, false);
    assert!(
        v.violations
            .iter()
            .any(|m| m.starts_with("no other leader within 1000 ms after kill of a")),
        "{:?}",
        v.violations
    );
    let v = with_takeover_at(4_200, true);
    assert!(
        v.violations
            .iter()
            .any(|m| m.starts_with("no other leader within 1000 ms after kill of a")),
        "{:?}",
        v.violations
    );
}

mod rates {
    use super::rate_checker::{check, RateRecord};
    use super::{Fault, MS};

    /// Two clients sharing 3 permits per 100 ms (burst 1): grants every 40 ms by the
    /// database clock.
    fn record() -> RateRecord {
        let mut r = RateRecord {
            interval_us: 100_000,
            most_per_interval: 3,
            table_permits: 10,
            start_ns: 0,
            quiesce_ns: 1_000 * MS,
            ..RateRecord::default()
        };
        let mut a = String::from("start a 0 0\n");
        let mut b = String::from("start b 0 0\n");
        for n in 1..=10u64 {
            let at_us = 1_000_000 + n * 40_000;
            let answered = n * 90 * MS;
            let line = format!("permit {n} {at_us} {} {answered}\n", answered - MS);
            if n % 2 == 0 {
                a.push_str(&line)
            } else {
                b.push_str(&line)
            }
        }
        a.push_str("limited 20000 5000000\nerror 6000000\nstop 990000000\n");
        r.add_history(&a).unwrap();
        r.add_history(&b).unwrap();
        r
    }

    #[test]
    fn a_clean_rate_run_passes() {
        let r = record();
        let v = check(&r, 500 * MS);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert_eq!(v.most_in_interval, 3);
        assert_eq!((r.limited, r.errors), (1, 1));
    }

    #[test]
    fn a_number_twice_or_above_the_table_is_caught() {
        let mut r = record();
        r.grants[3].number = r.grants[4].number;
        let v = check(&r, 500 * MS);
        assert!(
            v.violations.iter().any(|m| m.contains("given twice")),
            "{:?}",
            v.violations
        );
        let mut r = record();
        r.table_permits = 9;
        let v = check(&r, 500 * MS);
        assert!(
            v.violations
                .iter()
                .any(|m| m.contains("above the table's count")),
            "{:?}",
            v.violations
        );
    }

    #[test]
    fn a_span_over_the_quota_is_caught() {
        let mut r = record();
        // A fourth permit inside one span of 100 ms.
        r.grants[2].at_us = r.grants[1].at_us + 1;
        let v = check(&r, 500 * MS);
        assert!(
            v.violations
                .iter()
                .any(|m| m.starts_with("4 permits in the span of 100000")),
            "{:?}",
            v.violations
        );
    }

    #[test]
    fn a_stretch_without_permits_is_caught_unless_the_server_was_down() {
        let mut r = record();
        r.quiesce_ns = 2_000 * MS;
        let v = check(&r, 500 * MS);
        assert!(
            v.violations
                .iter()
                .any(|m| m.starts_with("no permit for 1100 ms")),
            "{:?}",
            v.violations
        );
        r.faults.push(Fault {
            kind: "restart".into(),
            candidate: None,
            start: 950 * MS,
            end: 1_700 * MS,
        });
        let v = check(&r, 500 * MS);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
    }
}

mod jobs {
    use super::jobs_checker::{check, JobHistories, RunRecord, WriteRow};

    #[test]
    fn a_kept_attempt_that_is_not_an_earlier_one_is_caught() {
        use super::jobs_checker::{check_history, JobVerdict, KeptAttempt};
        let mut latest = record(5000, "finished", 5000, Some(5100));
        latest.attempts = 3;
        let kept = |attempt: i32, state: &str, end: Option<i64>| KeptAttempt {
            job: "load-1".into(),
            slot: 5000,
            attempt,
            state: state.into(),
            finished_token: end,
        };
        let violations = |rows: &[KeptAttempt]| {
            let mut v = JobVerdict::default();
            check_history(std::slice::from_ref(&latest), rows, &mut v);
            v.violations
        };
        // Clean: a failed attempt and a lost one.
        let clean = [kept(1, "failed", Some(1)), kept(2, "running", None)];
        assert!(violations(&clean).is_empty(), "{:?}", violations(&clean));
        // The latest attempt kept (a copy after its reclaim), an attempt of no record, a
        // finished one, a lost one with an end: each caught.
        assert!(violations(&[kept(3, "failed", Some(1))])[0].contains("an earlier one"));
        let orphan = KeptAttempt {
            slot: 6000,
            ..kept(1, "failed", Some(1))
        };
        assert!(violations(&[orphan])[0].contains("without its record"));
        assert!(violations(&[kept(1, "finished", Some(1))])[0].contains("kept as"));
        assert!(violations(&[kept(1, "running", Some(1))])[0].contains("kept as"));
    }

    fn record(slot: i64, state: &str, claimed: i64, finished: Option<i64>) -> RunRecord {
        RunRecord {
            job: "load-1".into(),
            slot,
            state: state.into(),
            attempts: 1,
            claimed_token: Some(1),
            claimed_by: Some("a".into()),
            finished_token: finished.map(|_| 1),
            claimed_at_ms: Some(claimed),
            finished_at_ms: finished,
            key: None,
        }
    }

    fn false_skips(records: &[RunRecord]) -> usize {
        check(
            ("tick", 1000),
            ("load-", 1000),
            records,
            &[],
            &JobHistories::default(),
            (20, 20_000_000_000),
        )
        .violations
        .iter()
        .filter(|m| m.contains("was skipped, though"))
        .count()
    }

    fn keyed(slot: i64, key: &str, state: &str) -> RunRecord {
        RunRecord {
            job: "keyed".into(),
            key: Some(key.into()),
            finished_token: (state == "finished").then_some(1),
            ..record(slot, state, 1000, Some(1500))
        }
    }

    fn key_violations(records: &[RunRecord], history: &str) -> Vec<String> {
        let mut h = JobHistories::default();
        h.add_history(history, None).unwrap();
        let writes: Vec<super::jobs_checker::WriteRow> = records
            .iter()
            .filter(|r| r.state == "finished")
            .map(|r| super::jobs_checker::WriteRow {
                job: r.job.clone(),
                slot: r.slot,
                token: 1,
                writer: "a".into(),
                permit: Some((format!("cap#{}", r.slot % 2), r.slot)),
                span_ms: Some((r.slot, r.slot)),
            })
            .collect();
        check(
            ("tick", 1000),
            ("load-", 1000),
            records,
            &writes,
            &h,
            (0, 20_000_000_000),
        )
        .violations
        .into_iter()
        .filter(|m| m.contains("key "))
        .collect()
    }

    /// Rule 9: a key answered "created" twice, a key answered with a slot that has no record
    /// or another key's, and a key submitted long before the end that never finished are
    /// caught; a clean history is not.
    #[test]
    fn keys_created_twice_lost_or_unfinished_are_caught() {
        let ok = "start a 0 0\nsubmitted k-0 7 1 1000\nsubmitted k-0 7 0 2000\nsubmitted k-1 8 1 19000000000\n";
        let records = [keyed(7, "k-0", "finished"), keyed(8, "k-1", "queued")];
        assert_eq!(key_violations(&records, ok), Vec::<String>::new());
        let twice = "start a 0 0\nsubmitted k-0 7 1 1000\nsubmitted k-0 7 1 2000\n";
        assert_eq!(key_violations(&records, twice).len(), 1);
        let lost = "start a 0 0\nsubmitted k-2 9 1 1000\n";
        assert_eq!(key_violations(&records, lost).len(), 1);
        let other = "start a 0 0\nsubmitted k-9 7 0 1000\n";
        assert_eq!(key_violations(&records, other).len(), 1);
        let late = "start a 0 0\nsubmitted k-1 8 1 1000\n";
        assert_eq!(key_violations(&records, late).len(), 1);
    }

    /// A capped write: slot `slot` under `permit` token `token`, open from `from` to `to` ms.
    fn capped(slot: i64, permit: &str, token: i64, (from, to): (i64, i64)) -> WriteRow {
        WriteRow {
            job: "keyed".into(),
            slot,
            token: 1,
            writer: "a".into(),
            permit: Some((permit.into(), token)),
            span_ms: Some((from, to)),
        }
    }

    fn cap_violations(writes: &[WriteRow]) -> (Vec<String>, usize) {
        let mut v = super::jobs_checker::JobVerdict::default();
        super::jobs_checker::check_cap(writes, 2, &mut v);
        (v.violations, v.cap_peak)
    }

    /// Two permits' runs side by side, and one ending as the next begins: clean, at most two at
    /// once. A third open at once, a permit term writing twice, a permit beyond the cap and a
    /// write with no permit are each caught.
    #[test]
    fn more_capped_runs_at_once_than_permits_are_caught() {
        let clean = [
            capped(1, "cap#0", 1, (100, 200)),
            capped(2, "cap#1", 1, (150, 300)),
            capped(3, "cap#0", 2, (200, 250)),
        ];
        assert_eq!(cap_violations(&clean), (vec![], 2));
        let three = [
            capped(1, "cap#0", 1, (100, 200)),
            capped(2, "cap#1", 1, (150, 300)),
            capped(3, "cap#0", 2, (199, 250)),
        ];
        let (v, peak) = cap_violations(&three);
        assert_eq!(peak, 3);
        assert!(v.iter().any(|m| m.contains("over the cap of 2")), "{v:?}");
        let twice = [
            capped(1, "cap#0", 1, (100, 200)),
            capped(2, "cap#0", 1, (300, 400)),
        ];
        let (v, _) = cap_violations(&twice);
        assert!(
            v.iter().any(|m| m.contains("one permit term, two runs")),
            "{v:?}"
        );
        let beyond = [capped(1, "cap#2", 1, (100, 200))];
        let (v, _) = cap_violations(&beyond);
        assert!(
            v.iter().any(|m| m.contains("not one of the cap's 2")),
            "{v:?}"
        );
        let none = [WriteRow {
            permit: None,
            ..capped(1, "cap#0", 1, (100, 200))
        }];
        let (v, _) = cap_violations(&none);
        assert!(v.iter().any(|m| m.contains("without a permit")), "{v:?}");
    }

    #[test]
    fn a_skip_after_the_previous_run_ended_is_caught_unless_another_run_was_under_way() {
        // Slot 2000 skipped at 2100, though slot 1000's run ended at 1500.
        let mut records = vec![
            record(1000, "finished", 1000, Some(1500)),
            record(2000, "skipped", 2100, None),
        ];
        assert_eq!(false_skips(&records), 1);
        // A retry of slot 0, claimed at 2050 and ended at 2300, ran when the skip was made.
        records.push(record(0, "finished", 2050, Some(2300)));
        assert_eq!(false_skips(&records), 0);
        // One that ended before the skip explains nothing.
        records.pop();
        records.push(record(0, "finished", 1900, Some(2000)));
        assert_eq!(false_skips(&records), 1);
    }
}

mod rw {
    use super::shard_checker::{check_rw, ShardRecord};

    /// Reader r holds slot s#r0 (token 4) from 100 ms to 400 ms; writer w holds both slots
    /// (s#r0 token 5, s#r1 token 2) from 500 ms.
    const R: &str = "start r 0 0
lead s#r0 4 100000000 1
work s#r0 4 100000000 1
lost s#r0 4 400000000 900000000 released 1
done s#r0 4 400000000 900000000 1
stop 2000000000
";

    fn writer(line: &str) -> String {
        format!(
            "start w 0 0
lead s#r0 5 500000000 1
work s#r0 5 500000000 1
lead s#r1 2 500000000 2
work s#r1 2 500000000 2
{line}
lost s#r0 5 900000000 1500000000 released 1
done s#r0 5 900000000 1500000000 1
lost s#r1 2 900000000 1500000000 released 2
done s#r1 2 900000000 1500000000 2
stop 2000000000
"
        )
    }

    fn check(w: &str) -> Vec<String> {
        let mut r = ShardRecord::new(&["s#r0".to_owned(), "s#r1".to_owned()]);
        r.add_history(R, None).unwrap();
        r.add_history(&writer(w), None).unwrap();
        check_rw(&r)
    }

    /// A write hold of every slot, its token the highest of theirs: clean. One short of a
    /// slot, or with a token not above an earlier reader's, is caught.
    #[test]
    fn a_write_hold_must_hold_every_slot_with_a_higher_token() {
        let ok = check("rwwrite 5 600000000 s#r0=5 s#r1=2");
        assert!(ok.is_empty(), "{ok:?}");
        let short = check("rwwrite 2 600000000 s#r1=2");
        assert!(short.iter().any(|m| m.contains("not all of")), "{short:?}");
        assert!(
            short
                .iter()
                .any(|m| m.contains("not above r's earlier hold")),
            "{short:?}"
        );
        let lowest = check("rwwrite 2 600000000 s#r0=5 s#r1=2");
        assert!(
            lowest.iter().any(|m| m.contains("its slots' highest")),
            "{lowest:?}"
        );
        let unheld = check("rwwrite 5 950000000 s#r0=5 s#r1=2");
        assert!(
            unheld.iter().any(|m| m.contains("no believed term")),
            "{unheld:?}"
        );
    }
}

mod ranks {
    use super::checker::{Fault, Interval};
    use super::rank_checker::{check, handover_bound, lapse_bound, Incarnation};
    use super::MS;

    fn born(name: &str, start: u64) -> Incarnation {
        Incarnation {
            name: name.into(),
            start,
            killed: None,
        }
    }

    fn led(candidate: &str, start: u64, end: u64) -> Interval {
        Interval {
            candidate: candidate.into(),
            token: 1,
            start,
            end,
        }
    }

    #[test]
    fn the_top_candidate_leading_passes_and_a_lower_one_is_caught() {
        let all = [born("c0", 0), born("c1", 0), born("c2", 0)];
        // c2 leads after a handover from c0 at 1 s.
        let good = [led("c0", 0, 1_000 * MS), led("c2", 1_050 * MS, 10_000 * MS)];
        let v = check(&good, &[], &all, 0, 10_000 * MS);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert!(v.checked_ns >= 7_000 * MS, "{}", v.checked_ns);
        // c1 keeps it: caught.
        let bad = [led("c0", 0, 1_000 * MS), led("c1", 1_050 * MS, 10_000 * MS)];
        let v = check(&bad, &[], &all, 0, 10_000 * MS);
        assert!(
            v.violations
                .iter()
                .any(|m| m.contains("c2 (the highest-ranked")),
            "{:?}",
            v.violations
        );
        // A term lost and given back within a handover's bound: not a violation.
        let gap = handover_bound().as_nanos() as u64 - 100 * MS;
        let blip = [
            led("c2", 0, 5_000 * MS),
            led("c1", 5_000 * MS, 5_000 * MS + gap),
            led("c2", 5_000 * MS + gap, 10_000 * MS),
        ];
        let v = check(&blip, &[], &all, 0, 10_000 * MS);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        // But leadership moving away and back again and again is caught.
        let mut flapping = Vec::new();
        for n in 0..10u64 {
            let at = n * 1_000 * MS;
            flapping.push(led("c2", at, at + 800 * MS));
            flapping.push(led("c1", at + 800 * MS, at + 1_000 * MS));
        }
        let v = check(&flapping, &[], &all, 0, 10_000 * MS);
        assert!(
            v.violations
                .iter()
                .any(|m| m.contains("moves away from the top")),
            "{:?}",
            v.violations
        );
    }

    #[test]
    fn the_bound_counts_from_a_fault_and_from_coming_back() {
        // c2 paused 2-4 s; c1 is then the top one, but leads only from 4.5 s (the lapse and the
        // handover from the pause's start are 2 s + bound, not yet passed), and c2, back at
        // 4 s, leads again from 5.5 s.
        let all = [born("c0", 0), born("c1", 0), born("c2", 0)];
        let pause = Fault {
            kind: "pause".into(),
            candidate: Some("c2".into()),
            start: 2_000 * MS,
            end: 4_000 * MS,
        };
        let back = 4_000 * MS + handover_bound().as_nanos() as u64 - 50 * MS;
        let terms = [
            led("c2", 0, 2_000 * MS),
            led("c1", 3_000 * MS, back),
            led("c2", back, 12_000 * MS),
        ];
        let v = check(&terms, std::slice::from_ref(&pause), &all, 0, 12_000 * MS);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        // c2 never comes back to lead after the pause: caught once the fault is old enough.
        let never = [led("c2", 0, 2_000 * MS), led("c1", 3_000 * MS, 12_000 * MS)];
        let v = check(&never, &[pause], &all, 0, 12_000 * MS);
        assert!(
            v.violations
                .iter()
                .any(|m| m.contains("c2 (the highest-ranked")),
            "{:?}",
            v.violations
        );
        // A killed top candidate's replacement counts from its start.
        let all = [
            Incarnation {
                name: "c2".into(),
                start: 0,
                killed: Some(2_000 * MS),
            },
            born("c2-r1", 2_500 * MS),
            born("c1", 0),
        ];
        let kill = Fault {
            kind: "kill".into(),
            candidate: Some("c2".into()),
            start: 2_000 * MS,
            end: 2_000 * MS,
        };
        let settle = 2_000 * MS + (lapse_bound() + handover_bound()).as_nanos() as u64;
        let terms = [
            led("c2", 0, 2_000 * MS),
            led("c1", 2_600 * MS, settle - 10 * MS),
            led("c2-r1", settle - 10 * MS, 12_000 * MS),
        ];
        let v = check(&terms, &[kill], &all, 0, 12_000 * MS);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
    }

    #[test]
    fn a_run_with_no_quiet_spell_fails() {
        let all = [born("c0", 0), born("c1", 0)];
        let faults: Vec<Fault> = (0..20)
            .map(|n| Fault {
                kind: "connkill".into(),
                candidate: None,
                start: n * 500 * MS,
                end: n * 500 * MS,
            })
            .collect();
        let v = check(&[led("c1", 0, 10_000 * MS)], &faults, &all, 0, 10_000 * MS);
        assert!(
            v.violations.iter().any(|m| m.contains("no quiet spell")),
            "{:?}",
            v.violations
        );
    }
}
