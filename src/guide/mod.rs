//! The guides: the manual beside the API reference, the same pages as the repository's
//! `docs/` directory.
//!
//! - [`elector`]: safety rules, options and defaults (and how client-go's and ShedLock's map
//!   onto them), cleanup when a term ends, a holder stalled inside a fenced transaction, logs,
//!   metrics, health checks.
//! - [`shard_sets`]: many resources per node: fairness, handovers, drains, membership.
//! - [`locks`]: distributed locks and counting semaphores, a fencing token per hold.
//! - [`rate_limits`]: a rate limit shared by the cluster: the guarantee, clocks, waiting, the
//!   table.
//! - [`jobs`]: scheduled jobs that run exactly once per slot: the guarantee, missed slots,
//!   overlap, retries, daylight saving time.
//! - [`lease_table`]: the lease table, its migrations (your app's `Migrator`, or the command
//!   line; moving between them), custom table names, the entity.
//! - [`cli`]: the `orion-beacon` command line: who leads, watch it change, revoke a lease.
//! - [`topologies`]: PgBouncer, a promoted standby, a Galera cluster, and a stalled leader on
//!   each.
//! - [`performance`]: throughput, handover and failover times, and how to reproduce them.
//! - [`reliability`]: the model check, the fault-injection (torture) run, mutation testing.
//!
//! These modules hold no items: each page is its text.

// Each page is the file in `docs/`, read after `links.md`: its reference-style links to other
// pages (whose own definitions, at the end of each file, are the relative paths GitHub
// follows) resolve here to the rustdoc pages instead, because the first definition of a label
// wins.

// The pages' Rust examples are doctests; some need a feature (the health endpoint serializes
// `Health`, several run on SQLite, the jobs page needs `jobs`), so without it those pages are
// left out of doctests.
#[cfg(any(not(doctest), feature = "serde"))]
#[doc = include_str!("links.md")]
#[doc = include_str!("../../docs/elector.md")]
pub mod elector {}

#[cfg(any(not(doctest), feature = "sqlite"))]
#[doc = include_str!("links.md")]
#[doc = include_str!("../../docs/shard-sets.md")]
pub mod shard_sets {}

#[cfg(any(not(doctest), feature = "sqlite"))]
#[doc = include_str!("links.md")]
#[doc = include_str!("../../docs/locks.md")]
pub mod locks {}

#[cfg(any(not(doctest), feature = "sqlite"))]
#[doc = include_str!("links.md")]
#[doc = include_str!("../../docs/rate-limits.md")]
pub mod rate_limits {}

#[cfg(any(not(doctest), all(feature = "sqlite", feature = "jobs")))]
#[doc = include_str!("links.md")]
#[doc = include_str!("../../docs/jobs.md")]
pub mod jobs {}

#[doc = include_str!("links.md")]
#[doc = include_str!("../../docs/lease-table.md")]
pub mod lease_table {}

#[doc = include_str!("links.md")]
#[doc = include_str!("../../docs/cli.md")]
pub mod cli {}

#[doc = include_str!("links.md")]
#[doc = include_str!("../../docs/topologies.md")]
pub mod topologies {}

#[doc = include_str!("links.md")]
#[doc = include_str!("../../docs/performance.md")]
pub mod performance {}

#[doc = include_str!("links.md")]
#[doc = include_str!("../../docs/reliability.md")]
pub mod reliability {}

#[cfg(test)]
mod tests {
    /// The README's `Migrator` registers our migrations with the one call that lists them all,
    /// in order (so no step can be missing), and its Rust reads on GitHub and crates.io as it
    /// compiles: no rustdoc-hidden (`# `) lines.
    #[test]
    fn the_readmes_code_is_whole_and_registers_every_migration() {
        let readme = include_str!("../../README.md");
        let start = readme
            .find("impl MigratorTrait for Migrator")
            .expect("the README shows a Migrator");
        let block = &readme[start..];
        let block = &block[..block.find("```").expect("the code block ends")];
        assert!(
            block.contains("steps.extend(orion_beacon_migration::migrations())"),
            "the README's Migrator must take orion_beacon_migration::migrations()"
        );
        let mut in_rust = false;
        for (n, line) in readme.lines().enumerate() {
            if line.starts_with("```") {
                in_rust = !in_rust && line.starts_with("```rust");
                continue;
            }
            assert!(
                !(in_rust && (line == "#" || line.starts_with("# "))),
                "README.md:{}: a hidden doctest line shows on GitHub: {line}",
                n + 1
            );
        }
    }

    /// Every page, and the README, as the crate's docs include them.
    const PAGES: [(&str, &str); 10] = [
        ("README.md", include_str!("../../README.md")),
        ("elector.md", include_str!("../../docs/elector.md")),
        ("shard-sets.md", include_str!("../../docs/shard-sets.md")),
        ("locks.md", include_str!("../../docs/locks.md")),
        ("rate-limits.md", include_str!("../../docs/rate-limits.md")),
        ("lease-table.md", include_str!("../../docs/lease-table.md")),
        ("cli.md", include_str!("../../docs/cli.md")),
        ("topologies.md", include_str!("../../docs/topologies.md")),
        ("performance.md", include_str!("../../docs/performance.md")),
        ("reliability.md", include_str!("../../docs/reliability.md")),
    ];

    /// A page's link to another page is reference-style, and its label has a rustdoc target in
    /// `links.md`: an inline relative link, or a label only the page defines, would point
    /// docs.rs at a file it does not have.
    #[test]
    fn links_between_pages_resolve_on_docs_rs() {
        let ours = include_str!("links.md");
        for (page, text) in PAGES {
            for line in text.lines() {
                if let Some(label) = line.strip_prefix('[').and_then(|l| l.split_once("]: ")) {
                    let (label, target) = label;
                    if target.starts_with("http") {
                        continue;
                    }
                    assert!(
                        ours.contains(&format!("[{label}]: ")),
                        "{page}: no rustdoc target for [{label}] in src/guide/links.md"
                    );
                }
            }
            for (at, _) in text.match_indices("](") {
                let rest = &text[at + 2..];
                assert!(
                    rest.starts_with("http") || rest.starts_with('#') || rest.starts_with("crate"),
                    "{page}: an inline relative link ({}): make it reference-style",
                    &rest[..rest.len().min(40)]
                );
            }
        }
    }
}
