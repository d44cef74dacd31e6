//! The scheduler's decisions as a pure function: given a job's schedule and policies, what its
//! run table says, what runs here now and the database's now, which slots to start, skip or
//! give up, and when to look again.

use std::collections::BTreeSet;

use super::schedule::{MissedSlots, Overlap, Schedule};

/// A run record's state (the `state` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Running,
    Finished,
    Failed,
    GivenUp,
    Skipped,
    Rerun,
    /// A keyed job's key, submitted and not yet claimed.
    Queued,
    /// With spread runs: an attempt the leader claimed that no node runs yet (a node's runner
    /// takes it under a run hold of its own, and it becomes `running`).
    Claimed,
}

impl State {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Finished => "finished",
            State::Failed => "failed",
            State::GivenUp => "given_up",
            State::Skipped => "skipped",
            State::Rerun => "rerun",
            State::Queued => "queued",
            State::Claimed => "claimed",
        }
    }

    pub(crate) fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "running" => State::Running,
            "finished" => State::Finished,
            "failed" => State::Failed,
            "given_up" => State::GivenUp,
            "skipped" => State::Skipped,
            "rerun" => State::Rerun,
            "queued" => State::Queued,
            "claimed" => State::Claimed,
            _ => return None,
        })
    }
}

/// A job's policies, as the planner needs them (milliseconds).
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    pub missed: MissedSlots,
    pub overlap: Overlap,
    pub starting_deadline_ms: i64,
    pub max_catch_up: usize,
    pub max_attempts: i32,
    pub backoff_first_ms: i64,
    pub backoff_max_ms: i64,
    /// Under `Overlap::Allow`, the most runs at once.
    pub max_running: usize,
}

impl Policy {
    /// Whether a new slot that cannot start because another run holds its place (an earlier
    /// slot running, or a full cap) is skipped: under `Overlap::Skip`, except a catch-up of
    /// every missed slot, which waits instead (skipping would drop it).
    pub(crate) fn skips_when_busy(&self) -> bool {
        self.overlap == Overlap::Skip && self.missed != MissedSlots::RunAll
    }

    /// The wait before attempt `attempts + 1`, after `attempts` claimed ones: doubling from the
    /// first back-off, capped.
    pub(crate) fn backoff_ms(&self, attempts: i32) -> i64 {
        let doublings = attempts.saturating_sub(1).clamp(0, 40) as u32;
        self.backoff_first_ms
            .saturating_mul(1_i64 << doublings)
            .min(self.backoff_max_ms)
    }
}

/// A record that is not final: a claimed attempt (running here or, after a crash or a lost
/// term, nowhere), a failed one, or an operator's rerun mark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Open {
    pub slot: i64,
    pub state: State,
    pub attempts: i32,
    pub claimed_at_ms: Option<i64>,
}

impl Open {
    /// The number of the attempt that starts it again: the next one, except a `claimed`
    /// record's, whose attempt never ran (a runner of a node that spreads would have made it
    /// `running`): that one is started as it is.
    pub(crate) fn next_attempt(&self) -> i32 {
        if self.state == State::Claimed {
            self.attempts
        } else {
            self.attempts.saturating_add(1)
        }
    }
}

/// What the planner sees of one job.
pub(crate) struct View<'a> {
    pub schedule: &'a Schedule,
    pub policy: &'a Policy,
    /// The newest slot with a record (claimed, skipped, marked), if any.
    pub latest: Option<i64>,
    /// The job's records that are not final, oldest first.
    pub open: &'a [Open],
    /// The slots of this job whose closure runs in this process under the current term (what
    /// overlap is judged by).
    pub running: &'a BTreeSet<i64>,
    /// The slots of this job with an attempt in this process, closure returned or not (their
    /// end may not be written yet): never reclaimed from here.
    pub here: &'a BTreeSet<i64>,
    /// The database's now when this term first looked at the job: the job's deploy, as far as
    /// this term knows. The first slot at or after it runs however late the look is.
    pub first_look_ms: i64,
}

/// One decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Claim and run `slot`: a new record, or the next attempt of `prior`.
    Start { slot: i64, prior: Option<Open> },
    /// Record `slot` as skipped (it came due while an earlier slot ran).
    Skip { slot: i64 },
    /// Mark `prior` given up: its attempts are spent.
    GiveUp { prior: Open },
}

/// The decisions for one job now, and when to look at it again (database time, ms).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Plan {
    pub actions: Vec<Action>,
    pub wake_ms: Option<i64>,
}

/// The earlier of two optional times.
pub(crate) fn earliest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The later of two optional times.
pub(crate) fn latest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// The planner. `now_ms` is the database's now.
pub(crate) fn plan(view: &View<'_>, now_ms: i64) -> Plan {
    let policy = view.policy;
    let busy = !view.running.is_empty();
    let mut plan = Plan::default();
    let mut started = 0usize;
    // Without `Allow`, one run of a job at a time: a start only when nothing runs; with it, at
    // most `max_running` at once.
    let may_start = |started: usize| {
        if policy.overlap == Overlap::Allow {
            view.running.len().saturating_add(started) < policy.max_running
        } else {
            !busy && started == 0
        }
    };

    // Retries and operator marks first, oldest slot first.
    for open in view.open {
        if view.here.contains(&open.slot) {
            continue;
        }
        match open.state {
            // An operator's mark, or a key submitted: at once.
            State::Rerun | State::Queued => {}
            // A claimed attempt nobody runs is seen here only by a scheduler that does not
            // spread its runs (one that does counts it as running): run it as an earlier
            // term's.
            State::Running | State::Failed | State::Claimed => {
                // A claimed attempt never ran: it spent none of the slot's attempts.
                if open.state != State::Claimed && open.attempts >= policy.max_attempts {
                    plan.actions.push(Action::GiveUp {
                        prior: open.clone(),
                    });
                    continue;
                }
                // A record without a claim time (written by hand) is due at once.
                let due = open.claimed_at_ms.map_or(now_ms, |at| {
                    at.saturating_add(policy.backoff_ms(open.attempts))
                });
                if now_ms < due {
                    plan.wake_ms = earliest(plan.wake_ms, Some(due));
                    continue;
                }
            }
            _ => continue,
        }
        if may_start(started) {
            plan.actions.push(Action::Start {
                slot: open.slot,
                prior: Some(open.clone()),
            });
            started += 1;
        }
    }

    // New slots.
    plan.wake_ms = earliest(plan.wake_ms, view.schedule.next_after(now_ms));
    let Some(due) = view.schedule.latest_at_or_before(now_ms) else {
        return plan;
    };
    let on_time = now_ms.saturating_sub(due) <= policy.starting_deadline_ms;
    if policy.missed == MissedSlots::RunAll
        && view.latest.is_some_and(|latest| due > latest)
        && !may_start(started)
    {
        // A catch-up that cannot start now waits (it is never skipped): no need to list its
        // slots (up to `max_catch_up` cron computations) on every look.
        return plan;
    }
    let new: Vec<i64> = match (view.latest, policy.missed) {
        // Nothing recorded yet: history is never replayed unasked, but the first slot since
        // the job was deployed runs however late this look is (judged at the look, a short
        // deadline would otherwise refuse every slot of a new job, as nothing gets recorded).
        (None, _) => (on_time || due >= view.first_look_ms)
            .then_some(due)
            .into_iter()
            .collect(),
        (Some(latest), _) if due <= latest => Vec::new(),
        (Some(_), MissedSlots::RunLatest) => vec![due],
        (Some(_), MissedSlots::Skip) => on_time.then_some(due).into_iter().collect(),
        (Some(latest), MissedSlots::RunAll) => {
            view.schedule
                .slots_between(latest, now_ms, policy.max_catch_up)
        }
    };
    for slot in new {
        if may_start(started) {
            plan.actions.push(Action::Start { slot, prior: None });
            started += 1;
        } else if busy && policy.skips_when_busy() {
            plan.actions.push(Action::Skip { slot });
        } else {
            // Queued (or the next of a catch-up): started when what runs ends.
            break;
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn policy() -> Policy {
        Policy {
            missed: MissedSlots::RunLatest,
            overlap: Overlap::Skip,
            starting_deadline_ms: 5_000,
            max_catch_up: 100,
            max_attempts: 3,
            backoff_first_ms: 1_000,
            backoff_max_ms: 3_000,
            max_running: usize::MAX,
        }
    }

    fn run(
        schedule: &Schedule,
        policy: &Policy,
        latest: Option<i64>,
        open: &[Open],
        running: &[i64],
        now: i64,
    ) -> Plan {
        let running: BTreeSet<i64> = running.iter().copied().collect();
        plan(
            &View {
                schedule,
                policy,
                latest,
                open,
                running: &running,
                here: &running,
                first_look_ms: i64::MAX,
            },
            now,
        )
    }

    fn start(slot: i64) -> Action {
        Action::Start { slot, prior: None }
    }

    #[test]
    fn the_first_run_never_replays_history() {
        let every = Schedule::every(Duration::from_secs(60)).unwrap();
        // Deployed 30 s after a slot (inside the 5 s deadline? no): nothing until the next.
        let p = run(&every, &policy(), None, &[], &[], 630_000);
        assert_eq!(p.actions, vec![]);
        assert_eq!(p.wake_ms, Some(660_000));
        // Deployed 2 s after a slot: it runs.
        let p = run(&every, &policy(), None, &[], &[], 662_000);
        assert_eq!(p.actions, vec![start(660_000)]);
        for missed in [MissedSlots::RunAll, MissedSlots::Skip] {
            let pol = Policy { missed, ..policy() };
            assert_eq!(run(&every, &pol, None, &[], &[], 630_000).actions, vec![]);
        }
    }

    #[test]
    fn missed_slots_follow_the_policy() {
        let every = Schedule::every(Duration::from_secs(60)).unwrap();
        let latest = Some(60_000);
        // An outage: last recorded 60 s, now 330 s (slots 120..300 missed, 300 is 30 s late).
        let latest_only = run(&every, &policy(), latest, &[], &[], 330_000);
        assert_eq!(latest_only.actions, vec![start(300_000)]);
        let all = Policy {
            missed: MissedSlots::RunAll,
            ..policy()
        };
        assert_eq!(
            run(&every, &all, latest, &[], &[], 330_000).actions,
            vec![start(120_000)],
            "oldest first, one at a time"
        );
        let all_at_once = Policy {
            overlap: Overlap::Allow,
            ..all.clone()
        };
        assert_eq!(
            run(&every, &all_at_once, latest, &[], &[], 330_000).actions,
            vec![
                start(120_000),
                start(180_000),
                start(240_000),
                start(300_000)
            ]
        );
        // A catch-up under way with the default overlap: the rest wait, none is skipped.
        assert_eq!(
            run(&every, &all, Some(120_000), &[], &[120_000], 335_000).actions,
            vec![]
        );
        let capped = Policy {
            max_catch_up: 2,
            ..all_at_once
        };
        assert_eq!(
            run(&every, &capped, latest, &[], &[], 330_000).actions,
            vec![start(240_000), start(300_000)]
        );
        let skip = Policy {
            missed: MissedSlots::Skip,
            ..policy()
        };
        assert_eq!(
            run(&every, &skip, latest, &[], &[], 330_000).actions,
            vec![]
        );
        assert_eq!(
            run(&every, &skip, latest, &[], &[], 302_000).actions,
            vec![start(300_000)]
        );
        // Already recorded: nothing new.
        assert_eq!(
            run(&every, &policy(), Some(300_000), &[], &[], 330_000).actions,
            vec![]
        );
    }

    #[test]
    fn overlap_follows_the_policy() {
        let every = Schedule::every(Duration::from_secs(60)).unwrap();
        let running = [60_000];
        let skip = run(&every, &policy(), Some(60_000), &[], &running, 121_000);
        assert_eq!(skip.actions, vec![Action::Skip { slot: 120_000 }]);
        let queue = Policy {
            overlap: Overlap::Queue,
            ..policy()
        };
        assert_eq!(
            run(&every, &queue, Some(60_000), &[], &running, 121_000).actions,
            vec![]
        );
        let allow = Policy {
            overlap: Overlap::Allow,
            ..policy()
        };
        assert_eq!(
            run(&every, &allow, Some(60_000), &[], &running, 121_000).actions,
            vec![start(120_000)]
        );
    }

    #[test]
    fn crashed_and_failed_attempts_retry_with_backoff_then_give_up() {
        let every = Schedule::every(Duration::from_secs(60)).unwrap();
        let crashed = Open {
            slot: 60_000,
            state: State::Running,
            attempts: 2,
            claimed_at_ms: Some(61_000),
        };
        // Second attempt claimed at 61 s: the third waits 2 s (1 s doubled once).
        let early = run(
            &every,
            &policy(),
            Some(60_000),
            std::slice::from_ref(&crashed),
            &[],
            62_500,
        );
        assert_eq!(early.actions, vec![]);
        assert_eq!(early.wake_ms, Some(63_000));
        let due = run(
            &every,
            &policy(),
            Some(60_000),
            std::slice::from_ref(&crashed),
            &[],
            63_000,
        );
        assert_eq!(
            due.actions,
            vec![Action::Start {
                slot: 60_000,
                prior: Some(crashed.clone())
            }]
        );
        // Running here: left alone.
        let here = run(
            &every,
            &policy(),
            Some(60_000),
            std::slice::from_ref(&crashed),
            &[60_000],
            63_000,
        );
        assert_eq!(here.actions, vec![]);
        let spent = Open {
            attempts: 3,
            ..crashed
        };
        assert_eq!(
            run(
                &every,
                &policy(),
                Some(60_000),
                std::slice::from_ref(&spent),
                &[],
                90_000
            )
            .actions,
            vec![Action::GiveUp { prior: spent }]
        );
        let rerun = Open {
            slot: 0,
            state: State::Rerun,
            attempts: 1,
            claimed_at_ms: None,
        };
        assert_eq!(
            run(
                &every,
                &policy(),
                Some(60_000),
                std::slice::from_ref(&rerun),
                &[],
                90_000
            )
            .actions,
            vec![Action::Start {
                slot: 0,
                prior: Some(rerun)
            }]
        );
    }

    #[test]
    fn a_record_without_a_claim_time_is_due_at_once() {
        let every = Schedule::every(Duration::from_secs(60)).unwrap();
        let hand_made = Open {
            slot: 60_000,
            state: State::Failed,
            attempts: 1,
            claimed_at_ms: None,
        };
        assert_eq!(
            run(
                &every,
                &policy(),
                Some(60_000),
                std::slice::from_ref(&hand_made),
                &[],
                61_000
            )
            .actions,
            vec![Action::Start {
                slot: 60_000,
                prior: Some(hand_made)
            }]
        );
    }

    #[test]
    fn a_new_jobs_first_slot_after_its_deploy_runs_however_late_the_look() {
        let every = Schedule::every(Duration::from_secs(1)).unwrap();
        let tight = Policy {
            starting_deadline_ms: 0,
            ..policy()
        };
        let none = BTreeSet::new();
        let view = |first_look_ms| View {
            schedule: &every,
            policy: &tight,
            latest: None,
            open: &[],
            running: &none,
            here: &none,
            first_look_ms,
        };
        // Deployed at 10.5 s; the look for the 11 s slot comes 40 ms late: it still runs.
        assert_eq!(plan(&view(10_500), 11_040).actions, vec![start(11_000)]);
        // A slot before the deploy is history: judged by the deadline, not replayed.
        assert_eq!(plan(&view(10_500), 10_600).actions, vec![]);
    }

    #[test]
    fn a_returned_run_whose_end_is_not_written_neither_skips_nor_is_reclaimed() {
        let every = Schedule::every(Duration::from_secs(1)).unwrap();
        let ending = Open {
            slot: 10_000,
            state: State::Running,
            attempts: 1,
            claimed_at_ms: Some(10_001),
        };
        let here: BTreeSet<i64> = [10_000].into();
        let p = plan(
            &View {
                schedule: &every,
                policy: &policy(),
                latest: Some(10_000),
                open: std::slice::from_ref(&ending),
                running: &BTreeSet::new(),
                here: &here,
                first_look_ms: 0,
            },
            // Past the retry's back-off: a record of a run elsewhere would be claimed again.
            12_050,
        );
        assert_eq!(p.actions, vec![start(12_000)]);
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let p = policy();
        assert_eq!(
            [1, 2, 3, 4, 60, i32::MAX].map(|a| p.backoff_ms(a)),
            [1_000, 2_000, 3_000, 3_000, 3_000, 3_000]
        );
    }

    // Keys: queued ones start at once (no schedule of their own), in the order given; one at a
    // time under `Queue`, at most `max_running` under `Allow`, counting what runs here.
    #[test]
    fn queued_keys_start_at_once_within_the_cap() {
        let keyed = Schedule::keyed();
        let queued = |slot| Open {
            slot,
            state: State::Queued,
            attempts: 0,
            claimed_at_ms: Some(1),
        };
        let open = [queued(7), queued(3), queued(9)];
        let with = |overlap, max_running, running: &[i64]| {
            let pol = Policy {
                overlap,
                max_running,
                ..policy()
            };
            let running: BTreeSet<i64> = running.iter().copied().collect();
            plan(
                &View {
                    schedule: &keyed,
                    policy: &pol,
                    latest: Some(9),
                    open: &open,
                    running: &running,
                    here: &running,
                    first_look_ms: 0,
                },
                50_000,
            )
        };
        let begins = |slots: &[i64]| {
            slots
                .iter()
                .map(|&slot| Action::Start {
                    slot,
                    prior: open.iter().find(|o| o.slot == slot).cloned(),
                })
                .collect::<Vec<_>>()
        };
        let p = with(Overlap::Queue, usize::MAX, &[]);
        assert_eq!(p.actions, begins(&[7]));
        assert_eq!(p.wake_ms, None, "a keyed job has no time of its own");
        assert_eq!(with(Overlap::Queue, usize::MAX, &[1]).actions, vec![]);
        assert_eq!(
            with(Overlap::Allow, usize::MAX, &[]).actions,
            begins(&[7, 3, 9])
        );
        assert_eq!(with(Overlap::Allow, 2, &[]).actions, begins(&[7, 3]));
        assert_eq!(with(Overlap::Allow, 2, &[1]).actions, begins(&[7]));
        assert_eq!(with(Overlap::Allow, 2, &[1, 2]).actions, vec![]);
        // A key running here is never claimed again from here.
        assert_eq!(with(Overlap::Allow, 3, &[7]).actions, begins(&[3, 9]));
    }
}
