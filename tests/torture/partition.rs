//! Network partitions: a TCP proxy per candidate, in this (the harness's) process, between the
//! candidate and its database server. Cut, it stops reading and writing both of its sockets
//! without closing either, so neither side sees a FIN or an RST: what a pulled cable, a changed
//! security group or a frozen VM looks like (the kernels still acknowledge what fits in their
//! buffers). Healed, it forwards again, what was held back included; a connection the server
//! closed meanwhile then closes at the candidate too.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::Error;

/// One proxy: where candidates connect, and its switch.
struct Proxy {
    port: u16,
    cut: watch::Sender<bool>,
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
                let target: SocketAddr = target
                    .parse()
                    .map_err(|e| Error::from(format!("proxy target {target}: {e}")))?;
                tokio::spawn(serve(TcpListener::from_std(listener)?, target, rx));
                proxies.insert(key, Proxy { port, cut });
                port
            }
        };
        Ok(format!("{}127.0.0.1:{port}{}", &url[..start], &url[end..]))
    }

    /// Cuts (`true`) or heals (`false`) every connection of `candidate` to every server.
    pub fn set(&self, candidate: &str, cut: bool) {
        let proxies = self.proxies.lock().unwrap_or_else(|e| e.into_inner());
        for ((name, _), proxy) in proxies.iter() {
            if name == family(candidate) {
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

async fn serve(listener: TcpListener, target: SocketAddr, cut: watch::Receiver<bool>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        let cut = cut.clone();
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
            let up = tokio::spawn(pipe(cr, sw, cut.clone()));
            let down = tokio::spawn(pipe(sr, cw, cut));
            let _ = tokio::join!(up, down);
        });
    }
}

/// Copies `from` to `to`, holding everything (reads included) while cut.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut cut: watch::Receiver<bool>,
) {
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
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    // The other side closed: once healed, close this one too.
    let _ = cut.wait_for(|c| !*c).await;
    let _ = to.shutdown().await;
}
