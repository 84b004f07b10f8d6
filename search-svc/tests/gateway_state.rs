//! The gateways' shared working notes (issue 47, from the audit of issue
//! 48's shared state): a session's cap never pushes out a note above the
//! writer's trust, and two batches over the same notes in opposite orders
//! both land (rows are written in key order, so they queue, not deadlock).

mod common;

use common::*;
use engram_common::AccessLevel;
use engram_proto as pb;
use search_svc::gateway_state::{PutNotes, SessionId, get_notes, put_notes};

fn note(session: &str, id: &str, level: AccessLevel) -> pb::SessionNote {
    pb::SessionNote {
        session_id: session.into(),
        id: id.into(),
        access_level: level.to_proto(),
        body: id.as_bytes().to_vec(),
        content_hash: vec![7; 32],
        expires_at_ms: (chrono::Utc::now().timestamp() + 3600) * 1000,
        ..Default::default()
    }
}

fn batch(notes: Vec<pb::SessionNote>, max_per_session: u32) -> PutNotes {
    let req = pb::PutNotesRequest {
        notes,
        max_per_session,
    };
    PutNotes::try_from(req).expect("valid batch")
}

fn session(id: &str) -> SessionId {
    let req = pb::GetNotesRequest {
        session_id: id.into(),
    };
    SessionId::try_from(req).expect("valid session")
}

#[tokio::test]
async fn a_sessions_cap_never_pushes_out_a_higher_trust_note() {
    let h = start().await;
    let t = tenant();
    let sensitive = ident(&t, "agent", AccessLevel::Sensitive);
    let public = ident(&t, "agent", AccessLevel::Public);
    let kept = note("s", "secret", AccessLevel::Sensitive);
    let stored = put_notes(&h.pool, &sensitive, &batch(vec![kept], 2)).await;
    assert!(matches!(stored, Ok(Ok(_))), "{stored:?}");
    for id in ["p1", "p2", "p3"] {
        let n = note("s", id, AccessLevel::Public);
        let stored = put_notes(&h.pool, &public, &batch(vec![n], 2)).await;
        assert!(matches!(stored, Ok(Ok(_))), "{stored:?}");
    }
    let read = get_notes(&h.pool, &sensitive, &session("s")).await;
    let ids: Vec<String> = read.expect("read").into_iter().map(|n| n.id).collect();
    assert!(ids.contains(&"secret".to_string()), "{ids:?}");
    // The public key's own notes were capped: at most 2 of its 3 stay.
    let public_ids = ids.iter().filter(|i| i.starts_with('p')).count();
    assert!(public_ids <= 2, "{ids:?}");
}

#[tokio::test]
async fn batches_over_the_same_notes_in_opposite_orders_both_land() {
    let h = start().await;
    let who = ident(&tenant(), "agent", AccessLevel::Internal);
    let ids: Vec<String> = (0..40).map(|i| format!("n{i:02}")).collect();
    let forward: Vec<_> = (ids.iter())
        .map(|i| note("s", i, AccessLevel::Public))
        .collect();
    let backward: Vec<_> = forward.iter().rev().cloned().collect();
    for _ in 0..5 {
        let (fa, fb) = (batch(forward.clone(), 100), batch(backward.clone(), 100));
        let a = put_notes(&h.pool, &who, &fa);
        let b = put_notes(&h.pool, &who, &fb);
        let (a, b) = tokio::join!(a, b);
        assert!(matches!(a, Ok(Ok(_))), "{a:?}");
        assert!(matches!(b, Ok(Ok(_))), "{b:?}");
    }
}

fn beat(member: &str, group: &str, leaving: bool) -> search_svc::gateway_state::Heartbeat {
    let req = pb::HeartbeatRequest {
        member_id: member.into(),
        group: group.into(),
        ttl_ms: 60_000,
        leaving,
    };
    search_svc::gateway_state::Heartbeat::try_from(req).expect("valid heartbeat")
}

#[tokio::test]
async fn a_leaving_replica_stops_counting_at_once_and_only_in_its_group() {
    use search_svc::gateway_state::heartbeat;
    let h = start().await;
    let group = format!("g-{}", uuid::Uuid::new_v4().simple());
    let (a, b) = (format!("{group}-a"), format!("{group}-b"));
    assert_eq!(
        heartbeat(&h.pool, &beat(&a, &group, false)).await.ok(),
        Some(1)
    );
    assert_eq!(
        heartbeat(&h.pool, &beat(&b, &group, false)).await.ok(),
        Some(2)
    );
    // Another group cannot take b out.
    let other = heartbeat(&h.pool, &beat(&b, "another-group", true)).await;
    assert_eq!(other.ok(), Some(1), "the other group's count");
    assert_eq!(
        heartbeat(&h.pool, &beat(&a, &group, false)).await.ok(),
        Some(2)
    );
    // b leaves: a counts alone at its next heartbeat.
    assert_eq!(
        heartbeat(&h.pool, &beat(&b, &group, true)).await.ok(),
        Some(1)
    );
    assert_eq!(
        heartbeat(&h.pool, &beat(&a, &group, false)).await.ok(),
        Some(1)
    );
}

#[test]
fn a_note_kept_past_a_year_is_refused_by_name() {
    let mut n = note("s", "far", AccessLevel::Public);
    n.expires_at_ms = i64::MAX;
    let req = pb::PutNotesRequest {
        notes: vec![n],
        max_per_session: 10,
    };
    let e = PutNotes::try_from(req).err().map(|e| e.to_string());
    assert!(
        e.as_deref()
            .is_some_and(|e| e.contains("notes.expires_at_ms")),
        "{e:?}"
    );
}
