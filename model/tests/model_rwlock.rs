//! A model check of the reader-writer rule (`src/locks/rwlock.rs`): a reader-writer lock of `R`
//! read slots is `R + 1` lease rows, the slots and the writer's gate; a reader holds one slot,
//! asked for only after a read of the gate showed it free; a writer takes the gate, then every
//! slot in order, and holds the lock only if none of them was lost meanwhile.
//!
//! The rows are the hold rule's: `model_holds.rs` checks that a process believes a hold only
//! while the store has that row as the hold's, live. So here a row is an atomic lease (a holder
//! and a token that goes up with every new holder), and a lapse ends the holder's belief in the
//! row at the moment the store frees it. Every interleaving of three processes (each may read or
//! write, give up waiting, release, or lose any row at any time) is explored to a depth.
//!
//! # Properties
//!
//! - never a writer together with a reader or another writer (believed holds);
//! - writers are not starved: while a writer collects the slots, no reader that read the gate
//!   after the writer took it gets a slot (only readers that read it free before may);
//! - a write hold's token (the highest of its slots' tokens) exceeds the token of every hold,
//!   read or write, that began before it;
//! - sanity: two readers together, a writer, a writer after readers, a lapse mid-collection.
//!
//! Planted bugs, each caught: a write token taken from the gate or the lowest slot instead of
//! the highest slot; a writer that holds the lock without checking that its early rows were not
//! lost while it collected the later ones; a writer that skips the last slot; a reader that
//! does not read the gate.

use std::time::Instant;

use stateright::{Checker, Expectation, HasDiscoveries, Model, Property};

/// Read slots.
const SLOTS: usize = 2;
/// Rows: the gate (0) and the slots (1..=SLOTS).
const ROWS: usize = SLOTS + 1;
const CLIENTS: usize = 3;

#[derive(Clone, Copy, Debug, Default)]
struct Params {
    depth: usize,
    /// Planted: the write token is the gate's token.
    token_from_gate: bool,
    /// Planted: the write token is the lowest slot token.
    token_lowest: bool,
    /// Planted: a writer holds the lock without checking that its rows are all still its own.
    no_final_check: bool,
    /// Planted: a writer stops one slot short.
    skips_last_slot: bool,
    /// Planted: a reader asks for a slot without reading the gate.
    no_gate_check: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Client {
    Idle,
    /// Read the gate free when `epoch` gates had been taken; about to ask for a slot.
    GateFree {
        epoch: u8,
    },
    Reading {
        slot: usize,
    },
    /// A writer taking its rows: those it took, and those of them it lost since.
    Collecting {
        have: [bool; ROWS],
        lost: [bool; ROWS],
    },
    Writing {
        have: [bool; ROWS],
    },
    /// Its hold ended (a row lost); rows it still has are released by its next step.
    Stale {
        have: [bool; ROWS],
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    /// Each row's holder and token.
    holder: [Option<usize>; ROWS],
    token: [u8; ROWS],
    clients: [Client; CLIENTS],
    /// The highest token of any hold begun so far (read or write).
    begun_max: u8,
    /// A write hold began with a token not above `begun_max`.
    bad_token: bool,
    /// How many times the gate was taken.
    gate_epoch: u8,
    /// A reader got a slot while a writer collected, having read the gate after it was taken.
    bypassed: bool,
    /// Sanity marks.
    two_readers: bool,
    wrote_after_read: bool,
    lapsed_collecting: bool,
    any_read: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    ReadGate(usize),
    TakeSlot(usize, usize),
    Release(usize),
    TakeGate(usize),
    TakeNext(usize),
    Complete(usize),
    GiveUp(usize),
    Lapse(usize, usize),
}

#[derive(Clone)]
struct RwModel(Params);

impl RwModel {
    fn free(s: &mut State, c: usize, have: &[bool; ROWS]) {
        for (row, held) in have.iter().enumerate() {
            if *held && s.holder[row] == Some(c) {
                s.holder[row] = None;
            }
        }
    }

    fn last_slot(&self) -> usize {
        if self.0.skips_last_slot {
            SLOTS - 1
        } else {
            SLOTS
        }
    }
}

impl Model for RwModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            holder: [None; ROWS],
            token: [0; ROWS],
            clients: std::array::from_fn(|_| Client::Idle),
            begun_max: 0,
            bad_token: false,
            gate_epoch: 0,
            bypassed: false,
            two_readers: false,
            wrote_after_read: false,
            lapsed_collecting: false,
            any_read: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for c in 0..CLIENTS {
            match &s.clients[c] {
                Client::Idle => {
                    actions.push(Action::ReadGate(c));
                    actions.push(Action::TakeGate(c));
                }
                Client::GateFree { .. } => {
                    for slot in 1..=SLOTS {
                        actions.push(Action::TakeSlot(c, slot));
                    }
                    actions.push(Action::GiveUp(c));
                }
                Client::Reading { .. } | Client::Writing { .. } | Client::Stale { .. } => {
                    actions.push(Action::Release(c));
                }
                Client::Collecting { have, .. } => {
                    if have[1..=self.last_slot()].iter().all(|h| *h) {
                        actions.push(Action::Complete(c));
                    } else {
                        actions.push(Action::TakeNext(c));
                    }
                    actions.push(Action::GiveUp(c));
                }
            }
            for row in 0..ROWS {
                if s.holder[row] == Some(c) {
                    actions.push(Action::Lapse(c, row));
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::ReadGate(c) => {
                // The reader's read of the gate: only a free gate lets it ask for a slot.
                if s.holder[0].is_some() && !self.0.no_gate_check {
                    return None;
                }
                s.clients[c] = Client::GateFree {
                    epoch: s.gate_epoch,
                };
            }
            Action::TakeSlot(c, slot) => {
                let Client::GateFree { epoch } = s.clients[c] else {
                    return None;
                };
                if s.holder[slot].is_some() {
                    // Denied: back to waiting.
                    s.clients[c] = Client::Idle;
                } else {
                    let collecting = s.holder[0]
                        .is_some_and(|w| matches!(s.clients[w], Client::Collecting { .. }));
                    s.bypassed |= collecting && epoch == s.gate_epoch;
                    s.holder[slot] = Some(c);
                    s.token[slot] += 1;
                    s.begun_max = s.begun_max.max(s.token[slot]);
                    s.clients[c] = Client::Reading { slot };
                    s.any_read = true;
                    let readers = s
                        .clients
                        .iter()
                        .filter(|x| matches!(x, Client::Reading { .. }))
                        .count();
                    s.two_readers |= readers >= 2;
                }
            }
            Action::Release(c) => {
                match s.clients[c].clone() {
                    Client::Reading { slot } => {
                        if s.holder[slot] == Some(c) {
                            s.holder[slot] = None;
                        }
                    }
                    Client::Writing { have } | Client::Stale { have } => {
                        Self::free(&mut s, c, &have)
                    }
                    _ => return None,
                }
                s.clients[c] = Client::Idle;
            }
            Action::TakeGate(c) => {
                if s.holder[0].is_some() {
                    return None;
                }
                s.holder[0] = Some(c);
                s.token[0] += 1;
                s.gate_epoch += 1;
                let mut have = [false; ROWS];
                have[0] = true;
                s.clients[c] = Client::Collecting {
                    have,
                    lost: [false; ROWS],
                };
            }
            Action::TakeNext(c) => {
                let Client::Collecting { mut have, lost } = s.clients[c].clone() else {
                    return None;
                };
                let next = (1..=SLOTS).find(|r| !have[*r])?;
                if s.holder[next].is_some() {
                    return None; // waits for it
                }
                s.holder[next] = Some(c);
                s.token[next] += 1;
                have[next] = true;
                s.clients[c] = Client::Collecting { have, lost };
            }
            Action::Complete(c) => {
                let Client::Collecting { have, lost } = s.clients[c].clone() else {
                    return None;
                };
                if lost.iter().any(|l| *l) && !self.0.no_final_check {
                    // Not a write hold: let go of everything and start again.
                    Self::free(&mut s, c, &have);
                    s.clients[c] = Client::Idle;
                } else {
                    let slots = || (1..=self.last_slot()).map(|r| s.token[r]);
                    let token = if self.0.token_from_gate {
                        s.token[0]
                    } else if self.0.token_lowest {
                        slots().min().unwrap_or(0)
                    } else {
                        slots().max().unwrap_or(0)
                    };
                    s.bad_token |= token <= s.begun_max;
                    s.begun_max = s.begun_max.max(token);
                    s.wrote_after_read |= s.any_read;
                    let mut have = have;
                    for (row, l) in lost.iter().enumerate() {
                        if *l {
                            have[row] = false;
                        }
                    }
                    s.clients[c] = Client::Writing { have };
                }
            }
            Action::GiveUp(c) => {
                match s.clients[c].clone() {
                    Client::GateFree { .. } => {}
                    Client::Collecting { have, .. } => Self::free(&mut s, c, &have),
                    _ => return None,
                }
                s.clients[c] = Client::Idle;
            }
            Action::Lapse(c, row) => {
                if s.holder[row] != Some(c) {
                    return None;
                }
                s.holder[row] = None;
                s.clients[c] = match s.clients[c].clone() {
                    Client::Reading { .. } => Client::Idle,
                    Client::Collecting { have, mut lost } => {
                        lost[row] = true;
                        s.lapsed_collecting = true;
                        Client::Collecting { have, lost }
                    }
                    Client::Writing { mut have } | Client::Stale { mut have } => {
                        have[row] = false;
                        Client::Stale { have }
                    }
                    other => other,
                };
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(EXCLUSION, |_, s: &State| {
                let writers = s
                    .clients
                    .iter()
                    .filter(|c| matches!(c, Client::Writing { .. }))
                    .count();
                let readers = s
                    .clients
                    .iter()
                    .filter(|c| matches!(c, Client::Reading { .. }))
                    .count();
                writers == 0 || (writers == 1 && readers == 0)
            }),
            Property::always(TOKEN_ORDER, |_, s: &State| !s.bad_token),
            Property::always(NO_BYPASS, |_, s: &State| !s.bypassed),
            Property::sometimes("two readers at once", |_, s: &State| s.two_readers),
            Property::sometimes("a writer after a reader", |_, s: &State| s.wrote_after_read),
            Property::sometimes("a row lapses while a writer collects", |_, s: &State| {
                s.lapsed_collecting
            }),
        ]
    }
}

const EXCLUSION: &str = "a writer holds alone";
const TOKEN_ORDER: &str = "a write token exceeds every earlier hold's";
const NO_BYPASS: &str = "no reader gets in past a collecting writer's gate";

/// How far the checks explore (every state within this many steps of the start).
const DEPTH: usize = 18;

fn explore(
    p: Params,
    stop_at: Option<&'static str>,
) -> (usize, std::collections::BTreeMap<&'static str, String>) {
    let started = Instant::now();
    let mut builder = RwModel(p).checker().threads(2).target_max_depth(p.depth);
    if let Some(property) = stop_at {
        builder = builder.finish_when(HasDiscoveries::AnyOf([property].into()));
    }
    let checker = builder.spawn_bfs().join();
    let found = checker
        .discoveries()
        .into_iter()
        .map(|(name, path)| (name, format!("{:?}", path.into_actions())))
        .collect();
    println!(
        "model: reader-writer lock ({CLIENTS} processes, {SLOTS} read slots, depth {}): {} states in {:.1?}",
        p.depth,
        checker.unique_state_count(),
        started.elapsed()
    );
    (checker.unique_state_count(), found)
}

/// Every state within the depth: exclusion and token order hold, every sanity mark is reached.
#[test]
fn readers_together_or_one_writer_with_a_higher_token() {
    let p = Params {
        depth: DEPTH,
        ..Params::default()
    };
    let (_, found) = explore(p, None);
    for prop in RwModel(p).properties() {
        match prop.expectation {
            Expectation::Always => assert!(
                !found.contains_key(prop.name),
                "\"{}\" fails: {}",
                prop.name,
                found[prop.name]
            ),
            _ => assert!(
                found.contains_key(prop.name),
                "never reached \"{}\": the model is vacuous",
                prop.name
            ),
        }
    }
}

fn assert_caught(p: Params, property: &'static str) {
    let (states, found) = explore(p, Some(property));
    let trace = found
        .get(property)
        .unwrap_or_else(|| panic!("{p:?}: no counterexample to \"{property}\" in {states} states"));
    println!("  fails \"{property}\": {trace}");
}

#[test]
fn planted_a_write_token_from_the_gate_is_caught() {
    assert_caught(
        Params {
            depth: DEPTH,
            token_from_gate: true,
            ..Params::default()
        },
        TOKEN_ORDER,
    );
}

#[test]
fn planted_the_lowest_slot_token_is_caught() {
    assert_caught(
        Params {
            depth: DEPTH,
            token_lowest: true,
            ..Params::default()
        },
        TOKEN_ORDER,
    );
}

#[test]
fn planted_no_check_of_rows_lost_while_collecting_is_caught() {
    assert_caught(
        Params {
            depth: DEPTH,
            no_final_check: true,
            ..Params::default()
        },
        EXCLUSION,
    );
}

#[test]
fn planted_a_writer_short_of_one_slot_is_caught() {
    assert_caught(
        Params {
            depth: DEPTH,
            skips_last_slot: true,
            ..Params::default()
        },
        EXCLUSION,
    );
}

#[test]
fn planted_a_reader_that_skips_the_gate_is_caught() {
    assert_caught(
        Params {
            depth: DEPTH,
            no_gate_check: true,
            ..Params::default()
        },
        NO_BYPASS,
    );
}
