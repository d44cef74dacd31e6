// The README's links to the guides resolve to their rustdoc pages here (the first definition of
// a reference label wins; the README's own point at docs.rs, for crates.io and GitHub).
#![doc = include_str!("guide/links.md")]
// The README's examples compile as doctests where the features they use are on (the jobs
// example needs `jobs`).
#![cfg_attr(any(not(doctest), feature = "jobs"), doc = include_str!("../README.md"))]
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
#[cfg(feature = "jobs")]
#[cfg_attr(docsrs, doc(cfg(feature = "jobs")))]
pub mod jobs;
mod lease;
pub mod locks;
pub mod membership;
mod memory;
mod mutex;
mod random;
pub mod rate_limit;
pub mod shards;
pub mod store;
mod watch;

// The crate root is the public face only: what a user of the elector, locks, shard sets and
// jobs needs (inlined: their pages live here). What store implementations need (`LeaseOutcome`,
// `Renewals`, `async_trait`, ...) lives in `store`; the crate's own modules import from the
// module that defines a thing, never through this root.
#[doc(inline)]
pub use backend::fence::FenceError;
#[doc(inline)]
pub use backend::mysql::MySqlUpsert;
#[doc(inline)]
pub use backend::{Durability, SeaOrmLeaseStore};
#[doc(inline)]
pub use elector::Health;
#[doc(inline)]
pub use elector::{
    ConfigError, Elector, ElectorBuilder, ElectorHandle, Handover, LeaderTerm, Leadership,
    LossReason,
};
pub use error::{BackendError, BoxError, ErrorKind, StoreError, TableNameError};
pub use fencing::{FencingToken, Term};
#[cfg(feature = "jobs")]
#[doc(inline)]
pub use jobs::{Job, JobError, JobRun, Jobs, JobsHandle, Schedule};
pub use lease::{Lease, LeaseRecord};
#[doc(inline)]
pub use locks::{Lock, LockError, LockGuard, Locks, Semaphore};
#[doc(inline)]
pub use membership::{Candidate, Holding, Member, MembershipStore};
pub use memory::InMemoryLeaseStore;
#[doc(inline)]
pub use rate_limit::{Quota, RateLimitStore, RateLimiter};
#[doc(inline)]
pub use shards::{
    Assignment, ShardConfigError, ShardHandle, ShardSet, ShardSetBuilder, ShardStore,
};
#[doc(inline)]
pub use store::LeaseStore;
pub use watch::{Watch, WatchClosed};

/// The lease row as a SeaORM entity (re-exported from `orion-beacon-entity`).
pub use orion_beacon_entity as entity;
