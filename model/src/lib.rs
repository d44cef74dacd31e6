//! The model checks of orion-beacon's protocols live in this crate's tests:
//! `tests/model_election.rs` (the elector: one leader at a time, tokens that only grow, the
//! step-down rule), `tests/model_shards.rs` (shard-set rounds) and `tests/model_holds.rs` (the
//! hold rule for every kind of hold: lock guards, permits, shard and elector terms on the
//! renewer's batch). The crate exists so that the searches are built optimised in debug builds;
//! its code is what the models share. Run them with `cargo test -p orion-beacon-model` (the
//! longer runs: `-- --ignored`).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

/// Ticks of a clock that loses (`sign = -1`) or gains (`+1`) one tick per `k` database ticks,
/// counted over `w` database ticks, at the extreme (`k = 0`: no drift).
pub fn counted(w: i16, k: u8, sign: i16) -> i16 {
    if k == 0 {
        w
    } else {
        w + sign * (w + k as i16 - 1) / k as i16
    }
}

/// The derived rule, in ticks: the smallest safe margin for `lease` and rho = 1/`k`
/// (`ceil(lease / k)`; see `tests/model_election.rs`, "the margin rule").
pub fn rule_margin(lease: i8, k: u8) -> i8 {
    (lease as i16 - counted(lease as i16, k, -1)) as i8
}

/// Past instants (relative to now, so negative) that are only ever compared with `points`:
/// each keeps only its place among them. A point gets an even place, an instant between two
/// points (or below or above them all) the odd place between theirs, the latest gap -1; now and
/// later instants are kept as they are. `points` must be sorted and free of duplicates.
pub fn place(points: &[i8], t: i8) -> i8 {
    if t >= 0 {
        return t;
    }
    let n = points.len() as i8;
    match points.binary_search(&t) {
        Ok(i) => -2 * (n - i as i8),
        Err(i) => -2 * (n - i as i8) - 1,
    }
}
