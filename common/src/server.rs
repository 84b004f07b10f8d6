//! gRPC server scaffolding shared by every service: standard health and
//! reflection (v1 and v1alpha, so grpcurl 1.8 works too) and graceful
//! shutdown. Each service exposes `run(listener, shutdown)` built on this.

use std::future::Future;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::Routes;
use tonic::transport::Server;
use tonic_health::server::{HealthReporter, HealthService};

pub use tonic_health::ServingStatus;
pub use tonic_health::pb::health_server::HealthServer;

/// A fresh health service and the reporter that drives it.
pub fn health() -> (HealthReporter, HealthServer<HealthService>) {
    let reporter = HealthReporter::new();
    let service = HealthServer::new(HealthService::from_health_reporter(reporter.clone()));
    (reporter, service)
}

/// Serves `routes` plus health and reflection on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    routes: Routes,
    health: HealthServer<HealthService>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(engram_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let mut routes = routes.add_service(health);
    // Reflection only fails on a malformed descriptor set, which is a build bug.
    match builder().build_v1() {
        Ok(v1) => routes = routes.add_service(v1),
        Err(e) => tracing::error!(error = %e, "reflection v1 unavailable"),
    }
    match builder().build_v1alpha() {
        Ok(v1a) => routes = routes.add_service(v1a),
        Err(e) => tracing::error!(error = %e, "reflection v1alpha unavailable"),
    }
    Server::builder()
        .add_routes(routes)
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
}

/// Binds `addr`, turning "address in use" into one line with the fix.
pub async fn bind(addr: &str, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            anyhow::anyhow!(
                "{what}: address {addr} is already in use; stop the other process or set ENGRAM__LISTEN__{}=127.0.0.1:<port>",
                what.to_ascii_uppercase()
            )
        } else {
            anyhow::anyhow!("{what}: cannot listen on {addr}: {e}")
        }
    })
}

/// The client's deadline from the `grpc-timeout` header, if any; every
/// service caps its own budget with it.
pub fn grpc_timeout(md: &tonic::metadata::MetadataMap) -> Option<Duration> {
    parse_grpc_timeout(md.get("grpc-timeout")?.to_str().ok()?)
}

/// `grpc-timeout` value: digits then H, M, S, m, u or n (e.g. "2500m").
pub fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    let (num, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}
