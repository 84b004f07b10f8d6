//! TLS between engram's services (rustls through tonic): search-svc,
//! graph-svc and rerank-svc serve TLS when `[tls]` names a certificate and
//! key, and every internal client (the gateway, health probes, the stack)
//! verifies them against `tls.ca_path_opt`. The gateway's public port is
//! not covered: it sits behind the deployment's ingress, which terminates
//! TLS for clients.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

use crate::settings::TlsSettings;

fn read(path: &Path, what: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading tls {what} {}", path.display()))
}

/// The server side for an internal service, when a certificate is set.
pub fn server_config(s: &TlsSettings) -> anyhow::Result<Option<ServerTlsConfig>> {
    match (&s.cert_path_opt, &s.key_path_opt) {
        (Some(cert), Some(key)) => {
            let identity = Identity::from_pem(read(cert, "certificate")?, read(key, "key")?);
            Ok(Some(ServerTlsConfig::new().identity(identity)))
        }
        (None, None) => Ok(None),
        _ => anyhow::bail!("tls.cert_path_opt and tls.key_path_opt must be set together"),
    }
}

/// `https` when internal calls are verified against a CA, else `http`.
pub fn scheme(s: &TlsSettings) -> &'static str {
    match s.ca_path_opt {
        Some(_) => "https",
        None => "http",
    }
}

/// An endpoint for an internal service at `uri`: TLS verified against the
/// configured CA (and `tls.server_name`) when one is set.
pub fn endpoint(uri: &str, s: &TlsSettings) -> anyhow::Result<Endpoint> {
    let endpoint = Endpoint::from_shared(uri.to_string())
        .with_context(|| format!("internal uri {uri}"))?
        .connect_timeout(Duration::from_secs(1))
        .tcp_nodelay(true);
    let Some(ca) = &s.ca_path_opt else {
        return Ok(endpoint);
    };
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(ca, "ca")?))
        .domain_name(s.server_name.clone());
    endpoint
        .tls_config(tls)
        .with_context(|| format!("tls for {uri}"))
}

/// An internal service's URI at `addr`, in the scheme the settings call for.
pub fn uri(addr: std::net::SocketAddr, s: &TlsSettings) -> String {
    format!("{}://{addr}", scheme(s))
}
