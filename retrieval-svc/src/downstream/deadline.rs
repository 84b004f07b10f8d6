//! The timeout layer of a downstream stack. Unlike `tower::timeout` it also
//! honours the deadline the request carries ([`Call::deadline_opt`]): a call
//! made with 80 ms of the pipeline left gives up after 80 ms even when the
//! stack allows 300, so call sites need no second `timeout_at` around the
//! stack, and the call is counted (metrics, breaker) like any other timeout.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tower::timeout::error::Elapsed;
use tower::{BoxError, Layer, Service};

use super::Call;

#[derive(Debug, Clone, Copy)]
pub struct DeadlineLayer {
    timeout: Duration,
}

impl DeadlineLayer {
    pub fn new(timeout: Duration) -> Self {
        Self { timeout }
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;
    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline {
            inner,
            timeout: self.timeout,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Deadline<S> {
    inner: S,
    timeout: Duration,
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
        let own = Instant::now() + self.timeout;
        let until = req.deadline_opt.map_or(own, |d| d.min(own));
        let fut = self.inner.call(req);
        Box::pin(async move {
            match tokio::time::timeout_at(until, fut).await {
                Ok(r) => r.map_err(Into::into),
                Err(_) => Err(Elapsed::new().into()),
            }
        })
    }
}
