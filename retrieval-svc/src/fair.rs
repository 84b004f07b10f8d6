//! Fair shares of the gateway's work slots among the tenants that are
//! active now. Admission (admission.rs) caps each tenant's rate and
//! requests in flight, but those caps are absolute: one tenant within them
//! can still keep every core busy, and on a small host another tenant's
//! requests then wait for CPU behind it (the noisy-neighbour scenario of
//! `engram soak`: B's p95 rose 11× under A's flood with no error).
//!
//! So every pipeline run takes a slot, and while several tenants are
//! active (a request in the last window), each may hold at most its share:
//! the slots (one per core by default) divided by the active tenants. Two
//! get half each, whatever either sends. In `engram soak` (2 cores) B's p95
//! under attack was 1.8–2.4× solo with one slot per core and 2.6–3.1× with
//! two (no slots: 13.6×); a well-behaved neighbour running one query at a
//! time already costs B 1.6×, so a share below one run is what the rest
//! would take. A deployment whose runs mostly wait on I/O (a remote
//! Postgres) raises `tenant.work_slots`, or its cores idle while two
//! tenants wait on the network. The share is *not*
//! work-conserving on purpose: a slot left idle for a quiet tenant is what
//! lets its next request start at once instead of waiting for a hostile
//! tenant's slow one to finish. A tenant alone may run twice the slots at
//! once (see [`share`]). When a slot frees, it goes to a waiting tenant under its
//! share, the one holding the fewest first, oldest waiter first.
//!
//! No crate offers this (tower's concurrency limit and tokio's semaphore
//! are FIFO over everyone; governor limits rates, not work in flight), so
//! it is a small mutex-guarded table. A leaf: no gateway types.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use engram_common::settings::TenantLimitSettings;
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::error::Error;

/// Retry hint for a request that could not get a slot in time.
const BUSY_RETRY_MS: u64 = 200;

/// How many slots, and how long a tenant counts as active.
#[derive(Debug, Clone, Copy)]
pub struct FairConfig {
    pub slots: u32,
    /// Runs a tenant alone may have at once.
    pub alone: u32,
    pub active_window: Duration,
    pub max_wait: Duration,
}

impl FairConfig {
    pub fn from_settings(s: &TenantLimitSettings) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let auto = u32::try_from(cores).unwrap_or(u32::MAX);
        let slots = match s.work_slots {
            0 => auto,
            n => n,
        };
        Self {
            slots,
            alone: match s.alone_work_slots {
                0 => slots.saturating_mul(2),
                n => n,
            },
            active_window: Duration::from_millis(s.active_window_ms),
            max_wait: Duration::from_millis(s.slot_wait_ms),
        }
    }
}

pub struct FairGate {
    cfg: FairConfig,
    state: Arc<Mutex<State>>,
    /// What a refused caller is told it ran out of.
    what: &'static str,
}

#[derive(Default)]
struct State {
    tenants: HashMap<String, TenantState>,
    next_seq: u64,
}

struct TenantState {
    running: u32,
    last_seen: Instant,
    waiters: VecDeque<Waiter>,
}

struct Waiter {
    seq: u64,
    tx: oneshot::Sender<Slot>,
}

/// One work slot, held for the run; dropping it hands it on.
pub struct Slot {
    state: Arc<Mutex<State>>,
    tenant: String,
    cfg: FairConfig,
    /// False only for a slot that never reached its waiter.
    counted: bool,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("tenant", &self.tenant)
            .finish()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.counted {
            return;
        }
        let mut st = self.state.lock();
        if let Some(t) = st.tenants.get_mut(&self.tenant) {
            t.running = t.running.saturating_sub(1);
        }
        dispatch(&self.state, &mut st, &self.cfg);
    }
}

impl FairGate {
    pub fn new(cfg: FairConfig) -> Self {
        Self {
            cfg: FairConfig {
                slots: cfg.slots.max(1),
                alone: cfg.alone.max(1),
                ..cfg
            },
            state: Arc::default(),
            what: "work slots (the gateway is busy)",
        }
    }

    /// The gate with `what` named in its refusals.
    pub fn named(self, what: &'static str) -> Self {
        Self { what, ..self }
    }

    /// A slot for one run of `tenant`, waiting at most until the earlier of
    /// `deadline` and the configured wait; RESOURCE_EXHAUSTED after that.
    pub async fn acquire(&self, tenant: &str, deadline: Instant) -> Result<Slot, Error> {
        let rx = {
            let mut st = self.state.lock();
            let now = Instant::now();
            forget_idle(&mut st, now, self.cfg.active_window);
            let seq = st.next_seq;
            st.next_seq += 1;
            let t = st.tenants.entry(tenant.to_string()).or_insert(TenantState {
                running: 0,
                last_seen: now,
                waiters: VecDeque::new(),
            });
            t.last_seen = now;
            let (tx, rx) = oneshot::channel();
            t.waiters.push_back(Waiter { seq, tx });
            dispatch(&self.state, &mut st, &self.cfg);
            rx
        };
        let until = deadline.min(Instant::now() + self.cfg.max_wait);
        match tokio::time::timeout_at(until, rx).await {
            Ok(Ok(slot)) => Ok(slot),
            // Timed out (or the gate is gone): the waiter's sender is
            // dropped with it, and `dispatch` skips closed senders.
            _ => Err(Error::TenantLimit {
                what: self.what,
                retry_after_ms: BUSY_RETRY_MS,
            }),
        }
    }
}

/// The most slots one tenant may hold while `active` tenants share them.
/// A tenant alone has nobody to protect, but more runs than the cores can
/// serve only make each one slower and the slowest slower still: alone it
/// may run `alone` at once (`tenant.alone_work_slots`, by default twice
/// the slots, so runs that wait on Postgres or graph-svc still leave no
/// core idle), and the rest wait their turn in order. Runs waiting on the
/// cross-encoder hold no work slot (pipeline/ctx.rs, `Gates`). Measured in
/// docs/benchmarks.md ("Half-precision HNSW").
fn share(cfg: &FairConfig, active: usize) -> u32 {
    match u32::try_from(active) {
        Ok(0 | 1) => cfg.alone,
        Ok(n) => (cfg.slots / n).max(1).min(cfg.alone),
        Err(_) => 1,
    }
}

/// Tenants with nothing running or waiting and not seen within the window
/// leave the table (and the share count).
fn forget_idle(st: &mut State, now: Instant, window: Duration) {
    st.tenants.retain(|_, t| {
        t.running > 0 || !t.waiters.is_empty() || now.duration_since(t.last_seen) < window
    });
}

/// Hands slots to waiters of tenants under their share: the tenant
/// holding the fewest first, its oldest waiter first.
fn dispatch(state: &Arc<Mutex<State>>, st: &mut State, cfg: &FairConfig) {
    loop {
        let cap = share(cfg, st.tenants.len());
        let next_opt = (st.tenants.iter_mut())
            .filter(|(_, t)| t.running < cap)
            .filter_map(|(name, t)| {
                // Waiters that gave up are dropped on the way.
                while t.waiters.front().is_some_and(|w| w.tx.is_closed()) {
                    t.waiters.pop_front();
                }
                let seq = t.waiters.front()?.seq;
                Some((t.running, seq, name.clone()))
            })
            .min();
        let Some((_, _, name)) = next_opt else { return };
        let Some(t) = st.tenants.get_mut(&name) else {
            return;
        };
        let Some(w) = t.waiters.pop_front() else {
            return;
        };
        let slot = Slot {
            state: state.clone(),
            tenant: name,
            cfg: *cfg,
            counted: true,
        };
        t.running += 1;
        if let Err(mut returned) = w.tx.send(slot) {
            // The waiter left between the check and the send. Its drop
            // must not lock the state we hold: undo the count here.
            returned.counted = false;
            if let Some(t) = st.tenants.get_mut(&returned.tenant) {
                t.running -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(slots: u32) -> FairGate {
        // Alone unheld, so each test shows the shares it is about.
        FairGate::new(FairConfig {
            slots,
            alone: u32::MAX,
            active_window: Duration::from_secs(1),
            max_wait: Duration::from_secs(1),
        })
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(3)
    }

    fn running(g: &FairGate, tenant: &str) -> u32 {
        g.state.lock().tenants.get(tenant).map_or(0, |t| t.running)
    }

    async fn hold(g: &FairGate, tenant: &str, n: usize) -> Vec<Slot> {
        let mut held = Vec::new();
        for _ in 0..n {
            held.push(g.acquire(tenant, soon()).await.expect("within its share"));
        }
        held
    }

    #[test]
    fn zero_slots_means_one_per_core() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let auto = FairConfig::from_settings(&TenantLimitSettings::default());
        assert_eq!(auto.slots as usize, cores);
        let set = FairConfig::from_settings(&TenantLimitSettings {
            work_slots: 7,
            ..TenantLimitSettings::default()
        });
        assert_eq!(set.slots, 7);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_tenant_is_held_only_by_its_own_cap() {
        let g = gate(2);
        let _held = hold(&g, "a", 6).await;
        assert_eq!(running(&g, "a"), 6);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_tenant_over_its_alone_cap_waits_for_a_run_to_end() {
        let g = FairGate::new(FairConfig {
            alone: 2,
            ..gate(8).cfg
        });
        let mut held = hold(&g, "a", 2).await;
        let third = g.acquire("a", soon());
        tokio::pin!(third);
        assert!(
            tokio::time::timeout(Duration::from_millis(10), &mut third)
                .await
                .is_err(),
            "the third run waits"
        );
        held.pop();
        let slot = third.await.expect("a run ended, so the waiter starts");
        assert_eq!(running(&g, "a"), 2);
        drop(slot);
    }

    #[test]
    fn a_lone_tenant_may_run_twice_the_slots_unless_set() {
        let auto = FairConfig::from_settings(&TenantLimitSettings {
            work_slots: 3,
            ..TenantLimitSettings::default()
        });
        assert_eq!(auto.alone, 6);
        let set = FairConfig::from_settings(&TenantLimitSettings {
            alone_work_slots: 5,
            ..TenantLimitSettings::default()
        });
        assert_eq!(set.alone, 5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_share_never_exceeds_what_a_tenant_alone_may_run() {
        let g = FairGate::new(FairConfig {
            alone: 2,
            ..gate(8).cfg
        });
        drop(hold(&g, "b", 1).await);
        let _a_held = hold(&g, "a", 2).await;
        let a_third = g.acquire("a", soon()).await;
        assert!(
            matches!(a_third, Err(Error::TenantLimit { .. })),
            "half of 8 slots is 4, but a is never given more than alone"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_tenant_finds_its_half_free() {
        let g = gate(4);
        drop(hold(&g, "b", 1).await);
        // A floods while B is active: it is held to half of the slots.
        let _a_held = hold(&g, "a", 2).await;
        let a_third = g.acquire("a", soon()).await;
        assert!(
            matches!(a_third, Err(Error::TenantLimit { .. })),
            "over its share, a waits, then is refused"
        );
        let started = Instant::now();
        let _b_now = hold(&g, "b", 2).await;
        assert_eq!(started.elapsed(), Duration::ZERO, "b never waits for a");
        assert_eq!((running(&g, "a"), running(&g, "b")), (2, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_freed_slot_goes_to_its_tenants_oldest_waiter() {
        let g = Arc::new(gate(2));
        drop(hold(&g, "b", 1).await);
        let a1 = hold(&g, "a", 1).await;
        let mut waits = Vec::new();
        for n in 0..2 {
            let g = g.clone();
            waits.push(tokio::spawn(async move {
                g.acquire("a", soon()).await.map(|_| n)
            }));
            tokio::task::yield_now().await;
        }
        drop(a1);
        let first = waits.remove(0).await.expect("joined").expect("the oldest");
        assert_eq!(first, 0);
        let second = waits
            .remove(0)
            .await
            .expect("joined")
            .expect("then the next");
        assert_eq!(second, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_abandoned_wait_hands_its_slot_on() {
        let g = Arc::new(gate(2));
        drop(hold(&g, "b", 1).await);
        let held = hold(&g, "a", 1).await;
        let gone = tokio::time::timeout(Duration::from_millis(10), g.acquire("a", soon())).await;
        assert!(gone.is_err());
        let next = tokio::spawn({
            let g = g.clone();
            async move { g.acquire("a", soon()).await.is_ok() }
        });
        tokio::task::yield_now().await;
        drop(held);
        assert!(
            next.await.expect("joined"),
            "the slot skips the waiter that left"
        );
        let held: u32 = g.state.lock().tenants.values().map(|t| t.running).sum();
        assert_eq!(held, 0, "every slot came back");
    }

    #[tokio::test(start_paused = true)]
    async fn idle_tenants_leave_the_share_count() {
        let g = gate(2);
        drop(hold(&g, "b", 1).await);
        let first = hold(&g, "a", 1).await;
        assert!(
            tokio::time::timeout(Duration::from_millis(10), g.acquire("a", soon()))
                .await
                .is_err(),
            "b is active: a holds one of two"
        );
        tokio::time::advance(Duration::from_secs(2)).await;
        let _more = hold(&g, "a", 3).await;
        assert_eq!(g.state.lock().tenants.len(), 1);
        drop(first);
    }
}
