//! Wiring `ElectorHandle::health()` to HTTP probes with axum: `GET /healthz` (liveness and
//! readiness: 200 while the elector hears from its store, 503 when it is wedged or stopped) and
//! `GET /leader` (200 only on the leader, e.g. to route leader-only traffic). The body is the
//! `Health` value as JSON (feature `serde`).
//!
//! ```sh
//! cargo run --example health_http --features serde               # 127.0.0.1:8080 until Ctrl-C
//! curl -i http://127.0.0.1:8080/healthz
//! cargo run --example health_http --features serde -- --once     # asks itself once and exits
//! ```
//!
//! The elector here runs on the in-memory store so the example needs no database; use
//! `Elector::builder(SeaOrmLeaseStore::new(db))` in a service.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use orion_beacon::{Elector, ElectorHandle, Health};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// 200 while the elector hears from its store.
async fn healthz(State(elector): State<Arc<ElectorHandle>>) -> (StatusCode, Json<Health>) {
    let health = elector.health();
    (status(health.healthy), Json(health))
}

/// 200 only on a healthy leader.
async fn leader(State(elector): State<Arc<ElectorHandle>>) -> (StatusCode, Json<Health>) {
    let health = elector.health();
    (status(health.healthy && health.leader), Json(health))
}

fn status(ok: bool) -> StatusCode {
    if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

/// A minimal HTTP/1.1 GET, for `--once` (no HTTP client needed for one request).
async fn ask(addr: std::net::SocketAddr, path: &str) -> Result<String, Error> {
    let mut stream = TcpStream::connect(addr).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response.lines().next().unwrap_or_default().to_owned();
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    Ok(format!("{status}  {body}"))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let once = std::env::args().any(|a| a == "--once");
    let elector = Elector::builder_in_memory()
        .resource("nightly-report")
        .candidate_id("node-a")
        .lease_duration(Duration::from_secs(15))
        .renew_interval(Duration::from_secs(5))
        .health_window(Duration::from_secs(15)) // the default for these intervals
        .build()?;
    let handle = Arc::new(elector.start());
    handle.watch().wait_for(|s| s.is_leader()).await?;

    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/leader", get(leader))
        .with_state(handle.clone());
    let listener = TcpListener::bind(if once {
        "127.0.0.1:0"
    } else {
        "127.0.0.1:8080"
    })
    .await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    if once {
        println!("health: {}", handle.health());
        for path in ["/healthz", "/leader"] {
            println!("GET {path}  ->  {}", ask(addr, path).await?);
        }
    } else {
        println!("serving probes on http://{addr}/healthz and http://{addr}/leader (Ctrl-C stops)");
        tokio::signal::ctrl_c().await?;
    }
    server.abort();
    // The handle is shared with the server's state; shutdown needs only a reference.
    handle.shutdown().await;
    Ok(())
}
