//! Logging and tracing setup: JSON lines for machines, pretty output in a
//! terminal, and OpenTelemetry traces over OTLP when the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set.
//!
//! Traces reuse the `tracing` spans the code already has (through
//! `tracing-opentelemetry`), so there is one instrumentation API. The W3C
//! `traceparent` travels in gRPC metadata: [`inject_current`] on the client
//! side (the gateway's downstream calls) and [`set_remote_parent`] in the one
//! server layer every service shares (`server::serve`), which makes one
//! retrieval one trace across gateway, search, graph and rerank.
//!
//! Only the standard variables are read, so operators configure engram the
//! way they configure every other OTel-instrumented process:
//! `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`, `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`
//! (`http/protobuf`, the spec's default, or `grpc`), `..._HEADERS`,
//! `..._TIMEOUT`, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_SDK_DISABLED`, `OTEL_TRACES_EXPORTER=none`, `OTEL_TRACES_SAMPLER`.

use std::io::IsTerminal;
use std::sync::OnceLock;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{SpanExporter, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::settings::LogSettings;

/// Kept so [`shutdown`] can flush the last batch before the process exits.
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Installs the global subscriber once; later calls are no-ops (tests).
/// Call [`shutdown`] before exiting so buffered spans are exported.
pub fn init(log: &LogSettings) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .or_else(|| EnvFilter::try_new(&log.filter).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let json = match log.format.as_str() {
        "json" => true,
        "pretty" => false,
        _ => !std::io::stderr().is_terminal(),
    };
    let json_layer = json.then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            // The innermost span (the rpc) is enough context for a line.
            .with_span_list(false)
            .with_writer(std::io::stderr)
    });
    let pretty_layer =
        (!json).then(|| tracing_subscriber::fmt::layer().with_writer(std::io::stderr));
    let provider_opt = otlp_provider();
    let otel_layer = provider_opt
        .as_ref()
        .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("engram")));
    let installed = tracing_subscriber::registry()
        .with(json_layer)
        .with(pretty_layer)
        .with(otel_layer)
        .with(filter)
        .try_init()
        .is_ok();
    if installed {
        log_panics();
    }
    if let Some(provider) = provider_opt
        && installed
    {
        opentelemetry::global::set_tracer_provider(provider.clone());
        let _ = PROVIDER.set(provider);
        tracing::info!("otlp trace export enabled");
    }
}

/// Panics become one structured error event (message, location and, when
/// RUST_BACKTRACE asks for it, the backtrace as a field) instead of the
/// default hook's plain text in the middle of a JSON log.
fn log_panics() {
    std::panic::set_hook(Box::new(|info| {
        let message = crate::panic::panic_message(info.payload());
        let location = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let backtrace = std::backtrace::Backtrace::capture();
        let backtrace = match backtrace.status() {
            std::backtrace::BacktraceStatus::Captured => backtrace.to_string(),
            _ => String::new(),
        };
        tracing::error!(panic = %message, location, backtrace, "panic");
    }));
}

/// Flushes and stops the OTLP exporter (no-op without one). Bounded by the
/// exporter's own timeout, so a dead collector cannot hang the exit.
pub fn shutdown() {
    if let Some(p) = PROVIDER.get()
        && let Err(e) = p.shutdown()
    {
        eprintln!("engram: trace export shutdown: {e}");
    }
}

fn env(key: &str) -> Option<String> {
    std::env::var(key)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// The tracer provider when OTLP export is configured and not disabled; an
/// exporter that cannot be built costs a warning, never the service.
fn otlp_provider() -> Option<SdkTracerProvider> {
    if env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
    {
        return None;
    }
    env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"))?;
    let protocol = env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_else(|| "http/protobuf".into());
    let exporter = match protocol.as_str() {
        "grpc" => grpc_exporter(),
        other => {
            if other != "http/protobuf" {
                eprintln!(
                    "engram: OTEL_EXPORTER_OTLP_PROTOCOL={other} is not supported; using http/protobuf"
                );
            }
            SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .build()
                .map_err(|e| e.to_string())
        }
    };
    let exporter = match exporter {
        Ok(e) => e,
        Err(e) => {
            // The subscriber is not installed yet, so stderr directly.
            eprintln!("engram: otlp trace exporter unavailable, traces off: {e}");
            return None;
        }
    };
    let mut resource = Resource::builder();
    if env("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("engram");
    }
    Some(
        SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build(),
    )
}

/// The tonic exporter needs a Tokio runtime for its channel, and `init` runs
/// before the service runtime exists; a one-thread runtime of its own also
/// keeps export I/O off the serving runtime.
fn grpc_exporter() -> Result<SpanExporter, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("otlp-grpc".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    return;
                }
            };
            rt.block_on(async move {
                let built = SpanExporter::builder()
                    .with_tonic()
                    .build()
                    .map_err(|e| e.to_string());
                let _ = tx.send(built);
                // Drives the channel's connection tasks for the process' life.
                std::future::pending::<()>().await;
            });
        })
        .map_err(|e| e.to_string())?;
    rx.recv().map_err(|e| e.to_string())?
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

struct MetadataInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            tonic::metadata::MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(k, v);
        }
    }
}

/// Makes `span` a child of the caller's span when the request carries a
/// valid W3C `traceparent`; must run before `span` is first entered.
pub fn set_remote_parent(span: &tracing::Span, headers: &http::HeaderMap) {
    let cx = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    if cx.span().span_context().is_valid() {
        // Only fails when the span already started, which callers rule out.
        let _ = span.set_parent(cx);
    }
}

/// Writes the current span's W3C trace context into outgoing metadata
/// (nothing when tracing is off, so the downstream starts no false trace).
pub fn inject_current(md: &mut tonic::metadata::MetadataMap) {
    let cx = tracing::Span::current().context();
    if cx.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(&cx, &mut MetadataInjector(md));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

    #[test]
    fn traceparent_round_trips_through_metadata() {
        let sc = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("trace id"),
            SpanId::from_hex("00f067aa0ba902b7").expect("span id"),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        let cx = opentelemetry::Context::new().with_remote_span_context(sc);
        let mut md = tonic::metadata::MetadataMap::new();
        TraceContextPropagator::new().inject_context(&cx, &mut MetadataInjector(&mut md));
        assert_eq!(
            md.get("traceparent").and_then(|v| v.to_str().ok()),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        let headers = md.into_headers();
        let back = TraceContextPropagator::new().extract(&HeaderExtractor(&headers));
        assert_eq!(
            back.span().span_context().trace_id(),
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("trace id")
        );
    }

    #[test]
    fn no_context_injects_nothing() {
        let mut md = tonic::metadata::MetadataMap::new();
        inject_current(&mut md);
        assert!(md.get("traceparent").is_none());
    }
}
