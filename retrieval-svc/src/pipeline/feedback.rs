//! Stage 6: feedback. Validated at the boundary ([`Feedback::try_from`]),
//! accepted on the hot path into a bounded queue, stored by a background
//! task. A full queue drops the batch (counted) rather than slow the caller:
//! feedback is advisory. One tenant holds at most half of the queue, so its
//! flood cannot make another tenant's feedback drop (issue 47, item 9).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use engram_common::Identity;
use engram_proto::{
    FeedbackRequest, FeedbackSignal, RankExample, StoreFeedbackRequest, StoredFeedback,
};
use tokio::sync::mpsc;

use crate::downstream::{Downstreams, call};
use crate::error::Error;
use crate::receipt::{MAX_QUERY_ID_CHARS, answer_id};

pub const QUEUE_CAPACITY: usize = 1024;
const MAX_FEEDBACK_ITEMS: usize = 1000;

/// A `FeedbackRequest` that passed boundary validation: the query id as
/// sent (a receipt, receipt.rs) and the items, which carry only its answer
/// id (what search-svc stores).
#[derive(Debug)]
pub struct Feedback(String, Vec<StoredFeedback>);

impl TryFrom<FeedbackRequest> for Feedback {
    type Error = Error;

    fn try_from(r: FeedbackRequest) -> Result<Self, Error> {
        let FeedbackRequest { query_id, items } = r;
        if query_id.is_empty() || query_id.len() > MAX_QUERY_ID_CHARS {
            return Err(Error::invalid(
                "query_id",
                format!("must be 1..={MAX_QUERY_ID_CHARS} characters"),
            ));
        }
        let answer = answer_id(&query_id);
        if answer.is_empty() || answer.len() > 64 {
            return Err(Error::invalid(
                "query_id",
                "its answer id (before '~') must be 1..=64 characters",
            ));
        }
        if items.is_empty() || items.len() > MAX_FEEDBACK_ITEMS {
            return Err(Error::invalid(
                "items",
                format!("must hold 1..={MAX_FEEDBACK_ITEMS} items"),
            ));
        }
        let mut stored = Vec::with_capacity(items.len());
        for item in items {
            let signal = match FeedbackSignal::try_from(item.signal) {
                Ok(FeedbackSignal::Used) => "used",
                Ok(FeedbackSignal::Helpful) => "helpful",
                Ok(FeedbackSignal::Sufficient) => "sufficient",
                _ => {
                    return Err(Error::invalid(
                        "items.signal",
                        "must be used, helpful or sufficient",
                    ));
                }
            };
            // Memory ids are UUIDs (search-svc refuses anything else): a
            // batch with one other id would be accepted here and then lost
            // whole in the background store.
            if uuid::Uuid::parse_str(&item.memory_id).is_err() {
                return Err(Error::invalid("items.memory_id", "must be a UUID"));
            }
            stored.push(StoredFeedback {
                query_id: answer.to_string(),
                memory_id: item.memory_id,
                signal: signal.into(),
                value: item.value,
            });
        }
        Ok(Self(query_id, stored))
    }
}

impl Feedback {
    pub fn len(&self) -> u32 {
        self.1.len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.1.is_empty()
    }

    /// The query id as the caller sent it (a receipt, receipt.rs).
    pub fn query_id(&self) -> &str {
        &self.0
    }

    /// Every memory the items name.
    pub fn memory_ids(&self) -> impl Iterator<Item = &str> {
        self.1.iter().map(|f| f.memory_id.as_str())
    }

    /// Memories marked used or helpful.
    pub fn useful_ids(&self) -> std::collections::HashSet<&str> {
        (self.1.iter())
            .filter(|f| f.value && matches!(f.signal.as_str(), "used" | "helpful"))
            .map(|f| f.memory_id.as_str())
            .collect()
    }

    /// (signal, value) per item, for the feedback metrics.
    pub fn signals(&self) -> Vec<(&'static str, bool)> {
        self.1
            .iter()
            .map(|f| match f.signal.as_str() {
                "used" => ("used", f.value),
                "helpful" => ("helpful", f.value),
                _ => ("sufficient", f.value),
            })
            .collect()
    }

    pub fn into_items(self) -> Vec<StoredFeedback> {
        self.1
    }
}

type Batch = (Arc<Identity>, Vec<StoredFeedback>, Vec<RankExample>);

/// Batches each tenant has waiting in the queue, and how many one may.
#[derive(Debug)]
struct Shares {
    queued: Mutex<HashMap<String, usize>>,
    share: usize,
}

impl Shares {
    /// At most half of `capacity` (at least one) per tenant.
    fn new(capacity: usize) -> Self {
        Self {
            queued: Mutex::new(HashMap::new()),
            share: (capacity / 2).max(1),
        }
    }

    /// Takes a place for one of `tenant`'s batches; false at its share.
    fn take(&self, tenant: &str) -> bool {
        let mut queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        let n = queued.entry(tenant.to_string()).or_insert(0);
        if *n >= self.share {
            return false;
        }
        *n += 1;
        true
    }

    /// Gives back a place (the batch was stored, or never queued).
    fn give_back(&self, tenant: &str) {
        let mut queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = queued.get_mut(tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                queued.remove(tenant);
            }
        }
    }
}

/// What became of a submitted batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submitted {
    Queued,
    /// The queue was full: dropped and counted (feedback is advisory).
    Dropped,
    /// The caller's tenant already holds its share of the queue.
    OverShare,
}

#[derive(Clone)]
pub struct FeedbackQueue {
    tx: mpsc::Sender<Batch>,
    /// Batches dropped because the queue was full or the store failed.
    dropped: Arc<AtomicU64>,
    shares: Arc<Shares>,
}

impl FeedbackQueue {
    /// Spawns the writer; it ends when every queue handle is dropped.
    pub fn spawn(ds: Downstreams, capacity: usize) -> Self {
        let (tx, mut rx) = mpsc::channel::<Batch>(capacity.max(1));
        let dropped = Arc::new(AtomicU64::new(0));
        let counter = dropped.clone();
        let shares = Arc::new(Shares::new(capacity));
        let taken = shares.clone();
        tokio::spawn(async move {
            while let Some((identity, items, examples)) = rx.recv().await {
                taken.give_back(&identity.tenant);
                let n = items.len();
                match call(
                    &ds.store_feedback,
                    &identity,
                    StoreFeedbackRequest { items, examples },
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
        Self {
            tx,
            dropped,
            shares,
        }
    }

    /// Batches dropped since start.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Never waits.
    pub fn submit(
        &self,
        identity: Arc<Identity>,
        items: Vec<StoredFeedback>,
        examples: Vec<RankExample>,
    ) -> Submitted {
        let tenant = identity.tenant.clone();
        if !self.shares.take(&tenant) {
            return Submitted::OverShare;
        }
        match self.tx.try_send((identity, items, examples)) {
            Ok(()) => Submitted::Queued,
            Err(_) => {
                self.shares.give_back(&tenant);
                self.dropped.fetch_add(1, Ordering::Relaxed);
                Submitted::Dropped
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use engram_proto::FeedbackItem;

    use super::*;

    fn request(memory_id: &str) -> FeedbackRequest {
        FeedbackRequest {
            query_id: "q-1".into(),
            items: vec![FeedbackItem {
                memory_id: memory_id.into(),
                signal: FeedbackSignal::Helpful as i32,
                value: true,
            }],
        }
    }

    #[test]
    fn a_tenant_holds_at_most_half_the_queue() {
        let shares = Shares::new(4);
        assert!(shares.take("a") && shares.take("a"));
        assert!(!shares.take("a"), "a is at its half");
        assert!(shares.take("b") && shares.take("b"), "b still finds room");
        shares.give_back("a");
        assert!(shares.take("a"), "a stored one, so it may queue one");
        for _ in 0..3 {
            shares.give_back("b");
        }
        assert!(shares.take("b"), "giving back more than taken is harmless");
        assert!(Shares::new(1).take("a"), "a queue of one still takes one");
    }

    #[test]
    fn memory_ids_must_be_uuids() {
        for bad in [
            "",
            "g1",
            "not-a-uuid",
            "00000000-0000-0000-0000-00000000000g",
        ] {
            match Feedback::try_from(request(bad)) {
                Err(Error::InvalidArgument { field, rule }) => {
                    assert_eq!(field, "items.memory_id", "{bad:?}");
                    assert!(rule.contains("UUID"), "{bad:?}: {rule}");
                }
                other => panic!("{bad:?}: expected invalid argument, got {other:?}"),
            }
        }
        let ok = Feedback::try_from(request("6f1c2b1e-8a6b-4c1e-9d7a-2f0e5b3c4d11"));
        assert_eq!(ok.map(|f| f.len()).ok(), Some(1));
    }
}
