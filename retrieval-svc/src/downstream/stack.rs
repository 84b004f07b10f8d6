//! The one recipe every downstream call gets its resilience from:
//! [`layered`] stacks (outside → in) metrics, the request's deadline, retry
//! (idempotent reads only, inside a shared retry budget), a circuit breaker,
//! the stack's own timeout, load shedding and a concurrency limit. Metrics
//! sit outside retry so a retried call counts once, and outside everything so
//! every call is counted with its real outcome, a caller's hang-up included.
//! The request's deadline sits outside the breaker and the stack's timeout
//! inside it: running out of the caller's time is neutral, a slow downstream
//! is a failure.

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
            // Made before the future is first polled, so a call dropped even
            // then is counted (as cancelled).
            let mut counted = Counted {
                metrics: metrics.clone(),
                start: Instant::now(),
                done: false,
            };
            let record = span.clone();
            async move {
                let r: Result<R, DownstreamError> = fut.await;
                let (outcome, label) = outcome_of(&r);
                counted.finish(outcome);
                record.record("outcome", label);
                if let Err(e) = &r {
                    record.record("otel.status_code", "ERROR");
                    tracing::debug!(downstream = name, error = %e, "downstream call failed");
                }
                r
            }
            .instrument(span)
        })
        // Every inner error as one `DownstreamError` for the call sites.
        .map_err(DownstreamError::classify)
        // The caller's deadline: outside the breaker, so running out of the
        // caller's time is neutral.
        .layer(DeadlineLayer)
        // Idempotent reads only, once, inside the service's retry budget.
        .retry(RetryPolicy {
            idempotent: spec.idempotent,
            budget,
            retries_left: 1,
        })
        // A circuit per tenant and a shared one that opens only on evidence
        // about the downstream itself (breaker.rs).
        .layer(breaker)
        // The stack's own timeout: inside the breaker, so slowness counts.
        .timeout(spec.timeout)
        // Refuse at once instead of queueing when the limit below is full.
        .load_shed()
        // At most `max_concurrency` calls in flight to this RPC.
        .concurrency_limit(spec.max_concurrency)
        .service(inner);
    (BoxCloneSyncService::new(svc), handle)
}

fn outcome_of<R>(r: &Result<R, DownstreamError>) -> (CallOutcome, &'static str) {
    match r {
        Ok(_) => (CallOutcome::Ok, "ok"),
        Err(DownstreamError::Timeout) => (CallOutcome::Timeout, "timeout"),
        Err(DownstreamError::Deadline) => (CallOutcome::Deadline, "deadline"),
        Err(DownstreamError::CircuitOpen) => (CallOutcome::CircuitOpen, "circuit_open"),
        Err(DownstreamError::Overloaded) => (CallOutcome::Overloaded, "overloaded"),
        Err(_) => (CallOutcome::Error, "error"),
    }
}

/// Counts one call in the stack's metrics exactly once: with its outcome
/// when it finishes, as cancelled when its caller drops it first.
struct Counted {
    metrics: Arc<StackMetrics>,
    start: Instant,
    done: bool,
}

impl Counted {
    fn finish(&mut self, outcome: CallOutcome) {
        self.done = true;
        self.metrics.record(outcome, self.start.elapsed());
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        if !self.done {
            self.metrics
                .record(CallOutcome::Cancelled, self.start.elapsed());
        }
    }
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
                ..BreakerConfig::default()
            },
        }
    }

    fn stack(idempotent: bool) -> (Down<u32, u32>, BreakerHandle, mock::Handle<Call<u32>, u32>) {
        let (svc, breaker, handle, _) = counted_stack(spec(idempotent));
        (svc, breaker, handle)
    }

    type Harness = (
        Down<u32, u32>,
        BreakerHandle,
        mock::Handle<Call<u32>, u32>,
        Arc<crate::metrics::Metrics>,
    );

    /// A stack whose calls are counted in a real registry.
    fn counted_stack(spec: StackSpec) -> Harness {
        let (m, handle) = mock::pair::<Call<u32>, u32>();
        let budget = Arc::new(TpsBudget::new(Duration::from_secs(10), 100, 0.5));
        let metrics = Arc::new(crate::metrics::Metrics::new().expect("metrics"));
        let stack_metrics = Arc::new(metrics.stack(spec.name));
        let (svc, breaker) = layered(&spec, budget, stack_metrics, m);
        (svc, breaker, handle, metrics)
    }

    fn count(metrics: &crate::metrics::Metrics, outcome: &str) -> String {
        let text = metrics.render(&Default::default());
        let series =
            format!("engram_downstream_requests_total{{outcome=\"{outcome}\",stack=\"test\"}}");
        text.lines()
            .find(|l| l.starts_with(&series))
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or("0")
            .to_string()
    }

    /// Three calls the downstream refuses: enough to open the test breaker.
    async fn fail_three_times(
        svc: &Down<u32, u32>,
        handle: &mut mock::Handle<Call<u32>, u32>,
        id: &Arc<Identity>,
    ) {
        for _ in 0..3 {
            let (s, i) = (svc.clone(), id.clone());
            let task = tokio::spawn(async move { call(&s, &i, 1).await });
            let (_r, send) = handle.next_request().await.expect("request");
            send.send_error(Status::unavailable("down"));
            assert!(matches!(
                task.await.expect("join"),
                Err(DownstreamError::Status(_))
            ));
        }
    }

    async fn call_by(
        svc: &Down<u32, u32>,
        id: &Arc<Identity>,
        deadline: Instant,
    ) -> Result<u32, DownstreamError> {
        crate::downstream::call_until(svc, id, deadline, 1).await
    }

    /// Five calls that run out of the caller's 10 ms: left unanswered (the
    /// deadline layer ends them) or, `from_inside`, ended by the inner call
    /// with the deadline itself (tonic's grpc-timeout timer fires on the
    /// deadline layer's tick and is polled first). Either is neutral, or a
    /// tenant's 1 ms deadlines would open the breaker for everyone.
    async fn five_deadlines_leave_the_breaker_closed(from_inside: bool) {
        let (svc, breaker, mut handle, metrics) = counted_stack(spec(true));
        let id = ident();
        for _ in 0..5 {
            let (s, i) = (svc.clone(), id.clone());
            let deadline = Instant::now() + Duration::from_millis(10);
            let task = tokio::spawn(async move { call_by(&s, &i, deadline).await });
            let (_r, send) = handle.next_request().await.expect("request");
            let _unanswered = match from_inside {
                true => {
                    send.send_error(super::super::deadline::DeadlineReached);
                    None
                }
                false => Some(send),
            };
            let r = task.await.expect("join");
            assert!(matches!(r, Err(DownstreamError::Deadline)), "{r:?}");
            assert_eq!(breaker.phase(), BreakerPhase::Closed);
        }
        assert_eq!(count(&metrics, "deadline"), "5");
        assert_eq!(count(&metrics, "timeout"), "0");
    }

    #[tokio::test(start_paused = true)]
    async fn a_callers_deadline_is_neutral_for_the_breaker() {
        five_deadlines_leave_the_breaker_closed(false).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_callers_deadline_reported_from_inside_is_neutral_too() {
        five_deadlines_leave_the_breaker_closed(true).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_call_is_counted_and_releases_a_half_open_trial() {
        let (svc, breaker, mut handle, metrics) = counted_stack(spec(false));
        let id = ident();
        fail_three_times(&svc, &mut handle, &id).await;
        assert_eq!(breaker.phase(), BreakerPhase::Open);
        tokio::time::advance(Duration::from_secs(6)).await;
        // The half-open trial's caller hangs up before it is answered...
        let (s, i) = (svc.clone(), id.clone());
        let trial = tokio::spawn(async move { call(&s, &i, 2).await });
        let _pending = handle.next_request().await.expect("trial");
        trial.abort();
        let _ = trial.await;
        assert_eq!(count(&metrics, "cancelled"), "1");
        // ...which releases the trial: the next call is let through.
        let (s, i) = (svc.clone(), id.clone());
        let next = tokio::spawn(async move { call(&s, &i, 3).await });
        let (req, send) = handle.next_request().await.expect("second trial");
        assert_eq!(req.msg, 3);
        send.send_response(4);
        assert_eq!(next.await.expect("join").expect("ok"), 4);
        assert_eq!(breaker.phase(), BreakerPhase::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn shedding_and_a_busy_downstream_are_neutral() {
        let mut one = spec(false);
        one.max_concurrency = 1;
        let (svc, breaker, mut handle, _metrics) = counted_stack(one);
        let id = ident();
        let (s, i) = (svc.clone(), id.clone());
        let held = tokio::spawn(async move { call(&s, &i, 1).await });
        let (_r, hold) = handle.next_request().await.expect("held");
        for _ in 0..5 {
            let r = call(&svc, &id, 2).await;
            assert!(matches!(r, Err(DownstreamError::Overloaded)), "{r:?}");
        }
        hold.send_response(1);
        held.await.expect("join").expect("ok");
        for _ in 0..5 {
            let (s, i) = (svc.clone(), id.clone());
            let task = tokio::spawn(async move { call(&s, &i, 3).await });
            let (_r, send) = handle.next_request().await.expect("request");
            send.send_error(Status::resource_exhausted("queue full"));
            assert!(task.await.expect("join").is_err());
        }
        assert_eq!(breaker.phase(), BreakerPhase::Closed);
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
        fail_three_times(&svc, &mut handle, &id).await;
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

    fn tenant(name: &str) -> Arc<Identity> {
        Arc::new(Identity {
            tenant: name.into(),
            agent_id: "a".into(),
            trust: AccessLevel::Public,
        })
    }

    /// One call of `id` that the downstream never answers: the stack's own
    /// timeout ends it (the paused clock auto-advances to it).
    async fn time_out(
        svc: &Down<u32, u32>,
        handle: &mut mock::Handle<Call<u32>, u32>,
        id: &Arc<Identity>,
    ) {
        let (s, i) = (svc.clone(), id.clone());
        let task = tokio::spawn(async move { call(&s, &i, 1).await });
        let _pending = handle.next_request().await.expect("request");
        let r = task.await.expect("join");
        assert!(matches!(r, Err(DownstreamError::Timeout)), "{r:?}");
    }

    /// One call of `id` that the downstream ends with `answer`.
    async fn answered(
        svc: &Down<u32, u32>,
        handle: &mut mock::Handle<Call<u32>, u32>,
        id: &Arc<Identity>,
        answer: Result<u32, BoxError>,
    ) -> Result<u32, DownstreamError> {
        let (s, i) = (svc.clone(), id.clone());
        let task = tokio::spawn(async move { call(&s, &i, 1).await });
        let (_r, send) = handle.next_request().await.expect("request");
        match answer {
            Ok(v) => send.send_response(v),
            Err(e) => send.send_error(e),
        }
        task.await.expect("join")
    }

    #[tokio::test(start_paused = true)]
    async fn one_tenants_timeouts_open_its_circuit_only() {
        let mut twenty = spec(false);
        twenty.breaker.failure_threshold = 20;
        let (svc, breaker, mut handle, _metrics) = counted_stack(twenty);
        let (a, b) = (tenant("a"), tenant("b"));
        for _ in 0..20 {
            time_out(&svc, &mut handle, &a).await;
        }
        assert_eq!(breaker.tenant_phase("a"), BreakerPhase::Open);
        assert_eq!(breaker.phase(), BreakerPhase::Closed);
        // A fails fast without reaching the downstream (an unanswered call
        // would end in a timeout)...
        let r = call(&svc, &a, 1).await;
        assert!(matches!(r, Err(DownstreamError::CircuitOpen)), "{r:?}");
        // ...while B is still let through and answered.
        let r = answered(&svc, &mut handle, &b, Ok(2)).await;
        assert_eq!(r.expect("b answered"), 2);
        assert_eq!(breaker.tenant_phase("b"), BreakerPhase::Closed);
        assert_eq!(breaker.phase(), BreakerPhase::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_tenants_circuit_half_opens_and_closes_on_a_healthy_trial() {
        let (svc, breaker, mut handle) = stack(false);
        let a = tenant("a");
        for _ in 0..3 {
            time_out(&svc, &mut handle, &a).await;
        }
        assert_eq!(breaker.tenant_phase("a"), BreakerPhase::Open);
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(breaker.tenant_phase("a"), BreakerPhase::HalfOpen);
        let r = answered(&svc, &mut handle, &a, Ok(8)).await;
        assert_eq!(r.expect("trial ok"), 8);
        assert_eq!(breaker.tenant_phase("a"), BreakerPhase::Closed);
        // Nothing left to remember about A.
        assert_eq!(breaker.tracked_tenants(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_from_two_tenants_open_the_shared_circuit() {
        let (svc, breaker, mut handle) = stack(false);
        let (a, b, c) = (tenant("a"), tenant("b"), tenant("c"));
        let internal = || Err(Status::internal("boom").into());
        // A healthy answer to anyone ends the run of failures.
        let _ = answered(&svc, &mut handle, &a, internal()).await;
        time_out(&svc, &mut handle, &b).await;
        let _ = answered(&svc, &mut handle, &c, Ok(1)).await;
        assert_eq!(breaker.phase(), BreakerPhase::Closed);
        // Three in a row from two tenants, and no one served for longer
        // than `healthy_within`: the downstream, not one tenant.
        tokio::time::advance(Duration::from_secs(2)).await;
        let _ = answered(&svc, &mut handle, &a, internal()).await;
        time_out(&svc, &mut handle, &b).await;
        let _ = answered(&svc, &mut handle, &a, internal()).await;
        assert_eq!(breaker.phase(), BreakerPhase::Open);
        let r = call(&svc, &c, 1).await;
        assert!(matches!(r, Err(DownstreamError::CircuitOpen)), "{r:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn tenants_failing_together_while_another_is_served_leave_it_closed() {
        let (svc, breaker, mut handle) = stack(false);
        let c = tenant("c");
        let internal = || Err(Status::internal("boom").into());
        // Hostile tenants fail together, four in a row from two of them
        // each round (each under its own threshold of three); C is
        // answered twice a second between the rounds, and first.
        let r = answered(&svc, &mut handle, &c, Ok(3)).await;
        assert_eq!(r.expect("c served"), 3);
        for round in 0..6 {
            let (a, b) = (tenant(&format!("a{round}")), tenant(&format!("b{round}")));
            for _ in 0..2 {
                let _ = answered(&svc, &mut handle, &a, internal()).await;
                let _ = answered(&svc, &mut handle, &b, internal()).await;
            }
            assert_eq!(breaker.phase(), BreakerPhase::Closed, "round {round}");
            let r = answered(&svc, &mut handle, &c, Ok(3)).await;
            assert_eq!(r.expect("c served"), 3);
            tokio::time::advance(Duration::from_millis(500)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn transport_failures_of_one_tenant_open_the_shared_circuit() {
        let (svc, breaker, mut handle) = stack(false);
        let (a, b) = (tenant("a"), tenant("b"));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let _ = answered(&svc, &mut handle, &a, Err(refused.into())).await;
        for _ in 0..2 {
            let r = answered(
                &svc,
                &mut handle,
                &a,
                Err(Status::unavailable("down").into()),
            );
            assert!(matches!(r.await, Err(DownstreamError::Status(_))));
        }
        assert_eq!(breaker.phase(), BreakerPhase::Open);
        // Not A's fault: its own circuit learned nothing.
        assert_eq!(breaker.tenant_phase("a"), BreakerPhase::Closed);
        let r = call(&svc, &b, 1).await;
        assert!(matches!(r, Err(DownstreamError::CircuitOpen)), "{r:?}");
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
