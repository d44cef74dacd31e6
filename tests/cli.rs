//! The `orion-beacon` command line, run as a real binary against SQLite and PostgreSQL: its
//! output and its exit codes, bad input included.
#![cfg(feature = "cli")]

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use orion_beacon::{LeaseOutcome, LeaseStore, SeaOrmLeaseStore};

const BIN: &str = env!("CARGO_BIN_EXE_orion-beacon");
const LONG: Duration = Duration::from_secs(120);

/// Exit codes, as documented.
const BAD_INPUT: i32 = 2;
const UNREACHABLE: i32 = 3;
const MISSING_TABLE: i32 = 4;
const UNKNOWN_RESOURCE: i32 = 5;
const NOTHING_CHANGED: i32 = 6;

#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("DATABASE_URL")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn finish(child: std::process::Child) -> Run {
    let out = child.wait_with_output().expect("wait for orion-beacon");
    Run {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs the binary with `stdin` as its input (none: /dev/null), off the async runtime.
async fn run_with(args: &[&str], stdin: Option<&str>, env: &[(&str, &str)]) -> Run {
    let mut cmd = command(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let stdin = stdin.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        let mut child = cmd.spawn().expect("start orion-beacon");
        if let Some(text) = stdin {
            let mut pipe = child.stdin.take().expect("stdin");
            pipe.write_all(text.as_bytes()).expect("write stdin");
        }
        finish(child)
    })
    .await
    .expect("join")
}

async fn run(args: &[&str]) -> Run {
    run_with(args, None, &[]).await
}

fn assert_code(run: &Run, code: i32) {
    assert_eq!(run.code, code, "{run:#?}");
}

/// A resource's line in `leases`: its cells split on white space.
fn row<'a>(stdout: &'a str, resource: &str) -> Vec<&'a str> {
    stdout
        .lines()
        .find(|l| l.starts_with(&format!("{resource} ")))
        .unwrap_or_else(|| panic!("no row for {resource} in\n{stdout}"))
        .split_whitespace()
        .collect()
}

/// One database with a migrated lease table, and the arguments that point the CLI at it.
struct Target {
    store: SeaOrmLeaseStore,
    args: Vec<String>,
    _dir: Option<tempfile::TempDir>,
    cleanup: Option<(sea_orm::DatabaseConnection, String)>,
}

impl Target {
    /// `args` followed by the database (and table) arguments.
    fn with(&self, args: &[&str]) -> Vec<String> {
        args.iter()
            .map(|s| s.to_string())
            .chain(self.args.iter().cloned())
            .collect()
    }

    async fn run(&self, args: &[&str]) -> Run {
        let all = self.with(args);
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        run(&refs).await
    }

    async fn run_with(&self, args: &[&str], stdin: Option<&str>) -> Run {
        let all = self.with(args);
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        run_with(&refs, stdin, &[]).await
    }

    async fn teardown(self) {
        if let Some((db, table)) = self.cleanup {
            common::drop_table(&db, &table).await;
        }
    }
}

#[cfg(feature = "sqlite")]
async fn sqlite() -> (Target, String) {
    use orion_beacon_migration::{Migrator, MigratorTrait};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let db = common::connect_sqlite(&path, 2).await;
    Migrator::up(&db, None).await.unwrap();
    let url = format!("sqlite://{}", path.display());
    let target = Target {
        store: SeaOrmLeaseStore::new(db),
        args: vec!["--database-url".into(), url.clone()],
        _dir: Some(dir),
        cleanup: None,
    };
    (target, url)
}

#[cfg(feature = "postgres")]
async fn postgres() -> Option<Target> {
    let server = common::Server::Postgres;
    if server.skipped() {
        return None;
    }
    let db = server.connect(2).await;
    let table = common::unique("obcli");
    common::migrate(&db, &table).await;
    Some(Target {
        store: SeaOrmLeaseStore::new(db.clone())
            .with_table(&table)
            .unwrap(),
        args: vec![
            "--database-url".into(),
            server.url(),
            "--table".into(),
            table.clone(),
        ],
        _dir: None,
        cleanup: Some((db, table)),
    })
}

// ---- the scenarios, for any target ----

async fn leases_lists_every_resource(t: &Target) {
    let empty = t.run(&["leases"]).await;
    assert_code(&empty, 0);
    assert!(empty.stdout.starts_with("no leases in table"), "{empty:#?}");
    assert_eq!(t.run(&["ls", "--json"]).await.stdout.trim(), "[]");

    t.store
        .acquire_or_renew("report", "node-a", LONG)
        .await
        .unwrap();
    t.store
        .acquire_or_renew("billing", "node-b", LONG)
        .await
        .unwrap();
    t.store
        .acquire_or_renew("cleanup", "node-c", LONG)
        .await
        .unwrap();
    assert!(t.store.release("cleanup", "node-c").await.unwrap());
    t.store
        .acquire_or_renew("cleanup", "node-a", LONG)
        .await
        .unwrap();
    assert!(t.store.release("cleanup", "node-a").await.unwrap());

    let out = t.run(&["leases"]).await;
    assert_code(&out, 0);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [
            "RESOURCE", "HOLDER", "TOKEN", "STATE", "TIME", "LEFT", "ACQUIRED", "(UTC)", "RENEWED",
            "(UTC)"
        ]
    );
    // Ordered by resource.
    assert!(lines[1].starts_with("billing ") && lines[2].starts_with("cleanup "));
    assert!(lines[3].starts_with("report "));
    assert_eq!(
        lines[4],
        "3 leases, 2 live (time left by the database clock)"
    );
    let billing = row(&out.stdout, "billing");
    assert_eq!(&billing[..4], ["billing", "node-b", "1", "live"]);
    let left: f64 = billing[4].trim_end_matches('s').parse().unwrap_or(0.0);
    assert!(billing[4].contains('m') || left > 0.0, "{billing:?}");
    let cleanup = row(&out.stdout, "cleanup");
    assert_eq!(&cleanup[..5], ["cleanup", "node-a", "2", "expired", "-"]);
    // acquired and renewed: a date and a time each.
    assert_eq!(cleanup.len(), 9, "{cleanup:?}");

    // The alias, and JSON for scripts.
    let json = t.run(&["ls", "--json"]).await;
    assert_code(&json, 0);
    let all: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let all = all.as_array().unwrap();
    assert_eq!(all.len(), 3);
    assert_eq!(all[0]["resource"], "billing");
    assert_eq!(all[0]["holder"], "node-b");
    assert_eq!(all[0]["token"], 1);
    assert_eq!(all[0]["live"], true);
    let remaining = all[0]["remaining_ms"].as_u64().unwrap();
    assert!(remaining > 100_000 && remaining <= 120_000, "{remaining}");
    assert_eq!(all[1]["token"], 2);
    assert_eq!(all[1]["live"], false);
    assert_eq!(all[1]["remaining_ms"], 0);
    for key in ["expires_at", "acquired_at", "renewed_at"] {
        let text = all[1][key].as_str().unwrap();
        assert!(
            chrono::DateTime::parse_from_rfc3339(text).is_ok(),
            "{key}: {text}"
        );
    }
}

async fn show_one_and_unknown(t: &Target) {
    t.store
        .acquire_or_renew("shown", "node-a", LONG)
        .await
        .unwrap();
    let out = t.run(&["show", "shown"]).await;
    assert_code(&out, 0);
    for line in [
        "resource     shown",
        "holder       node-a",
        "token        1",
        "state        live",
    ] {
        assert!(out.stdout.contains(line), "{line:?} in {out:#?}");
    }
    assert!(out.stdout.contains("(database clock)"), "{out:#?}");
    let json = t.run(&["show", "shown", "--json"]).await;
    let value: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(value["holder"], "node-a");
    assert_eq!(value["live"], true);

    let unknown = t.run(&["show", "no-such-resource"]).await;
    assert_code(&unknown, UNKNOWN_RESOURCE);
    assert!(
        unknown
            .stderr
            .contains("error: no lease for resource \"no-such-resource\""),
        "{unknown:#?}"
    );
    assert!(unknown.stdout.is_empty());
}

async fn release_is_guarded(t: &Target) {
    t.store
        .acquire_or_renew("released", "node-a", LONG)
        .await
        .unwrap();
    let wrong = t.run(&["release", "released", "--holder", "node-b"]).await;
    assert_code(&wrong, NOTHING_CHANGED);
    assert!(
        wrong
            .stderr
            .contains("nothing released: \"released\" is held by \"node-a\" (token 1"),
        "{wrong:#?}"
    );
    assert!(t.store.current("released").await.unwrap().unwrap().live);

    let ok = t.run(&["release", "released", "--holder", "node-a"]).await;
    assert_code(&ok, 0);
    assert!(
        ok.stdout
            .contains("released \"released\": node-a's lease (token 1) ended")
            && ok.stdout.contains("with token 2"),
        "{ok:#?}"
    );
    assert!(!t.store.current("released").await.unwrap().unwrap().live);

    let again = t.run(&["release", "released", "--holder", "node-a"]).await;
    assert_code(&again, NOTHING_CHANGED);
    assert!(again.stderr.contains("already ended"), "{again:#?}");
    assert_code(
        &t.run(&["release", "nope", "--holder", "node-a"]).await,
        UNKNOWN_RESOURCE,
    );
    let next = t
        .store
        .acquire_or_renew("released", "node-b", LONG)
        .await
        .unwrap();
    assert!(matches!(next, LeaseOutcome::Acquired(ref l) if l.token.get() == 2));
}

async fn revoke_needs_force_and_confirmation(t: &Target) {
    t.store
        .acquire_or_renew("stuck", "node-a", LONG)
        .await
        .unwrap();

    let no_force = t.run(&["revoke", "stuck"]).await;
    assert_code(&no_force, BAD_INPUT);
    assert!(no_force.stderr.contains("pass --force"), "{no_force:#?}");

    // Declined, or no answer at all: nothing changes.
    for answer in [Some("n\n"), Some(""), None] {
        let declined = t.run_with(&["revoke", "stuck", "--force"], answer).await;
        assert_code(&declined, NOTHING_CHANGED);
        assert!(
            declined.stderr.contains("held by \"node-a\" (token 1")
                && declined.stderr.contains("[y/N]")
                && declined.stderr.contains("not revoked"),
            "{declined:#?}"
        );
        assert!(t.store.current("stuck").await.unwrap().unwrap().live);
    }

    let before = t.store.current("stuck").await.unwrap().unwrap();
    let done = t
        .run_with(&["revoke", "stuck", "--force"], Some("y\n"))
        .await;
    assert_code(&done, 0);
    assert!(
        done.stdout
            .contains("revoked \"stuck\": the lease of \"node-a\" (token 1,")
            && done.stdout.contains("takes over with token 2"),
        "{done:#?}"
    );
    // The audit log line, on stderr: what was revoked, from whom.
    assert!(
        done.stderr.contains("lease revoked by an operator")
            && done.stderr.contains("holder=node-a")
            && done.stderr.contains("token=1"),
        "{done:#?}"
    );
    let after = t.store.current("stuck").await.unwrap().unwrap();
    assert!(!after.live);
    assert_eq!(
        (
            &after.holder,
            after.token,
            after.acquired_at,
            after.renewed_at
        ),
        (
            &before.holder,
            before.token,
            before.acquired_at,
            before.renewed_at
        ),
        "only the expiry moved"
    );
    let next = t
        .store
        .acquire_or_renew("stuck", "node-b", LONG)
        .await
        .unwrap();
    assert!(matches!(next, LeaseOutcome::Acquired(ref l) if l.token.get() == 2));

    // --yes skips the prompt; an ended lease has nothing to revoke; unknown resources fail.
    let yes = t.run(&["revoke", "stuck", "--force", "--yes"]).await;
    assert_code(&yes, 0);
    assert!(
        yes.stdout.contains("the lease of \"node-b\" (token 2"),
        "{yes:#?}"
    );
    assert!(!yes.stderr.contains("[y/N]"));
    let ended = t.run(&["revoke", "stuck", "--force", "--yes"]).await;
    assert_code(&ended, 0);
    assert!(ended.stdout.starts_with("nothing to revoke"), "{ended:#?}");
    assert_code(
        &t.run(&["revoke", "nope", "--force", "--yes"]).await,
        UNKNOWN_RESOURCE,
    );
}

async fn watch_prints_each_change(t: &Target) {
    t.store
        .acquire_or_renew("watched", "node-a", LONG)
        .await
        .unwrap();
    let all = t.with(&[
        "watch",
        "watched",
        "--interval",
        "50ms",
        "--max-changes",
        "2",
        "--for",
        "30s",
    ]);
    let child = command(&all.iter().map(String::as_str).collect::<Vec<_>>())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(t.store.release("watched", "node-a").await.unwrap());
    tokio::time::sleep(Duration::from_millis(700)).await;
    t.store
        .acquire_or_renew("watched", "node-b", LONG)
        .await
        .unwrap();
    let out = tokio::task::spawn_blocking(move || finish(child))
        .await
        .unwrap();
    assert_code(&out, 0);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{out:#?}");
    assert!(
        lines[0].contains("watched  holder node-a  token 1  live, ") && lines[0].ends_with("(now)"),
        "{out:#?}"
    );
    assert!(
        lines[1].contains("holder node-a  token 1  expired  (ended)"),
        "{out:#?}"
    );
    assert!(
        lines[2].contains("holder node-b  token 2  live, ") && lines[2].ends_with("(new term)"),
        "{out:#?}"
    );

    // --for ends it; --json prints one object per line.
    let timed = t
        .run(&[
            "watch",
            "watched",
            "--interval",
            "100ms",
            "--for",
            "500ms",
            "--json",
        ])
        .await;
    assert_code(&timed, 0);
    let first: serde_json::Value =
        serde_json::from_str(timed.stdout.lines().next().unwrap()).unwrap();
    assert_eq!(first["change"], "now");
    assert_eq!(first["holder"], "node-b");
    assert_eq!(first["token"], 2);
    assert_eq!(timed.stdout.lines().count(), 1, "{timed:#?}");

    assert_code(
        &t.run(&["watch", "nope", "--for", "1s"]).await,
        UNKNOWN_RESOURCE,
    );
}

async fn missing_table_says_how_to_migrate(t: &Target, url: &str) {
    let table = common::unique("never_migrated");
    for args in [
        vec!["leases", "--table", &table],
        vec!["show", "x", "--table", &table],
        vec!["revoke", "x", "--force", "--yes", "--table", &table],
    ] {
        let mut all = args.clone();
        all.extend(["--database-url", url]);
        let out = run(&all).await;
        assert_code(&out, MISSING_TABLE);
        assert!(
            out.stderr
                .contains(&format!("the lease table \"{table}\" does not exist"))
                && out.stderr.contains(&format!(
                    "add orion_beacon_migration::CreateLeaseTable::with_table(\"{table}\") to your app's Migrator"
                )),
            "{out:#?}"
        );
    }
    let _ = t;
}

// ---- SQLite ----

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn leases_show_release_revoke_watch() {
        let (t, url) = sqlite().await;
        leases_lists_every_resource(&t).await;
        show_one_and_unknown(&t).await;
        release_is_guarded(&t).await;
        revoke_needs_force_and_confirmation(&t).await;
        watch_prints_each_change(&t).await;
        missing_table_says_how_to_migrate(&t, &url).await;
        t.teardown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn database_url_from_the_environment() {
        let (t, url) = sqlite().await;
        t.store
            .acquire_or_renew("env", "node-a", LONG)
            .await
            .unwrap();
        let out = run_with(&["ls"], None, &[("DATABASE_URL", &url)]).await;
        assert_code(&out, 0);
        assert_eq!(
            &row(&out.stdout, "env")[..4],
            ["env", "node-a", "1", "live"]
        );
    }

    /// `-o table|wide|json` (`--json` kept), `--no-headers`, wide characters aligned, "did you
    /// mean" for a typo, shell completions, Ctrl-C on `watch` exits 130.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn output_formats_and_command_line_habits() {
        let (t, _url) = sqlite().await;
        for (r, who) in [("nightly-report", "node-a"), ("日本-shard", "ノード")] {
            t.store.acquire_or_renew(r, who, LONG).await.unwrap();
        }
        let table = t.run(&["leases"]).await;
        let wide = t.run(&["leases", "-o", "wide"]).await;
        assert_code(&wide, 0);
        let header = wide.stdout.lines().next().unwrap();
        assert!(header.contains("EXPIRES (UTC)"), "{wide:#?}");
        assert!(!table.stdout.contains("EXPIRES"), "{table:#?}");
        // Columns line up in terminal columns: the token column ends at the same place.
        let ends: Vec<usize> = table
            .stdout
            .lines()
            .take(3)
            .map(|line| {
                let token_end = line.find(" live").or_else(|| line.find(" STATE")).unwrap();
                line[..token_end]
                    .chars()
                    .map(|c| if c.is_ascii() { 1 } else { 2 })
                    .sum()
            })
            .collect();
        assert!(
            ends.windows(2).all(|w| w[0] == w[1]),
            "{ends:?}\n{}",
            table.stdout
        );
        assert!(
            table.stdout.lines().all(|l| !l.ends_with(' ')),
            "trailing spaces"
        );
        let bare = t.run(&["leases", "--no-headers"]).await;
        assert_eq!(bare.stdout.lines().count(), 2, "{bare:#?}");
        assert!(bare.stdout.starts_with("nightly-report "), "{bare:#?}");
        let names = |text: &str| -> Vec<String> {
            let all: serde_json::Value = serde_json::from_str(text).unwrap();
            let all = all.as_array().unwrap().iter();
            all.map(|r| r["resource"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(
            names(&t.run(&["ls", "-o", "json"]).await.stdout),
            names(&t.run(&["ls", "--json"]).await.stdout)
        );
        assert_code(&t.run(&["ls", "--json", "-o", "wide"]).await, BAD_INPUT);

        let typo = t.run(&["show", "nightly-reprot"]).await;
        assert_code(&typo, UNKNOWN_RESOURCE);
        assert!(
            typo.stderr.contains("did you mean \"nightly-report\"?"),
            "{typo:#?}"
        );
        let far = t.run(&["show", "billing"]).await;
        assert!(!far.stderr.contains("did you mean"), "{far:#?}");

        let completions = run(&["completions", "bash"]).await;
        assert_code(&completions, 0);
        assert!(
            completions.stdout.contains("orion-beacon"),
            "{completions:#?}"
        );

        // Ctrl-C on watch: exit 130, like any program stopped by SIGINT in a shell.
        let all = t.with(&["watch", "nightly-report", "--interval", "100ms"]);
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        let child = command(&refs).spawn().unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        )
        .unwrap();
        let out = tokio::task::spawn_blocking(move || finish(child))
            .await
            .unwrap();
        assert_code(&out, 130);
        assert!(out.stdout.contains("holder node-a"), "{out:#?}");
        t.teardown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bad_input_and_unreachable_databases() {
        let (_t, url) = sqlite().await;
        let dir = tempfile::tempdir().unwrap();

        // A file that is not there: unreachable, and not created behind the operator's back.
        let missing = dir.path().join("typo.db");
        let out = run(&[
            "leases",
            "--database-url",
            &format!("sqlite://{}", missing.display()),
        ])
        .await;
        assert_code(&out, UNREACHABLE);
        assert!(
            out.stderr.contains("no SQLite database file at"),
            "{out:#?}"
        );
        assert!(!missing.exists());

        // An empty database: the table is missing.
        let empty = dir.path().join("empty.db");
        std::fs::File::create(&empty).unwrap();
        let out = run(&[
            "leases",
            "--database-url",
            &format!("sqlite://{}", empty.display()),
        ])
        .await;
        assert_code(&out, MISSING_TABLE);
        assert!(
            out.stderr.contains("\"orionbeacon_leases\" does not exist"),
            "{out:#?}"
        );

        // Bad table names, checked before connecting.
        for bad in ["x; DROP TABLE y", "1x", "a\"b", ""] {
            let out = run(&["leases", "--database-url", &url, "--table", bad]).await;
            assert_code(&out, BAD_INPUT);
            assert!(out.stderr.starts_with("error: table name"), "{out:#?}");
        }
        // Bad resource and holder names.
        let out = run(&["show", " padded", "--database-url", &url]).await;
        assert_code(&out, BAD_INPUT);
        assert!(out.stderr.contains("invalid resource name"), "{out:#?}");
        let out = run(&["release", "r", "--holder", "", "--database-url", &url]).await;
        assert_code(&out, BAD_INPUT);
        assert!(out.stderr.contains("invalid candidate id"), "{out:#?}");
        // No database; an unknown scheme; usage errors (clap's, also 2).
        let out = run(&["leases"]).await;
        assert_code(&out, BAD_INPUT);
        assert!(
            out.stderr
                .contains("pass --database-url URL or set DATABASE_URL"),
            "{out:#?}"
        );
        let out = run(&["leases", "--database-url", "redis://localhost"]).await;
        assert_code(&out, BAD_INPUT);
        assert!(out.stderr.contains("unsupported database URL"), "{out:#?}");
        assert_code(&run(&["frobnicate"]).await, BAD_INPUT);
        // A URL in the wrong place: clap's message quotes it, without the password.
        let out = run(&["leases", "postgres://app:hunter2@db/app"]).await;
        assert_code(&out, BAD_INPUT);
        assert!(
            !out.stderr.contains("hunter2") && out.stderr.contains("postgres://app:***@db/app"),
            "{out:#?}"
        );
        let out = run(&[
            "leases",
            "--database-url",
            "Server=db;User Id=sa;Password=S3cret;",
        ])
        .await;
        assert_code(&out, BAD_INPUT);
        assert!(!out.stderr.contains("S3cret"), "{out:#?}");
        assert_code(
            &run(&[
                "watch",
                "r",
                "--interval",
                "5parsecs",
                "--database-url",
                &url,
            ])
            .await,
            BAD_INPUT,
        );
        assert_code(
            &run(&["watch", "r", "--interval", "0s", "--database-url", &url]).await,
            BAD_INPUT,
        );
        let help = run(&["--help"]).await;
        assert_code(&help, 0);
        assert!(help.stdout.contains("leases") && help.stdout.contains("revoke"));
    }
}

// ---- PostgreSQL ----

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn leases_show_release_revoke_watch() {
        let Some(t) = postgres().await else {
            return;
        };
        let url = common::Server::Postgres.url();
        leases_lists_every_resource(&t).await;
        show_one_and_unknown(&t).await;
        release_is_guarded(&t).await;
        revoke_needs_force_and_confirmation(&t).await;
        watch_prints_each_change(&t).await;
        missing_table_says_how_to_migrate(&t, &url).await;
        t.teardown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unreachable_server() {
        // Nothing listens on port 1.
        let out = run(&[
            "leases",
            "--database-url",
            "postgres://postgres:secret@127.0.0.1:1/test",
            "--connect-timeout",
            "3s",
        ])
        .await;
        assert_code(&out, UNREACHABLE);
        assert!(
            out.stderr
                .contains("cannot reach the database at postgres://postgres:***@127.0.0.1:1/test"),
            "{out:#?}"
        );
        assert!(
            !out.stderr.contains("secret"),
            "the password is not printed"
        );
        // The real cause, not the pool's "timed out".
        assert!(
            out.stderr.contains("Connection refused") && !out.stderr.contains("timed out"),
            "{out:#?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_missing_database_is_named() {
        if common::Server::Postgres.skipped() {
            return;
        }
        let url = common::Server::Postgres.url();
        let base = url.rsplit_once('/').map(|(b, _)| b).unwrap_or(&url);
        let out = run(&[
            "leases",
            "--database-url",
            &format!("{base}/no_such_db_here"),
        ])
        .await;
        assert_code(&out, UNREACHABLE);
        assert!(
            out.stderr
                .contains("database \"no_such_db_here\" does not exist")
                && !out.stderr.contains("line"),
            "{out:#?}"
        );
    }
}
