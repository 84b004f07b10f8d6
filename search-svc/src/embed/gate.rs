//! The embed gate: write-path embedding runs chunk by chunk, and each
//! chunk needs one of a few shared slots (`search.embed_batch_slots`). One
//! tenant holds at most half of them, rounded up, counting the chunks it
//! has queued for a slot as well as those running: another tenant's chunk
//! then waits behind at most that many of the first tenant's chunks,
//! whatever it sends (issue 47: one tenant's 300-memory batches had every
//! tenant's embedding queued behind them). Single-text query embeddings
//! never pass the gate (embed.rs).
//!
//! tokio's semaphore is FIFO over everyone, so the per-tenant bound is a
//! second, per-tenant semaphore taken first; no crate in the workspace
//! offers keyed concurrency limits (governor limits rates).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{Error, Result};

#[derive(Debug)]
pub struct EmbedGate {
    slots: Arc<Semaphore>,
    per_tenant: usize,
    /// Per-tenant semaphores, dropped once nobody holds or awaits them.
    tenants: Mutex<HashMap<String, Arc<Semaphore>>>,
}

/// One chunk's slot. The shared slot is released first (fields drop in
/// order): it goes to the oldest chunk waiting for one, another tenant's,
/// before this tenant's next chunk may line up.
#[derive(Debug)]
pub struct ChunkPermit {
    _slot: OwnedSemaphorePermit,
    _own: OwnedSemaphorePermit,
}

impl EmbedGate {
    /// `slots` chunks at once (at least one); a tenant at most half of
    /// them, rounded up.
    pub fn new(slots: usize) -> Self {
        let slots = slots.max(1);
        Self {
            slots: Arc::new(Semaphore::new(slots)),
            per_tenant: slots.div_ceil(2),
            tenants: Mutex::default(),
        }
    }

    pub fn per_tenant(&self) -> usize {
        self.per_tenant
    }

    /// Shared slots free now.
    pub fn available(&self) -> usize {
        self.slots.available_permits()
    }

    /// A slot for one chunk of `tenant`: first one of its own share, then
    /// a shared slot, each in arrival order. Cancel-safe.
    pub async fn acquire(&self, tenant: &str) -> Result<ChunkPermit> {
        let own = self.tenant(tenant).acquire_owned().await.map_err(closed)?;
        let slot = (self.slots.clone()).acquire_owned().await.map_err(closed)?;
        Ok(ChunkPermit {
            _slot: slot,
            _own: own,
        })
    }

    /// The tenant's semaphore; entries nobody holds or awaits are dropped
    /// on the way, so the table only holds tenants embedding now.
    fn tenant(&self, tenant: &str) -> Arc<Semaphore> {
        let mut map = self.tenants.lock();
        map.retain(|_, s| Arc::strong_count(s) > 1);
        let per_tenant = self.per_tenant;
        (map.entry(tenant.to_string()))
            .or_insert_with(|| Arc::new(Semaphore::new(per_tenant)))
            .clone()
    }
}

fn closed(_: tokio::sync::AcquireError) -> Error {
    Error::Internal("the embed gate is closed".into())
}

#[cfg(test)]
mod tests {
    use futures::FutureExt as _;

    use super::*;

    fn now(g: &EmbedGate, tenant: &str) -> ChunkPermit {
        (g.acquire(tenant).now_or_never())
            .expect("no wait")
            .expect("gate open")
    }

    #[test]
    fn a_tenant_holds_at_most_half_the_slots() {
        assert_eq!(EmbedGate::new(0).per_tenant(), 1);
        assert_eq!(EmbedGate::new(1).per_tenant(), 1);
        assert_eq!(EmbedGate::new(2).per_tenant(), 1);
        assert_eq!(EmbedGate::new(3).per_tenant(), 2);
        assert_eq!(EmbedGate::new(4).per_tenant(), 2);
    }

    #[test]
    fn a_tenant_at_its_share_waits_and_another_starts_at_once() {
        let g = EmbedGate::new(4);
        let a1 = now(&g, "a");
        let _a2 = now(&g, "a");
        let mut a3 = Box::pin(g.acquire("a"));
        assert!(a3.as_mut().now_or_never().is_none(), "a is at its share");
        let _b1 = now(&g, "b");
        assert_eq!(g.available(), 1, "a's waiting chunk holds no slot");
        drop(a1);
        assert!(a3.now_or_never().is_some(), "a's own chunk ended");
    }

    #[test]
    fn a_freed_slot_goes_to_the_other_tenant_first() {
        let g = EmbedGate::new(1);
        let a1 = now(&g, "a");
        let mut a2 = Box::pin(g.acquire("a"));
        assert!(a2.as_mut().now_or_never().is_none());
        let mut b1 = Box::pin(g.acquire("b"));
        assert!(b1.as_mut().now_or_never().is_none());
        drop(a1);
        let b = b1.now_or_never().expect("b's chunk is next");
        assert!(a2.as_mut().now_or_never().is_none(), "a waits behind b");
        drop(b);
        assert!(a2.now_or_never().is_some());
    }

    #[test]
    fn idle_tenants_leave_the_table() {
        let g = EmbedGate::new(2);
        drop(now(&g, "a"));
        let _b = now(&g, "b");
        assert_eq!(g.tenants.lock().len(), 1, "only b embeds now");
    }
}
