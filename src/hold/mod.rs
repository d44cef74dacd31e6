//! What a held lease is, for every primitive that holds one (an elector's term, a lock's
//! guard, a semaphore's permit, a shard set's term): its term and fencing token, its local
//! deadline and the timing options it is checked against, and the renewer that renews every
//! hold of a store together.

pub(crate) mod health;
pub(crate) mod renewer;
mod term;
pub(crate) mod timing;

pub use term::{LeaderTerm, Leadership, LossReason};

use crate::random::random_u64;

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
