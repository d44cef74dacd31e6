//! The lease row: one per elected resource.
#![allow(missing_docs)] // the derive macros generate the Column/ActiveModel items

use sea_orm::entity::prelude::*;

/// One lease row. The table name here is the default (`orionbeacon_leases`); a store configured
/// with another table name writes rows of the same shape there. The model is the table after
/// every migration, `AddLeasePayload` included: on a table made before that one, select the
/// columns you need instead (the orion-beacon stores themselves work on either).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "orionbeacon_leases")]
pub struct Model {
    /// What is being led, e.g. `nightly-report` (primary key, up to 255 characters).
    #[sea_orm(
        primary_key,
        auto_increment = false,
        column_type = "String(StringLen::N(255))"
    )]
    pub resource: String,
    /// The candidate that holds (or last held) the lease.
    #[sea_orm(column_type = "String(StringLen::N(255))")]
    pub holder: String,
    /// The fencing token of the current (or last) term; it only ever increases.
    pub fencing_token: i64,
    /// When the lease lapses, in the database's clock (UTC). A released lease has an expiry in
    /// the past: the row is a tombstone that keeps the token.
    pub expires_at: DateTimeUtc,
    /// When the current term began (database clock).
    pub acquired_at: DateTimeUtc,
    /// When the current term was last acquired or renewed (database clock).
    pub renewed_at: DateTimeUtc,
    /// The payload the holder wrote with its latest grant or renew (up to 1,024 bytes), if
    /// any. It belongs to the term whose token is in `payload_token`: read it only when that
    /// equals `fencing_token` (a term that wrote none leaves an earlier term's behind). Added
    /// by the `AddLeasePayload` migration.
    #[sea_orm(column_type = "String(StringLen::N(1024))", nullable)]
    pub payload: Option<String>,
    /// The token of the term that wrote `payload`.
    #[sea_orm(nullable)]
    pub payload_token: Option<i64>,
}

impl Model {
    /// The payload of the row's current (or last) term: `payload`, if that term wrote it.
    pub fn current_payload(&self) -> Option<&str> {
        match self.payload_token {
            Some(token) if token == self.fencing_token => self.payload.as_deref(),
            _ => None,
        }
    }
}

/// The lease table has no relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
