//! Per-tenant fairness at the gateway's door. Every RPC takes a permit for
//! its tenant before any work: a keyed GCRA rate limit (governor) and a cap
//! on the tenant's requests in flight, counted apart for reads and writes
//! ([`Lane`]): while Postgres was down, writes waited for it holding their
//! permits and the tenant's reads, which degrade and answer, were refused
//! (`engram soak`, Postgres kill: 12 failed reads of 479). Over either, the caller gets
//! RESOURCE_EXHAUSTED with a retry hint, and the other tenants never notice:
//! the downstream stacks' shared concurrency limits are only reached by
//! traffic that is each tenant's fair share. With several gateway replicas
//! each takes its share, 1/live of the rate, the burst and the in-flight
//! cap (`downstream/members.rs` counts them), so a tenant's limits hold for
//! the deployment, not per replica (issue 48, check 3). A leaf: no gateway
//! types.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use engram_common::settings::TenantLimitSettings;
use governor::clock::{Clock, DefaultClock};
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};
use parking_lot::Mutex;

use crate::error::Error;

/// Rate-limiter state of tenants idle for a while is dropped every this
/// many checks, so tenant names (JWTs bring any) cannot grow it unbounded.
const PRUNE_EVERY: u64 = 4096;
/// Retry hint when only the concurrency cap refused: about one request's
/// time.
const BUSY_RETRY_MS: u64 = 100;

type Keyed = RateLimiter<String, DefaultKeyedStateStore<String>, DefaultClock>;

/// Which in-flight count a request is charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// Retrieval and every other request that reads.
    Read,
    /// Requests that change stored memories (they wait on Postgres).
    Write,
}

type InFlight = Arc<Mutex<HashMap<(String, Lane), u32>>>;

pub struct Admission {
    rate: Keyed,
    clock: DefaultClock,
    max_concurrent: u32,
    in_flight: InFlight,
    checks: AtomicU64,
    /// The burst: a request may not cost more cells than it.
    burst: u32,
    /// Live gateway replicas, this one included (at least 1).
    replicas: AtomicU32,
}

/// A tenant's share of the gateway, held for the request's duration.
#[derive(Debug)]
pub struct Permit {
    in_flight: InFlight,
    key: (String, Lane),
    weight: u32,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut map = self.in_flight.lock();
        if let Some(n) = map.get_mut(&self.key) {
            *n = n.saturating_sub(self.weight);
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// The most gateway replicas one deployment's limits are shared among
/// (the Kubernetes HPA scales 2 to 10): a larger live count is taken as
/// this one, so each replica still grants at least 1/64 of a tenant's rate.
pub const MAX_REPLICAS: u32 = 64;

impl Admission {
    pub fn new(s: &TenantLimitSettings) -> Self {
        let one = NonZeroU32::MIN;
        let rps = NonZeroU32::new(s.requests_per_second).unwrap_or(one);
        let burst = NonZeroU32::new(s.burst).unwrap_or(one);
        Self {
            rate: RateLimiter::keyed(Quota::per_second(rps).allow_burst(burst)),
            clock: DefaultClock::default(),
            max_concurrent: s.max_concurrent.max(1),
            in_flight: Arc::default(),
            checks: AtomicU64::new(0),
            burst: burst.get(),
            replicas: AtomicU32::new(1),
        }
    }

    /// Admits one request charged to `tenant` (the gateway passes the
    /// tenant and the key's trust level) in `lane` that may run `weight`
    /// pipelines at once (1 for everything but agentic retrieval).
    pub fn admit(&self, tenant: &str, lane: Lane, weight: u32) -> Result<Permit, Error> {
        self.admit_costing(tenant, lane, weight, 1)
    }

    /// [`Admission::admit`] for a request that costs `cost` ordinary
    /// requests (`query::read_cost`): `cost` cells of the tenant's rate (at
    /// most its burst) and as many of its places in flight (at most all of
    /// them). An expensive read holds the shared cores for as long as it
    /// runs, so the in-flight cap, not only the rate, must count it as the
    /// ordinary reads it displaces (issue 47, High 3).
    pub fn admit_costing(
        &self,
        tenant: &str,
        lane: Lane,
        weight: u32,
        cost: u32,
    ) -> Result<Permit, Error> {
        self.prune();
        let replicas = self.replicas.load(Ordering::Relaxed).max(1);
        // The places in flight first: a request refused for them has done
        // no work, so it must not spend the tenant's rate as well (a client
        // retrying a busy refusal would drain its own bucket).
        let permit = self.hold(tenant, lane, weight.max(cost), replicas)?;
        // Each request costs `replicas` cells of the tenant's bucket per
        // unit of cost: this replica grants 1/replicas of the rate and of
        // the burst.
        let cells = replicas.saturating_mul(cost.max(1)).min(self.burst);
        let cells = NonZeroU32::new(cells).unwrap_or(NonZeroU32::MIN);
        if let Ok(Err(not_until)) = self.rate.check_key_n(&tenant.to_string(), cells) {
            // Dropping the permit gives its places back.
            let wait = not_until.wait_time_from(self.clock.now());
            return Err(Error::TenantLimit {
                what: "request rate",
                retry_after_ms: (wait.as_millis() as u64).max(1),
            });
        }
        Ok(permit)
    }

    /// Takes `weight` of the tenant's places in flight in `lane` (at least
    /// one, at most this replica's share of the cap).
    fn hold(&self, tenant: &str, lane: Lane, weight: u32, replicas: u32) -> Result<Permit, Error> {
        let cap = self.max_concurrent.div_ceil(replicas).max(1);
        let weight = weight.clamp(1, cap);
        let key = (tenant.to_string(), lane);
        let mut map = self.in_flight.lock();
        let n = map.entry(key.clone()).or_insert(0);
        if *n + weight > cap {
            if *n == 0 {
                map.remove(&key);
            }
            return Err(Error::TenantLimit {
                what: "requests in flight",
                retry_after_ms: BUSY_RETRY_MS,
            });
        }
        *n += weight;
        Ok(Permit {
            in_flight: self.in_flight.clone(),
            key,
            weight,
        })
    }

    /// Sets how many gateway replicas are alive; 0 (unknown: search-svc
    /// did not answer) keeps the last count, and a count past
    /// [`MAX_REPLICAS`] counts as that many: a forged or runaway membership
    /// must not cut every tenant's share to nothing.
    pub fn set_replicas(&self, live: u32) {
        if live > 0 {
            self.replicas
                .store(live.min(MAX_REPLICAS), Ordering::Relaxed);
        }
    }

    fn prune(&self) {
        if self.checks.fetch_add(1, Ordering::Relaxed) % PRUNE_EVERY == PRUNE_EVERY - 1 {
            self.rate.retain_recent();
            self.rate.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(rps: u32, burst: u32, max_concurrent: u32) -> Admission {
        Admission::new(&TenantLimitSettings {
            requests_per_second: rps,
            burst,
            max_concurrent,
            ..TenantLimitSettings::default()
        })
    }

    fn is_limit(r: &Result<Permit, Error>, what: &str) -> bool {
        matches!(r, Err(Error::TenantLimit { what: w, retry_after_ms }) if *w == what && *retry_after_ms > 0)
    }

    #[test]
    fn a_costly_request_takes_its_cost_of_the_rate() {
        let a = limits(1, 10, 100);
        assert!(a.admit_costing("t1", Lane::Read, 1, 8).is_ok());
        assert!(a.admit("t1", Lane::Read, 1).is_ok());
        assert!(a.admit("t1", Lane::Read, 1).is_ok(), "8 + 2 of 10");
        assert!(is_limit(&a.admit("t1", Lane::Read, 1), "request rate"));
        assert!(
            a.admit_costing("t2", Lane::Read, 1, 1000).is_ok(),
            "a cost past the burst is the burst, not a refusal forever"
        );
    }

    #[test]
    fn a_costly_read_holds_its_cost_of_the_places_in_flight() {
        let a = limits(1000, 1000, 32);
        let held: Vec<_> = (0..4)
            .map(|_| a.admit_costing("t1", Lane::Read, 1, 8))
            .collect();
        assert!(held.iter().all(Result::is_ok), "4 x 8 of 32");
        let fifth = a.admit_costing("t1", Lane::Read, 1, 8);
        assert!(is_limit(&fifth, "requests in flight"));
        assert!(
            a.admit("t2", Lane::Read, 1).is_ok(),
            "another tenant's places are its own"
        );
        drop(held);
        let ordinary: Vec<_> = (0..32).map(|_| a.admit("t1", Lane::Read, 1)).collect();
        assert!(
            ordinary.iter().all(Result::is_ok),
            "freed on drop; a read of cost 1 takes 1"
        );
        let b = limits(1000, 1000, 4);
        assert!(
            b.admit_costing("t1", Lane::Read, 1, 8).is_ok(),
            "a cost past the cap is the whole cap, not a refusal forever"
        );
    }

    #[test]
    fn a_tenants_burst_is_its_own() {
        let a = limits(1, 3, 100);
        let held: Vec<_> = (0..3).map(|_| a.admit("t1", Lane::Read, 1)).collect();
        assert!(held.iter().all(Result::is_ok));
        assert!(is_limit(&a.admit("t1", Lane::Read, 1), "request rate"));
        assert!(
            a.admit("t2", Lane::Read, 1).is_ok(),
            "another tenant is not charged"
        );
    }

    #[test]
    fn a_request_refused_for_places_in_flight_spends_no_rate() {
        // Burst 3, one place in flight.
        let a = limits(1, 3, 1);
        let held = a.admit("t1", Lane::Read, 1).expect("first");
        for _ in 0..10 {
            assert!(is_limit(
                &a.admit("t1", Lane::Read, 1),
                "requests in flight"
            ));
        }
        drop(held);
        // The ten refusals took nothing: two of the three cells are left.
        assert!(a.admit("t1", Lane::Read, 1).is_ok());
        assert!(a.admit("t1", Lane::Read, 1).is_ok());
        assert!(is_limit(&a.admit("t1", Lane::Read, 1), "request rate"));
        assert!(
            a.in_flight.lock().is_empty(),
            "a rate refusal gives its place back"
        );
    }

    #[test]
    fn in_flight_is_capped_per_tenant_and_freed_on_drop() {
        let a = limits(1000, 1000, 4);
        let agentic = a.admit("t1", Lane::Read, 3).expect("weight 3 of 4");
        let one = a.admit("t1", Lane::Read, 1).expect("the fourth slot");
        assert!(is_limit(
            &a.admit("t1", Lane::Read, 1),
            "requests in flight"
        ));
        assert!(
            a.admit("t2", Lane::Read, 4).is_ok(),
            "another tenant has its own cap"
        );
        drop(agentic);
        assert!(a.admit("t1", Lane::Read, 3).is_ok());
        drop(one);
        assert!(a.in_flight.lock().is_empty(), "idle tenants leave no entry");
    }

    #[test]
    fn each_replica_grants_its_share() {
        let a = limits(1, 20, 8);
        a.set_replicas(2);
        let granted = (0..20)
            .filter(|_| a.admit("t1", Lane::Read, 1).is_ok())
            .count();
        assert_eq!(granted, 10, "half the burst on each of two replicas");
        let b = limits(1000, 1000, 8);
        b.set_replicas(2);
        let held: Vec<_> = (0..4).map(|_| b.admit("t1", Lane::Read, 1)).collect();
        assert!(held.iter().all(Result::is_ok));
        assert!(is_limit(
            &b.admit("t1", Lane::Read, 1),
            "requests in flight"
        ));
        b.set_replicas(0);
        assert!(
            is_limit(&b.admit("t1", Lane::Read, 1), "requests in flight"),
            "an unknown count keeps the last share"
        );
        let c = limits(1, 2, 8);
        c.set_replicas(5);
        assert!(
            c.admit("t1", Lane::Read, 1).is_ok(),
            "more replicas than burst: one each"
        );
        // A forged count of a million is taken as MAX_REPLICAS: a tenant
        // with burst 640 still gets 10 at once here.
        let d = limits(1000, 640, 64_000);
        d.set_replicas(1_000_000);
        let granted = (0..20)
            .filter(|_| d.admit("t1", Lane::Read, 1).is_ok())
            .count();
        assert_eq!(granted, 10);
    }

    #[test]
    fn writes_in_flight_never_refuse_reads() {
        let a = limits(1000, 1000, 2);
        let stuck: Vec<_> = (0..2).map(|_| a.admit("t1", Lane::Write, 1)).collect();
        assert!(stuck.iter().all(Result::is_ok));
        assert!(is_limit(
            &a.admit("t1", Lane::Write, 1),
            "requests in flight"
        ));
        let read = a.admit("t1", Lane::Read, 1);
        assert!(
            read.is_ok(),
            "writes waiting on Postgres leave the reads their cap"
        );
    }
}
