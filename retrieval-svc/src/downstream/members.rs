//! How many gateway replicas are alive (issue 48): each replica heartbeats
//! to search-svc's `GatewayStateService` every [`EVERY`] and hears the live
//! count back, so it can take its share of every tenant's limits
//! (admission.rs). A replica that stops heartbeating stops counting after
//! [`TTL`]; while search-svc cannot be reached the last count stands (a
//! replica never grants more than it last knew was its share).

use std::time::Duration;

use engram_common::identity::INTERNAL_TOKEN_KEY;
use engram_proto::HeartbeatRequest;
use engram_proto::gateway_state_service_client::GatewayStateServiceClient;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

/// Heartbeat period.
pub const EVERY: Duration = Duration::from_secs(2);
/// How long a replica counts after its last heartbeat: three periods, so
/// one lost heartbeat does not make the others grant a full rate.
pub const TTL: Duration = Duration::from_secs(6);

/// Who heartbeats: this replica's random id and its deployment's group.
pub struct Member {
    pub id: String,
    pub group: String,
}

/// Heartbeats as `member` until `on_live` returns false (its gateway is
/// gone), telling it the live count after each answer; then says it is
/// leaving, so the others take its share at once rather than after [`TTL`].
pub async fn follow(
    channel: Channel,
    token: String,
    member: Member,
    on_live: impl Fn(u32) -> bool,
) {
    let mut client = GatewayStateServiceClient::new(channel);
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let live = match client.heartbeat(request(&member, &token, false)).await {
            Ok(r) => r.into_inner().live,
            Err(e) => {
                tracing::debug!(error = %e, "gateway heartbeat failed; keeping the last replica count");
                0
            }
        };
        if !on_live(live) {
            break;
        }
    }
    if let Err(e) = client.heartbeat(request(&member, &token, true)).await {
        tracing::debug!(error = %e, "leaving heartbeat failed; the membership expires on its own");
    }
}

/// One heartbeat of `member`, with the internal token.
fn request(member: &Member, token: &str, leaving: bool) -> tonic::Request<HeartbeatRequest> {
    let mut req = tonic::Request::new(HeartbeatRequest {
        member_id: member.id.clone(),
        group: member.group.clone(),
        ttl_ms: u32::try_from(TTL.as_millis()).unwrap_or(u32::MAX),
        leaving,
    });
    if let Ok(v) = MetadataValue::try_from(token) {
        req.metadata_mut().insert(INTERNAL_TOKEN_KEY, v);
    }
    req.set_timeout(EVERY);
    req
}
