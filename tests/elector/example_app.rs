//! `examples/app.rs`, the README's path into a SeaORM application (the lease migration in the
//! app's Migrator, one shared connection, a job run by the leader with fenced writes), runs to
//! a clean exit on SQLite. `cargo test` builds the examples before the tests run.
#![cfg(any(feature = "sqlite", feature = "serde"))]

use std::path::PathBuf;
use std::process::Command;

/// `target/<profile>/examples/app`, next to this test binary's `deps/` directory.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps/<test>");
    profile_dir.join("examples").join(name)
}

#[cfg(feature = "sqlite")]
#[test]
fn the_example_app_runs_a_fenced_job_as_leader() {
    let path = example("app");
    assert!(
        path.exists(),
        "{} was not built (cargo test builds examples; run `cargo build --examples --all-features`)",
        path.display()
    );
    let out = Command::new(&path).output().expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "example failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("nightly job ran with token 1") && stdout.contains("leaders at once: 1"),
        "{stdout}"
    );
}

/// `examples/health_http.rs` serves its probes with axum and asks itself once.
#[cfg(feature = "serde")]
#[test]
fn the_health_probe_example_answers() {
    let path = example("health_http");
    assert!(path.exists(), "{} was not built", path.display());
    let out = Command::new(&path)
        .arg("--once")
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("GET /healthz  ->  HTTP/1.1 200 OK")
            && stdout.contains("\"healthy\":true")
            && stdout.contains("GET /leader  ->  HTTP/1.1 200 OK"),
        "{stdout}"
    );
}
