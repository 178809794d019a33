//! A loopback TCP proxy in front of a Redis server that can hold what clients send (feature `aio`).
//!
//! It injects the fault a frozen process leaves behind: a command that passed every check in the client and
//! was on its way when the process froze reaches Redis only later, after the world moved on. While held,
//! the proxy reads what clients send and keeps it (the clients see nothing unusual); replies still flow back.
//! [`HoldProxy::release`] forwards everything held, in order.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A proxy to one server; dropping it stops accepting (open connections live on until either side closes).
#[derive(Debug)]
pub struct HoldProxy {
    addr: SocketAddr,
    holding: watch::Sender<bool>,
    held: Arc<Mutex<Vec<u8>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl HoldProxy {
    /// A proxy on a free loopback port, forwarding to `upstream`.
    ///
    /// # Panics
    /// If no loopback port can be bound.
    pub async fn start(upstream: SocketAddr) -> HoldProxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind a loopback port for the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let holding = watch::Sender::new(false);
        let held = Arc::new(Mutex::new(Vec::new()));
        let (rx, log) = (holding.subscribe(), held.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, mut to_server) = server.into_split();
                let (chunks, mut queue) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
                let (mut rx, log) = (rx.clone(), log.clone());
                let mut gate = rx.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match from_client.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if *rx.borrow_and_update() {
                            log.lock().expect("held log").extend_from_slice(&buf[..n]);
                        }
                        if chunks.send(buf[..n].to_vec()).is_err() {
                            break;
                        }
                    }
                });
                tokio::spawn(async move {
                    while let Some(chunk) = queue.recv().await {
                        if gate.wait_for(|holding| !holding).await.is_err()
                            || to_server.write_all(&chunk).await.is_err()
                        {
                            break;
                        }
                    }
                    let _ = to_server.shutdown().await;
                });
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
                    let _ = to_client.shutdown().await;
                });
            }
        });
        HoldProxy {
            addr,
            holding,
            held,
            accept,
        }
    }

    /// `redis://127.0.0.1:<port>` of the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// From now on, keep what clients send instead of forwarding it.
    pub fn hold(&self) {
        self.held.lock().expect("held log").clear();
        self.holding.send_replace(true);
    }

    /// What clients sent since [`hold`](Self::hold), as text (RESP is mostly ASCII).
    pub fn held(&self) -> String {
        String::from_utf8_lossy(&self.held.lock().expect("held log")).into_owned()
    }

    /// Forward everything held, in order, and everything sent from now on.
    pub fn release(&self) {
        self.holding.send_replace(false);
    }
}

impl Drop for HoldProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}
