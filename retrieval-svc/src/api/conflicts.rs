//! `MemoryService.ListConflicts` / `ReviewConflict`: the review of updates
//! detected at write time (search-svc conflicts.rs, issue 21). Checked
//! here first, so a bad request never costs a downstream call, then
//! forwarded to search-svc's `ConflictService` with the caller's identity,
//! which scopes every row to the caller's tenant and trust level.
//!
//! Like listing, a direct call on search-svc's channel rather than a stack
//! in `downstream`: review is operator-paced, not a pipeline stage, and
//! must not count against the breakers that guard retrieval.

use std::time::Duration;

use engram_common::Identity;
use engram_common::text::MAX_NAMESPACE_CHARS;
use engram_proto::conflict_service_client::ConflictServiceClient;
use engram_proto::{
    ConflictDecision, ListConflictsRequest, ListConflictsResponse, ReviewConflictRequest,
    ReviewConflictResponse,
};
use tonic::Request;

use crate::api::checks::{check_short_texts, search_error};
use crate::error::Error;
use crate::gateway::Gateway;

/// search-svc's bounds (`search_svc::conflicts`).
pub const MAX_CONFLICT_PAGE: u32 = 200;
const MAX_PAGE_TOKEN_CHARS: usize = 32;
/// A page is at most 200 pairs of 400 characters under search-svc's 1 s
/// statement timeout; a review is one short write transaction.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A `ListConflictsRequest` that passed the gateway's checks.
#[derive(Debug, Clone)]
pub struct ConflictPage(ListConflictsRequest);

impl TryFrom<ListConflictsRequest> for ConflictPage {
    type Error = Error;

    fn try_from(r: ListConflictsRequest) -> Result<Self, Error> {
        let ListConflictsRequest {
            page_size,
            page_token,
            namespace,
            include_confirmed,
        } = r;
        if let Some(size) = page_size
            && !(1..=MAX_CONFLICT_PAGE).contains(&size)
        {
            return Err(Error::invalid(
                "page_size",
                format!("must be in 1..={MAX_CONFLICT_PAGE}"),
            ));
        }
        check_short_texts(&[
            ("page_token", &page_token, MAX_PAGE_TOKEN_CHARS),
            ("namespace", &namespace, MAX_NAMESPACE_CHARS),
        ])?;
        Ok(Self(ListConflictsRequest {
            page_size,
            page_token,
            namespace,
            include_confirmed,
        }))
    }
}

/// A `ReviewConflictRequest` that passed the gateway's checks.
#[derive(Debug, Clone)]
pub struct ConflictReview(ReviewConflictRequest);

impl TryFrom<ReviewConflictRequest> for ConflictReview {
    type Error = Error;

    fn try_from(r: ReviewConflictRequest) -> Result<Self, Error> {
        let ReviewConflictRequest {
            new_id,
            old_id,
            decision,
        } = r;
        for (field, id) in [("new_id", &new_id), ("old_id", &old_id)] {
            uuid::Uuid::parse_str(id).map_err(|_| Error::invalid(field, "must be a UUID"))?;
        }
        match ConflictDecision::try_from(decision) {
            Ok(ConflictDecision::Confirm | ConflictDecision::Reject) => {}
            _ => {
                return Err(Error::invalid(
                    "decision",
                    "must be CONFLICT_DECISION_CONFIRM or CONFLICT_DECISION_REJECT",
                ));
            }
        }
        Ok(Self(ReviewConflictRequest {
            new_id,
            old_id,
            decision,
        }))
    }
}

/// A client on search-svc's channel and a request carrying `identity`.
fn call<T>(
    gw: &Gateway,
    identity: &Identity,
    msg: T,
) -> (ConflictServiceClient<tonic::transport::Channel>, Request<T>) {
    let client = ConflictServiceClient::new(gw.downstreams().search_channel.clone());
    let token = (gw.settings().auth.internal_token_opt.clone()).unwrap_or_default();
    let mut req = Request::new(msg);
    identity.write_internal(req.metadata_mut(), &token);
    engram_common::telemetry::inject_current(req.metadata_mut());
    req.set_timeout(CALL_TIMEOUT);
    (client, req)
}

pub async fn list(
    gw: &Gateway,
    identity: &Identity,
    page: ConflictPage,
) -> Result<ListConflictsResponse, Error> {
    let deadline = tokio::time::Instant::now() + CALL_TIMEOUT;
    let _slot = (gw.downstreams().list_gate)
        .acquire(&identity.tenant, deadline)
        .await?;
    let (mut client, req) = call(gw, identity, page.0);
    let r = client.list_conflicts(req).await.map_err(search_error)?;
    Ok(r.into_inner())
}

pub async fn review(
    gw: &Gateway,
    identity: &Identity,
    review: ConflictReview,
) -> Result<ReviewConflictResponse, Error> {
    let (mut client, req) = call(gw, identity, review.0);
    let r = client.review_conflict(req).await.map_err(search_error)?;
    Ok(r.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of<T, U>(r: T) -> String
    where
        U: TryFrom<T, Error = Error> + std::fmt::Debug,
    {
        match U::try_from(r) {
            Err(Error::InvalidArgument { field, .. }) => field.to_string(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn conflict_requests_are_checked_field_by_field() {
        assert!(ConflictPage::try_from(ListConflictsRequest::default()).is_ok());
        for size in [0, MAX_CONFLICT_PAGE + 1] {
            let r = ListConflictsRequest {
                page_size: Some(size),
                ..Default::default()
            };
            assert_eq!(field_of::<_, ConflictPage>(r), "page_size");
        }
        let r = ListConflictsRequest {
            namespace: "a\0".into(),
            ..Default::default()
        };
        assert_eq!(field_of::<_, ConflictPage>(r), "namespace");
        let r = ListConflictsRequest {
            page_token: "t".repeat(MAX_PAGE_TOKEN_CHARS + 1),
            ..Default::default()
        };
        assert_eq!(field_of::<_, ConflictPage>(r), "page_token");
        let id = uuid::Uuid::new_v4().to_string();
        let review = |new_id: &str, decision: i32| ReviewConflictRequest {
            new_id: new_id.into(),
            old_id: id.clone(),
            decision,
        };
        let reject = ConflictDecision::Reject as i32;
        assert_eq!(field_of::<_, ConflictReview>(review("x", reject)), "new_id");
        assert_eq!(field_of::<_, ConflictReview>(review(&id, 0)), "decision");
        assert!(ConflictReview::try_from(review(&id, reject)).is_ok());
    }
}
