//! The change feed: every tenant's write notifications (`engram_changes`)
//! streamed to the gateways, so each one drops its cached answers for a
//! tenant that changed whichever gateway (or `engram ingest`, or SQL) made
//! the change. One Postgres listener per search-svc process, started by the
//! first subscriber and stopped after the last one leaves; gateways never
//! need database credentials of their own.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use engram_proto as pb;
use futures::Stream;
use parking_lot::Mutex;
use serde::Deserialize;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use crate::writes::CHANNEL;

/// Events buffered per subscriber; a subscriber that falls further behind
/// gets a resync instead of the events it missed.
const BUFFER: usize = 1024;
/// How often an idle listener checks whether anyone still subscribes.
const IDLE_CHECK: Duration = Duration::from_secs(1);

pub type ChangeStream =
    Pin<Box<dyn Stream<Item = Result<pb::ChangeEvent, tonic::Status>> + Send + 'static>>;

/// The notification payload search-svc writes (see `writes.rs`).
#[derive(Deserialize)]
struct Notification {
    tenant: String,
    #[serde(default)]
    op: String,
    #[serde(default)]
    ids: Vec<String>,
    #[serde(default)]
    write: String,
}

fn resync() -> pb::ChangeEvent {
    pb::ChangeEvent {
        resync: true,
        ..Default::default()
    }
}

/// The `op` of the resync sent when the listener lost its connection: until
/// the next plain resync (sent once LISTEN holds again) changes go unheard.
/// Subscribers that only drop state treat it as any resync; the keyword
/// index also stops trusting itself until then (`keyword_index.rs`).
pub const DISCONNECTED: &str = "disconnected";

fn disconnected() -> pb::ChangeEvent {
    pb::ChangeEvent {
        resync: true,
        op: DISCONNECTED.into(),
        ..Default::default()
    }
}

/// Shared by every handler clone of the service.
#[derive(Debug)]
pub struct Feed {
    pool: PgPool,
    sender: Arc<Mutex<Option<broadcast::Sender<pb::ChangeEvent>>>>,
    /// The Postgres listener is listening: a new subscriber may start from
    /// a resync of its own. Before that, the listener's own resync (sent
    /// once LISTEN holds) is the first thing every subscriber hears, so no
    /// change between subscribing and listening goes unannounced.
    listening: Arc<AtomicBool>,
    stop: CancellationToken,
}

impl Feed {
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            sender: Arc::default(),
            listening: Arc::default(),
            stop: CancellationToken::new(),
        }
    }

    /// Cancelled when the server shuts down: streams end, the listener too,
    /// so a gateway's open stream never holds up a drain.
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    fn subscribe(&self) -> broadcast::Receiver<pb::ChangeEvent> {
        let mut sender = self.sender.lock();
        if let Some(tx) = sender.as_ref().filter(|tx| tx.receiver_count() > 0) {
            return tx.subscribe();
        }
        let (tx, rx) = broadcast::channel(BUFFER);
        self.listening.store(false, Ordering::SeqCst);
        let listening = self.listening.clone();
        tokio::spawn(listen(
            self.pool.clone(),
            tx.clone(),
            listening,
            self.stop.clone(),
        ));
        *sender = Some(tx);
        rx
    }

    /// One subscriber's stream: a resync first (it knows nothing yet; sent
    /// by the listener once it listens), then each change; a resync again
    /// whenever it fell behind.
    pub fn stream(&self) -> ChangeStream {
        let rx = self.subscribe();
        let stop = self.stop.clone();
        let already = self.listening.load(Ordering::SeqCst);
        let first = futures::stream::iter(already.then(|| Ok(resync())));
        let rest = futures::stream::unfold((rx, stop), |(mut rx, stop)| async move {
            let event = tokio::select! {
                _ = stop.cancelled() => return None,
                r = rx.recv() => match r {
                    Ok(event) => event,
                    Err(RecvError::Lagged(_)) => resync(),
                    Err(RecvError::Closed) => return None,
                },
            };
            Some((Ok(event), (rx, stop)))
        });
        Box::pin(futures::StreamExt::chain(first, rest))
    }
}

/// Forwards notifications while anyone subscribes; reconnects with a pause
/// and sends a resync after each (re)connection, since notifications sent
/// while it was not listening are gone.
async fn listen(
    pool: PgPool,
    tx: broadcast::Sender<pb::ChangeEvent>,
    listening: Arc<AtomicBool>,
    stop: CancellationToken,
) {
    while tx.receiver_count() > 0 && !stop.is_cancelled() {
        match connect(&pool).await {
            Ok(mut listener) => {
                listening.store(true, Ordering::SeqCst);
                let _ = tx.send(resync());
                if forward(&mut listener, &tx, &stop).await {
                    return;
                }
                listening.store(false, Ordering::SeqCst);
            }
            Err(e) => {
                tracing::warn!(error = %e, "change feed cannot listen");
                let _ = tx.send(disconnected());
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(IDLE_CHECK) => {}
        }
    }
}

async fn connect(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

/// Relays until the connection fails (false) or the feed is done (true).
async fn forward(
    listener: &mut PgListener,
    tx: &broadcast::Sender<pb::ChangeEvent>,
    stop: &CancellationToken,
) -> bool {
    loop {
        // One receive kept across the idle checks: dropping it part-way
        // could drop a reconnect sqlx had begun, and the next receive would
        // then reconnect and LISTEN again without the `Ok(None)` that makes
        // this send a resync, so changes in between would go unannounced.
        let recv = listener.try_recv();
        tokio::pin!(recv);
        let received = loop {
            tokio::select! {
                _ = stop.cancelled() => return true,
                _ = tokio::time::sleep(IDLE_CHECK) => {
                    if tx.receiver_count() == 0 {
                        return true;
                    }
                }
                r = &mut recv => break r,
            }
        };
        let event = match received {
            Ok(Some(n)) => match serde_json::from_str::<Notification>(n.payload()) {
                Ok(c) if !c.tenant.is_empty() => pb::ChangeEvent {
                    tenant: c.tenant,
                    op: c.op,
                    resync: false,
                    ids: c.ids,
                    write_id: c.write,
                },
                _ => {
                    tracing::warn!(bytes = n.payload().len(), "unparsable change notification");
                    continue;
                }
            },
            // sqlx reconnected by itself: notifications may have been lost.
            Ok(None) => resync(),
            Err(e) => {
                tracing::warn!(error = %e, "change feed connection failed");
                let _ = tx.send(disconnected());
                return false;
            }
        };
        if tx.send(event).is_err() {
            return true;
        }
    }
}
