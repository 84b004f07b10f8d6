//! The request-deadline layer of a downstream stack: a call made with 80 ms
//! of the pipeline left gives up after 80 ms even when the stack allows 300
//! ([`Call::deadline_opt`]), so call sites need no second `timeout_at`
//! around the stack. It sits outside retry and the breaker and ends the call
//! with [`DeadlineReached`]: the caller ran out of time, which says nothing
//! about the downstream, so the breaker stays neutral and the metrics count
//! it as `deadline`. The stack's own timeout is a separate layer inside the
//! breaker.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tower::{BoxError, Layer, Service};

use super::Call;

/// The call's request deadline passed before it finished.
#[derive(Debug, thiserror::Error)]
#[error("request deadline reached")]
pub struct DeadlineReached;

#[derive(Debug, Clone, Copy, Default)]
pub struct DeadlineLayer;

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;
    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline { inner }
    }
}

#[derive(Debug, Clone)]
pub struct Deadline<S> {
    inner: S,
}

impl<S, T> Service<Call<T>> for Deadline<S>
where
    S: Service<Call<T>>,
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

    fn call(&mut self, req: Call<T>) -> Self::Future {
        let deadline_opt = req.deadline_opt;
        let fut = self.inner.call(req);
        Box::pin(async move {
            let Some(deadline) = deadline_opt else {
                return fut.await.map_err(Into::into);
            };
            match tokio::time::timeout_at(deadline, fut).await {
                Ok(r) => r.map_err(Into::into),
                Err(_) => Err(DeadlineReached.into()),
            }
        })
    }
}
