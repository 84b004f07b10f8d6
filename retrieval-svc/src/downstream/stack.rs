//! The one recipe every downstream call gets its resilience from:
//! [`layered`] stacks (outside → in) metrics, the per-call timeout (the
//! stack's own, or the request's deadline when that comes first), retry
//! (idempotent reads only, inside a shared retry budget), a circuit breaker,
//! load shedding and a concurrency limit. Metrics sit outside retry so a
//! retried call counts once.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tonic::Status;
use tower::retry::budget::{Budget, TpsBudget};
use tower::util::BoxCloneSyncService;
use tower::{BoxError, Service, ServiceBuilder};

use tracing::Instrument as _;

use super::breaker::{BreakerConfig, BreakerHandle, BreakerLayer};
use super::deadline::DeadlineLayer;
use super::{Call, Down, DownstreamError};
use crate::metrics::{CallOutcome, StackMetrics};

#[derive(Debug, Clone)]
pub struct StackSpec {
    pub name: &'static str,
    pub timeout: Duration,
    pub idempotent: bool,
    pub max_concurrency: usize,
    pub breaker: BreakerConfig,
}

/// Builds the resilience stack around `inner` (a tonic call in production,
/// a `tower_test` mock in tests).
pub fn layered<S, T, R>(
    spec: &StackSpec,
    budget: Arc<TpsBudget>,
    metrics: Arc<StackMetrics>,
    inner: S,
) -> (Down<T, R>, BreakerHandle)
where
    S: Service<Call<T>, Response = R, Error = BoxError> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
    T: Clone + Send + Sync + 'static,
    R: Send + 'static,
{
    let breaker = BreakerLayer::new(spec.breaker.clone());
    let handle = breaker.handle();
    let name = spec.name;
    let svc = ServiceBuilder::new()
        .map_future(move |fut| {
            let metrics = metrics.clone();
            let start = Instant::now();
            // One client span per call (retries included), a child of the
            // caller's stage span; `rpc` injects its context as traceparent.
            let span = tracing::info_span!(
                "downstream",
                otel.name = format!("downstream.{name}"),
                otel.kind = "client",
                otel.status_code = tracing::field::Empty,
                rpc.system = "grpc",
                downstream = name,
                outcome = tracing::field::Empty,
            );
            let record = span.clone();
            async move {
                let r: Result<R, DownstreamError> = fut.await;
                let (outcome, label) = match &r {
                    Ok(_) => (CallOutcome::Ok, "ok"),
                    Err(DownstreamError::Timeout) => (CallOutcome::Timeout, "timeout"),
                    Err(DownstreamError::CircuitOpen) => (CallOutcome::CircuitOpen, "circuit_open"),
                    Err(DownstreamError::Overloaded) => (CallOutcome::Overloaded, "overloaded"),
                    Err(_) => (CallOutcome::Error, "error"),
                };
                metrics.record(outcome, start.elapsed());
                record.record("outcome", label);
                if let Err(e) = &r {
                    record.record("otel.status_code", "ERROR");
                    tracing::debug!(downstream = name, error = %e, "downstream call failed");
                }
                r
            }
            .instrument(span)
        })
        .map_err(DownstreamError::classify)
        .layer(DeadlineLayer::new(spec.timeout))
        .retry(RetryPolicy {
            idempotent: spec.idempotent,
            budget,
            retries_left: 1,
        })
        .layer(breaker)
        .load_shed()
        .concurrency_limit(spec.max_concurrency)
        .service(inner);
    (BoxCloneSyncService::new(svc), handle)
}

/// tower clones the policy per call, so `retries_left` bounds one call's
/// retries: without it a refusing downstream was retried every 10 ms until
/// the shared budget ran dry, and one query's retries alone opened the
/// breaker for everyone.
#[derive(Clone)]
struct RetryPolicy {
    idempotent: bool,
    budget: Arc<TpsBudget>,
    retries_left: u32,
}

impl<T: Clone, R> tower::retry::Policy<Call<T>, R, BoxError> for RetryPolicy {
    type Future = Pin<Box<tokio::time::Sleep>>;

    fn retry(
        &mut self,
        _req: &mut Call<T>,
        result: &mut Result<R, BoxError>,
    ) -> Option<Self::Future> {
        match result {
            Ok(_) => {
                self.budget.deposit();
                None
            }
            Err(e) => {
                // Only transient transport failures; the breaker's own
                // rejection and client errors are final.
                let transient = e
                    .downcast_ref::<Status>()
                    .is_some_and(|s| s.code() == tonic::Code::Unavailable);
                if self.idempotent && transient && self.retries_left > 0 && self.budget.withdraw() {
                    self.retries_left -= 1;
                    Some(Box::pin(tokio::time::sleep(Duration::from_millis(10))))
                } else {
                    None
                }
            }
        }
    }

    fn clone_request(&mut self, req: &Call<T>) -> Option<Call<T>> {
        self.idempotent.then(|| req.clone())
    }
}

#[cfg(test)]
mod tests {
    use engram_common::{AccessLevel, Identity};
    use tower_test::mock;

    use super::*;
    use crate::downstream::breaker::BreakerPhase;
    use crate::downstream::call;

    fn ident() -> Arc<Identity> {
        Arc::new(Identity {
            tenant: "t".into(),
            agent_id: "a".into(),
            trust: AccessLevel::Public,
        })
    }

    fn spec(idempotent: bool) -> StackSpec {
        StackSpec {
            name: "test",
            timeout: Duration::from_millis(300),
            idempotent,
            max_concurrency: 8,
            breaker: BreakerConfig {
                failure_threshold: 3,
                open_for: Duration::from_secs(5),
                half_open_trials: 1,
            },
        }
    }

    fn stack(idempotent: bool) -> (Down<u32, u32>, BreakerHandle, mock::Handle<Call<u32>, u32>) {
        let (m, handle) = mock::pair::<Call<u32>, u32>();
        let budget = Arc::new(TpsBudget::new(Duration::from_secs(10), 100, 0.5));
        let (svc, breaker) = layered(&spec(idempotent), budget, Arc::default(), m);
        (svc, breaker, handle)
    }

    #[tokio::test(start_paused = true)]
    async fn timeout_fires_at_the_strategy_budget() {
        let (svc, _b, mut handle) = stack(true);
        let id = ident();
        let task = tokio::spawn(async move { call(&svc, &id, 1).await });
        let (_req, _send) = handle.next_request().await.expect("request");
        // Never answered: the paused clock auto-advances to the timeout.
        let r = task.await.expect("join");
        assert!(matches!(r, Err(DownstreamError::Timeout)), "{r:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn breaker_opens_half_opens_and_closes() {
        let (svc, breaker, mut handle) = stack(false);
        let id = ident();
        for _ in 0..3 {
            let s = svc.clone();
            let i = id.clone();
            let task = tokio::spawn(async move { call(&s, &i, 1).await });
            let (_r, send) = handle.next_request().await.expect("request");
            send.send_error(Status::unavailable("down"));
            assert!(matches!(
                task.await.expect("join"),
                Err(DownstreamError::Status(_))
            ));
        }
        assert_eq!(breaker.phase(), BreakerPhase::Open);
        // While open, calls fail fast without reaching the downstream.
        let r = call(&svc, &id, 1).await;
        assert!(matches!(r, Err(DownstreamError::CircuitOpen)), "{r:?}");

        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(breaker.phase(), BreakerPhase::HalfOpen);
        let s = svc.clone();
        let i = id.clone();
        let task = tokio::spawn(async move { call(&s, &i, 7).await });
        let (req, send) = handle.next_request().await.expect("trial");
        assert_eq!(req.msg, 7);
        send.send_response(8);
        assert_eq!(task.await.expect("join").expect("trial ok"), 8);
        assert_eq!(breaker.phase(), BreakerPhase::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn slow_calls_trip_the_breaker() {
        let (svc, breaker, mut handle) = stack(false);
        let id = ident();
        for _ in 0..3 {
            let s = svc.clone();
            let i = id.clone();
            let task = tokio::spawn(async move { call(&s, &i, 1).await });
            let _pending = handle.next_request().await.expect("request");
            assert!(matches!(
                task.await.expect("join"),
                Err(DownstreamError::Timeout)
            ));
        }
        assert_eq!(breaker.phase(), BreakerPhase::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn idempotent_reads_are_retried_writes_are_not() {
        let (svc, _b, mut handle) = stack(true);
        let id = ident();
        let i = id.clone();
        let s = svc.clone();
        let task = tokio::spawn(async move { call(&s, &i, 1).await });
        let (_r, send) = handle.next_request().await.expect("first");
        send.send_error(Status::unavailable("blip"));
        let (_r, send) = handle.next_request().await.expect("retry");
        send.send_response(2);
        assert_eq!(task.await.expect("join").expect("ok"), 2);

        let (svc, _b, mut handle) = stack(false);
        let task = tokio::spawn(async move { call(&svc, &id, 1).await });
        let (_r, send) = handle.next_request().await.expect("first");
        send.send_error(Status::unavailable("blip"));
        assert!(task.await.expect("join").is_err());
    }
}
