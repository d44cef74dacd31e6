//! The demo: three candidate processes elect a leader over one database; the leader is killed
//! (no release) to show failover, then the next one shuts down gracefully to show handover.
//!
//! ```sh
//! cargo run --example election --features sqlite                               # SQLite file in a temp dir
//! cargo run --example election --features sqlite,postgres -- --database-url postgres://postgres@127.0.0.1/test
//! cargo run --example election --features sqlite,mysql -- --database-url mysql://root@127.0.0.1/test
//! ```
//!
//! The example re-executes itself with `--candidate NAME` for each candidate process.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use orion_beacon::{Elector, Leadership, LeaseStore, SeaOrmLeaseStore};
use orion_beacon_migration::{Migrator, MigratorTrait};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;

const LEASE: Duration = Duration::from_secs(2);
const RENEW: Duration = Duration::from_millis(500);
const RETRY: Duration = Duration::from_secs(1);

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    database_url: Option<String>,
    candidate: Option<String>,
    resource: String,
}

fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        database_url: None,
        candidate: None,
        resource: format!("demo-{}", std::process::id()),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--database-url" => args.database_url = Some(value()?),
            "--candidate" => args.candidate = Some(value()?),
            "--resource" => args.resource = value()?,
            "-h" | "--help" => {
                println!(
                    "usage: election [--database-url URL]   (default: a SQLite file in a temp dir)"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?} (try --help)").into()),
        }
    }
    Ok(args)
}

async fn connect(url: &str) -> Result<sea_orm::DatabaseConnection, Error> {
    let mut options = if url.starts_with("sqlite:") {
        orion_beacon::backend::sqlite::connect_options(url)
    } else {
        sea_orm::ConnectOptions::new(url)
    };
    options.max_connections(2).sqlx_logging(false);
    Ok(sea_orm::Database::connect(options).await?)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args = parse_args()?;
    match args.candidate.clone() {
        Some(name) => candidate(&name, &args).await,
        None => demo(args).await,
    }
}

/// One candidate process: runs an elector and reports its leadership on stdout, one line per
/// change; a `shutdown` line (or the end of stdin) shuts it down gracefully.
async fn candidate(name: &str, args: &Args) -> Result<(), Error> {
    let url = args
        .database_url
        .as_deref()
        .ok_or("--database-url is required with --candidate")?;
    let store = SeaOrmLeaseStore::new(connect(url).await?);
    let handle = Elector::builder(store)
        .resource(&args.resource)
        .candidate_id(name)
        .lease_duration(LEASE)
        .renew_interval(RENEW)
        .retry_interval(RETRY)
        .build()?
        .start();
    let mut rx = handle.watch();
    let reporter = tokio::spawn(async move {
        loop {
            let line = match &rx.borrow_and_update() {
                Leadership::Starting => None,
                Leadership::Leader(term) => Some(format!("LEADER {}", term.token())),
                Leadership::Follower { leader, .. } => {
                    Some(format!("FOLLOWER {}", leader.as_deref().unwrap_or("-")))
                }
                Leadership::Failed(err) => Some(format!("FAILED {err}")),
                _ => None,
            };
            if let Some(line) = line {
                println!("{line}");
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    });
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = stdin.next_line().await {
        if line.trim() == "shutdown" {
            break;
        }
    }
    handle.shutdown().await;
    let _ = reporter.await;
    println!("STOPPED");
    Ok(())
}

struct Proc {
    child: Child,
}

#[derive(Debug)]
struct Term {
    candidate: String,
    token: i64,
    start: Duration,
    end: Option<Duration>,
}

struct Demo {
    started: Instant,
    events: mpsc::UnboundedReceiver<(Instant, String, String)>,
    procs: HashMap<String, Proc>,
    terms: Vec<Term>,
}

impl Demo {
    fn at(&self, t: Instant) -> Duration {
        t - self.started
    }

    fn say(&self, who: &str, what: &str) {
        println!(
            "[{:>6.2}s] {who:<7} {what}",
            self.at(Instant::now()).as_secs_f64()
        );
    }

    fn close_term(&mut self, candidate: &str, at: Duration) {
        if let Some(t) = self
            .terms
            .iter_mut()
            .rev()
            .find(|t| t.candidate == candidate && t.end.is_none())
        {
            t.end = Some(at);
        }
    }

    /// Prints and records events until `until` returns true for one, or the time runs out.
    async fn until<F: FnMut(&str, &str) -> bool>(
        &mut self,
        limit: Duration,
        mut until: F,
    ) -> Result<Duration, Error> {
        let start = Instant::now();
        let deadline = start + limit;
        loop {
            let Ok(Some((t, who, line))) =
                tokio::time::timeout_at(deadline, self.events.recv()).await
            else {
                return Err(format!("nothing happened within {limit:?}").into());
            };
            let at = self.at(t);
            println!("[{:>6.2}s] {who:<7} {line}", at.as_secs_f64());
            if let Some(token) = line.strip_prefix("LEADER ") {
                // A new term straight after another (the old one was superseded) ends the old.
                self.close_term(&who, at);
                self.terms.push(Term {
                    candidate: who.clone(),
                    token: token.parse()?,
                    start: at,
                    end: None,
                });
            } else if line.starts_with("FOLLOWER") || line == "STOPPED" {
                self.close_term(&who, at);
            }
            if until(&who, &line) {
                return Ok(t - start);
            }
        }
    }

    /// Lets the current state run for a while, still printing what happens.
    async fn run_for(&mut self, d: Duration) -> Result<(), Error> {
        match self.until(d, |_, _| false).await {
            Ok(_) | Err(_) => Ok(()),
        }
    }

    fn leader(&self) -> Option<String> {
        self.terms
            .iter()
            .rev()
            .find(|t| t.end.is_none())
            .map(|t| t.candidate.clone())
    }
}

async fn demo(args: Args) -> Result<(), Error> {
    let temp = tempfile::tempdir()?;
    let url = match &args.database_url {
        Some(url) => url.clone(),
        None => format!("sqlite://{}", temp.path().join("leases.db").display()),
    };
    println!("orion-beacon election demo: 3 candidate processes, lease {LEASE:?}, renew {RENEW:?}, retry {RETRY:?}");
    println!("database: {url}   resource: {}", args.resource);
    let db = connect(&url).await?;
    Migrator::up(&db, None).await?;
    let store = SeaOrmLeaseStore::new(db);

    let (tx, events) = mpsc::unbounded_channel();
    let mut demo = Demo {
        started: Instant::now(),
        events,
        procs: HashMap::new(),
        terms: Vec::new(),
    };
    let exe = std::env::current_exe()?;
    for name in ["node-a", "node-b", "node-c"] {
        let mut child = Command::new(&exe)
            .args([
                "--candidate",
                name,
                "--database-url",
                &url,
                "--resource",
                &args.resource,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let tx = tx.clone();
        let who = name.to_owned();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = tx.send((Instant::now(), who.clone(), line));
            }
        });
        demo.procs.insert(name.to_owned(), Proc { child });
    }
    demo.say("demo", "started node-a, node-b, node-c");

    demo.until(Duration::from_secs(15), |_, line| {
        line.starts_with("LEADER")
    })
    .await?;
    demo.run_for(Duration::from_secs(3)).await?;

    // 1. Crash: SIGKILL the leader. It cannot release; its lease must lapse.
    let victim = demo.leader().ok_or("no leader")?;
    demo.procs
        .get_mut(&victim)
        .ok_or("no such process")?
        .child
        .start_kill()?;
    let killed = Instant::now();
    demo.say(
        "demo",
        &format!("SIGKILL {victim} (no release: its lease must lapse)"),
    );
    let at = demo.at(killed);
    demo.close_term(&victim, at);
    demo.procs.remove(&victim);
    let failover = demo
        .until(LEASE * 3, |_, line| line.starts_with("LEADER"))
        .await?;
    demo.say(
        "demo",
        &format!(
            "failover took {:.0} ms (lease {} ms)",
            failover.as_secs_f64() * 1e3,
            LEASE.as_millis()
        ),
    );
    demo.run_for(Duration::from_secs(3)).await?;

    // 2. Graceful: the new leader shuts down, releasing its lease.
    let leaving = demo.leader().ok_or("no leader")?;
    let stdin = demo
        .procs
        .get_mut(&leaving)
        .and_then(|p| p.child.stdin.as_mut())
        .ok_or("no stdin")?;
    stdin.write_all(b"shutdown\n").await?;
    demo.say(
        "demo",
        &format!("asked {leaving} to shut down gracefully (it releases)"),
    );
    let handover = demo
        .until(RETRY * 3, |who, line| {
            who != leaving && line.starts_with("LEADER")
        })
        .await?;
    demo.say(
        "demo",
        &format!(
            "handover took {:.0} ms (retry interval {} ms)",
            handover.as_secs_f64() * 1e3,
            RETRY.as_millis()
        ),
    );
    demo.run_for(Duration::from_secs(2)).await?;

    // 3. Stop everyone.
    for proc in demo.procs.values_mut() {
        if let Some(stdin) = proc.child.stdin.as_mut() {
            let _ = stdin.write_all(b"shutdown\n").await;
        }
    }
    for proc in demo.procs.values_mut() {
        let _ = tokio::time::timeout(Duration::from_secs(10), proc.child.wait()).await;
    }
    demo.run_for(Duration::from_millis(200)).await?;
    let record = store.current(&args.resource).await?;

    // Summary, from what the processes reported.
    println!();
    println!("summary");
    for t in &demo.terms {
        let end = t
            .end
            .map_or("-".to_owned(), |e| format!("{:.2}s", e.as_secs_f64()));
        println!(
            "  term {:>2}  {:<7} {:>6.2}s .. {end}",
            t.token,
            t.candidate,
            t.start.as_secs_f64()
        );
    }
    let tokens: Vec<i64> = demo.terms.iter().map(|t| t.token).collect();
    let increasing = tokens.windows(2).all(|w| w[1] > w[0]);
    let mut overlaps = 0;
    for w in demo.terms.windows(2) {
        if w[0].end.is_none_or(|end| end > w[1].start) {
            overlaps += 1;
        }
    }
    println!(
        "  terms seen: {}   tokens in order: {tokens:?} ({})",
        tokens.len(),
        if increasing {
            "strictly increasing"
        } else {
            "NOT INCREASING"
        }
    );
    println!(
        "  two leaders at once: {}",
        if overlaps == 0 { "never" } else { "YES" }
    );
    println!(
        "  failover after a crash: {:.0} ms; graceful handover: {:.0} ms",
        failover.as_secs_f64() * 1e3,
        handover.as_secs_f64() * 1e3
    );
    if let Some(r) = record {
        println!(
            "  lease row now: holder {} token {} live {}",
            r.holder, r.token, r.live
        );
    }
    if !increasing || overlaps > 0 || tokens.len() < 3 {
        return Err("the demo saw a safety violation".into());
    }
    Ok(())
}
