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

/// Runs `command` to its end, killed after `limit`: a hung example fails the test with what it
/// printed instead of holding up the whole run (it prints a few lines, so its pipes never fill
/// while it runs).
#[cfg(feature = "sqlite")]
fn run_bounded(mut command: Command, limit: std::time::Duration) -> std::process::Output {
    use std::process::Stdio;
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the example");
    let started = std::time::Instant::now();
    while child.try_wait().expect("wait for the example").is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let out = child
                .wait_with_output()
                .expect("the killed example's output");
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(60).collect();
            panic!(
                "the example did not end within {limit:?}; the last lines it wrote:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    child.wait_with_output().expect("the example's output")
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
    let out = run_bounded(Command::new(&path), std::time::Duration::from_secs(90));
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
