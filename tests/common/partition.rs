//! Network partitions: a TCP proxy per candidate, in the test's (or the torture harness's)
//! process, between the candidate and its database server. Cut, it stops reading and writing
//! both of its sockets without closing either, so neither side sees a FIN or an RST: what a
//! pulled cable, a changed security group or a frozen VM looks like (the kernels still
//! acknowledge what fits in their buffers). Healed, it forwards again, what was held back
//! included. A connection the server closed meanwhile (a takeover ended its session, a
//! keepalive gave up) then closes at the candidate too, or, when the cut was made with
//! `lose_fins`, stays silently open at the candidate until the candidate sends something, which
//! then closes it: the half-open connection a partition leaves once it outlasts the server's FIN
//! retransmissions. A client reading such a connection waits forever unless it bounds the wait.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// One proxy: where candidates connect, and its switches.
struct Proxy {
    port: u16,
    cut: watch::Sender<bool>,
    /// Whether a close by the server during the current cut reaches the candidate at the heal.
    lose_fins: Arc<AtomicBool>,
}

/// The proxies, by candidate name (a candidate's replacements share its proxies) and target.
#[derive(Clone, Default)]
pub struct Partitions {
    proxies: Arc<Mutex<HashMap<(String, String), Proxy>>>,
}

impl Partitions {
    /// `url` with its `host:port` replaced by a proxy of `candidate`'s to it. URLs without one
    /// (SQLite) are returned as they are.
    pub fn route(&self, candidate: &str, url: &str) -> Result<String, Error> {
        let Some((target, start, end)) = host_port(url) else {
            return Ok(url.to_owned());
        };
        let key = (family(candidate).to_owned(), target.clone());
        let mut proxies = self.proxies.lock().unwrap_or_else(|e| e.into_inner());
        let port = match proxies.get(&key) {
            Some(p) => p.port,
            None => {
                let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
                listener.set_nonblocking(true)?;
                let port = listener.local_addr()?.port();
                let (cut, rx) = watch::channel(false);
                let lose_fins = Arc::new(AtomicBool::new(false));
                let target: SocketAddr = target
                    .parse()
                    .map_err(|e| Error::from(format!("proxy target {target}: {e}")))?;
                tokio::spawn(serve(
                    TcpListener::from_std(listener)?,
                    target,
                    rx,
                    lose_fins.clone(),
                ));
                proxies.insert(
                    key,
                    Proxy {
                        port,
                        cut,
                        lose_fins,
                    },
                );
                port
            }
        };
        Ok(format!("{}127.0.0.1:{port}{}", &url[..start], &url[end..]))
    }

    /// Cuts (`true`) or heals (`false`) every connection of `candidate` to every server; a
    /// connection the server closes during the cut closes at the candidate at the heal.
    pub fn set(&self, candidate: &str, cut: bool) {
        self.set_with(candidate, cut, false);
    }

    /// As [`set`](Self::set); cutting with `lose_fins`, a connection the server closes during
    /// the cut stays open and silent at the candidate after the heal, until the candidate
    /// sends on it (then it closes).
    pub fn set_with(&self, candidate: &str, cut: bool, lose_fins: bool) {
        let proxies = self.proxies.lock().unwrap_or_else(|e| e.into_inner());
        for ((name, _), proxy) in proxies.iter() {
            if name == family(candidate) {
                if cut {
                    proxy.lose_fins.store(lose_fins, Ordering::SeqCst);
                }
                proxy.cut.send_replace(cut);
            }
        }
    }
}

/// `c3-r2` is a replacement of `c3`.
fn family(candidate: &str) -> &str {
    candidate.split("-r").next().unwrap_or(candidate)
}

/// The `host:port` of a URL (`scheme://user@host:port/db?...`) and where it is in the text.
fn host_port(url: &str) -> Option<(String, usize, usize)> {
    let after_scheme = url.find("://")? + 3;
    let rest = &url[after_scheme..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let host_start = authority.rfind('@').map_or(0, |i| i + 1);
    let host_port = &authority[host_start..];
    host_port.contains(':').then(|| {
        (
            host_port.to_owned(),
            after_scheme + host_start,
            after_scheme + authority_end,
        )
    })
}

async fn serve(
    listener: TcpListener,
    target: SocketAddr,
    cut: watch::Receiver<bool>,
    lose_fins: Arc<AtomicBool>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        let cut = cut.clone();
        let lose_fins = lose_fins.clone();
        tokio::spawn(async move {
            // While cut, a new connection is not even forwarded: its connect hangs.
            let mut wait = cut.clone();
            if wait.wait_for(|c| !*c).await.is_err() {
                return;
            }
            let Ok(server) = TcpStream::connect(target).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            let gone = Arc::new(Gone::default());
            let up = tokio::spawn(upstream(cr, sw, cut.clone(), gone.clone()));
            let down = tokio::spawn(downstream(sr, cw, cut, lose_fins, gone));
            let _ = tokio::join!(up, down);
        });
    }
}

/// A connection whose server side closed during a cut made with `lose_fins`: the candidate's
/// side stays open until the candidate sends.
#[derive(Default)]
struct Gone {
    server: AtomicBool,
    client_sent: Notify,
}

/// Candidate to server: nothing is read while cut (the candidate's data waits in the kernels'
/// buffers, as in a network that drops it and retransmits after the heal).
async fn upstream(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut cut: watch::Receiver<bool>,
    gone: Arc<Gone>,
) {
    // However this ends, the other direction stops waiting for the candidate.
    struct Done(Arc<Gone>);
    impl Drop for Done {
        fn drop(&mut self) {
            self.0.client_sent.notify_one();
        }
    }
    let _done = Done(gone.clone());
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if cut.wait_for(|c| !*c).await.is_err() {
            return;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            // Cut while waiting to read: stop reading (or the harness is gone).
            cutting = cut.wait_for(|c| *c) => match cutting {
                Ok(_) => continue,
                Err(_) => return,
            },
        };
        // Data read just before a cut is held until the heal.
        if cut.wait_for(|c| !*c).await.is_err() {
            return;
        }
        if gone.server.load(Ordering::SeqCst) {
            // Sent to a server that is gone: the answer is a reset (here: a close).
            break;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    gone.client_sent.notify_one();
    let _ = cut.wait_for(|c| !*c).await;
    let _ = to.shutdown().await;
}

/// Server to candidate: read all along, delivered only while healed. A close by the server
/// during a cut made with `lose_fins` is never delivered.
async fn downstream(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut cut: watch::Receiver<bool>,
    lose_fins: Arc<AtomicBool>,
    gone: Arc<Gone>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut held: Vec<u8> = Vec::new();
    loop {
        let deliver = !held.is_empty();
        tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => held.extend_from_slice(&buf[..n]),
            },
            // (a bool: the watch guard must not live across the write below)
            healed = async { cut.wait_for(|c| !*c).await.is_ok() }, if deliver => {
                if !healed {
                    return;
                }
                if to.write_all(&held).await.is_err() {
                    return;
                }
                held.clear();
            }
        }
    }
    let cut_now = *cut.borrow();
    if cut_now && lose_fins.load(Ordering::SeqCst) {
        // Lost with the partition: what the server sent last, and its FIN.
        gone.server.store(true, Ordering::SeqCst);
        gone.client_sent.notified().await;
        return;
    }
    if cut.wait_for(|c| !*c).await.is_err() {
        return;
    }
    let _ = to.write_all(&held).await;
    let _ = to.shutdown().await;
}
