//! The project's cross-encoder (BERT sequence classification, one logit):
//! relevance of (query, passage) pairs, encoded the way it was trained
//! (`truncation='only_second'`, query = segment 0, passage = segment 1).

use ort::session::Session;
use std::path::Path;
use tokenizers::utils::truncation::truncate_encodings;
use tokenizers::{
    Encoding, PostProcessor, Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy,
};

use crate::sessions::Sessions;
use crate::{Batch, BertInputs, ModelError};

/// Longest pair the model's position embeddings allow.
pub const MAX_PAIR_TOKENS: usize = 512;

/// Passages are cut to this many bytes per allowed token before
/// tokenizing: a WordPiece token covers at least one non-space character,
/// so only text that is nearly all whitespace could lose tokens it would
/// have kept, and a 64 KiB passage no longer costs a full tokenization.
const BYTES_PER_TOKEN_CAP: usize = 32;

pub struct CrossEncoder {
    /// Single-threaded sessions scoring a request's pairs side by side
    /// (crate::sessions).
    sessions: Sessions,
    tokenizer: Tokenizer,
    inputs: BertInputs,
    output: String,
}

impl std::fmt::Debug for CrossEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrossEncoder")
            .field("output", &self.output)
            .finish_non_exhaustive()
    }
}

impl CrossEncoder {
    /// `dir` holds `model.onnx` and `tokenizer.json`. `threads` (0 = the
    /// machine's cores) is split into that many single-threaded sessions.
    pub fn load(dir: &Path, threads: usize) -> Result<Self, ModelError> {
        Self::load_with(dir, crate::resolve_threads(threads), 1)
    }

    /// `sessions` sessions of `intra_threads` intra-op threads each.
    pub fn load_with(
        dir: &Path,
        sessions: usize,
        intra_threads: usize,
    ) -> Result<Self, ModelError> {
        let model = dir.join("model.onnx");
        let sessions = Sessions::open(&model, sessions, intra_threads)?;
        let (inputs, output) = sessions.bert_io("logits")?;
        let tokenizer = crate::load_tokenizer(&dir.join("tokenizer.json"))?;
        tracing::info!(model = %model.display(), sessions = sessions.len(), intra_threads, "cross-encoder loaded");
        Ok(Self {
            sessions,
            tokenizer,
            inputs,
            output,
        })
    }

    /// sigmoid(logit) per passage, in order. `max_length` (2..=512) bounds
    /// each pair including special tokens; passages are truncated first.
    /// CPU-heavy: call from a blocking thread.
    pub fn score(
        &self,
        query: &str,
        passages: &[&str],
        max_length: usize,
    ) -> Result<Vec<f32>, ModelError> {
        Ok(self
            .logits(query, passages, max_length)?
            .into_iter()
            .map(sigmoid)
            .collect())
    }

    /// Raw logits, in order.
    pub fn logits(
        &self,
        query: &str,
        passages: &[&str],
        max_length: usize,
    ) -> Result<Vec<f32>, ModelError> {
        if passages.is_empty() {
            return Ok(Vec::new());
        }
        let encodings = self.encode_pairs(query, passages, max_length)?;
        // One pair per run, never a padded batch: the int8 model quantises
        // activations per batch, so batching moves a pair's logit by up to
        // 0.3 depending on its neighbours (1.41 instead of the reference
        // 1.69 for the check pair). Unbatched scores are reproducible; the
        // sessions split the pairs by length (crate::sessions), each on its
        // own thread.
        let lengths: Vec<usize> = encodings.iter().map(|e| e.get_ids().len()).collect();
        self.sessions
            .run_each(&lengths, |session, i| self.run_one(session, &encodings[i]))
    }

    fn run_one(&self, session: &mut Session, enc: &Encoding) -> Result<f32, ModelError> {
        let inputs = Batch::from_encodings(std::slice::from_ref(enc)).into_inputs(self.inputs)?;
        let outputs = session
            .run(inputs)
            .map_err(|e| ModelError::Inference(e.to_string()))?;
        let value = outputs
            .get(&self.output)
            .ok_or_else(|| ModelError::Output(format!("missing output {}", self.output)))?;
        let (shape, data) = value
            .try_extract_tensor::<f32>()
            .map_err(|e| ModelError::Output(e.to_string()))?;
        match (&shape[..], data) {
            ([1] | [1, 1], [logit]) => Ok(*logit),
            (dims, _) => Err(ModelError::Output(format!(
                "output {} has shape {dims:?}, expected [1, 1]",
                self.output
            ))),
        }
    }

    fn encode_pairs(
        &self,
        query: &str,
        passages: &[&str],
        max_length: usize,
    ) -> Result<Vec<Encoding>, ModelError> {
        let processor = self
            .tokenizer
            .get_post_processor()
            .ok_or_else(|| ModelError::Encode("tokenizer has no post-processor".into()))?;
        let added = processor.added_tokens(true);
        if max_length <= added || max_length > MAX_PAIR_TOKENS {
            return Err(ModelError::InvalidArgument(format!(
                "max_length must be in {}..={MAX_PAIR_TOKENS}, got {max_length}",
                added + 1
            )));
        }
        let budget = max_length - added;
        let enc_err = |e: tokenizers::Error| ModelError::Encode(e.to_string());
        let query_enc = self.tokenizer.encode_fast(query, false).map_err(enc_err)?;
        let byte_cap = max_length * BYTES_PER_TOKEN_CAP;
        let cut: Vec<&str> = passages.iter().map(|p| cut_at(p, byte_cap)).collect();
        let passage_encs = self
            .tokenizer
            .encode_batch_fast(cut, false)
            .map_err(enc_err)?;
        let params = |strategy| TruncationParams {
            direction: TruncationDirection::Right,
            max_length: budget,
            strategy,
            stride: 0,
        };
        passage_encs
            .into_iter()
            .map(|p| {
                // OnlySecond fails when the query alone exceeds the budget;
                // then both sides give way, as the longer one is cut first.
                let (q, p) = truncate_encodings(
                    query_enc.clone(),
                    Some(p.clone()),
                    &params(TruncationStrategy::OnlySecond),
                )
                .or_else(|_| {
                    truncate_encodings(
                        query_enc.clone(),
                        Some(p),
                        &params(TruncationStrategy::LongestFirst),
                    )
                })
                .map_err(enc_err)?;
                processor.process(q, p, true).map_err(enc_err)
            })
            .collect()
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Longest prefix of at most `max_bytes` bytes ending on a char boundary.
fn cut_at(s: &str, max_bytes: usize) -> &str {
    if s.len() <= max_bytes {
        return s;
    }
    let mut end = max_bytes;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support;

    /// The cross-encoder from shared/models; None (the test skips) in a
    /// clone without it.
    fn model() -> Option<CrossEncoder> {
        let dir = test_support::cross_encoder_dir_or_skip()?;
        test_support::init();
        Some(CrossEncoder::load(&dir, 2).expect("cross-encoder (from shared/models)"))
    }

    #[test]
    fn cross_encoder_is_send_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<CrossEncoder>();
    }

    #[test]
    fn logits_match_the_reference_in_source_md() {
        let Some(ce) = model() else { return };
        let logits = ce
            .logits(
                "what is the capital of france?",
                &[
                    "Paris is the capital and most populous city of France.",
                    "The Eiffel Tower was completed in 1889.",
                    "Bananas are rich in potassium.",
                ],
                256,
            )
            .expect("logits");
        for (got, want) in logits.iter().zip([1.69f32, -2.72, -3.41]) {
            assert!((got - want).abs() < 0.02, "logit {got} vs reference {want}");
        }
        let scores = ce
            .score(
                "what is the capital of france?",
                &["Paris is the capital and most populous city of France."],
                256,
            )
            .expect("score");
        assert!((scores[0] - sigmoid(logits[0])).abs() < 1e-5);
    }

    #[test]
    fn scores_do_not_depend_on_neighbours() {
        let Some(ce) = model() else { return };
        let q = "who wrote the novel";
        let short = "Herman Melville wrote Moby-Dick.";
        let long = "The novel Moby-Dick was written by Herman Melville and published in 1851, \
                    telling the story of Captain Ahab's quest for the white whale.";
        let alone = ce.logits(q, &[short], 256).expect("alone")[0];
        let batched = ce.logits(q, &[long, short], 256).expect("batched")[1];
        assert!((alone - batched).abs() < 1e-5, "{alone} vs {batched}");
    }

    #[test]
    fn session_layout_does_not_change_scores() {
        let Some(dir) = test_support::cross_encoder_dir_or_skip() else {
            return;
        };
        test_support::init();
        let one = CrossEncoder::load_with(&dir, 1, 2).expect("one session");
        let three = CrossEncoder::load_with(&dir, 3, 1).expect("three sessions");
        let q = "who directed the film?";
        let ps = [
            "The film was directed by Jane Campion.",
            "Kiwis are flightless birds.",
            "Campion also wrote the screenplay, which won an award in 1993.",
            "The river flows through the old town.",
            "A director shapes the film.",
        ];
        let a = one.logits(q, &ps, 128).expect("one");
        let b = three.logits(q, &ps, 128).expect("three");
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() < 1e-4, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn pairs_are_truncated_to_max_length() {
        let Some(ce) = model() else { return };
        let long = "potassium ".repeat(3000);
        let q = "which fruit is rich in potassium?";
        let enc = ce.encode_pairs(q, &[long.as_str()], 64).expect("encode");
        assert_eq!(enc[0].len(), 64);
        assert_eq!(enc[0].get_type_ids()[0], 0);
        assert_eq!(enc[0].get_type_ids()[63], 1);
        // A query longer than the budget falls back to cutting both sides.
        let long_q = "why ".repeat(400);
        let enc = ce
            .encode_pairs(&long_q, &["short passage"], 32)
            .expect("encode");
        assert_eq!(enc[0].len(), 32);
        let s = ce.score(&long_q, &[long.as_str()], 512).expect("score");
        assert!(s[0].is_finite());
        assert!(ce.score(q, &["x"], 2).is_err());
        assert!(ce.score(q, &["x"], 513).is_err());
        assert!(ce.score(q, &[], 256).expect("empty").is_empty());
    }

    #[test]
    fn cut_respects_char_boundaries() {
        assert_eq!(cut_at("héllo", 2), "h");
        assert_eq!(cut_at("abc", 10), "abc");
    }

    /// p50/p95 latency on this machine; `cargo test -p engram-models --release -- --ignored --nocapture bench`.
    #[test]
    #[ignore = "a latency benchmark: run with --release"]
    fn bench_cross_encoder_and_embedder() {
        use std::time::Instant;
        // ~128 BERT tokens per passage.
        let passage = "The river flows through the old town, past the cathedral and the \
            market square, where merchants have sold wool, salt and wine since the twelfth \
            century. In 1842 a fire destroyed most of the wooden houses on the east bank, and \
            the council rebuilt them in stone, which is why the quarter looks so uniform today. \
            The bridge was widened in 1903 to carry trams, and again in 1968 for cars; a \
            footbridge added in 2001 links the university library to the botanical garden. \
            Every summer the town holds a regatta on the river, and the rowing clubs of three \
            neighbouring cities compete for a silver cup donated by a wool merchant.";
        let q = "when was the bridge over the river widened for trams?";
        let Some(single) = model() else { return };
        let n_tokens = single
            .tokenizer
            .encode_fast(passage, false)
            .map(|e| e.len())
            .unwrap_or(0);
        eprintln!("passage tokens: {n_tokens}");
        for (sessions, intra) in [(1usize, 2usize), (2, 1)] {
            let ce = CrossEncoder::load_with(&test_support::cross_encoder_dir(), sessions, intra)
                .expect("cross-encoder");
            for &(n, max_len) in &[
                (10usize, 128usize),
                (20, 256),
                (50, 256),
                (20, 128),
                (50, 128),
            ] {
                let ps: Vec<&str> = vec![passage; n];
                let _ = ce.score(q, &ps, max_len).expect("warmup");
                let mut times: Vec<f64> = (0..15)
                    .map(|_| {
                        let t = Instant::now();
                        let _ = ce.score(q, &ps, max_len).expect("score");
                        t.elapsed().as_secs_f64() * 1000.0
                    })
                    .collect();
                times.sort_by(f64::total_cmp);
                let p50 = times[times.len() / 2];
                let p95 = times[(times.len() * 95).div_ceil(100) - 1];
                eprintln!(
                    "cross-encoder sessions={sessions}x{intra} n={n} max_length={max_len}: p50 {p50:.0} ms, p95 {p95:.0} ms"
                );
            }
        }
        let (m, t) = test_support::embedder_files();
        let e = crate::Embedder::load(&m, &t, 2).expect("embedder");
        let texts: Vec<String> = (0..256)
            .map(|i| format!("memory {i}: the agent noted that the user prefers tea over coffee in the morning and likes hiking on weekends near lake {i}"))
            .collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let _ = e.embed(&refs[..32]).expect("warmup");
        let t = Instant::now();
        for chunk in refs.chunks(32) {
            let _ = e.embed(chunk).expect("embed");
        }
        let secs = t.elapsed().as_secs_f64();
        eprintln!(
            "embedder batch 32: {:.0} texts/s ({} texts in {:.2} s)",
            refs.len() as f64 / secs,
            refs.len(),
            secs
        );
    }
}
