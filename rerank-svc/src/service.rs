//! RerankService: validation at the boundary, a bulkhead in front of the
//! model thread (worker.rs), and the cross-encoder behind it.

use std::sync::Arc;
use std::time::Instant;

use engram_common::Identity;
use engram_common::server::grpc_timeout;
use engram_common::settings::Settings;
use engram_models::MAX_PAIR_TOKENS;
use engram_proto::rerank_service_server::RerankService;
use engram_proto::{ScoreRequest, ScoreResponse};
use tokio::sync::Semaphore;
use tonic::{Request, Response, Status};

use crate::error::{Error, Result};
use crate::worker::ModelThread;

pub const MAX_QUERY_CHARS: usize = 4096;
pub const MAX_CANDIDATES: usize = 200;
pub const MAX_CANDIDATE_BYTES: usize = 64 * 1024;
/// 3 special tokens ([CLS] q [SEP] p [SEP]) plus at least one of each side.
pub const MIN_MAX_LENGTH: usize = 5;

/// A request that passed every bound.
#[derive(Debug)]
pub struct ValidScore {
    pub query: String,
    pub candidates: Vec<String>,
    /// None = the server default.
    pub max_length_opt: Option<usize>,
}

impl TryFrom<ScoreRequest> for ValidScore {
    type Error = Error;

    fn try_from(req: ScoreRequest) -> Result<Self> {
        let ScoreRequest {
            query,
            candidates,
            max_length,
        } = req;
        if query.trim().is_empty() {
            return Err(Error::invalid("query", "must not be empty"));
        }
        if query.chars().count() > MAX_QUERY_CHARS {
            return Err(Error::invalid(
                "query",
                format!("must be at most {MAX_QUERY_CHARS} characters"),
            ));
        }
        if candidates.len() > MAX_CANDIDATES {
            return Err(Error::invalid(
                "candidates",
                format!(
                    "at most {MAX_CANDIDATES} per request, got {}",
                    candidates.len()
                ),
            ));
        }
        if let Some(i) = candidates
            .iter()
            .position(|c| c.len() > MAX_CANDIDATE_BYTES)
        {
            return Err(Error::invalid(
                format!("candidates[{i}]"),
                format!("must be at most {MAX_CANDIDATE_BYTES} bytes"),
            ));
        }
        let max_length = usize::try_from(max_length).unwrap_or(usize::MAX);
        let max_length_opt = match max_length {
            0 => None,
            n if (MIN_MAX_LENGTH..=MAX_PAIR_TOKENS).contains(&n) => Some(n),
            n => {
                return Err(Error::invalid(
                    "max_length",
                    format!(
                        "must be 0 (server default) or in {MIN_MAX_LENGTH}..={MAX_PAIR_TOKENS}, got {n}"
                    ),
                ));
            }
        };
        Ok(Self {
            query,
            candidates,
            max_length_opt,
        })
    }
}

#[derive(Clone)]
pub struct RerankSvc {
    model: Result<ModelThread, Arc<str>>,
    /// One permit per request running or waiting for the model.
    bulkhead: Arc<Semaphore>,
    queue_capacity: usize,
    default_max_length: usize,
    internal_token_opt: Option<String>,
}

impl std::fmt::Debug for RerankSvc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RerankSvc")
            .field("ready", &self.model.is_ok())
            .field("queue_capacity", &self.queue_capacity)
            .field("default_max_length", &self.default_max_length)
            .finish_non_exhaustive()
    }
}

impl RerankSvc {
    pub fn new(model: std::result::Result<ModelThread, String>, settings: &Settings) -> Self {
        let configured = settings.rerank.max_length;
        let default_max_length = configured.clamp(MIN_MAX_LENGTH, MAX_PAIR_TOKENS);
        if default_max_length != configured {
            tracing::warn!(
                configured,
                used = default_max_length,
                "rerank.max_length out of range; clamped"
            );
        }
        let queue_capacity = settings.rerank.queue_capacity;
        Self {
            model: model.map_err(Arc::from),
            // The model runs one request at a time (the session is locked),
            // so capacity counts the waiting ones on top of the running one.
            bulkhead: Arc::new(Semaphore::new(queue_capacity.saturating_add(1))),
            queue_capacity,
            default_max_length,
            internal_token_opt: settings.auth.internal_token_opt.clone(),
        }
    }

    pub fn is_ready(&self) -> bool {
        self.model.is_ok()
    }

    /// Scores a validated request on the model thread, or refuses at once
    /// when the bulkhead is full or the scores could not be ready by
    /// `deadline_opt`: a late rerank is worse than none. Under load the
    /// scores are those of a head of the candidates, at least 3
    /// (backlog.rs).
    pub async fn score(&self, req: ValidScore, deadline_opt: Option<Instant>) -> Result<Vec<f32>> {
        let model = self
            .model
            .as_ref()
            .map_err(|reason| Error::ModelUnavailable(reason.to_string()))?
            .clone();
        if req.candidates.is_empty() {
            return Ok(Vec::new());
        }
        let permit = self
            .bulkhead
            .clone()
            .try_acquire_owned()
            .map_err(|_| Error::Overloaded {
                capacity: self.queue_capacity,
            })?;
        let max_length = req.max_length_opt.unwrap_or(self.default_max_length);
        let ValidScore {
            query, candidates, ..
        } = req;
        (model.score((query, candidates, max_length), deadline_opt, permit)).await
    }
}

#[tonic::async_trait]
impl RerankService for RerankSvc {
    async fn score(
        &self,
        request: Request<ScoreRequest>,
    ) -> std::result::Result<Response<ScoreResponse>, Status> {
        let identity =
            Identity::read_internal(request.metadata(), self.internal_token_opt.as_deref())
                .map_err(Error::from)?;
        let started = Instant::now();
        // The caller's deadline, as the gateway advertises it; a timeout too
        // large for the clock (grpc-timeout takes any digits) means none.
        let deadline_opt = grpc_timeout(request.metadata()).and_then(|t| started.checked_add(t));
        let req = ValidScore::try_from(request.into_inner())?;
        let n = req.candidates.len();
        let scores = RerankSvc::score(self, req, deadline_opt).await?;
        tracing::debug!(
            tenant = %identity.tenant,
            candidates = n,
            scored = scores.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "scored candidates"
        );
        Ok(Response::new(ScoreResponse { scores }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(query: &str, candidates: Vec<String>, max_length: u32) -> ScoreRequest {
        ScoreRequest {
            query: query.into(),
            candidates,
            max_length,
        }
    }

    fn field_of(r: ScoreRequest) -> String {
        match ValidScore::try_from(r) {
            Err(Error::InvalidArgument(m)) => m,
            other => panic!("expected invalid argument, got {other:?}"),
        }
    }

    #[test]
    fn bounds_name_the_field() {
        assert!(field_of(req("", vec![], 0)).starts_with("query:"));
        assert!(field_of(req(&"q".repeat(4097), vec![], 0)).starts_with("query:"));
        assert!(field_of(req("q", vec!["p".into(); 201], 0)).starts_with("candidates:"));
        let big = "x".repeat(MAX_CANDIDATE_BYTES + 1);
        assert!(field_of(req("q", vec!["ok".into(), big], 0)).starts_with("candidates[1]:"));
        assert!(field_of(req("q", vec![], 513)).starts_with("max_length:"));
        assert!(field_of(req("q", vec![], 2)).starts_with("max_length:"));
    }

    #[test]
    fn valid_requests_pass() {
        let v =
            ValidScore::try_from(req(&"é".repeat(4096), vec!["p".into(); 200], 0)).expect("valid");
        assert_eq!(v.max_length_opt, None);
        let v = ValidScore::try_from(req("q", vec![], 512)).expect("valid");
        assert_eq!(v.max_length_opt, Some(512));
    }
}
