// The README's links to the guides resolve to their rustdoc pages here (the first definition of
// a reference label wins; the README's own point at docs.rs, for crates.io and GitHub).
#![doc = include_str!("guide/links.md")]
#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
mod clock;
pub mod elector;
mod error;
mod fencing;
pub mod guide;
mod hold;
pub mod jobs;
mod lease;
pub mod locks;
pub mod membership;
mod memory;
mod mutex;
mod random;
pub mod shards;
pub mod store;
mod watch;

// The main types, on the crate root (inlined: their pages live here, not only in the modules).
/// The attribute [`LeaseStore`] and [`MembershipStore`] are written with, for implementations
/// (the same version as ours).
pub use async_trait::async_trait;
#[doc(inline)]
pub use backend::fence::FenceError;
#[doc(inline)]
pub use backend::mysql::MySqlUpsert;
#[cfg(feature = "sqlserver")]
#[doc(inline)]
pub use backend::sqlserver::SqlServerLeaseStore;
#[doc(inline)]
pub use backend::{Durability, SeaOrmLeaseStore};
#[doc(inline)]
pub use elector::Health;
#[doc(inline)]
pub use elector::{
    ConfigError, Elector, ElectorBuilder, ElectorHandle, Handover, LeaderTerm, Leadership,
    LossReason,
};
pub use error::{BackendError, ErrorKind, StoreError, TableNameError};
pub use fencing::{FencingToken, Term};
#[doc(inline)]
pub use jobs::{Job, JobError, JobRun, Jobs, JobsHandle, Schedule};
pub use lease::{Denial, Lease, LeaseOutcome, LeaseRecord, Renewals};
#[doc(inline)]
pub use locks::{Lock, LockError, LockGuard, Locks, Semaphore};
#[doc(inline)]
pub use membership::{Holding, Member, MembershipStore};
pub use memory::InMemoryLeaseStore;
#[doc(inline)]
pub use shards::{Assignment, ShardHandle, ShardSet, ShardSetBuilder, ShardStore};
#[doc(inline)]
pub use store::{LeaseStore, ReleaseEvents, MAX_OFFER_TARGET_LEN};
pub use watch::{Watch, WatchClosed};

/// The lease row as a SeaORM entity (re-exported from `orion-beacon-entity`).
pub use orion_beacon_entity as entity;
