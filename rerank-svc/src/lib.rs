//! rerank-svc: cross-encoder relevance of (query, passage) pairs for Stage 3.
//! The model is optional at startup: without it the service still answers
//! health (NOT_SERVING) so the gateway can skip reranking instead of failing.

pub mod backlog;
pub mod error;
pub mod service;
pub mod worker;

use std::future::Future;
use std::path::PathBuf;

use backlog::Backlog;
use engram_common::bootstrap;
use engram_common::server::{self, ServingStatus};
use engram_common::settings::Settings;
use engram_models::CrossEncoder;
use engram_proto::rerank_service_server::RerankServiceServer;
use tokio::net::TcpListener;
use tonic::service::Routes;

pub use error::Error;
pub use service::RerankSvc;
pub use worker::ModelThread;

/// Health name: SERVING only while a cross-encoder is loaded.
pub const SERVICE_NAME: &str = "engram.v1.RerankService";

/// The installed cross-encoder's directory name under `<home>/models` and
/// `../shared/models`.
pub const CROSS_ENCODER_DIR: &str = "engram-ce-minilm-l6";

/// Requests can carry 200 candidates of 64 KiB each; tonic's 4 MiB default
/// would refuse legal requests.
const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Serves RerankService on `listener` until `shutdown`, loading the model
/// named in settings (or the installed copy) first.
pub async fn run(
    listener: TcpListener,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let model = load_model_thread(&settings).await.map_err(|e| {
        report_unavailable(&settings, &e);
        e.to_string()
    });
    run_with_model(listener, settings, model, shutdown).await
}

/// Where the cross-encoder is looked for: `models.cross_encoder_dir_opt`, else
/// the installed copy under `<home>/models`.
pub fn model_dir(settings: &Settings) -> PathBuf {
    match &settings.models.cross_encoder_dir_opt {
        Some(d) => settings.home_path(d),
        None => settings.home.join("models").join(CROSS_ENCODER_DIR),
    }
}

/// The message for a cross-encoder that could not be loaded: where it was
/// looked for and how to supply one, or how to stop asking for it.
pub fn unavailable_message(settings: &Settings, e: &Error) -> String {
    format!(
        "pipeline.cross_encoder is on but no cross-encoder could be loaded from {} ({e}); \
         the relevance check is skipped on every query. To supply one, copy \
         ../shared/models/{CROSS_ENCODER_DIR} there (done automatically when ../shared exists) \
         or point models.cross_encoder_dir_opt at any BERT-style sequence-classification \
         ONNX dir (README, Configuration); or set pipeline.cross_encoder = false",
        model_dir(settings).display()
    )
}

/// Reports a missing cross-encoder once, at start: a warning when the
/// pipeline asks for it, a debug line when it is off (nothing is lost).
pub fn report_unavailable(settings: &Settings, e: &Error) {
    if settings.pipeline.cross_encoder {
        tracing::warn!("{}", unavailable_message(settings, e));
    } else {
        tracing::debug!(error = %e, "no cross-encoder; pipeline.cross_encoder is off");
    }
}

/// [`run`] with the model supplied (or its absence and the reason), so tests
/// share one loaded model and can exercise the missing-model path.
pub async fn run_with_model(
    listener: TcpListener,
    settings: Settings,
    model: Result<ModelThread, String>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (reporter, health) = server::health();
    let status = if model.is_ok() {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    reporter.set_service_status(SERVICE_NAME, status).await;
    let opts = server::ServeOptions::internal(&settings)?;
    let svc = RerankSvc::new(model, &settings);
    let routes =
        Routes::new(RerankServiceServer::new(svc).max_decoding_message_size(MAX_MESSAGE_BYTES));
    server::serve_with(listener, routes, health, opts, shutdown).await?;
    Ok(())
}

/// Loads the cross-encoder on its own lower-priority thread (worker.rs),
/// which then serves every score request.
pub async fn load_model_thread(settings: &Settings) -> Result<ModelThread, Error> {
    let s = settings.clone();
    let backlog = Backlog::from_settings(&settings.rerank);
    ModelThread::start(move || load_model(&s), backlog).await
}

/// Loads ONNX Runtime and the cross-encoder. Blocking (may pip-install the
/// runtime on a fresh machine): call from `spawn_blocking`.
pub fn load_model(settings: &Settings) -> Result<CrossEncoder, Error> {
    let m = &settings.models;
    let lib = match &m.onnxruntime_path_opt {
        Some(p) => settings.home_path(p),
        None => bootstrap::ensure_python_packages(&settings.home)
            .map_err(|e| Error::ModelUnavailable(e.to_string()))?
            .onnxruntime_lib(),
    };
    let dir: PathBuf = match &m.cross_encoder_dir_opt {
        Some(d) => settings.home_path(d),
        None => bootstrap::ensure_cross_encoder(&settings.home).ok_or_else(|| {
            Error::ModelUnavailable(format!(
                "no model.onnx and tokenizer.json in {} nor in a shared/ folder",
                model_dir(settings).display()
            ))
        })?,
    };
    engram_models::init_ort(&lib).map_err(|e| Error::ModelUnavailable(e.to_string()))?;
    CrossEncoder::load(&dir, m.intra_threads).map_err(|e| Error::ModelUnavailable(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one start-up message names the path and both ways out.
    #[test]
    fn missing_model_message_says_how_to_supply_one() {
        let mut s = Settings {
            home: PathBuf::from("/nonexistent-home"),
            ..Settings::default()
        };
        let e = Error::ModelUnavailable("no model.onnx".into());
        let m = unavailable_message(&s, &e);
        assert!(
            m.contains("/nonexistent-home/models/engram-ce-minilm-l6"),
            "{m}"
        );
        assert!(m.contains("../shared/models/engram-ce-minilm-l6"), "{m}");
        assert!(m.contains("models.cross_encoder_dir_opt"), "{m}");
        assert!(m.contains("pipeline.cross_encoder = false"), "{m}");
        s.models.cross_encoder_dir_opt = Some(PathBuf::from("/m/ce"));
        assert!(unavailable_message(&s, &e).contains("/m/ce"));
    }
}
