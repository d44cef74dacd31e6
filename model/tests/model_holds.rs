//! A model check of the hold rule, once for every kind of hold on the store's one renewer, with
//! one set of properties: lock guards and semaphore permits (every attempt under a holder id of
//! its own, released by that id), shard terms and elector terms renewed together (one id per
//! process, a release naming the term's token). Two client processes, one or two lease rows (two
//! locks, or the two permits of one semaphore, or two shards), every interleaving of their store
//! calls and of the store, clocks slow or fast, at the margin the rule asks for.
//! docs/reliability.md ("Every kind of hold") describes the checks and their results.
//!
//! Time, clocks and the store's statements follow `model_election.rs`: one tick of the database
//! clock is the unit; a statement has a start (its `now`, which judges liveness: expired iff
//! `expires_at <= now`) and is applied later, atomically, at its write (`expires_at = write +
//! lease`); a client's clock counts `lease - margin` over anywhere from `fast` to `slow`
//! database ticks, each deadline placed on its own.
//!
//! # The clients
//!
//! Each follows `src/locks/holder.rs`, `src/hold/keeper.rs` and `src/hold/renewer.rs` (shard
//! sets and electors renewing together send the same batch):
//! - an acquire of a row it does not hold, one at a time; its answer `Acquired` begins a hold
//!   with the local deadline `sent + span` (`sent` read before the call) unless that deadline has
//!   passed (then the grant is released); a `Renewed` (a live lease of the asker's own id) begins
//!   nothing and is released; an acquire may be given up on while its statement still runs;
//! - the renewer's batch: one call for any of the client's holds whose deadline has not passed
//!   (nothing is sent past a deadline), one send instant for all; each row is renewed on its own
//!   (the batch's statement, or the single renew of a row it skipped because a transaction held
//!   it), conditional on the hold's (holder, token) and its liveness at that statement's start;
//!   the answer moves each renewed hold's deadline to `sent + span` and ends each hold found
//!   lost; a batch may be given up on (no answer in time) with its statements still running;
//! - a hold whose deadline passed ends when the keeper sees it (a release may follow, or not);
//!   a hold may be released at any time (it ends first, then the release is sent);
//! - a holder's work sends fenced writes fenced by any set of the holds it has, also past their
//!   deadlines (a paused process that wakes up): a write commits only if every row it names is
//!   still that hold's (holder, token) and live at the write's start.
//!
//! Every step may happen at any time or never, statements may start late and be applied later,
//! and answers may never be read; statements nobody waits for are bounded (`max_orphans`).
//! Times are relative to now (past instants by their order among the starts in flight), tokens
//! and ids by rank. The state space of two processes runs to tens of millions of states, so
//! each check explores every state within a number of steps from the start (16 with one row, 12
//! with two; `HOLDS_DEPTH=N` goes deeper), and each planted bug below is found within 14 steps.
//!
//! # Properties (invariants of every reachable state)
//!
//! - at most one process holds each row under a local deadline that has not passed, and the
//!   store agrees with it (the row is that hold's, live);
//! - holds begin in token order, and each hold's token exceeds every earlier hold's of that row;
//! - a fenced write commits only if every hold it names is the current one of its row, believed
//!   by no other process (whatever the deadlines of the writer's holds by then).

use std::time::Instant;

use orion_beacon_model::{counted, place, rule_margin};
use stateright::{Checker, Expectation, HasDiscoveries, Model, Property};

/// The most lease rows a check has.
const ROWS: usize = 2;

#[derive(Clone, Copy, Debug)]
struct Params {
    /// The kind of hold, for the output.
    kind: &'static str,
    clients: usize,
    rows: usize,
    /// Lease duration, in database ticks.
    lease: i8,
    /// Step-down margin, in ticks of the client's clock.
    margin: i8,
    /// `K`: the clocks may differ by one tick per `K` database ticks; 0: no drift.
    skew_every: u8,
    /// Every acquire under a holder id of its own, released by that id alone (lock guards,
    /// permits); otherwise one id per process and a release that names the hold's token
    /// (shard terms, elector terms).
    fresh_ids: bool,
    fence: bool,
    max_orphans: usize,
    /// Explore this many steps from the start (`None`: every reachable state).
    depth: Option<usize>,
    /// Planted bugs, each for a negative check: a batch's deadlines (not a grant's) counted from
    /// its answer instead of its send; a fence that checks only the first hold it names; a release that
    /// names only the holder where one id holds again.
    deadline_from_answer: bool,
    fence_checks_first_only: bool,
    /// Planted: an acquire answered `Renewed` (a live lease of the asker's own id) begins a
    /// hold, as the elector's first rule did.
    renewed_begins_holds: bool,
    release_names_holder_only: bool,
}

impl Params {
    /// `kind` with two clients, fenced writes, one statement in flight that nobody waits for,
    /// and the rule's margin.
    fn of(kind: &'static str, rows: usize, fresh_ids: bool, lease: i8, k: u8) -> Self {
        Params {
            kind,
            clients: 2,
            rows,
            lease,
            margin: rule_margin(lease, k),
            skew_every: k,
            fresh_ids,
            fence: true,
            max_orphans: 1,
            depth: None,
            deadline_from_answer: false,
            fence_checks_first_only: false,
            renewed_begins_holds: false,
            release_names_holder_only: false,
        }
    }

    /// The database ticks over which a client's clock counts `lease - margin`: the fastest and
    /// the slowest clock.
    fn spans(&self) -> (i8, i8) {
        let d = (self.lease - self.margin) as i16;
        let first = |sign: i16| {
            (0..)
                .find(|&w| counted(w, self.skew_every, sign) >= d)
                .unwrap_or(d)
        };
        (first(1) as i8, first(-1) as i8)
    }
}

/// A holder id: the client and, with fresh ids, the attempt (0 otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Id {
    client: u8,
    n: u8,
}

/// A lease row. Past instants are kept only by their order among the starts in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Row {
    holder: Id,
    token: u8,
    expires: i8,
    renewed: i8,
    /// Ghost (not a column): a hold has begun on this token.
    led: bool,
}

/// A hold a client has: its id and token, and the database instant (relative to now) at which
/// its clock reaches the local deadline (0: passed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Hold {
    id: Id,
    token: u8,
    deadline: i8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Answer {
    Acquired(u8),
    Renewed(u8),
    Denied,
}

/// The acquire a client waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Call {
    row: u8,
    id: Id,
    sent: i8,
    answer: Option<Answer>,
}

/// One hold's renew in a batch, and whether the store renewed it (once applied).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Item {
    id: Id,
    token: u8,
    renewed: Option<bool>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Batch {
    sent: i8,
    items: [Option<Item>; ROWS],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Client {
    /// The next fresh id's attempt number.
    next: u8,
    holds: [Option<Hold>; ROWS],
    acquire: Option<Call>,
    batch: Option<Batch>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    Acquire,
    /// The renew of the hold with this token.
    Renew(u8),
    /// The release of the hold with this token (with fresh ids the statement names the id only).
    Release(u8),
    /// A fenced write: the (id, token) of each hold it is fenced by, per row.
    Fence([Option<(Id, u8)>; ROWS]),
}

/// A statement on its way to, or waiting in, the database.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Msg {
    origin: Id,
    row: u8,
    kind: Kind,
    /// Its `now`, once it started (relative to now, so <= 0).
    start: Option<i8>,
    /// Whether the sender still waits for the answer.
    wanted: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    rows: [Option<Row>; ROWS],
    clients: Vec<Client>,
    msgs: Vec<Msg>,
    /// A violation seen on a transition.
    bad: Option<&'static str>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    /// The database clock advances one tick; first the statements in the mask (a bit set of
    /// indices of statements not started yet) start at the instant that ends (a start matters
    /// only through its instant).
    Tick(u16),
    /// The database applies statement `i` (one not started yet starts now).
    Apply(usize),
    /// Client `c` sends an acquire of row `r`.
    Acquire(usize, u8),
    /// Client `c` reads its acquire's answer; a grant's deadline comes `span` ticks after the send.
    AcquireAnswer(usize, i8),
    /// Client `c` stops waiting for its acquire (the statement may still run).
    AcquireGiveUp(usize),
    /// Client `c`'s renewer sends a batch for the holds of the rows in the mask.
    Renew(usize, u8),
    /// Client `c` reads its batch's answer; spans per row.
    RenewAnswer(usize, [i8; ROWS]),
    /// Client `c` stops waiting for its batch (its statements may still run).
    RenewGiveUp(usize),
    /// Client `c` finds its hold of row `r` past its deadline and ends it (a release that
    /// follows is `Release`'s).
    End(usize, u8),
    /// Client `c` releases its hold of row `r` (the hold ends first).
    Release(usize, u8),
    /// Client `c`'s work sends a fenced write fenced by its holds of the rows in the mask.
    Fence(usize, u8),
}

const AGREES: &str = "the store agrees with every hold under its deadline";
const ONE_HOLDER: &str = "at most one process holds each row";
const TOKEN_ORDER: &str = "holds begin in token order";
const NEW_TOKEN: &str = "each hold's token exceeds every earlier hold's of its row";
const FENCE_ORDER: &str = "a fenced write commits only for the current holds";

#[derive(Clone)]
struct Holds {
    p: Params,
    fast: i8,
    slow: i8,
}

impl State {
    fn orphans(&self) -> usize {
        self.msgs.iter().filter(|m| !m.wanted).count()
    }
}

fn bits(mask: u8) -> impl Iterator<Item = usize> {
    (0..ROWS).filter(move |r| mask & (1 << r) != 0)
}

impl Holds {
    fn new(p: Params) -> Self {
        let (fast, slow) = p.spans();
        Holds { p, fast, slow }
    }

    fn spans(&self) -> impl Iterator<Item = i8> {
        self.fast..=self.slow
    }

    /// A statement nobody waits for, if the bound allows (otherwise it is lost on the way).
    fn send_orphan(&self, s: &mut State, origin: Id, row: u8, kind: Kind) {
        if s.orphans() < self.p.max_orphans {
            s.msgs.push(Msg {
                origin,
                row,
                kind,
                start: None,
                wanted: false,
            });
        }
    }

    /// The waited-for acquire (or renew) of `origin` on `row` is no longer waited for.
    fn orphan(&self, s: &mut State, origin: Id, row: u8, acquire: bool) {
        if let Some(i) = s.msgs.iter().position(|m| {
            m.origin == origin && m.row == row && m.wanted && (m.kind == Kind::Acquire) == acquire
        }) {
            s.msgs[i].wanted = false;
            if s.orphans() > self.p.max_orphans {
                s.msgs.remove(i);
            }
        }
    }

    fn release(&self, s: &mut State, id: Id, row: u8, token: u8) {
        self.send_orphan(s, id, row, Kind::Release(token));
    }

    fn apply(&self, s: &mut State, m: Msg) {
        let start = m.start.unwrap_or(0);
        let lease = self.p.lease;
        let r = m.row as usize;
        let live = |row: &Row| row.expires > start;
        match m.kind {
            Kind::Acquire => {
                let answer = match s.rows[r] {
                    Some(row) if live(&row) && row.holder == m.origin => {
                        s.rows[r] = Some(Row {
                            expires: lease,
                            renewed: start,
                            ..row
                        });
                        Answer::Renewed(row.token)
                    }
                    Some(row) if live(&row) => Answer::Denied,
                    previous => {
                        let token = previous.map_or(1, |row| row.token + 1);
                        s.rows[r] = Some(Row {
                            holder: m.origin,
                            token,
                            expires: lease,
                            renewed: start,
                            led: false,
                        });
                        Answer::Acquired(token)
                    }
                };
                if m.wanted {
                    let call = s.clients[m.origin.client as usize].acquire.as_mut();
                    if let Some(call) = call.filter(|c| c.id == m.origin && c.row == m.row) {
                        call.answer = Some(answer);
                    }
                }
            }
            Kind::Renew(token) => {
                let renewed = match s.rows[r] {
                    Some(row) if live(&row) && row.holder == m.origin && row.token == token => {
                        s.rows[r] = Some(Row {
                            expires: lease,
                            renewed: start,
                            ..row
                        });
                        true
                    }
                    _ => false,
                };
                if m.wanted {
                    let batch = s.clients[m.origin.client as usize].batch.as_mut();
                    if let Some(item) = batch.and_then(|b| b.items[r].as_mut()) {
                        item.renewed = Some(renewed);
                    }
                }
            }
            Kind::Release(token) => {
                let by_id = self.p.fresh_ids || self.p.release_names_holder_only;
                if let Some(row) = s.rows[r].as_mut() {
                    if live(row) && row.holder == m.origin && (by_id || row.token == token) {
                        row.expires = row.renewed.min(start);
                    }
                }
            }
            Kind::Fence(holds) => {
                let named: Vec<(usize, (Id, u8))> =
                    (0..ROWS).filter_map(|r| holds[r].map(|h| (r, h))).collect();
                let checked = if self.p.fence_checks_first_only {
                    &named[..1]
                } else {
                    &named[..]
                };
                let commits = checked.iter().all(|&(r, (id, token))| {
                    matches!(s.rows[r], Some(row)
                        if row.holder == id && row.token == token && live(&row))
                });
                let others_believe = named.iter().any(|&(r, (id, token))| {
                    s.clients.iter().any(|c| {
                        matches!(c.holds[r], Some(h)
                            if h.deadline > 0 && (h.id != id || h.token != token))
                    })
                });
                let current = named.iter().all(|&(r, (id, token))| {
                    matches!(s.rows[r], Some(row) if row.holder == id && row.token == token)
                });
                if commits && (others_believe || !current) {
                    s.bad = Some(FENCE_ORDER);
                }
            }
        }
    }

    /// Keeps the state finite and small without changing what can happen next.
    fn canonicalize(&self, s: &mut State) {
        for c in s.clients.iter_mut() {
            if let Some(call) = c.acquire.as_mut() {
                // Any send this long ago gives a deadline that has passed; a denial needs none.
                let timed = call.answer != Some(Answer::Denied);
                call.sent = if timed { call.sent.max(-self.slow) } else { 0 };
            }
            if let Some(batch) = c.batch.as_mut() {
                batch.sent = if self.p.deadline_from_answer {
                    0
                } else {
                    batch.sent.max(-self.slow)
                };
            }
        }
        // Past instants of the rows are only ever compared with the starts in flight.
        let mut starts: Vec<i8> = s
            .msgs
            .iter()
            .filter_map(|m| m.start)
            .filter(|&t| t < 0)
            .collect();
        starts.sort_unstable();
        starts.dedup();
        let place = |t: i8| place(&starts, t);
        for row in s.rows.iter_mut().flatten() {
            row.expires = place(row.expires);
            row.renewed = place(row.renewed);
        }
        for m in s.msgs.iter_mut() {
            if let Some(t) = m.start {
                m.start = Some(place(t));
            }
        }
        for r in 0..ROWS {
            self.rank_tokens(s, r);
        }
        if self.p.fresh_ids {
            self.rank_ids(s);
        }
        s.msgs.sort_unstable();
    }

    /// Tokens of row `r` are only compared with each other: keep them by rank.
    fn rank_tokens(&self, s: &mut State, r: usize) {
        let mut seen: Vec<u8> = Vec::new();
        visit_tokens(s, r, |t| seen.push(*t));
        seen.sort_unstable();
        seen.dedup();
        visit_tokens(s, r, |t| {
            *t = seen.binary_search(t).map_or(0, |i| i as u8 + 1);
        });
    }

    /// Fresh ids are only compared with each other: keep each client's by rank, the next one
    /// above them all.
    fn rank_ids(&self, s: &mut State) {
        for client in 0..s.clients.len() as u8 {
            let mut seen: Vec<u8> = Vec::new();
            visit_ids(s, |id| {
                if id.client == client {
                    seen.push(id.n)
                }
            });
            seen.sort_unstable();
            seen.dedup();
            visit_ids(s, |id| {
                if id.client == client {
                    id.n = seen.binary_search(&id.n).map_or(0, |i| i as u8);
                }
            });
            s.clients[client as usize].next = seen.len() as u8;
        }
    }
}

/// Every token of row `r` in the state.
fn visit_tokens(s: &mut State, r: usize, mut f: impl FnMut(&mut u8)) {
    if let Some(row) = s.rows[r].as_mut() {
        f(&mut row.token);
    }
    for c in s.clients.iter_mut() {
        if let Some(h) = c.holds[r].as_mut() {
            f(&mut h.token);
        }
        if let Some(call) = c.acquire.as_mut().filter(|c| c.row as usize == r) {
            if let Some(Answer::Acquired(t) | Answer::Renewed(t)) = call.answer.as_mut() {
                f(t);
            }
        }
        if let Some(item) = c.batch.as_mut().and_then(|b| b.items[r].as_mut()) {
            f(&mut item.token);
        }
    }
    for m in s.msgs.iter_mut() {
        match &mut m.kind {
            Kind::Renew(t) | Kind::Release(t) if m.row as usize == r => f(t),
            Kind::Fence(holds) => {
                if let Some((_, t)) = holds[r].as_mut() {
                    f(t);
                }
            }
            _ => {}
        }
    }
}

/// Every holder id in the state.
fn visit_ids(s: &mut State, mut f: impl FnMut(&mut Id)) {
    for row in s.rows.iter_mut().flatten() {
        f(&mut row.holder);
    }
    for c in s.clients.iter_mut() {
        for h in c.holds.iter_mut().flatten() {
            f(&mut h.id);
        }
        if let Some(call) = c.acquire.as_mut() {
            f(&mut call.id);
        }
        if let Some(batch) = c.batch.as_mut() {
            for item in batch.items.iter_mut().flatten() {
                f(&mut item.id);
            }
        }
    }
    for m in s.msgs.iter_mut() {
        f(&mut m.origin);
        if let Kind::Fence(holds) = &mut m.kind {
            for (id, _) in holds.iter_mut().flatten() {
                f(id);
            }
        }
    }
}

impl Model for Holds {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let client = Client {
            next: 0,
            holds: [None; ROWS],
            acquire: None,
            batch: None,
        };
        vec![State {
            rows: [None; ROWS],
            clients: vec![client; self.p.clients],
            msgs: Vec::new(),
            bad: None,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.bad.is_some() {
            return;
        }
        let unstarted: Vec<usize> = (0..s.msgs.len())
            .filter(|&i| s.msgs[i].start.is_none())
            .collect();
        for subset in 0..(1u16 << unstarted.len()) {
            let mask = unstarted
                .iter()
                .enumerate()
                .filter(|(bit, _)| subset & (1 << bit) != 0)
                .fold(0u16, |mask, (_, &i)| mask | (1 << i));
            actions.push(Action::Tick(mask));
        }
        actions.extend((0..s.msgs.len()).map(Action::Apply));
        let room = s.orphans() < self.p.max_orphans;
        let masks = 1u8..(1 << self.p.rows);
        for (c, client) in s.clients.iter().enumerate() {
            match client.acquire {
                None => {
                    for r in 0..self.p.rows {
                        if client.holds[r].is_none() {
                            actions.push(Action::Acquire(c, r as u8));
                        }
                    }
                }
                Some(call) => {
                    match call.answer {
                        Some(Answer::Acquired(_)) => {
                            actions.extend(self.spans().map(|w| Action::AcquireAnswer(c, w)))
                        }
                        Some(Answer::Renewed(_)) if self.p.renewed_begins_holds => {
                            actions.extend(self.spans().map(|w| Action::AcquireAnswer(c, w)))
                        }
                        Some(_) => actions.push(Action::AcquireAnswer(c, 0)),
                        None => {}
                    }
                    actions.push(Action::AcquireGiveUp(c));
                }
            }
            match client.batch {
                None => {
                    for mask in masks.clone() {
                        let due = bits(mask)
                            .all(|r| matches!(client.holds[r], Some(h) if h.deadline > 0));
                        if due {
                            actions.push(Action::Renew(c, mask));
                        }
                    }
                }
                Some(batch) => {
                    let items: Vec<usize> =
                        (0..ROWS).filter(|&r| batch.items[r].is_some()).collect();
                    if items
                        .iter()
                        .all(|&r| batch.items[r].is_some_and(|i| i.renewed.is_some()))
                    {
                        // A span for each renewed item (the others need none).
                        let mut combos = vec![[0i8; ROWS]];
                        for &r in &items {
                            if batch.items[r].is_some_and(|i| i.renewed == Some(true)) {
                                combos = combos
                                    .into_iter()
                                    .flat_map(|combo| {
                                        self.spans().map(move |w| {
                                            let mut next = combo;
                                            next[r] = w;
                                            next
                                        })
                                    })
                                    .collect();
                            }
                        }
                        actions.extend(combos.into_iter().map(|w| Action::RenewAnswer(c, w)));
                    }
                    actions.push(Action::RenewGiveUp(c));
                }
            }
            for r in 0..self.p.rows {
                if let Some(h) = client.holds[r] {
                    if h.deadline == 0 {
                        actions.push(Action::End(c, r as u8));
                    }
                    actions.push(Action::Release(c, r as u8));
                }
            }
            if self.p.fence && room {
                for mask in masks.clone() {
                    if bits(mask).all(|r| client.holds[r].is_some()) {
                        actions.push(Action::Fence(c, mask));
                    }
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick(starts) => {
                for (i, m) in s.msgs.iter_mut().enumerate() {
                    if starts & (1 << i) != 0 {
                        m.start = Some(0);
                    }
                }
                for row in s.rows.iter_mut().flatten() {
                    row.expires -= 1;
                    row.renewed -= 1;
                }
                for m in s.msgs.iter_mut() {
                    if let Some(t) = m.start.as_mut() {
                        *t -= 1;
                    }
                }
                for c in s.clients.iter_mut() {
                    for h in c.holds.iter_mut().flatten() {
                        h.deadline = (h.deadline - 1).max(0);
                    }
                    if let Some(call) = c.acquire.as_mut() {
                        call.sent -= 1;
                    }
                    if let Some(batch) = c.batch.as_mut() {
                        batch.sent -= 1;
                    }
                }
            }
            Action::Apply(i) => {
                let mut m = s.msgs.remove(i);
                m.start.get_or_insert(0);
                self.apply(&mut s, m);
            }
            Action::Acquire(c, r) => {
                let client = &mut s.clients[c];
                let id = Id {
                    client: c as u8,
                    n: if self.p.fresh_ids { client.next } else { 0 },
                };
                client.next += u8::from(self.p.fresh_ids);
                client.acquire = Some(Call {
                    row: r,
                    id,
                    sent: 0,
                    answer: None,
                });
                s.msgs.push(Msg {
                    origin: id,
                    row: r,
                    kind: Kind::Acquire,
                    start: None,
                    wanted: true,
                });
            }
            Action::AcquireAnswer(c, span) => {
                let call = s.clients[c].acquire.take()?;
                let r = call.row as usize;
                let deadline = (call.sent + span).max(0);
                let answer = match call.answer? {
                    Answer::Renewed(token) if self.p.renewed_begins_holds => {
                        Answer::Acquired(token)
                    }
                    answer => answer,
                };
                match answer {
                    Answer::Acquired(token) if deadline > 0 => {
                        match s.rows[r].as_mut() {
                            Some(row) if row.holder == call.id && row.token == token => {
                                if row.led {
                                    s.bad = Some(NEW_TOKEN);
                                }
                                row.led = true;
                            }
                            _ => s.bad = Some(TOKEN_ORDER),
                        }
                        s.clients[c].holds[r] = Some(Hold {
                            id: call.id,
                            token,
                            deadline,
                        });
                    }
                    // Too late to be trusted, or a live lease of its own id: never a hold.
                    Answer::Acquired(token) | Answer::Renewed(token) => {
                        self.release(&mut s, call.id, call.row, token)
                    }
                    Answer::Denied => {}
                }
            }
            Action::AcquireGiveUp(c) => {
                let call = s.clients[c].acquire.take()?;
                self.orphan(&mut s, call.id, call.row, true);
            }
            Action::Renew(c, mask) => {
                let mut batch = Batch {
                    sent: 0,
                    items: [None; ROWS],
                };
                for r in bits(mask) {
                    let h = s.clients[c].holds[r]?;
                    batch.items[r] = Some(Item {
                        id: h.id,
                        token: h.token,
                        renewed: None,
                    });
                    s.msgs.push(Msg {
                        origin: h.id,
                        row: r as u8,
                        kind: Kind::Renew(h.token),
                        start: None,
                        wanted: true,
                    });
                }
                s.clients[c].batch = Some(batch);
            }
            Action::RenewAnswer(c, spans) => {
                let batch = s.clients[c].batch.take()?;
                let base = if self.p.deadline_from_answer {
                    0
                } else {
                    batch.sent
                };
                for (r, span) in spans.into_iter().enumerate() {
                    let Some(item) = batch.items[r] else { continue };
                    let hold = &mut s.clients[c].holds[r];
                    // An answer only for the hold it was sent for.
                    if !matches!(hold, Some(h) if h.id == item.id && h.token == item.token) {
                        continue;
                    }
                    if item.renewed == Some(true) {
                        if let Some(h) = hold.as_mut() {
                            h.deadline = (base + span).max(0);
                        }
                    } else {
                        *hold = None;
                    }
                }
            }
            Action::RenewGiveUp(c) => {
                let batch = s.clients[c].batch.take()?;
                for r in 0..ROWS {
                    if let Some(item) = batch.items[r].filter(|i| i.renewed.is_none()) {
                        self.orphan(&mut s, item.id, r as u8, false);
                    }
                }
            }
            Action::End(c, r) => {
                s.clients[c].holds[r as usize].take()?;
            }
            Action::Release(c, r) => {
                let h = s.clients[c].holds[r as usize].take()?;
                self.release(&mut s, h.id, r, h.token);
            }
            Action::Fence(c, mask) => {
                let mut holds = [None; ROWS];
                for r in bits(mask) {
                    let h = s.clients[c].holds[r]?;
                    holds[r] = Some((h.id, h.token));
                }
                let origin = Id {
                    client: c as u8,
                    n: 0,
                };
                self.send_orphan(&mut s, origin, 0, Kind::Fence(holds));
            }
        }
        self.canonicalize(&mut s);
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(AGREES, |_, s: &State| {
                s.clients.iter().all(|c| {
                    (0..ROWS).all(|r| match c.holds[r] {
                        Some(h) if h.deadline > 0 => matches!(s.rows[r], Some(row)
                            if row.holder == h.id && row.token == h.token && row.expires > 0),
                        _ => true,
                    })
                })
            }),
            Property::always(ONE_HOLDER, |_, s: &State| {
                (0..ROWS).all(|r| {
                    s.clients
                        .iter()
                        .filter(|c| c.holds[r].is_some_and(|h| h.deadline > 0))
                        .count()
                        <= 1
                })
            }),
            Property::always(TOKEN_ORDER, |_, s: &State| s.bad != Some(TOKEN_ORDER)),
            Property::always(NEW_TOKEN, |_, s: &State| s.bad != Some(NEW_TOKEN)),
            Property::always(FENCE_ORDER, |_, s: &State| s.bad != Some(FENCE_ORDER)),
            // Sanity: the model reaches the situations the properties are about.
            Property::sometimes("a process holds a row", |_, s: &State| {
                s.clients
                    .iter()
                    .any(|c| c.holds.iter().flatten().any(|h| h.deadline > 0))
            }),
            Property::sometimes(
                "a process holds every row at once",
                |m: &Holds, s: &State| {
                    s.clients
                        .iter()
                        .any(|c| (0..m.p.rows).all(|r| c.holds[r].is_some_and(|h| h.deadline > 0)))
                },
            ),
            Property::sometimes(
                "a process holds a row another still holds past its deadline",
                |_, s: &State| {
                    (0..ROWS).any(|r| {
                        s.clients
                            .iter()
                            .any(|c| c.holds[r].is_some_and(|h| h.deadline > 0))
                            && s.clients
                                .iter()
                                .any(|c| c.holds[r].is_some_and(|h| h.deadline == 0))
                    })
                },
            ),
            Property::sometimes("a batch renews a hold", |_, s: &State| {
                s.clients.iter().any(|c| {
                    c.batch
                        .is_some_and(|b| b.items.iter().flatten().any(|i| i.renewed == Some(true)))
                })
            }),
            Property::sometimes(
                "a stale fenced write is in flight while another process holds its row",
                |m: &Holds, s: &State| {
                    !m.p.fence
                        || s.msgs.iter().any(|msg| {
                            let Kind::Fence(holds) = msg.kind else {
                                return false;
                            };
                            (0..ROWS).any(|r| {
                                holds[r].is_some()
                                    && s.clients.iter().enumerate().any(|(c, cl)| {
                                        c != msg.origin.client as usize
                                            && cl.holds[r].is_some_and(|h| h.deadline > 0)
                                    })
                            })
                        })
                },
            ),
        ]
    }
}

// ---------------------------------------------------------------------------------------------
// Running the checks
// ---------------------------------------------------------------------------------------------

fn describe(p: &Params) -> String {
    let (fast, slow) = p.spans();
    format!(
        "{}: {} processes, {} row(s), lease {}, margin {}, rho {} (deadline {}..={} ticks after \
         the send), {}, fenced writes {}, orphans <= {}, {}",
        p.kind,
        p.clients,
        p.rows,
        p.lease,
        p.margin,
        if p.skew_every == 0 {
            "0".to_string()
        } else {
            format!("1/{}", p.skew_every)
        },
        fast,
        slow,
        if p.fresh_ids {
            "an id per hold, released by its id"
        } else {
            "an id per process, releases naming the token"
        },
        p.fence,
        p.max_orphans,
        match p.depth {
            Some(d) => format!("within {d} steps"),
            None => "exhaustive".to_owned(),
        },
    )
}

fn who(id: Id) -> String {
    let name = (b'A' + id.client) as char;
    format!("{name}{}", "'".repeat(id.n as usize))
}

/// The rows and the holds under their deadlines, times relative to now.
fn show(s: &State) -> String {
    let mut out = Vec::new();
    for (r, row) in s.rows.iter().enumerate() {
        if let Some(row) = row {
            out.push(format!(
                "r{r}: {} token {} expires {:+}",
                who(row.holder),
                row.token,
                row.expires
            ));
        }
    }
    for c in &s.clients {
        for (r, h) in c.holds.iter().enumerate() {
            if let Some(h) = h {
                out.push(format!(
                    "{} holds r{r} token {} deadline {:+}",
                    who(h.id),
                    h.token,
                    h.deadline
                ));
            }
        }
    }
    out.join("; ")
}

/// A trace: one line per step, the action (statement indices into the sorted statements in
/// flight) and then the rows and holds.
fn trace(path: stateright::Path<State, Action>) -> String {
    let steps = path.into_vec();
    let mut out = String::new();
    let mut db = 0;
    for w in steps.windows(2) {
        let Some(action) = w[0].1 else { break };
        if matches!(action, Action::Tick(_)) {
            db += 1;
        }
        out.push_str(&format!("  db={db:<3} {action:?}   [{}]\n", show(&w[1].0)));
    }
    out
}

struct Run {
    unique: usize,
    depth: usize,
    elapsed: std::time::Duration,
    discoveries: std::collections::BTreeMap<&'static str, String>,
}

fn explore(p: Params, stop_at: Option<&'static str>) -> Run {
    let model = Holds::new(p);
    let started = Instant::now();
    let mut builder = model.clone().checker().threads(2);
    // `HOLDS_DEPTH=N` explores the safety checks deeper (minutes and gigabytes past 18).
    let deeper = std::env::var("HOLDS_DEPTH")
        .ok()
        .filter(|_| stop_at.is_none());
    let depth = deeper.and_then(|v| v.parse().ok()).or(p.depth);
    if let Some(depth) = depth {
        builder = builder.target_max_depth(depth);
    }
    if let Some(property) = stop_at {
        builder = builder.finish_when(HasDiscoveries::AnyOf([property].into()));
    }
    let checker = builder.spawn_bfs().join();
    Run {
        elapsed: started.elapsed(),
        depth: checker.max_depth(),
        unique: checker.unique_state_count(),
        discoveries: checker
            .discoveries()
            .into_iter()
            .map(|(name, path)| (name, trace(path)))
            .collect(),
    }
}

/// Every reachable state: no safety property fails, every sanity property is reached.
fn assert_safe(p: Params) {
    let run = explore(p, None);
    println!(
        "model: {}: safe; {} states, depth {}, {:.1?}",
        describe(&p),
        run.unique,
        run.depth,
        run.elapsed
    );
    for prop in Holds::new(p).properties() {
        let found = run.discoveries.get(prop.name);
        if matches!(prop.expectation, Expectation::Always) {
            if let Some(trace) = found {
                panic!("model: {}: \"{}\" fails:\n{trace}", describe(&p), prop.name);
            }
        } else {
            assert!(
                found.is_some(),
                "model: {}: never reached \"{}\": the model is vacuous",
                describe(&p),
                prop.name
            );
        }
    }
}

/// A counterexample to `property` (the shortest, breadth first).
fn assert_unsafe(p: Params, property: &'static str) {
    let p = Params {
        depth: Some(p.depth.unwrap_or(30)),
        ..p
    };
    let run = explore(p, Some(property));
    let Some(trace) = run.discoveries.get(property) else {
        panic!(
            "model: {}: expected a counterexample to \"{property}\", found none in {} states",
            describe(&p),
            run.unique
        );
    };
    println!(
        "model: {}: counterexample after {} states, {:.1?}",
        describe(&p),
        run.unique,
        run.elapsed
    );
    println!("  fails \"{property}\":\n{trace}");
}

// ---------------------------------------------------------------------------------------------
// The checks (state counts and times: docs/reliability.md)
// ---------------------------------------------------------------------------------------------

/// How far the checks explore: every state within this many steps of the start (the state
/// space of two processes is tens of millions of states past these depths).
const ONE_ROW_DEPTH: usize = 16;
const TWO_ROWS_DEPTH: usize = 12;

/// Lock guards and semaphore permits: each hold under an id of its own, released by that id,
/// renewed by the batch.
#[test]
fn lock_guards_one_holder() {
    assert_safe(Params {
        depth: Some(ONE_ROW_DEPTH),
        ..Params::of("lock guards", 1, true, 2, 2)
    });
}

/// Two locks, or two permits of one semaphore: a process may hold both, renews them in one
/// batch and fences one transaction with both.
#[test]
fn two_locks_or_permits_fenced_together_one_holder_each() {
    assert_safe(Params {
        depth: Some(TWO_ROWS_DEPTH),
        ..Params::of("two locks or permits", 2, true, 2, 2)
    });
}

/// Shard terms and elector terms renewed together: one id per process, releases naming the
/// term.
#[test]
fn terms_one_holder() {
    assert_safe(Params {
        depth: Some(ONE_ROW_DEPTH),
        ..Params::of("shard and elector terms", 1, false, 2, 2)
    });
}

/// Shard terms of two shards, one batch for both.
#[test]
fn shard_terms_one_holder_per_shard() {
    assert_safe(Params {
        depth: Some(TWO_ROWS_DEPTH),
        ..Params::of("shard terms", 2, false, 2, 2)
    });
}

/// Without clock drift no margin is needed.
#[test]
fn no_drift_needs_no_margin() {
    assert_safe(Params {
        margin: 0,
        depth: Some(ONE_ROW_DEPTH),
        ..Params::of("lock guards", 1, true, 2, 0)
    });
}

/// A margin one tick below the rule lets two processes hold a row.
#[test]
fn one_tick_below_the_rule_fails() {
    let p = Params::of("lock guards", 1, true, 3, 3);
    assert_unsafe(
        Params {
            margin: p.margin - 1,
            ..p
        },
        ONE_HOLDER,
    );
}

/// A batch's deadlines counted from its answer instead of its send.
#[test]
fn a_batch_deadline_counted_from_its_answer_fails() {
    assert_unsafe(
        Params {
            deadline_from_answer: true,
            ..Params::of("lock guards", 1, true, 3, 3)
        },
        ONE_HOLDER,
    );
}

/// A fenced write that checks only the first of the holds it names.
#[test]
fn a_fence_that_checks_one_of_its_holds_fails() {
    assert_unsafe(
        Params {
            fence_checks_first_only: true,
            ..Params::of("two locks", 2, true, 1, 0)
        },
        FENCE_ORDER,
    );
}

/// A `Renewed` taken up as a new hold (the elector's first rule) begins a hold on a token a
/// hold already began on, where one id per process asks again.
#[test]
fn a_renewed_taken_up_as_a_hold_reuses_its_token() {
    assert_unsafe(
        Params {
            renewed_begins_holds: true,
            ..Params::of("shard terms", 1, false, 2, 2)
        },
        NEW_TOKEN,
    );
}

/// Where one id holds a row again, a release that names only the holder ends a later hold.
#[test]
fn a_release_naming_only_the_holder_fails_for_one_id_per_process() {
    assert_unsafe(
        Params {
            release_names_holder_only: true,
            ..Params::of("shard terms", 1, false, 3, 3)
        },
        ONE_HOLDER,
    );
}
