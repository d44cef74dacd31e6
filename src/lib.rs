#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
mod clock;
pub mod elector;
mod error;
mod fencing;
mod lease;
pub mod membership;
mod memory;
pub mod shards;
pub mod store;
mod watch;

pub use backend::fence::FenceError;
pub use backend::mysql::MySqlUpsert;
#[cfg(feature = "sqlserver")]
pub use backend::sqlserver::SqlServerLeaseStore;
pub use backend::{Durability, SeaOrmLeaseStore};
pub use elector::Health;
pub use elector::{
    ConfigError, Elector, ElectorBuilder, ElectorHandle, LeaderTerm, Leadership, LossReason,
};
pub use error::{BackendError, ErrorKind, StoreError, TableNameError};
pub use fencing::{FencingToken, Term};
pub use lease::{Denial, Lease, LeaseOutcome, LeaseRecord, Renewals};
pub use membership::{Member, MembershipStore};
pub use memory::InMemoryLeaseStore;
pub use shards::{Assignment, ShardHandle, ShardSet, ShardSetBuilder, ShardStore};
pub use store::{LeaseStore, ReleaseEvents};
pub use watch::{Watch, WatchClosed};

/// The lease row as a SeaORM entity (re-exported from `orion-beacon-entity`).
pub use orion_beacon_entity as entity;

// The Rust examples of the guides in docs/ are doctests too.
// (its health endpoint serializes `Health`, which needs the `serde` feature)
#[cfg(all(doctest, feature = "serde"))]
#[doc = include_str!("../docs/elector.md")]
mod elector_docs {}
#[cfg(doctest)]
#[doc = include_str!("../docs/lease-table.md")]
mod lease_table_docs {}
#[cfg(doctest)]
#[doc = include_str!("../docs/topologies.md")]
mod topologies_docs {}
#[cfg(all(doctest, feature = "sqlite"))]
#[doc = include_str!("../docs/shard-sets.md")]
mod shard_sets_docs {}
