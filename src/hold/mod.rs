//! What a held lease is, for every primitive that holds one (an elector's term, a lock's
//! guard, a semaphore's permit, a shard set's term): its term and fencing token, its local
//! deadline and the timing options it is checked against, and the renewer that renews every
//! hold of a store together.

pub(crate) mod health;
pub(crate) mod keeper;
pub(crate) mod renewer;
mod term;
pub(crate) mod timing;

pub use term::{LeaderTerm, Leadership, LossReason};

use tokio::time::Instant;

use crate::lease::Lease;
use crate::random::random_u64;

/// A lease this process holds: the term its work sees, and the store's last answer for it
/// (the write a release ends).
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) term: LeaderTerm,
    pub(crate) lease: Lease,
}

impl Held {
    /// Whether `lease` (a renew's answer for this hold's resource) is this hold's term.
    pub(crate) fn names(&self, lease: &Lease) -> bool {
        self.term.token() == lease.token
    }

    /// The store renewed this hold's lease as `lease`, trusted until `deadline` (its local
    /// deadline). A current term is trusted until then; one that ended (its deadline passed, or
    /// its owner ended it) stays ended, and its release names this write.
    pub(crate) fn renewed(&mut self, lease: Lease, deadline: Instant) {
        if self.term.is_current() {
            self.term.extend(deadline);
        }
        self.lease = lease;
    }

    /// Ends the term for `reason` and tells its work to stop.
    pub(crate) fn end(&self, reason: LossReason) {
        self.term.end(reason);
        self.term.cut_off();
    }
}

/// The host name as the system reports it (`HOSTNAME`, else the kernel's), or `host`.
fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_owned())
}

/// Host name + process id + a random suffix: unique per elector, readable in `leases` output.
pub(crate) fn default_candidate_id() -> String {
    let host: String = host_name()
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    format!(
        "{}-{}-{:08x}",
        host.trim(),
        std::process::id(),
        random_u64() as u32
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default id is `<host>-<pid>-<8 hex>`, with the host name as the system reports it
    /// (control characters dropped).
    #[test]
    fn default_id_names_the_host() {
        let host = host_name();
        let id = default_candidate_id();
        let expected = format!("{}-{}-", host.trim(), std::process::id());
        assert!(
            id.starts_with(&expected),
            "{id} should start with {expected}"
        );
        assert_eq!(id.len(), expected.len() + 8, "{id}");
        assert!(!id.chars().any(char::is_control));
        assert_ne!(default_candidate_id(), default_candidate_id());
    }
}
