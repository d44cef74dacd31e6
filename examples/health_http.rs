//! Wiring `ElectorHandle::health()` to HTTP probes, with nothing but tokio: `GET /healthz`
//! (liveness/readiness: 200 while the elector hears from its store, 503 when it is wedged) and
//! `GET /leader` (200 only on the leader, e.g. to route leader-only traffic).
//!
//! ```sh
//! cargo run --example health_http                 # serves on 127.0.0.1:8080 until Ctrl-C
//! curl -i http://127.0.0.1:8080/healthz
//! cargo run --example health_http -- --once       # asks itself once and exits
//! ```
//!
//! With axum the handler is the same few lines (see the README's Operations section). The
//! elector here runs on the in-memory store so the example needs no database; use
//! `Elector::builder(SeaOrmLeaseStore::new(db))` in a service.

use std::sync::Arc;
use std::time::Duration;

use orion_beacon::{Elector, ElectorHandle, Health};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The probe's answer: status line and a small JSON body.
fn respond(path: &str, health: &Health) -> (u16, String) {
    let body = format!(
        "{{\"healthy\":{},\"leader\":{},\"last_round_trip_ms\":{},\"window_ms\":{}}}",
        health.healthy,
        health.leader,
        health
            .last_round_trip
            .map_or("null".to_owned(), |d| d.as_millis().to_string()),
        health.window.as_millis()
    );
    let ok = match path {
        "/healthz" => health.healthy,
        "/leader" => health.healthy && health.leader,
        _ => return (404, "{\"error\":\"not found\"}".to_owned()),
    };
    (if ok { 200 } else { 503 }, body)
}

async fn serve_one(mut stream: TcpStream, elector: Arc<ElectorHandle>) -> Result<(), Error> {
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await??;
    let request = String::from_utf8_lossy(&buf[..n]);
    let path = request.split_whitespace().nth(1).unwrap_or("/");
    let (status, body) = respond(path, &elector.health());
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        _ => "Service Unavailable",
    };
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await?;
    Ok(())
}

async fn get(addr: std::net::SocketAddr, path: &str) -> Result<String, Error> {
    let mut stream = TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\n\r\n").as_bytes())
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
    let mut state = handle.watch();
    state.wait_for(|s| s.is_leader()).await?;

    let listener = TcpListener::bind(if once {
        "127.0.0.1:0"
    } else {
        "127.0.0.1:8080"
    })
    .await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn({
        let handle = handle.clone();
        async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let handle = handle.clone();
                tokio::spawn(async move {
                    if let Err(err) = serve_one(stream, handle).await {
                        eprintln!("probe connection failed: {err}");
                    }
                });
            }
        }
    });

    if once {
        println!("health: {}", handle.health());
        for path in ["/healthz", "/leader"] {
            println!("GET {path}  ->  {}", get(addr, path).await?);
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
