//! The circuit breaker of every downstream stack, one per stack, with a
//! circuit per tenant beside the stack's shared one.
//!
//! A breaker must open only on evidence that the downstream is unhealthy
//! for everyone, never on one tenant's slow, large or malformed work
//! (issue 47). So a finished call is judged twice:
//!
//! * **The tenant's circuit** counts that tenant's own failures (the
//!   stack's timeout, INTERNAL, UNKNOWN, DEADLINE_EXCEEDED). At the
//!   threshold it opens for that tenant alone, who then fails fast with
//!   [`BreakerOpen`] while every other tenant is still let through.
//! * **The shared circuit** counts every failure in one run of consecutive
//!   failures (any healthy answer ends the run) but opens only when the run
//!   holds evidence about the downstream itself: a transport failure (tonic
//!   reports a refused connection as UNAVAILABLE; any error that is neither
//!   a `Status` nor the stack's timeout), or failures from at least two
//!   distinct tenants while no tenant had a healthy answer for
//!   [`BreakerConfig::healthy_within`]: tenants failing together while
//!   another is served (two hostile tenants sending work that fails) are
//!   not a downstream failure. Its phase is what [`BreakerHandle::phase`]
//!   reports (the `engram_retrieval_circuit_state` gauge).
//!
//! A call is let through when both circuits admit it. Neutral verdicts
//! (the caller's deadline or hang-up, our own shedding, RESOURCE_EXHAUSTED,
//! CANCELLED) teach neither circuit anything. Only tenants with something
//! to remember (failures, an open or half-open circuit) are kept, at most
//! [`BreakerConfig::max_tenants`]: a hostile set of tenants cannot grow it.
//!
//! Hand-written rather than tower-resilience 0.13's: that one keeps one
//! state per layer instance, keyed by nothing, so it cannot tell tenants
//! apart, and it keeps time with `std::time::Instant`, so its open →
//! half-open transition cannot be driven by tokio's paused clock in tests.
//! The stack's timeout sits inside the breaker, so a hanging downstream
//! trips it like a failing one, while the request's deadline sits outside.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use tonic::Status;
use tower::{BoxError, Layer, Service};

use super::Call;

/// Tenants whose circuit state a breaker keeps, by default.
pub const DEFAULT_MAX_TENANTS: usize = 1024;

/// [`BreakerConfig::healthy_within`] by default.
pub const DEFAULT_HEALTHY_WITHIN: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct BreakerConfig {
    /// Consecutive failures that open a circuit (a tenant's, or the shared
    /// one when the run holds downstream-wide evidence).
    pub failure_threshold: u32,
    pub open_for: Duration,
    /// Trial calls let through while half-open.
    pub half_open_trials: u32,
    /// Tenants with remembered state, at most; beyond it a new failing
    /// tenant is judged by the shared circuit only.
    pub max_tenants: usize,
    /// A healthy answer to any tenant this recently shows the downstream
    /// serving: failures tenants are blamed for then do not open the
    /// shared circuit, however many tenants send them.
    pub healthy_within: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failure_threshold: 5,
            open_for: Duration::from_secs(5),
            half_open_trials: 1,
            max_tenants: DEFAULT_MAX_TENANTS,
            healthy_within: DEFAULT_HEALTHY_WITHIN,
        }
    }
}

/// What a request says about who it is for: the key of its circuit.
pub trait TenantKey {
    fn tenant_key(&self) -> &str;
}

impl<T> TenantKey for Call<T> {
    fn tenant_key(&self) -> &str {
        &self.identity.tenant
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerPhase {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerPhase {
    /// The value of `engram_retrieval_circuit_state`.
    pub fn gauge(self) -> i64 {
        match self {
            Self::Closed => 0,
            Self::HalfOpen => 1,
            Self::Open => 2,
        }
    }
}

/// One circuit: the shared one or a tenant's.
#[derive(Debug)]
struct Circuit {
    phase: BreakerPhase,
    open_until: Instant,
    consecutive_failures: u32,
    trials_in_flight: u32,
}

/// What one finished call teaches one circuit.
#[derive(Debug, Clone, Copy)]
enum Seen {
    Healthy,
    /// A failure; `may_open` is false while the shared circuit's run holds
    /// no evidence about the downstream itself.
    Failed {
        may_open: bool,
    },
    Neutral,
}

impl Circuit {
    fn closed() -> Self {
        Self {
            phase: BreakerPhase::Closed,
            open_until: Instant::now(),
            consecutive_failures: 0,
            trials_in_flight: 0,
        }
    }

    /// The phase as a caller would see it now (an expired open is half-open).
    fn phase_now(&self) -> BreakerPhase {
        if self.phase == BreakerPhase::Open && Instant::now() >= self.open_until {
            BreakerPhase::HalfOpen
        } else {
            self.phase
        }
    }

    fn admit(&mut self, cfg: &BreakerConfig) -> bool {
        match self.phase {
            BreakerPhase::Closed => true,
            BreakerPhase::Open if Instant::now() >= self.open_until => {
                self.phase = BreakerPhase::HalfOpen;
                self.trials_in_flight = 1;
                true
            }
            BreakerPhase::Open => false,
            BreakerPhase::HalfOpen if self.trials_in_flight < cfg.half_open_trials => {
                self.trials_in_flight += 1;
                true
            }
            BreakerPhase::HalfOpen => false,
        }
    }

    /// Gives back a half-open trial the call did not use.
    fn release_trial(&mut self) {
        self.trials_in_flight = self.trials_in_flight.saturating_sub(1);
    }

    fn open(&mut self, cfg: &BreakerConfig) {
        self.phase = BreakerPhase::Open;
        self.open_until = Instant::now() + cfg.open_for;
        self.trials_in_flight = 0;
    }

    /// Applies one verdict; true when it opened the circuit.
    fn record(&mut self, cfg: &BreakerConfig, seen: Seen) -> bool {
        match (self.phase, seen) {
            (BreakerPhase::HalfOpen, Seen::Failed { may_open: true }) => self.open(cfg),
            // A failure that says nothing about the downstream (one
            // tenant's, or while others are served) spends no trial.
            (BreakerPhase::HalfOpen, Seen::Failed { may_open: false }) => self.release_trial(),
            (BreakerPhase::HalfOpen, Seen::Healthy) => *self = Self::closed(),
            // The trial taught nothing: let another call try.
            (BreakerPhase::HalfOpen, Seen::Neutral) => self.release_trial(),
            (BreakerPhase::Closed, Seen::Failed { may_open }) => {
                self.consecutive_failures += 1;
                if !(may_open && self.consecutive_failures >= cfg.failure_threshold) {
                    return false;
                }
                self.open(cfg);
            }
            (BreakerPhase::Closed, Seen::Healthy) => self.consecutive_failures = 0,
            // A late answer from before the circuit opened changes nothing.
            (BreakerPhase::Closed, Seen::Neutral) | (BreakerPhase::Open, _) => return false,
        }
        self.phase == BreakerPhase::Open
    }

    /// Nothing to remember: a closed circuit without failures.
    fn is_idle(&self) -> bool {
        self.phase == BreakerPhase::Closed && self.consecutive_failures == 0
    }

    /// Still holding its tenant back (kept when the map is full).
    fn holds_back(&self, now: Instant) -> bool {
        match self.phase {
            BreakerPhase::Open => now < self.open_until,
            BreakerPhase::HalfOpen => true,
            BreakerPhase::Closed => false,
        }
    }
}

/// The shared circuit's current run of consecutive failures: whether it
/// holds evidence that the downstream itself is unhealthy.
#[derive(Debug, Default)]
struct Run {
    first_tenant_opt: Option<Box<str>>,
    downstream_wide: bool,
}

impl Run {
    fn note_tenant(&mut self, tenant: &str) {
        match &self.first_tenant_opt {
            None => self.first_tenant_opt = Some(tenant.into()),
            Some(first) if **first != *tenant => self.downstream_wide = true,
            Some(_) => {}
        }
    }
}

/// Everything one stack's breaker knows, behind one lock.
#[derive(Debug)]
struct State {
    shared: Circuit,
    run: Run,
    /// When some tenant last had a healthy answer.
    last_healthy_opt: Option<Instant>,
    /// Only tenants with something to remember; at most `max_tenants`.
    tenants: HashMap<Box<str>, Circuit>,
}

impl State {
    fn new() -> Self {
        Self {
            shared: Circuit::closed(),
            run: Run::default(),
            last_healthy_opt: None,
            tenants: HashMap::new(),
        }
    }

    /// Lets a call through when the tenant's circuit and the shared one
    /// both admit it; a tenant trial the shared circuit refuses is given
    /// back.
    fn admit(&mut self, cfg: &BreakerConfig, tenant: &str) -> bool {
        let mut tenant_trial = false;
        if let Some(c) = self.tenants.get_mut(tenant) {
            if !c.admit(cfg) {
                return false;
            }
            tenant_trial = c.phase == BreakerPhase::HalfOpen;
        }
        if self.shared.admit(cfg) {
            return true;
        }
        if let Some(c) = self.tenants.get_mut(tenant).filter(|_| tenant_trial) {
            c.release_trial();
        }
        false
    }

    fn record(&mut self, cfg: &BreakerConfig, tenant: &str, verdict: Verdict) {
        self.record_shared(cfg, tenant, verdict);
        self.record_tenant(cfg, tenant, verdict);
    }

    fn record_shared(&mut self, cfg: &BreakerConfig, tenant: &str, verdict: Verdict) {
        let seen = match verdict {
            Verdict::Healthy => {
                self.run = Run::default();
                self.last_healthy_opt = Some(Instant::now());
                Seen::Healthy
            }
            Verdict::Neutral => Seen::Neutral,
            Verdict::DownstreamFailed => {
                self.run.downstream_wide = true;
                Seen::Failed { may_open: true }
            }
            Verdict::TenantFailed => {
                self.run.note_tenant(tenant);
                let serving =
                    (self.last_healthy_opt).is_some_and(|at| at.elapsed() < cfg.healthy_within);
                Seen::Failed {
                    may_open: self.run.downstream_wide && !serving,
                }
            }
        };
        if self.shared.record(cfg, seen) {
            self.run = Run::default();
            tracing::warn!(
                failures = self.shared.consecutive_failures,
                "downstream circuit opened for every tenant"
            );
        }
    }

    fn record_tenant(&mut self, cfg: &BreakerConfig, tenant: &str, verdict: Verdict) {
        let seen = match verdict {
            Verdict::TenantFailed => Seen::Failed { may_open: true },
            Verdict::Healthy => Seen::Healthy,
            // The downstream's own failure says nothing about this tenant.
            Verdict::DownstreamFailed | Verdict::Neutral => Seen::Neutral,
        };
        let Some(c) = self.tenant_circuit(cfg, tenant, seen) else {
            return;
        };
        if c.record(cfg, seen) {
            tracing::info!(tenant, "downstream circuit opened for one tenant");
        }
        if c.is_idle() {
            self.tenants.remove(tenant);
        }
    }

    /// The tenant's circuit; a new one only for a failure and while there
    /// is room (after dropping every entry that no longer holds its tenant
    /// back).
    fn tenant_circuit(
        &mut self,
        cfg: &BreakerConfig,
        tenant: &str,
        seen: Seen,
    ) -> Option<&mut Circuit> {
        if !self.tenants.contains_key(tenant) {
            if !matches!(seen, Seen::Failed { .. }) {
                return None;
            }
            if self.tenants.len() >= cfg.max_tenants {
                let now = Instant::now();
                self.tenants.retain(|_, c| c.holds_back(now));
            }
            if self.tenants.len() >= cfg.max_tenants {
                return None;
            }
            self.tenants.insert(tenant.into(), Circuit::closed());
        }
        self.tenants.get_mut(tenant)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("circuit open")]
pub struct BreakerOpen;

#[derive(Clone)]
pub struct BreakerHandle(Arc<Mutex<State>>);

impl BreakerHandle {
    /// The shared circuit's phase as a caller would see it now: the
    /// downstream's health for everyone, not any one tenant's.
    pub fn phase(&self) -> BreakerPhase {
        self.0.lock().shared.phase_now()
    }

    /// One tenant's own circuit (closed when nothing is remembered).
    #[cfg(test)]
    pub(crate) fn tenant_phase(&self, tenant: &str) -> BreakerPhase {
        let s = self.0.lock();
        s.tenants
            .get(tenant)
            .map_or(BreakerPhase::Closed, Circuit::phase_now)
    }

    /// How many tenants' circuits are remembered.
    #[cfg(test)]
    pub(crate) fn tracked_tenants(&self) -> usize {
        self.0.lock().tenants.len()
    }
}

#[derive(Clone)]
pub struct BreakerLayer {
    cfg: Arc<BreakerConfig>,
    state: Arc<Mutex<State>>,
}

impl BreakerLayer {
    pub fn new(cfg: BreakerConfig) -> Self {
        Self {
            cfg: Arc::new(cfg),
            state: Arc::new(Mutex::new(State::new())),
        }
    }

    /// Reads the phase of every breaker this layer makes (they share one).
    pub fn handle(&self) -> BreakerHandle {
        BreakerHandle(self.state.clone())
    }
}

impl<S> Layer<S> for BreakerLayer {
    type Service = Breaker<S>;
    fn layer(&self, inner: S) -> Breaker<S> {
        Breaker {
            inner,
            cfg: self.cfg.clone(),
            state: self.state.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Breaker<S> {
    inner: S,
    cfg: Arc<BreakerConfig>,
    state: Arc<Mutex<State>>,
}

/// What a finished (or abandoned) call says about the downstream's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// It answered: a result, or a client error (bad argument, not found,
    /// auth), which a healthy service gives too.
    Healthy,
    /// It failed or was too slow for the stack's own timeout, which may be
    /// this tenant's work (an expensive read, a huge batch, a request the
    /// downstream chokes on): the tenant's circuit counts it, the shared
    /// one only together with another tenant's failure.
    TenantFailed,
    /// It could not reach the downstream (UNAVAILABLE, a refused connection,
    /// a transport error): evidence about the downstream for everyone.
    DownstreamFailed,
    /// Nothing learned about its health: the caller gave up (its deadline
    /// or a hang-up dropped the call), our own concurrency limit shed it, or
    /// the downstream said it is busy (queue full) or saw the call cancelled.
    /// A hostile or hasty caller must not open the circuit for everyone.
    Neutral,
}

fn verdict<R>(r: &Result<R, BoxError>) -> Verdict {
    let e = match r {
        Ok(_) => return Verdict::Healthy,
        Err(e) => e,
    };
    // The caller's deadline can also end the call from inside the breaker:
    // `rpc` advertises the time left as grpc-timeout, and when tonic's own
    // timer for it fires on the same tick as the deadline layer's, the inner
    // future is polled first and wins. Still the caller's time, so neutral:
    // counting it as a failure let a tenant's 1 ms deadlines open the
    // breaker for everyone (a CI run of tests/isolation.rs caught it).
    if e.is::<tower::load_shed::error::Overloaded>() || e.is::<super::deadline::DeadlineReached>() {
        return Verdict::Neutral;
    }
    match e.downcast_ref::<Status>().map(Status::code) {
        // tonic reports a refused or failed connection as UNAVAILABLE.
        Some(tonic::Code::Unavailable) => Verdict::DownstreamFailed,
        Some(tonic::Code::Unknown | tonic::Code::Internal | tonic::Code::DeadlineExceeded) => {
            Verdict::TenantFailed
        }
        Some(tonic::Code::ResourceExhausted | tonic::Code::Cancelled) => Verdict::Neutral,
        Some(_) => Verdict::Healthy,
        // The stack's own timeout (inside the breaker).
        None if e.is::<tower::timeout::error::Elapsed>() => Verdict::TenantFailed,
        // Anything else never reached an answer: a transport error.
        None => Verdict::DownstreamFailed,
    }
}

/// A call dropped before it finished was abandoned by its caller (the
/// request's deadline or a hang-up): neutral, and a half-open trial is
/// released. Slowness still counts through the stack's own timeout, which
/// sits inside the breaker and ends the call with an error.
struct Outcome {
    state: Arc<Mutex<State>>,
    cfg: Arc<BreakerConfig>,
    tenant: Box<str>,
    done: bool,
}

impl Outcome {
    fn finish(&mut self, verdict: Verdict) {
        self.done = true;
        self.state.lock().record(&self.cfg, &self.tenant, verdict);
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        if !self.done {
            self.state
                .lock()
                .record(&self.cfg, &self.tenant, Verdict::Neutral);
        }
    }
}

impl<S, Req> Service<Req> for Breaker<S>
where
    S: Service<Req>,
    Req: TenantKey,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let tenant: Box<str> = req.tenant_key().into();
        if !self.state.lock().admit(&self.cfg, &tenant) {
            return Box::pin(std::future::ready(Err(BreakerOpen.into())));
        }
        let fut = self.inner.call(req);
        let mut outcome = Outcome {
            state: self.state.clone(),
            cfg: self.cfg.clone(),
            tenant,
            done: false,
        };
        Box::pin(async move {
            let r = fut.await.map_err(Into::into);
            outcome.finish(verdict(&r));
            r
        })
    }
}

#[cfg(test)]
mod tests {
    use engram_common::{AccessLevel, Identity};
    use tower::ServiceExt;

    use super::*;

    fn call_of(tenant: String, msg: u32) -> Call<u32> {
        let id = Arc::new(Identity {
            tenant,
            agent_id: "a".into(),
            trust: AccessLevel::Public,
        });
        Call::new(&id, msg)
    }

    #[test]
    fn verdicts_tell_the_downstream_from_one_tenant() {
        let status = |s: Status| verdict::<()>(&Err(s.into()));
        assert_eq!(
            status(Status::unavailable("tcp connect error")),
            Verdict::DownstreamFailed
        );
        assert_eq!(status(Status::internal("boom")), Verdict::TenantFailed);
        assert_eq!(status(Status::unknown("?")), Verdict::TenantFailed);
        assert_eq!(
            status(Status::deadline_exceeded("slow")),
            Verdict::TenantFailed
        );
        assert_eq!(status(Status::invalid_argument("bad")), Verdict::Healthy);
        assert_eq!(status(Status::resource_exhausted("busy")), Verdict::Neutral);
        let elapsed = tower::timeout::error::Elapsed::new();
        assert_eq!(verdict::<()>(&Err(elapsed.into())), Verdict::TenantFailed);
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(
            verdict::<()>(&Err(refused.into())),
            Verdict::DownstreamFailed
        );
    }

    /// 10,000 tenants, each failing once (a healthy call in between keeps
    /// the shared circuit closed): the breaker remembers at most its cap,
    /// whether the entries are closed with a failure (threshold 2, dropped
    /// when room is needed) or open (threshold 1, kept until they expire).
    #[tokio::test(start_paused = true)]
    async fn ten_thousand_failing_tenants_stay_within_the_cap() {
        for threshold in [1, 2] {
            let cfg = BreakerConfig {
                failure_threshold: threshold,
                max_tenants: 64,
                ..BreakerConfig::default()
            };
            let layer = BreakerLayer::new(cfg);
            let handle = layer.handle();
            let svc = layer.layer(tower::service_fn(|c: Call<u32>| async move {
                match c.msg {
                    0 => Ok(0),
                    _ => Err(BoxError::from(Status::internal("boom"))),
                }
            }));
            let mut most = 0;
            for i in 0..10_000 {
                let failed = svc.clone().oneshot(call_of(format!("t{i}"), 1)).await;
                assert!(failed.is_err());
                let ok = svc.clone().oneshot(call_of("healthy".into(), 0)).await;
                assert!(ok.is_ok(), "threshold {threshold}, tenant {i}");
                most = most.max(handle.tracked_tenants());
            }
            assert_eq!(most, 64, "threshold {threshold}: {most} tenants kept");
            assert_eq!(handle.phase(), BreakerPhase::Closed);
        }
    }
}
