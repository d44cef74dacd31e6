//! The rate-limit row: one per key of a cluster-wide rate limit.
#![allow(missing_docs)] // the derive macros generate the Column/ActiveModel items

use sea_orm::entity::prelude::*;

/// One rate-limit key. The table name here is the default (`orionbeacon_rate_limits`); a store
/// configured with another table writes rows of the same shape there.
///
/// The row is written only by the store's one conditional upsert per call, with times from the
/// database clock, as whole microseconds since the Unix epoch (integers, the same on every
/// backend).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "orionbeacon_rate_limits")]
pub struct Model {
    /// The key (primary key, up to 255 characters).
    #[sea_orm(
        primary_key,
        auto_increment = false,
        column_type = "String(StringLen::N(255))"
    )]
    pub limit_key: String,
    /// The key's theoretical arrival time (GCRA): a permit is granted while it is at most the
    /// quota's burst span ahead of the database's now (µs since the Unix epoch).
    pub tat_us: i64,
    /// How many permits the key has granted.
    pub permits: i64,
    /// Whether the key's last decision granted a permit.
    pub granted: bool,
    /// When the key's last decision was made (database clock, µs since the Unix epoch).
    pub decided_us: i64,
    /// A random number the last decision's caller chose: the row it reads back is its own
    /// decision only if this is the number it wrote.
    pub decision_id: i64,
}

/// The rate-limit table has no relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
