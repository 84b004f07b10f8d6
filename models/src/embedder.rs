//! Sentence embeddings with all-MiniLM-L6-v2, computed exactly like the
//! sentence-transformers pipeline (and the Python reference baseline):
//! truncate at 256 tokens, mean-pool the token embeddings over the attention
//! mask, L2-normalise.

use std::path::Path;
use std::sync::Mutex;

use ort::session::Session;
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use crate::{Batch, BertInputs, ModelError};

pub const EMBEDDING_DIM: usize = 384;

/// `max_seq_length` of the sentence-transformers config of the model.
const MAX_TOKENS: usize = 256;

/// Texts per inference call.
const MAX_BATCH: usize = 32;

/// Padded tokens per inference call. ONNX Runtime's arena keeps its peak:
/// 32 texts of 256 tokens took the search process from 235 MB to 1.4 GB
/// (attention alone is batch x 12 heads x 256^2 floats per layer), so long
/// texts go in smaller batches; short ones (queries) still go 32 at a time.
const MAX_BATCH_TOKENS: usize = 2048;

pub struct Embedder {
    /// `Session::run` takes `&mut self`; inference is serialised per model.
    session: Mutex<Session>,
    tokenizer: Tokenizer,
    inputs: BertInputs,
    output: String,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder")
            .field("output", &self.output)
            .finish_non_exhaustive()
    }
}

impl Embedder {
    pub fn load(model: &Path, tokenizer: &Path, intra_threads: usize) -> Result<Self, ModelError> {
        let session = crate::open_session(model, intra_threads)?;
        let inputs = BertInputs::discover(&session)?;
        let output = session
            .outputs()
            .iter()
            .find(|o| o.name() == "last_hidden_state")
            .or_else(|| session.outputs().first())
            .map(|o| o.name().to_string())
            .ok_or_else(|| ModelError::Output("model declares no outputs".into()))?;
        let mut tokenizer = crate::load_tokenizer(tokenizer)?;
        tokenizer
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length: MAX_TOKENS,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(|e| ModelError::Encode(e.to_string()))?;
        tracing::info!(model = %model.display(), output = %output, "embedding model loaded");
        Ok(Self {
            session: Mutex::new(session),
            tokenizer,
            inputs,
            output,
        })
    }

    /// Unit-length vectors of [`EMBEDDING_DIM`] floats, one per text, in
    /// order. CPU-heavy: call from a blocking thread.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, ModelError> {
        let encodings = self
            .tokenizer
            .encode_batch_fast(texts.to_vec(), true)
            .map_err(|e| ModelError::Encode(e.to_string()))?;
        // Batches of similar length waste little on padding; this model's
        // vectors do not depend on batch composition (checked against the
        // Python reference, batched and one at a time), so sorting is free.
        let mut order: Vec<usize> = (0..encodings.len()).collect();
        order.sort_by_key(|&i| encodings[i].len());
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); encodings.len()];
        let lengths: Vec<usize> = order.iter().map(|&i| encodings[i].len()).collect();
        let mut start = 0;
        for size in batch_sizes(&lengths) {
            let chunk = &order[start..start + size];
            start += size;
            let batch: Vec<tokenizers::Encoding> =
                chunk.iter().map(|&i| encodings[i].clone()).collect();
            for (&i, v) in chunk.iter().zip(self.embed_batch(&batch)?) {
                out[i] = v;
            }
        }
        Ok(out)
    }

    fn embed_batch(&self, encodings: &[tokenizers::Encoding]) -> Result<Vec<Vec<f32>>, ModelError> {
        let batch = Batch::from_encodings(encodings);
        let (rows, cols) = (batch.rows, batch.cols);
        let mask = batch.mask.clone();
        let inputs = batch.into_inputs(self.inputs)?;
        let mut session = self
            .session
            .lock()
            .map_err(|_| ModelError::Inference("model lock poisoned by an earlier panic".into()))?;
        let outputs = session
            .run(inputs)
            .map_err(|e| ModelError::Inference(e.to_string()))?;
        let value = outputs
            .get(&self.output)
            .ok_or_else(|| ModelError::Output(format!("missing output {}", self.output)))?;
        let (shape, data) = value
            .try_extract_tensor::<f32>()
            .map_err(|e| ModelError::Output(e.to_string()))?;
        let dims: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
        let vectors = match dims.as_slice() {
            [b, s, d] if *b == rows && *s == cols && *d == EMBEDDING_DIM => {
                mean_pool(data, &mask, rows, cols)
            }
            [b, d] if *b == rows && *d == EMBEDDING_DIM => data
                .chunks_exact(EMBEDDING_DIM)
                .map(<[f32]>::to_vec)
                .collect(),
            _ => {
                return Err(ModelError::Output(format!(
                    "output {} has shape {dims:?}, expected [{rows}, {cols}, {EMBEDDING_DIM}] or [{rows}, {EMBEDDING_DIM}]",
                    self.output
                )));
            }
        };
        Ok(vectors.into_iter().map(normalise).collect())
    }
}

/// Mean of the token vectors where the mask is 1 (sentence-transformers'
/// "mean" pooling; the mask sum is clamped at 1e-9 like theirs).
fn mean_pool(hidden: &[f32], mask: &[i64], rows: usize, cols: usize) -> Vec<Vec<f32>> {
    (0..rows)
        .map(|r| {
            let mut acc = vec![0f32; EMBEDDING_DIM];
            let mut count = 0f32;
            for c in 0..cols {
                if mask[r * cols + c] == 0 {
                    continue;
                }
                count += 1.0;
                let base = (r * cols + c) * EMBEDDING_DIM;
                for (a, h) in acc.iter_mut().zip(&hidden[base..base + EMBEDDING_DIM]) {
                    *a += h;
                }
            }
            let count = count.max(1e-9);
            acc.iter_mut().for_each(|a| *a /= count);
            acc
        })
        .collect()
}

fn normalise(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

/// Consecutive batch sizes over texts sorted by ascending token count: each
/// batch at most [`MAX_BATCH`] texts and [`MAX_BATCH_TOKENS`] padded tokens
/// (its longest text times its size), at least one text.
fn batch_sizes(sorted_lengths: &[usize]) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut size = 0;
    for &len in sorted_lengths {
        if size > 0 && (size == MAX_BATCH || (size + 1) * len > MAX_BATCH_TOKENS) {
            sizes.push(size);
            size = 0;
        }
        size += 1;
    }
    if size > 0 {
        sizes.push(size);
    }
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support;

    fn embedder() -> Embedder {
        test_support::init();
        let (model, tok) = test_support::embedder_files();
        Embedder::load(&model, &tok, 2).expect("embedder (installed by the CI script)")
    }

    fn cos(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    fn vm_hwm_mb() -> f64 {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmHWM:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<f64>().ok())
            })
            .unwrap_or(0.0)
            / 1024.0
    }

    /// Peak RSS of embedding long passages (run alone: VmHWM is per process).
    #[test]
    #[ignore]
    fn embed_peak_rss() {
        let e = embedder();
        let before = vm_hwm_mb();
        let text = "The quick brown fox jumps over the lazy dog near the river bank. ".repeat(40);
        let texts: Vec<&str> = (0..256).map(|_| text.as_str()).collect();
        let t = std::time::Instant::now();
        e.embed(&texts).expect("embed");
        println!(
            "peak rss before {before:.0} MB, after {:.0} MB, {:.0} ms for 256 x 256 tokens",
            vm_hwm_mb(),
            t.elapsed().as_secs_f64() * 1e3
        );
    }

    #[test]
    fn batches_are_bounded_by_texts_and_padded_tokens() {
        assert_eq!(batch_sizes(&[]), Vec::<usize>::new());
        // Queries: short, 32 per call.
        assert_eq!(batch_sizes(&[12; 70]), vec![32, 32, 6]);
        // Long passages: 2048 / 256 = 8 per call.
        assert_eq!(batch_sizes(&[256; 20]), vec![8, 8, 4]);
        // Mixed (sorted): the batch closes when its longest text would
        // push it past the token budget.
        let mut lens = vec![10; 5];
        lens.extend([200; 12]);
        let sizes = batch_sizes(&lens);
        assert_eq!(sizes.iter().sum::<usize>(), 17);
        let mut start = 0;
        for size in sizes {
            let longest = lens[start + size - 1];
            assert!(
                size == 1 || size * longest <= MAX_BATCH_TOKENS,
                "{size} x {longest}"
            );
            start += size;
        }
    }

    #[test]
    fn embedder_is_send_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Embedder>();
    }

    #[test]
    fn related_sentences_are_closer_than_unrelated() {
        let e = embedder();
        let v = e
            .embed(&[
                "what is the capital of france",
                "Paris is the capital of France",
                "bananas are rich in potassium",
            ])
            .expect("embed");
        assert_eq!(v.len(), 3);
        for x in &v {
            assert_eq!(x.len(), EMBEDDING_DIM);
            let n: f32 = x.iter().map(|a| a * a).sum();
            assert!((n - 1.0).abs() < 1e-4, "not unit length: {n}");
        }
        let rel = cos(&v[0], &v[1]);
        let unrel = cos(&v[0], &v[2]);
        assert!(rel > unrel + 0.3, "related {rel} vs unrelated {unrel}");
    }

    #[test]
    fn matches_the_python_reference() {
        // First 8 components for "what is the capital of france", from the
        // Python baseline (onnxruntime 1.31.1, tokenizers, same model files).
        let e = embedder();
        let v = e.embed(&["what is the capital of france"]).expect("embed");
        let expected = REFERENCE_HEAD;
        for (i, (got, want)) in v[0].iter().zip(expected).enumerate() {
            assert!((got - want).abs() < 1e-4, "component {i}: {got} vs {want}");
        }
    }

    #[test]
    fn vectors_do_not_depend_on_batch_composition() {
        let e = embedder();
        let texts = [
            "a short one",
            "a considerably longer sentence about the memory of an agent that talks to users every day",
            "what is the capital of france",
        ];
        let batched = e.embed(&texts).expect("batched");
        for (t, b) in texts.iter().zip(&batched) {
            let single = e.embed(&[t]).expect("single");
            let c = cos(&single[0], b);
            assert!(c > 0.99999, "{t}: cos {c}");
        }
    }

    #[test]
    fn long_text_is_truncated_and_empty_batch_is_empty() {
        let e = embedder();
        let long = "memory ".repeat(5000);
        let v = e.embed(&[long.as_str(), ""]).expect("embed");
        assert_eq!(v.len(), 2);
        assert!(v.iter().all(|x| x.iter().all(|a| a.is_finite())));
        assert!(e.embed(&[]).expect("empty").is_empty());
    }

    const REFERENCE_HEAD: [f32; 8] = [
        0.066_611_79,
        -0.009_878_338,
        0.023_949_08,
        -0.021_882_08,
        0.079_778_02,
        -0.064_490_55,
        0.004_128_955,
        -0.003_314_219,
    ];
}
