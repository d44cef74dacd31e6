//! Live nodes of a shard set: the membership contract and its input rules.
//!
//! A node that spreads resources with others ([`ShardSet`](crate::ShardSet)) heartbeats into
//! the membership table; the nodes whose heartbeat is live by the **database clock** are the
//! members its fair share is computed over. Membership only steers *who tries* to lead what:
//! the leases decide who leads, so a wrong or stale view of the members can delay or unbalance
//! an assignment, never grant a resource twice.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::error::StoreError;
use crate::store::{lease_millis, validate_candidate, MAX_NAME_LEN};

/// One live member of a shard set, as the store judged it by its clock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Member {
    /// The shard set.
    pub shard_set: String,
    /// The member id (the holder name its leases carry).
    pub member: String,
    /// Whether the member is draining: it hands its resources over and takes none.
    pub draining: bool,
    /// Membership time left without another heartbeat.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "remaining_ms", serialize_with = "crate::lease::millis")
    )]
    pub remaining: Duration,
    /// When the current membership began (database clock; `None` for the in-memory store).
    pub joined_at: Option<DateTime<Utc>>,
    /// The last heartbeat (database clock; `None` for the in-memory store).
    pub heartbeat_at: Option<DateTime<Utc>>,
    /// What the member reported leading at its last heartbeat, if it reports it (see
    /// [`MembershipStore::heartbeat_holding`]).
    pub holding: Option<Holding>,
}

/// What a shard-set member leads, as it reports with its heartbeat: how many of the set's
/// leases it renewed in its last round, and a fingerprint of its list of the set's resources
/// (the counts of members with the same list add up to at most the list's length while no
/// resource is free).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Holding {
    /// The set's leases the member renewed (or took) in its last round.
    pub leases: u64,
    /// The fingerprint of the member's list of resources ([`Holding::fingerprint`]); a decimal
    /// string in its `serde` form (JSON numbers lose precision above 2^53).
    #[cfg_attr(feature = "serde", serde(serialize_with = "decimal"))]
    pub set_hash: u64,
}

#[cfg(feature = "serde")]
fn decimal<S: serde::Serializer>(n: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(n)
}

impl Holding {
    /// `leases` leases of the set whose resources are `resources`.
    pub fn new<S: AsRef<str>>(leases: u64, resources: &[S]) -> Self {
        Self {
            leases,
            set_hash: Self::fingerprint(resources),
        }
    }

    /// The holding as a store keeps it for the lease table `lease_table`: its fingerprint
    /// mixed with the table's name, so that two groups on one membership table (the same set
    /// name, different lease tables) never count each other's leases as theirs. Its own
    /// inverse: a holding read back is unscoped the same way, and a holding scoped for
    /// another table reads back as another list.
    pub fn scoped(self, lease_table: &str) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in b"lease table\xff".iter().chain(lease_table.as_bytes()) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        Self {
            leases: self.leases,
            set_hash: self.set_hash ^ h,
        }
    }

    /// The column values a database store keeps: the count and the fingerprint as signed
    /// bigints (the fingerprint bit for bit, a count past `i64::MAX` as `i64::MAX`).
    pub fn stored(self) -> (i64, i64) {
        (
            i64::try_from(self.leases).unwrap_or(i64::MAX),
            i64::from_ne_bytes(self.set_hash.to_ne_bytes()),
        )
    }

    /// The holding a store's columns hold, read back as [`stored`](Self::stored) wrote it:
    /// `None` where either is NULL (a member that reports none) or the count is negative.
    pub fn from_stored(leases: Option<i64>, set_hash: Option<i64>) -> Option<Self> {
        Some(Self {
            leases: u64::try_from(leases?).ok()?,
            set_hash: u64::from_ne_bytes(set_hash?.to_ne_bytes()),
        })
    }

    /// The fingerprint of a list of resources, whatever its order: FNV-1a over the sorted,
    /// deduplicated names, stable across processes and versions.
    pub fn fingerprint<S: AsRef<str>>(resources: &[S]) -> u64 {
        let mut names: Vec<&str> = resources.iter().map(AsRef::as_ref).collect();
        names.sort_unstable();
        names.dedup();
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for name in names {
            for b in name.bytes().chain([0xff]) {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        h
    }
}

impl Member {
    /// A live member `member` of `shard_set` with `remaining` time, not draining, no database
    /// times: for [`MembershipStore`] implementations (set the other fields as known).
    pub fn new(
        shard_set: impl Into<String>,
        member: impl Into<String>,
        remaining: Duration,
    ) -> Self {
        Self {
            shard_set: shard_set.into(),
            member: member.into(),
            draining: false,
            remaining,
            joined_at: None,
            heartbeat_at: None,
            holding: None,
        }
    }
}

/// One live candidate of a ranked election (see
/// [`ElectorBuilder::rank`](crate::ElectorBuilder::rank)), as the store judged it by its clock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Candidate {
    /// The candidate id (the holder name its lease carries when it leads).
    pub candidate: String,
    /// Its rank: the live candidate with the highest rank is preferred as leader.
    pub rank: i64,
    /// How long it has been live without a lapse, at the read (by the store's clock).
    #[cfg_attr(
        feature = "serde",
        serde(rename = "live_for_ms", serialize_with = "crate::lease::millis")
    )]
    pub live_for: Duration,
    /// Its candidacy's time left without another heartbeat.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "remaining_ms", serialize_with = "crate::lease::millis")
    )]
    pub remaining: Duration,
}

impl Candidate {
    /// A live candidate: for [`MembershipStore`] implementations.
    pub fn new(
        candidate: impl Into<String>,
        rank: i64,
        live_for: Duration,
        remaining: Duration,
    ) -> Self {
        Self {
            candidate: candidate.into(),
            rank,
            live_for,
            remaining,
        }
    }
}

/// Where the members of shard sets heartbeat: the membership table of a database store, or
/// the in-memory store's map.
///
/// Liveness is judged by the store's clock (the database's), like a lease's. Bad input (an
/// invalid shard set or member name, a time to live outside the lease bounds) is refused
/// before any SQL runs.
///
/// Implemented like [`LeaseStore`](crate::LeaseStore): plain `async fn`s under
/// [`async_trait`](crate::store::async_trait) (rustdoc shows the desugared signatures).
#[async_trait]
pub trait MembershipStore: Send + Sync {
    /// Records that `member` of `shard_set` is alive for `ttl` from now (by the store's
    /// clock), draining or not, and returns the live members of the set ordered by id (the
    /// caller included).
    async fn heartbeat(
        &self,
        shard_set: &str,
        member: &str,
        ttl: Duration,
        draining: bool,
    ) -> Result<Vec<Member>, StoreError>;

    /// [`heartbeat`](Self::heartbeat) that also records what the member leads, so that the
    /// other members can tell, from the members alone, whether a resource of the set may be
    /// free (and skip reading the set's leases when none can be). A store that keeps no such
    /// record (the default, and a database store whose membership table lacks the columns of
    /// the `AddMemberHolding` migration) heartbeats without it, and its members'
    /// [`holding`](Member::holding) is `None`.
    async fn heartbeat_holding(
        &self,
        shard_set: &str,
        member: &str,
        ttl: Duration,
        draining: bool,
        holding: Holding,
    ) -> Result<Vec<Member>, StoreError> {
        let _ = holding;
        self.heartbeat(shard_set, member, ttl, draining).await
    }

    /// Removes `member` from `shard_set` (and the set's lapsed rows); `true` if it was live.
    async fn leave(&self, shard_set: &str, member: &str) -> Result<bool, StoreError>;

    /// The live members of `shard_set`, ordered by id.
    async fn members(&self, shard_set: &str) -> Result<Vec<Member>, StoreError>;

    /// Records that `candidate` of the election of `resource` is live for `ttl` from now (by
    /// the store's clock) with `rank`, and returns the election's live candidates ordered by
    /// id (the caller included). Kept apart from every shard set's members (see
    /// [`stored_candidates`]). The default: [`StoreError::Unsupported`].
    async fn candidate_heartbeat(
        &self,
        resource: &str,
        candidate: &str,
        ttl: Duration,
        rank: i64,
    ) -> Result<Vec<Candidate>, StoreError> {
        let _ = (resource, candidate, ttl, rank);
        Err(StoreError::Unsupported {
            operation: "ranked candidates",
        })
    }

    /// Removes `candidate` from the election of `resource` (and its lapsed rows); `true` if it
    /// was live. The default: [`StoreError::Unsupported`].
    async fn candidate_leave(&self, resource: &str, candidate: &str) -> Result<bool, StoreError> {
        let _ = (resource, candidate);
        Err(StoreError::Unsupported {
            operation: "ranked candidates",
        })
    }

    /// The live candidates of the election of `resource`, ordered by id. The default:
    /// [`StoreError::Unsupported`].
    async fn candidates(&self, resource: &str) -> Result<Vec<Candidate>, StoreError> {
        let _ = resource;
        Err(StoreError::Unsupported {
            operation: "ranked candidates",
        })
    }

    /// Checks, without touching the database, that this store can keep the candidates of the
    /// election of `resource` (their stored name fits; see [`stored_candidates`]), so that
    /// [`ElectorBuilder::build`](crate::ElectorBuilder::build) refuses what every heartbeat
    /// would. The default: the rule for a store without tables.
    fn check_election(&self, resource: &str) -> Result<(), StoreError> {
        stored_candidates(resource, "").map(drop)
    }
}

#[async_trait]
impl<S: MembershipStore + ?Sized> MembershipStore for std::sync::Arc<S> {
    async fn heartbeat(
        &self,
        shard_set: &str,
        member: &str,
        ttl: Duration,
        draining: bool,
    ) -> Result<Vec<Member>, StoreError> {
        (**self).heartbeat(shard_set, member, ttl, draining).await
    }

    async fn heartbeat_holding(
        &self,
        shard_set: &str,
        member: &str,
        ttl: Duration,
        draining: bool,
        holding: Holding,
    ) -> Result<Vec<Member>, StoreError> {
        (**self)
            .heartbeat_holding(shard_set, member, ttl, draining, holding)
            .await
    }

    async fn leave(&self, shard_set: &str, member: &str) -> Result<bool, StoreError> {
        (**self).leave(shard_set, member).await
    }

    async fn members(&self, shard_set: &str) -> Result<Vec<Member>, StoreError> {
        (**self).members(shard_set).await
    }

    async fn candidate_heartbeat(
        &self,
        resource: &str,
        candidate: &str,
        ttl: Duration,
        rank: i64,
    ) -> Result<Vec<Candidate>, StoreError> {
        (**self)
            .candidate_heartbeat(resource, candidate, ttl, rank)
            .await
    }

    async fn candidate_leave(&self, resource: &str, candidate: &str) -> Result<bool, StoreError> {
        (**self).candidate_leave(resource, candidate).await
    }

    async fn candidates(&self, resource: &str) -> Result<Vec<Candidate>, StoreError> {
        (**self).candidates(resource).await
    }

    fn check_election(&self, resource: &str) -> Result<(), StoreError> {
        (**self).check_election(resource)
    }
}

/// Checks a shard set name (the rules of resource names: 1 to 255 characters, no control
/// characters, no leading or trailing white space).
pub fn validate_shard_set(name: &str) -> Result<(), StoreError> {
    crate::store::validate_resource(name).map_err(|_| StoreError::InvalidShardSet {
        name: name.to_owned(),
        reason: shard_set_problem(name),
    })
}

fn shard_set_problem(name: &str) -> &'static str {
    if name.is_empty() {
        "must not be empty"
    } else if name.chars().count() > MAX_NAME_LEN {
        "must be at most 255 characters"
    } else if name.chars().any(char::is_control) {
        "must not contain control characters"
    } else {
        "must not start or end with white space"
    }
}

/// A shard set's name as the membership table keeps it for a store on the lease table
/// `lease_table`: the name itself on the default table, and on any other table the name behind
/// a white space, the table's name and `/` (no valid set name starts with white space, and a
/// table name has no `/`), so that groups on one membership table with different lease tables
/// never see, count or prune each other's members. Refused before any SQL runs when the stored
/// form would not fit the column.
pub fn stored_set(shard_set: &str, lease_table: &str) -> Result<String, StoreError> {
    validate_shard_set(shard_set)?;
    if lease_table == orion_beacon_entity::DEFAULT_TABLE {
        return Ok(shard_set.to_owned());
    }
    let stored = format!(" {lease_table}/{shard_set}");
    if stored.chars().count() > MAX_NAME_LEN {
        return Err(StoreError::InvalidShardSet {
            name: shard_set.to_owned(),
            reason: "must fit in 255 characters together with the lease table's name plus 2 \
                     (a store on a lease table other than the default keeps its sets' members \
                     under that table's name)",
        });
    }
    Ok(stored)
}

/// The shard set a stored name is for a store on `lease_table`, as [`stored_set`] wrote it;
/// `None` for another lease table's members.
pub fn set_of_stored(stored: &str, lease_table: &str) -> Option<String> {
    if lease_table == orion_beacon_entity::DEFAULT_TABLE {
        return (!stored.starts_with(' ')).then(|| stored.to_owned());
    }
    stored
        .strip_prefix(' ')?
        .strip_prefix(lease_table)?
        .strip_prefix('/')
        .map(str::to_owned)
}

/// The name the membership table keeps the candidates of the election of `resource` under,
/// for a store on the lease table `lease_table` (`""` for a store without tables): a white
/// space, `=`, the table's name, `/` and the resource. No shard set's stored name has this form
/// (a set name never starts with white space, and a table name has no `=`), so candidates and
/// shard-set members never see, count or prune each other, nor do two lease tables'
/// elections. Refused before any SQL runs when it would not fit the column (the resource
/// and the table's name together at most 252 characters).
pub fn stored_candidates(resource: &str, lease_table: &str) -> Result<String, StoreError> {
    crate::store::validate_resource(resource)?;
    let stored = format!(" ={lease_table}/{resource}");
    if stored.chars().count() > MAX_NAME_LEN {
        return Err(StoreError::InvalidResource {
            name: resource.to_owned(),
            reason: "a ranked election's resource must fit in 255 characters together with \
                     the lease table's name plus 3 (its candidates are kept under both)",
        });
    }
    Ok(stored)
}

/// Checks a candidate heartbeat's input and returns its stored election name and time to live
/// in milliseconds.
pub fn validate_candidate_heartbeat(
    resource: &str,
    candidate: &str,
    ttl: Duration,
    lease_table: &str,
) -> Result<(String, i64), StoreError> {
    let stored = stored_candidates(resource, lease_table)?;
    validate_candidate(candidate)?;
    Ok((stored, lease_millis(ttl)?))
}

/// Checks a heartbeat's input and returns its time to live in milliseconds.
pub fn validate_heartbeat(shard_set: &str, member: &str, ttl: Duration) -> Result<i64, StoreError> {
    validate_shard_set(shard_set)?;
    validate_candidate(member)?;
    lease_millis(ttl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_are_kept_under_their_lease_table() {
        let default = orion_beacon_entity::DEFAULT_TABLE;
        assert_eq!(stored_set("orders", default).unwrap(), "orders");
        assert_eq!(stored_set("orders", "t_b").unwrap(), " t_b/orders");
        for table in [default, "t_b", "T_B", "t"] {
            let stored = stored_set("a/b", table).unwrap();
            assert_eq!(set_of_stored(&stored, table).as_deref(), Some("a/b"));
            for other in [default, "t_b", "T_B", "t"] {
                if other != table {
                    assert_eq!(set_of_stored(&stored, other), None, "{table} {other}");
                }
            }
        }
        // The stored form must fit the column: 255 characters with the table's name.
        assert!(stored_set(&"x".repeat(255), default).is_ok());
        assert!(stored_set(&"x".repeat(250), "t_b").is_ok());
        assert!(matches!(
            stored_set(&"x".repeat(251), "t_b"),
            Err(StoreError::InvalidShardSet { .. })
        ));
        assert!(stored_set(" orders", "t_b").is_err());
    }

    #[test]
    fn shard_set_names() {
        assert!(validate_shard_set("orders").is_ok());
        for bad in ["", " a", "a\n", &"x".repeat(256)] {
            let err = validate_shard_set(bad).unwrap_err();
            assert!(matches!(err, StoreError::InvalidShardSet { .. }), "{err:?}");
        }
        assert!(validate_heartbeat("s", "m", Duration::ZERO).is_err());
        assert!(validate_heartbeat("s", "", Duration::from_secs(1)).is_err());
        assert_eq!(
            validate_heartbeat("s", "m", Duration::from_secs(1)).unwrap(),
            1000
        );
    }
}
