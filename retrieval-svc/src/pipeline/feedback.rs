//! Stage 6 feedback: accepted on the hot path into a bounded queue, stored
//! by a background task. A full queue drops the batch (counted) rather than
//! slow the caller: feedback is advisory.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use engram_common::Identity;
use engram_proto::{StoreFeedbackRequest, StoredFeedback};
use tokio::sync::mpsc;

use crate::downstream::{Downstreams, call};

pub const QUEUE_CAPACITY: usize = 1024;

type Batch = (Arc<Identity>, Vec<StoredFeedback>);

#[derive(Clone)]
pub struct FeedbackQueue {
    tx: mpsc::Sender<Batch>,
    /// Batches dropped because the queue was full or the store failed.
    pub dropped: Arc<AtomicU64>,
}

impl FeedbackQueue {
    /// Spawns the writer; it ends when every queue handle is dropped.
    pub fn spawn(ds: Downstreams, capacity: usize) -> Self {
        let (tx, mut rx) = mpsc::channel::<Batch>(capacity.max(1));
        let dropped = Arc::new(AtomicU64::new(0));
        let counter = dropped.clone();
        tokio::spawn(async move {
            while let Some((identity, items)) = rx.recv().await {
                let n = items.len();
                match call(
                    &ds.store_feedback,
                    &identity,
                    StoreFeedbackRequest { items },
                )
                .await
                {
                    Ok(r) => {
                        tracing::debug!(tenant = %identity.tenant, stored = r.stored, "feedback stored")
                    }
                    Err(e) => {
                        counter.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(tenant = %identity.tenant, items = n, error = %e, "feedback lost");
                    }
                }
            }
        });
        Self { tx, dropped }
    }

    /// Never waits; false when the batch was dropped.
    pub fn submit(&self, identity: Arc<Identity>, items: Vec<StoredFeedback>) -> bool {
        match self.tx.try_send((identity, items)) {
            Ok(()) => true,
            Err(_) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }
}
