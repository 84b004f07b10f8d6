//! A delaying TCP proxy for the slow-not-dead scenario: every chunk the
//! downstream sends back waits `delay` before it is forwarded, so the
//! service stays up and healthy on its own port while the gateway sees it
//! answer late. The delay is read per chunk, so it applies to connections
//! already open (the gateway keeps one HTTP/2 connection per downstream).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct DelayProxy {
    pub addr: SocketAddr,
    delay_ms: Arc<AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
}

impl DelayProxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let delay_ms = Arc::new(AtomicU64::new(0));
        let delay = delay_ms.clone();
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let delay = delay.clone();
                tokio::spawn(async move {
                    if let Ok(outbound) = TcpStream::connect(upstream).await {
                        let _ = inbound.set_nodelay(true);
                        let _ = outbound.set_nodelay(true);
                        relay(inbound, outbound, delay).await;
                    }
                });
            }
        });
        Ok(Self {
            addr,
            delay_ms,
            accept,
        })
    }

    pub fn set_delay(&self, d: Duration) {
        self.delay_ms.store(d.as_millis() as u64, Ordering::Relaxed);
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Requests pass straight through; answers wait the current delay.
async fn relay(inbound: TcpStream, outbound: TcpStream, delay: Arc<AtomicU64>) {
    let (mut in_r, mut in_w) = inbound.into_split();
    let (mut out_r, mut out_w) = outbound.into_split();
    let up = async move {
        let _ = tokio::io::copy(&mut in_r, &mut out_w).await;
        let _ = out_w.shutdown().await;
    };
    let down = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match out_r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let ms = delay.load(Ordering::Relaxed);
            if ms > 0 {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            if in_w.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = in_w.shutdown().await;
    };
    tokio::join!(up, down);
}
