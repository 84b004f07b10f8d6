//! Follows search-svc's change feed, so a write taken by any gateway
//! replica (or loaded by `engram ingest`, or made in SQL) makes this
//! gateway's cached answers for that tenant stale. Runs for the gateway's
//! lifetime; reconnects with a pause, and treats every gap in the stream as
//! "anything may have changed".

use std::time::Duration;

use engram_common::identity::INTERNAL_TOKEN_KEY;
use engram_proto::search_service_client::SearchServiceClient;
use engram_proto::{ChangeEvent, WatchChangesRequest};
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

/// Pause between attempts while search-svc is away.
const RETRY: Duration = Duration::from_secs(1);
/// Pause before asking a search-svc without the feed again.
const UNSUPPORTED_RETRY: Duration = Duration::from_secs(30);

fn resync() -> ChangeEvent {
    ChangeEvent {
        resync: true,
        ..Default::default()
    }
}

/// Calls `on_event` for each change until it returns false (its gateway is
/// gone); `None` says the feed answered that it has none (an older
/// search-svc) and asks whether to go on. A lost or refused stream is
/// reported as a resync.
pub async fn follow(
    channel: Channel,
    token: String,
    on_event: impl Fn(Option<&ChangeEvent>) -> bool,
) {
    loop {
        let mut client = SearchServiceClient::new(channel.clone());
        let mut req = tonic::Request::new(WatchChangesRequest {});
        if let Ok(v) = MetadataValue::try_from(token.as_str()) {
            req.metadata_mut().insert(INTERNAL_TOKEN_KEY, v);
        }
        match client.watch_changes(req).await {
            Ok(resp) => {
                let mut stream = resp.into_inner();
                loop {
                    match stream.message().await {
                        Ok(Some(event)) if !on_event(Some(&event)) => return,
                        Ok(Some(_)) => {}
                        Ok(None) => break,
                        Err(e) => {
                            tracing::debug!(error = %e, "change feed interrupted");
                            break;
                        }
                    }
                }
            }
            Err(e) if e.code() == tonic::Code::Unimplemented => {
                // A search-svc without the feed (an older version during a
                // rollout): nothing was missed that a resync would recover,
                // so keep the caches and ask again later.
                tracing::warn!("search-svc has no change feed; cached answers expire by ttl only");
                if !on_event(None) {
                    return;
                }
                tokio::time::sleep(UNSUPPORTED_RETRY).await;
                continue;
            }
            Err(e) => tracing::debug!(error = %e, "change feed unavailable"),
        }
        if !on_event(Some(&resync())) {
            return;
        }
        tokio::time::sleep(RETRY).await;
    }
}
