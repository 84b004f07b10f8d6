//! The circuit breaker of every downstream stack.
//!
//! Hand-written rather than tower-resilience 0.13's: that one keeps time
//! with `std::time::Instant`, so its open → half-open transition cannot be
//! driven by tokio's paused clock in tests, and it adds a boxed future per
//! call anyway. This one is ~100 lines and uses `tokio::time`. Only the
//! downstream's own failures count (see `Verdict`): the stack's timeout sits
//! inside the breaker, so a hanging downstream trips it like a failing one,
//! while a call its caller abandoned (deadline, hang-up) or that our own
//! limit shed is neutral.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use tonic::Status;
use tower::{BoxError, Layer, Service};

#[derive(Debug, Clone)]
pub struct BreakerConfig {
    /// Consecutive failures that open the circuit.
    pub failure_threshold: u32,
    pub open_for: Duration,
    /// Trial calls let through while half-open.
    pub half_open_trials: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failure_threshold: 5,
            open_for: Duration::from_secs(5),
            half_open_trials: 1,
        }
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

#[derive(Debug)]
struct BreakerState {
    phase: BreakerPhase,
    open_until: Instant,
    consecutive_failures: u32,
    trials_in_flight: u32,
}

#[derive(Debug, thiserror::Error)]
#[error("circuit open")]
pub struct BreakerOpen;

#[derive(Clone)]
pub struct BreakerHandle(Arc<Mutex<BreakerState>>);

impl BreakerHandle {
    /// The phase as a caller would see it now (an expired open is half-open).
    pub fn phase(&self) -> BreakerPhase {
        let s = self.0.lock();
        if s.phase == BreakerPhase::Open && Instant::now() >= s.open_until {
            BreakerPhase::HalfOpen
        } else {
            s.phase
        }
    }
}

#[derive(Clone)]
pub struct BreakerLayer {
    cfg: Arc<BreakerConfig>,
    shared: Arc<Mutex<BreakerState>>,
}

impl BreakerLayer {
    pub fn new(cfg: BreakerConfig) -> Self {
        Self {
            cfg: Arc::new(cfg),
            shared: Arc::new(Mutex::new(BreakerState {
                phase: BreakerPhase::Closed,
                open_until: Instant::now(),
                consecutive_failures: 0,
                trials_in_flight: 0,
            })),
        }
    }
}

impl BreakerLayer {
    /// Reads the phase of every breaker this layer makes (they share one).
    pub fn handle(&self) -> BreakerHandle {
        BreakerHandle(self.shared.clone())
    }
}

impl<S> Layer<S> for BreakerLayer {
    type Service = Breaker<S>;
    fn layer(&self, inner: S) -> Breaker<S> {
        Breaker {
            inner,
            cfg: self.cfg.clone(),
            shared: self.shared.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Breaker<S> {
    inner: S,
    cfg: Arc<BreakerConfig>,
    shared: Arc<Mutex<BreakerState>>,
}

fn admit(s: &mut BreakerState, cfg: &BreakerConfig) -> bool {
    match s.phase {
        BreakerPhase::Closed => true,
        BreakerPhase::Open => {
            if Instant::now() >= s.open_until {
                s.phase = BreakerPhase::HalfOpen;
                s.trials_in_flight = 1;
                true
            } else {
                false
            }
        }
        BreakerPhase::HalfOpen => {
            if s.trials_in_flight < cfg.half_open_trials {
                s.trials_in_flight += 1;
                true
            } else {
                false
            }
        }
    }
}

/// What a finished (or abandoned) call says about the downstream's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// It answered: a result, or a client error (bad argument, not found,
    /// auth), which a healthy service gives too.
    Healthy,
    /// It failed or was too slow for the stack's own timeout.
    Failed,
    /// Nothing learned about its health: the caller gave up (its deadline
    /// or a hang-up dropped the call), our own concurrency limit shed it, or
    /// the downstream said it is busy (queue full) or saw the call cancelled.
    /// A hostile or hasty caller must not open the circuit for everyone.
    Neutral,
}

fn record(shared: &Mutex<BreakerState>, cfg: &BreakerConfig, verdict: Verdict) {
    let mut s = shared.lock();
    match (s.phase, verdict) {
        (BreakerPhase::HalfOpen, Verdict::Failed) => {
            s.phase = BreakerPhase::Open;
            s.open_until = Instant::now() + cfg.open_for;
            s.trials_in_flight = 0;
            tracing::warn!("downstream circuit re-opened after failed trial");
        }
        (BreakerPhase::HalfOpen, Verdict::Healthy) => {
            s.phase = BreakerPhase::Closed;
            s.consecutive_failures = 0;
            s.trials_in_flight = 0;
        }
        // The trial taught nothing: let another call try.
        (BreakerPhase::HalfOpen, Verdict::Neutral) => {
            s.trials_in_flight = s.trials_in_flight.saturating_sub(1);
        }
        (BreakerPhase::Closed, Verdict::Failed) => {
            s.consecutive_failures += 1;
            if s.consecutive_failures >= cfg.failure_threshold {
                s.phase = BreakerPhase::Open;
                s.open_until = Instant::now() + cfg.open_for;
                tracing::warn!(
                    failures = s.consecutive_failures,
                    "downstream circuit opened"
                );
            }
        }
        (BreakerPhase::Closed, Verdict::Healthy) => s.consecutive_failures = 0,
        (BreakerPhase::Closed, Verdict::Neutral) => {}
        // A late answer from before the circuit opened changes nothing.
        (BreakerPhase::Open, _) => {}
    }
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
        Some(
            tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Internal
            | tonic::Code::DeadlineExceeded,
        ) => Verdict::Failed,
        Some(tonic::Code::ResourceExhausted | tonic::Code::Cancelled) => Verdict::Neutral,
        Some(_) => Verdict::Healthy,
        // The stack's own timeout (inside the breaker) and transport errors.
        None => Verdict::Failed,
    }
}

/// A call dropped before it finished was abandoned by its caller (the
/// request's deadline or a hang-up): neutral, and a half-open trial is
/// released. Slowness still trips the breaker through the stack's own
/// timeout, which sits inside it and ends the call with an error.
struct Outcome {
    shared: Arc<Mutex<BreakerState>>,
    cfg: Arc<BreakerConfig>,
    done: bool,
}

impl Drop for Outcome {
    fn drop(&mut self) {
        if !self.done {
            record(&self.shared, &self.cfg, Verdict::Neutral);
        }
    }
}

impl<S, Req> Service<Req> for Breaker<S>
where
    S: Service<Req>,
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
        let admitted = admit(&mut self.shared.lock(), &self.cfg);
        if !admitted {
            return Box::pin(std::future::ready(Err(BreakerOpen.into())));
        }
        let fut = self.inner.call(req);
        let mut outcome = Outcome {
            shared: self.shared.clone(),
            cfg: self.cfg.clone(),
            done: false,
        };
        Box::pin(async move {
            let r = fut.await.map_err(Into::into);
            outcome.done = true;
            record(&outcome.shared, &outcome.cfg, verdict(&r));
            r
        })
    }
}
