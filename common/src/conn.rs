//! How long a connection may hold a port without asking for anything.
//!
//! A connection costs a socket, a task and buffers whether or not it ever
//! sends a request, and neither `axum::serve` nor tonic's server bounds the
//! time before the first one: a client that connected and sent nothing, or
//! half a header, was held as long as it liked (issue 47, item 17: 70 s in
//! the attack round, 900 connections at once for 25 s). Here:
//!
//! - HTTP/1 ([`serve_http`], the Foundry HTTP API and the admin port): a
//!   request's headers must arrive within `listen.header_read_timeout_ms`
//!   of the connection opening or of the previous response (hyper's own
//!   header-read timeout, which `axum::serve` leaves unset), so the same
//!   bound is the keep-alive idle bound.
//! - gRPC ([`Bounded`] around every accepted socket, [`ActivityLayer`] in
//!   the server's stack; `server::serve_with`): a connection with no call in
//!   flight is closed `listen.header_read_timeout_ms` after it opened (TLS
//!   and HTTP/2 handshakes included) and `listen.idle_timeout_ms` after its
//!   last call ended. A call in flight (a unary call until its answer is
//!   sent, a stream until it ends) holds it open however long it runs.
//!   HTTP/2 keepalive pings (`listen.http2_keepalive_*`) close a peer that
//!   stops answering sooner.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::time::{Instant, Sleep};

// ------------------------------------------------------------------ HTTP/1

/// Serves `router` over HTTP/1.1 on `listener` until `shutdown`, then lets
/// open requests finish (as `axum::serve(..).with_graceful_shutdown`).
/// Every request's headers must arrive within `header_read` of the
/// connection opening or of the previous response; a connection that sends
/// nothing, or half a header, is closed then.
pub async fn serve_http(
    listener: TcpListener,
    router: axum::Router,
    header_read: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header_read)
        .keep_alive(true);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let tcp = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    accept_error(e).await;
                    continue;
                }
            },
        };
        // NODELAY: a response written in pieces must not wait on delayed ACKs.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "tcp nodelay not set");
        }
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let conn =
            graceful.watch(http1.serve_connection(hyper_util::rt::TokioIo::new(tcp), service));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "http connection ended");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// A failed accept: a connection that went away before it was accepted is
/// skipped; anything else (out of file descriptors) waits a second so the
/// loop does not spin, as `axum::serve` does.
async fn accept_error(e: io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
        return;
    }
    tracing::warn!(error = %e, "accept failed; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

// -------------------------------------------------------------------- gRPC

/// How long a gRPC connection may go without a call in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// From the connection opening to its first call.
    pub first_call: Duration,
    /// From the end of its last call to the next.
    pub idle: Duration,
}

impl Limits {
    /// While a call is in flight, how often the socket looks again.
    fn recheck(self) -> Duration {
        self.first_call.min(self.idle).max(Duration::from_millis(1))
    }
}

/// A connection's calls in flight and since when it has had none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    in_flight: usize,
    /// The connection's opening, or the end of its last call.
    idle_since: Instant,
    called: bool,
}

impl State {
    fn new(now: Instant) -> Self {
        Self {
            in_flight: 0,
            idle_since: now,
            called: false,
        }
    }

    /// When the connection is to be closed unless a call starts first;
    /// `None` while one is in flight.
    fn deadline(&self, limits: Limits) -> Option<Instant> {
        if self.in_flight > 0 {
            return None;
        }
        let limit = if self.called {
            limits.idle
        } else {
            limits.first_call
        };
        Some(self.idle_since + limit)
    }

    fn start(&mut self) {
        self.in_flight += 1;
        self.called = true;
    }

    fn end(&mut self, now: Instant) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if self.in_flight == 0 {
            self.idle_since = now;
        }
    }
}

/// Shared by a connection's socket ([`Bounded`]) and its calls
/// ([`ActivityLayer`]).
#[derive(Debug)]
struct Activity(Mutex<State>);

impl Activity {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is two numbers and a flag, valid after any panic.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn start(self: &Arc<Self>) -> CallGuard {
        self.state().start();
        CallGuard(self.clone())
    }
}

/// One call in flight on a connection; dropped when the call ends (its
/// response body is done or dropped, or the caller went away).
#[derive(Debug)]
struct CallGuard(Arc<Activity>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.0.state().end(Instant::now());
    }
}

/// An accepted socket that fails its reads, which ends the connection, once
/// it has had no call in flight for its [`Limits`].
pub struct Bounded<T> {
    io: T,
    activity: Arc<Activity>,
    limits: Limits,
    timer: Pin<Box<Sleep>>,
}

impl<T> Bounded<T> {
    pub fn new(io: T, limits: Limits) -> Self {
        let now = Instant::now();
        Self {
            io,
            activity: Arc::new(Activity(Mutex::new(State::new(now)))),
            limits,
            timer: Box::pin(tokio::time::sleep_until(now + limits.first_call)),
        }
    }

    /// Ready with the error to end the connection once its time without a
    /// call is up; otherwise the timer is set to wake this read then (or to
    /// look again, while a call is in flight).
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            let now = Instant::now();
            let deadline = self.activity.state().deadline(self.limits);
            let at = match deadline {
                Some(at) if at <= now => {
                    return Poll::Ready(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no request on this connection in time",
                    ));
                }
                Some(at) => at,
                None if self.timer.deadline() > now => self.timer.deadline(),
                None => now + self.limits.recheck(),
            };
            if self.timer.deadline() != at {
                self.timer.as_mut().reset(at);
            }
            if self.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Bounded<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Pending => this.poll_expired(cx).map(Err),
            ready => ready,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Bounded<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// What tonic puts in each request's extensions for a [`Bounded`] socket:
/// the socket's own connect info, and the connection's activity, which
/// [`ActivityLayer`] counts the call in.
#[derive(Debug, Clone)]
pub struct BoundedInfo<I> {
    pub inner: I,
    activity: Arc<Activity>,
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for Bounded<T> {
    type ConnectInfo = BoundedInfo<T::ConnectInfo>;

    fn connect_info(&self) -> Self::ConnectInfo {
        BoundedInfo {
            inner: self.io.connect_info(),
            activity: self.activity.clone(),
        }
    }
}

/// Counts each call as in flight on its connection until its response body
/// ends or is dropped. A request from a socket that is not [`Bounded`]
/// passes untouched.
#[derive(Debug, Clone, Copy, Default)]
pub struct ActivityLayer;

impl<S> tower::Layer<S> for ActivityLayer {
    type Service = Active<S>;

    fn layer(&self, inner: S) -> Active<S> {
        Active { inner }
    }
}

/// See [`ActivityLayer`].
#[derive(Debug, Clone)]
pub struct Active<S> {
    inner: S,
}

type TcpInfo = BoundedInfo<tonic::transport::server::TcpConnectInfo>;

impl<S, B, RB> tower::Service<http::Request<B>> for Active<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<HeldBody<RB>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // tonic inserts the socket's info for TLS connections too.
        let call = req
            .extensions()
            .get::<TcpInfo>()
            .map(|info| info.activity.start());
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            Ok(resp.map(|body| HeldBody { body, _call: call }))
        })
    }
}

/// A response body that keeps its call counted in flight while it lives.
#[derive(Debug)]
pub struct HeldBody<B> {
    body: B,
    _call: Option<CallGuard>,
}

impl<B: http_body::Body + Unpin> http_body::Body for HeldBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    const LIMITS: Limits = Limits {
        first_call: Duration::from_secs(10),
        idle: Duration::from_secs(60),
    };

    #[test]
    fn the_first_call_and_the_idle_time_are_bounded_and_a_call_in_flight_is_not() {
        let t0 = Instant::now();
        let mut s = State::new(t0);
        assert_eq!(s.deadline(LIMITS), Some(t0 + LIMITS.first_call));
        s.start();
        s.start();
        assert_eq!(s.deadline(LIMITS), None, "two calls in flight");
        s.end(t0 + Duration::from_secs(100));
        assert_eq!(s.deadline(LIMITS), None, "one call still in flight");
        let t1 = t0 + Duration::from_secs(200);
        s.end(t1);
        assert_eq!(s.deadline(LIMITS), Some(t1 + LIMITS.idle));
        s.end(t1 + Duration::from_secs(1));
        assert_eq!(s.in_flight, 0, "an extra end never underflows");
    }

    /// The socket wrapper on the paused clock: reads fail once the time
    /// without a call is up, never while a call is in flight, and bytes
    /// alone (half a header, trickled) never extend it.
    #[tokio::test(start_paused = true)]
    async fn a_socket_without_a_call_in_flight_fails_its_reads_in_time() {
        let (mut client, server) = tokio::io::duplex(1024);
        let mut bounded = Bounded::new(server, LIMITS);
        let t0 = Instant::now();
        // Trickled bytes are read, but do not move the deadline.
        for _ in 0..4 {
            client.write_all(b"P").await.expect("write");
            let mut buf = [0u8; 8];
            assert_eq!(bounded.read(&mut buf).await.expect("read"), 1);
            tokio::time::advance(Duration::from_secs(2)).await;
        }
        let mut buf = [0u8; 8];
        let e = bounded.read(&mut buf).await.expect_err("closed");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let waited = Instant::now() - t0;
        assert!(waited >= LIMITS.first_call, "{waited:?}");
        assert!(
            waited < LIMITS.first_call + Duration::from_secs(1),
            "{waited:?}"
        );
        drop(client);

        // A call in flight holds the connection past both limits.
        let (_client, server) = tokio::io::duplex(1024);
        let mut bounded = Bounded::new(server, LIMITS);
        let call = bounded.activity.start();
        let read = tokio::time::timeout(Duration::from_secs(600), bounded.read(&mut buf)).await;
        assert!(read.is_err(), "still waiting after 600 s: {read:?}");
        // Its end starts the idle time.
        let ended = Instant::now();
        drop(call);
        let e = bounded.read(&mut buf).await.expect_err("closed");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let waited = Instant::now() - ended;
        assert!(waited >= LIMITS.idle, "{waited:?}");
        assert!(waited < LIMITS.idle + Duration::from_secs(1), "{waited:?}");
    }

    /// A real HTTP/1 server on port 0: a connection that sends nothing, or
    /// half a header, is closed once the header-read time is up; a full
    /// request is answered, and the kept-alive connection is closed once
    /// the next header is that late.
    #[tokio::test]
    async fn http_connections_without_a_header_in_time_are_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let router = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_http(
            listener,
            router,
            Duration::from_millis(200),
            async {
                let _ = rx.await;
            },
        ));
        for sent in [&b""[..], b"GET / HTTP/1.1\r\nHost: x\r\n"] {
            let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
            tcp.write_all(sent).await.expect("write");
            let t0 = std::time::Instant::now();
            let mut rest = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut rest));
            assert!(read.await.is_ok(), "{sent:?}: still open after 5 s");
            assert!(t0.elapsed() >= Duration::from_millis(150), "{sent:?}");
        }
        let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let mut all = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut all));
        assert!(read.await.is_ok(), "the kept-alive connection stayed open");
        let text = String::from_utf8_lossy(&all);
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.ends_with("ok"), "{text}");
        let _ = tx.send(());
        server.await.expect("join").expect("serve");
    }
}
