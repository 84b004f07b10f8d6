//! `MemoryService`: authenticate, then the write front (surfaces/writes.rs),
//! and `ListMemories`, the paged listing `engram memories` uses: validated
//! here ([`ListPage`]) and forwarded to search-svc's `ListingService`.

use std::sync::Arc;
use std::time::Duration;

use engram_common::Identity;
use engram_common::text::{MAX_NAMESPACE_CHARS, check_label, check_timestamp};
use engram_proto::listing_service_client::ListingServiceClient;
use engram_proto::memory_service_server::MemoryService;
use engram_proto::{
    AddEdgesRequest, AddEdgesResponse, DeleteEdgesRequest, DeleteEdgesResponse, DeleteRequest,
    DeleteResponse, GetRequest, GetResponse, ListConflictsRequest, ListConflictsResponse,
    ListMemoriesRequest, ListMemoriesResponse, ReviewConflictRequest, ReviewConflictResponse,
    TimeRange, UpsertRequest, UpsertResponse,
};
use tonic::{Request, Response, Status};

use crate::api::checks::{check_short_texts, search_error};
use crate::api::conflicts::{self, ConflictPage, ConflictReview};
use crate::error::Error;
use crate::gateway::Gateway;
use crate::surfaces::writes;

/// search-svc's bounds (`search_svc::list`), checked here first so a bad
/// request never costs a downstream call.
pub const MAX_LIST_PAGE: u32 = 1000;
pub const DEFAULT_LIST_PAGE: u32 = 100;
const MAX_PAGE_TOKEN_CHARS: usize = 128;
const MAX_LIST_TYPES: usize = 32;
/// A listing reads at most one page (1,000 rows, ~3 MiB) under search-svc's
/// 1 s statement timeout; this leaves room for the transfer.
const LIST_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct Memory(pub Gateway);

#[tonic::async_trait]
impl MemoryService for Memory {
    async fn upsert(
        &self,
        request: Request<UpsertRequest>,
    ) -> Result<Response<UpsertResponse>, Status> {
        let identity = self.0.authenticate(request.metadata())?;
        let _permit = self.0.admit_write(&identity)?;
        let r = writes::upsert(&self.0, identity, request.into_inner()).await?;
        Ok(Response::new(r))
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let identity = self.0.authenticate(request.metadata())?;
        let _permit = self.0.admit_write(&identity)?;
        let r = writes::delete(&self.0, identity, request.into_inner()).await?;
        Ok(Response::new(r))
    }

    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let identity = self.0.authenticate(request.metadata())?;
        let _permit = self.0.admit(&identity, 1)?;
        let r = writes::get(&self.0, identity, request.into_inner()).await?;
        Ok(Response::new(r))
    }

    async fn add_edges(
        &self,
        request: Request<AddEdgesRequest>,
    ) -> Result<Response<AddEdgesResponse>, Status> {
        let identity = self.0.authenticate(request.metadata())?;
        let _permit = self.0.admit_write(&identity)?;
        let r = writes::add_edges(&self.0, identity, request.into_inner()).await?;
        Ok(Response::new(r))
    }

    async fn delete_edges(
        &self,
        request: Request<DeleteEdgesRequest>,
    ) -> Result<Response<DeleteEdgesResponse>, Status> {
        let identity = self.0.authenticate(request.metadata())?;
        let _permit = self.0.admit_write(&identity)?;
        let r = writes::delete_edges(&self.0, identity, request.into_inner()).await?;
        Ok(Response::new(r))
    }

    async fn list_memories(
        &self,
        request: Request<ListMemoriesRequest>,
    ) -> Result<Response<ListMemoriesResponse>, Status> {
        let identity = self.0.authenticate(request.metadata())?;
        let _permit = self.0.admit(&identity, 1)?;
        let page = ListPage::try_from(request.into_inner())?;
        let r = list(&self.0, identity, page).await?;
        Ok(Response::new(r))
    }

    async fn list_conflicts(
        &self,
        request: Request<ListConflictsRequest>,
    ) -> Result<Response<ListConflictsResponse>, Status> {
        let identity = self.0.authenticate(request.metadata())?;
        let _permit = self.0.admit(&identity, 1)?;
        let page = ConflictPage::try_from(request.into_inner())?;
        let r = conflicts::list(&self.0, &identity, page).await?;
        Ok(Response::new(r))
    }

    async fn review_conflict(
        &self,
        request: Request<ReviewConflictRequest>,
    ) -> Result<Response<ReviewConflictResponse>, Status> {
        let identity = self.0.authenticate(request.metadata())?;
        let _permit = self.0.admit_write(&identity)?;
        let review = ConflictReview::try_from(request.into_inner())?;
        let r = conflicts::review(&self.0, &identity, review).await?;
        Ok(Response::new(r))
    }
}

/// A `ListMemoriesRequest` that passed the gateway's checks, with the
/// page size made explicit.
#[derive(Debug, Clone)]
pub struct ListPage(ListMemoriesRequest);

impl TryFrom<ListMemoriesRequest> for ListPage {
    type Error = Error;

    fn try_from(r: ListMemoriesRequest) -> Result<Self, Error> {
        let ListMemoriesRequest {
            page_size,
            page_token,
            namespace,
            memory_types,
            time_range,
            include_historical,
            include_consolidated,
            newest_first,
        } = r;
        let page_size = page_size.unwrap_or(DEFAULT_LIST_PAGE);
        if !(1..=MAX_LIST_PAGE).contains(&page_size) {
            return Err(Error::invalid(
                "page_size",
                format!("must be in 1..={MAX_LIST_PAGE}"),
            ));
        }
        check_short_texts(&[
            ("page_token", &page_token, MAX_PAGE_TOKEN_CHARS),
            ("namespace", &namespace, MAX_NAMESPACE_CHARS),
        ])?;
        if memory_types.len() > MAX_LIST_TYPES {
            return Err(Error::invalid(
                "memory_types",
                format!("must hold at most {MAX_LIST_TYPES} types"),
            ));
        }
        for t in &memory_types {
            check_label(t).map_err(|rule| Error::invalid("memory_types", rule))?;
        }
        if let Some(TimeRange { start, end }) = &time_range {
            for (field, ts_opt) in [("time_range.start", start), ("time_range.end", end)] {
                if let Some(ts) = ts_opt {
                    check_timestamp(ts).map_err(|rule| Error::invalid(field, rule))?;
                }
            }
            if let (Some(s), Some(e)) = (start, end)
                && (e.seconds, e.nanos) <= (s.seconds, s.nanos)
            {
                return Err(Error::invalid(
                    "time_range.end",
                    "must be after time_range.start",
                ));
            }
        }
        Ok(Self(ListMemoriesRequest {
            page_size: Some(page_size),
            page_token,
            namespace,
            memory_types,
            time_range,
            include_historical,
            include_consolidated,
            newest_first,
        }))
    }
}

/// One page from search-svc, then only the caller's tenant and trust,
/// whatever came back (as `MemoryService.Get` does), and no embeddings.
///
/// A direct call on search-svc's channel rather than a stack of its own
/// in `downstream`: listing is a bulk, operator-paced read (a CLI walking
/// pages), not a pipeline stage, so it neither needs retries nor should
/// count against the breakers that guard retrieval.
async fn list(
    gw: &Gateway,
    identity: Identity,
    page: ListPage,
) -> Result<ListMemoriesResponse, Error> {
    let deadline = tokio::time::Instant::now() + LIST_TIMEOUT;
    let _slot = (gw.downstreams().list_gate)
        .acquire(&identity.tenant, deadline)
        .await?;
    let channel = gw.downstreams().search_channel.clone();
    let mut client = ListingServiceClient::new(channel).max_decoding_message_size(64 << 20);
    let token = gw
        .settings()
        .auth
        .internal_token_opt
        .clone()
        .unwrap_or_default();
    let identity = Arc::new(identity);
    let mut req = Request::new(page.0);
    identity.write_internal(req.metadata_mut(), &token);
    engram_common::telemetry::inject_current(req.metadata_mut());
    req.set_timeout(LIST_TIMEOUT);
    let mut r = client
        .list_memories(req)
        .await
        .map_err(search_error)?
        .into_inner();
    r.memories
        .retain(|m| m.tenant_id == identity.tenant && m.access_level <= identity.trust.to_proto());
    for m in &mut r.memories {
        m.embedding.clear();
    }
    r.tenant = identity.tenant.clone();
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_types::Timestamp;

    fn field_of(r: ListMemoriesRequest) -> String {
        match ListPage::try_from(r) {
            Err(Error::InvalidArgument { field, .. }) => field.to_string(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn a_listing_is_checked_field_by_field() {
        let ok = ListPage::try_from(ListMemoriesRequest::default()).expect("defaults");
        assert_eq!(ok.0.page_size, Some(DEFAULT_LIST_PAGE));
        for size in [0, MAX_LIST_PAGE + 1] {
            let r = ListMemoriesRequest {
                page_size: Some(size),
                ..Default::default()
            };
            assert_eq!(field_of(r), "page_size");
        }
        let r = ListMemoriesRequest {
            namespace: "ns\0".into(),
            ..Default::default()
        };
        assert_eq!(field_of(r), "namespace");
        let r = ListMemoriesRequest {
            memory_types: vec!["Episodic".into()],
            ..Default::default()
        };
        assert_eq!(field_of(r), "memory_types");
        let at = |seconds| Some(Timestamp { seconds, nanos: 0 });
        let r = ListMemoriesRequest {
            time_range: Some(TimeRange {
                start: at(10),
                end: at(10),
            }),
            ..Default::default()
        };
        assert_eq!(field_of(r), "time_range.end");
        let r = ListMemoriesRequest {
            page_token: "x".repeat(MAX_PAGE_TOKEN_CHARS + 1),
            ..Default::default()
        };
        assert_eq!(field_of(r), "page_token");
    }
}
