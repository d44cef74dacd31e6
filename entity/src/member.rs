//! The membership row: one per live node of a shard set.
#![allow(missing_docs)] // the derive macros generate the Column/ActiveModel items

use sea_orm::entity::prelude::*;

/// One member row. The table name here is the default (`orionbeacon_members`); a store
/// configured with another membership table writes rows of the same shape there.
///
/// A member is live while `expires_at` is ahead of the database's now; the row is written only
/// by the member's own heartbeats, with times from the database clock.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "orionbeacon_members")]
pub struct Model {
    /// The shard set the node takes part in (the first half of the primary key).
    #[sea_orm(
        primary_key,
        auto_increment = false,
        column_type = "String(StringLen::N(255))"
    )]
    pub shard_set: String,
    /// The node's member id: the holder its leases carry (the second half of the key).
    #[sea_orm(
        primary_key,
        auto_increment = false,
        column_type = "String(StringLen::N(255))"
    )]
    pub member: String,
    /// Whether the node is draining: it hands its resources over and takes none.
    pub draining: bool,
    /// When the node's current membership began (database clock).
    pub joined_at: DateTimeUtc,
    /// The node's last heartbeat (database clock).
    pub heartbeat_at: DateTimeUtc,
    /// When the membership lapses without another heartbeat (database clock).
    pub expires_at: DateTimeUtc,
    /// How many of the set's leases the node leads at its heartbeat. It belongs to the
    /// heartbeat at `counted_at`: read it only when that equals `heartbeat_at` (a node that
    /// reports no counts leaves the last ones behind). Added by the `AddMemberHolding`
    /// migration.
    pub leases_held: Option<i64>,
    /// A fingerprint of the node's list of the set's resources: the counts of nodes with the
    /// same list add up. Added by the `AddMemberHolding` migration.
    pub set_hash: Option<i64>,
    /// The heartbeat that wrote `leases_held` and `set_hash` (database clock). Added by the
    /// `AddMemberHolding` migration.
    pub counted_at: Option<DateTimeUtc>,
    /// A ranked election's candidate: its rank (shard-set members leave it NULL). Added by the
    /// `AddMemberRank` migration.
    pub candidate_rank: Option<i64>,
}

/// The membership table has no relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
