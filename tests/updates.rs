//! Memories that stay current (issue 21): a write that changes a fact an
//! older memory states is detected without an LLM, recorded as a
//! system-detected `contradicts` edge, and the answer is what is true now.

use engram::client::Client;
use engram_proto::{
    ConflictDecision, GetRequest, ListConflictsRequest, Memory, RetrieveRequest,
    ReviewConflictRequest, UpsertRequest,
};
use engram_tests::TestStack;

fn at(days_ago: i64) -> prost_types::Timestamp {
    let t = chrono::Utc::now() - chrono::Duration::days(days_ago);
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: 0,
    }
}

async fn write(c: &mut Client, content: &str, days_ago: i64) -> anyhow::Result<String> {
    write_at(c, content, days_ago, engram_proto::AccessLevel::Unspecified).await
}

/// [`write`] at an access level (`Unspecified`: the server's default).
async fn write_at(
    c: &mut Client,
    content: &str,
    days_ago: i64,
    level: engram_proto::AccessLevel,
) -> anyhow::Result<String> {
    let m = Memory {
        content: content.into(),
        memory_type: "semantic".into(),
        access_level: level as i32,
        event_time: Some(at(days_ago)),
        ..Default::default()
    };
    let r = c
        .memories
        .upsert(UpsertRequest { memories: vec![m] })
        .await?
        .into_inner();
    Ok(r.results.first().map(|r| r.id.clone()).unwrap_or_default())
}

/// Every service with update detection on (and auto-supersede from
/// `auto_supersede`, 0 = detect only), for a `sensitive` key. Detection
/// runs before each write is acknowledged, so a test reads the edge right
/// after the write.
async fn detecting_stack(auto_supersede: f32) -> anyhow::Result<TestStack> {
    detecting_stack_queued(auto_supersede, 0).await
}

/// [`detecting_stack`] with `queue` writes' detection allowed to wait on
/// search-svc's background worker (`search.update_detection_queue`).
async fn detecting_stack_queued(auto_supersede: f32, queue: usize) -> anyhow::Result<TestStack> {
    let mut settings = engram_tests::settings().await?;
    settings.search.update_detection = true;
    settings.search.update_auto_supersede = auto_supersede;
    settings.search.update_detection_queue = queue;
    TestStack::start_with(
        settings,
        engram::stack::Service::ALL.into_iter().collect(),
        "sensitive",
    )
    .await
}

/// Old facts (five months ago), unrelated facts, then the three updates.
const OLD: [&str; 3] = [
    "Priya lives in Berlin.",
    "The team standup is at 9:30 every morning.",
    "Code reviews happen in the mornings.",
];
const OTHER: [&str; 5] = [
    "Priya likes hiking on weekends.",
    "Priya's manager is Tom Becker.",
    "The team uses Rust for the backend services.",
    "Priya prefers tea over coffee.",
    "The quarterly planning happens in January.",
];
const NEW: [&str; 3] = [
    "Priya moved to Amsterdam.",
    "The standup moved to 10:00.",
    "Code reviews are now at 15:00.",
];

/// The tenant's system-detected `contradicts` edges (new → old, score,
/// reason), strongest first.
async fn detected_edges(
    tenant: &str,
) -> anyhow::Result<Vec<(uuid::Uuid, uuid::Uuid, f32, String)>> {
    let pool = engram_common::db::test_database().await?;
    Ok(sqlx::query_as(
        "SELECT src_id, dst_id, weight, coalesce(reason, '') FROM edges \
         WHERE tenant_id = $1 AND origin = 'detected' AND edge_type = 'contradicts' ORDER BY weight DESC",
    )
    .bind(tenant)
    .fetch_all(&pool)
    .await?)
}

/// With the default queue detection runs after the acknowledgement, on
/// search-svc's background worker: the edges appear shortly after.
#[tokio::test]
async fn an_implicit_update_is_detected_and_the_current_fact_answers() -> anyhow::Result<()> {
    let queue = engram_common::Settings::default()
        .search
        .update_detection_queue;
    assert!(queue > 0, "detection is queued by default");
    let ts = detecting_stack_queued(0.0, queue).await?;
    let mut c = ts.client().await?;
    let mut old_ids = Vec::new();
    for (i, fact) in OLD.iter().enumerate() {
        old_ids.push(write(&mut c, fact, 150 - i as i64).await?);
    }
    for (i, fact) in OTHER.iter().enumerate() {
        write(&mut c, fact, 120 - i as i64).await?;
    }
    let mut new_ids = Vec::new();
    for (i, fact) in NEW.iter().enumerate() {
        new_ids.push(write(&mut c, fact, 10 - i as i64).await?);
    }
    let mut detected = Vec::new();
    for _ in 0..100 {
        detected = detected_edges(&ts.tenant).await?;
        if detected.len() >= NEW.len() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    for (s, d, w, r) in &detected {
        eprintln!("detected {s} -> {d} {w:.3} {r}");
    }
    let pairs: Vec<(String, String)> = detected
        .iter()
        .map(|(s, d, _, _)| (s.to_string(), d.to_string()))
        .collect();
    for (new, old) in new_ids.iter().zip(&old_ids) {
        assert!(
            pairs.contains(&(new.clone(), old.clone())),
            "{new} updates {old}: {detected:?}"
        );
    }
    assert_eq!(pairs.len(), 3, "nothing else is an update: {detected:?}");

    // The default answer is what is true now; the old version is a conflict.
    let mut current = None;
    for _ in 0..40 {
        let r = c
            .retrieval
            .retrieve(RetrieveRequest {
                text: "Where does Priya live?".into(),
                limit: Some(5),
                no_cache: true,
                ..Default::default()
            })
            .await?
            .into_inner();
        let texts: Vec<&str> = (r.records.iter())
            .filter_map(|s| s.memory.as_ref().map(|m| m.content.as_str()))
            .collect();
        if !r.conflicts.is_empty() {
            current = Some((
                texts.contains(&NEW[0]),
                texts.contains(&OLD[0]),
                r.conflicts.clone(),
            ));
            break;
        }
        // graph-svc picks the new edges up from the change feed.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (new_returned, old_returned, conflicts) =
        current.ok_or_else(|| anyhow::anyhow!("no conflict reported"))?;
    assert!(new_returned, "the current fact is in the answer");
    assert!(
        !old_returned,
        "the outdated fact is not in the default answer"
    );
    assert!(conflicts.iter().any(
        |p| p.winner_id == new_ids[0] && (p.memory_a == old_ids[0] || p.memory_b == old_ids[0])
    ));
    ts.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_lower_trust_writer_never_flags_a_higher_trust_memory() -> anyhow::Result<()> {
    let mut settings = engram_tests::settings().await?;
    settings.search.update_detection = true;
    settings.search.update_detection_queue = 0; // the edge (or none) at the ack
    let (stack, uri, keys) =
        engram_tests::stack_with_keys(settings, &[("t", "sensitive"), ("t", "public")]).await?;
    let mut high = Client::connect(&uri, &keys[0]).await?;
    let mut low = Client::connect(&uri, &keys[1]).await?;
    let sensitive = engram_proto::AccessLevel::Sensitive;
    let secret_id: uuid::Uuid = write_at(&mut high, OLD[0], 100, sensitive).await?.parse()?;
    write(&mut low, "Priya moved to Amsterdam.", 1).await?;
    let pool = engram_common::db::test_database().await?;
    let (n,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM edges WHERE dst_id = $1 AND origin = 'detected'")
            .bind(secret_id)
            .fetch_one(&pool)
            .await?;
    assert_eq!(
        n, 0,
        "a public writer cannot mark a sensitive memory outdated"
    );
    stack.shutdown().await;
    Ok(())
}

/// Issue 47, item 15: a sensitive write never closes (or flags) a public
/// memory, which public readers would lose without seeing why.
#[tokio::test]
async fn a_higher_trust_write_never_closes_a_memory_lower_readers_see() -> anyhow::Result<()> {
    let mut settings = engram_tests::settings().await?;
    settings.search.update_detection = true;
    settings.search.update_auto_supersede = 0.6;
    settings.search.update_detection_queue = 0; // the edge (or none) at the ack
    let (stack, uri, keys) =
        engram_tests::stack_with_keys(settings, &[("t", "sensitive"), ("t", "public")]).await?;
    let mut high = Client::connect(&uri, &keys[0]).await?;
    let mut low = Client::connect(&uri, &keys[1]).await?;
    let public = engram_proto::AccessLevel::Public;
    let open_id: uuid::Uuid = write_at(&mut low, OLD[0], 150, public).await?.parse()?;
    let sensitive = engram_proto::AccessLevel::Sensitive;
    write_at(&mut high, NEW[0], 10, sensitive).await?;
    let pool = engram_common::db::test_database().await?;
    let (closed, edges): (bool, i64) = sqlx::query_as(
        "SELECT valid_to IS NOT NULL, \
                (SELECT count(*) FROM edges WHERE dst_id = $1 AND origin = 'detected') \
         FROM memories WHERE id = $1",
    )
    .bind(open_id)
    .fetch_one(&pool)
    .await?;
    assert!(!closed, "a sensitive write closed a public memory");
    assert_eq!(edges, 0, "a sensitive write flagged a public memory");
    stack.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn auto_supersede_closes_the_old_version_which_history_still_shows() -> anyhow::Result<()> {
    let ts = detecting_stack(0.6).await?;
    let mut c = ts.client().await?;
    let old = write(&mut c, OLD[0], 150).await?;
    let new = write(&mut c, NEW[0], 10).await?;
    let ask = |historical: bool| RetrieveRequest {
        text: "Where does Priya live?".into(),
        limit: Some(5),
        no_cache: true,
        include_historical: historical,
        token_budget: 400,
        ..Default::default()
    };
    let now = c.retrieval.retrieve(ask(false)).await?.into_inner();
    let ids: Vec<&str> = (now.records.iter())
        .filter_map(|s| s.memory.as_ref().map(|m| m.id.as_str()))
        .collect();
    assert!(
        ids.contains(&new.as_str()) && !ids.contains(&old.as_str()),
        "{now:?}"
    );
    let history = c.retrieval.retrieve(ask(true)).await?.into_inner();
    let was = (history.records.iter())
        .filter_map(|s| s.memory.as_ref())
        .find(|m| m.id == old)
        .ok_or_else(|| anyhow::anyhow!("history keeps the old version: {history:?}"))?;
    assert!(was.valid_to.is_some(), "closed at the update's event time");
    assert!(
        history.context_block.contains(&format!(
            "_Outdated: superseded on {} by: \"{}\"._\n{}",
            chrono::DateTime::from_timestamp(
                (history.records.iter())
                    .filter_map(|s| s.memory.as_ref())
                    .find(|m| m.id == new)
                    .and_then(|m| m.event_time.as_ref())
                    .map_or(0, |t| t.seconds),
                0
            )
            .map(|d| d.format("%Y-%m-%d").to_string())
            .unwrap_or_default(),
            NEW[0],
            OLD[0]
        )),
        "{}",
        history.context_block
    );
    ts.shutdown().await;
    Ok(())
}

fn review(new_id: &str, old_id: &str, decision: ConflictDecision) -> ReviewConflictRequest {
    ReviewConflictRequest {
        new_id: new_id.into(),
        old_id: old_id.into(),
        decision: decision as i32,
    }
}

async fn pending(c: &mut Client) -> anyhow::Result<Vec<(String, String)>> {
    let r = c
        .memories
        .list_conflicts(ListConflictsRequest::default())
        .await?
        .into_inner();
    Ok(r.conflicts
        .into_iter()
        .map(|p| (p.new_id, p.old_id))
        .collect())
}

/// A detected update is listed for review; a rejection removes it for good
/// (rewriting the newer memory does not bring it back) and reopens what it
/// closed; a confirmation closes the old version.
#[tokio::test]
async fn detected_conflicts_are_listed_and_reviews_stick() -> anyhow::Result<()> {
    let ts = detecting_stack(0.6).await?;
    let mut c = ts.client().await?;
    let berlin = write(&mut c, OLD[0], 150).await?;
    let standup = write(&mut c, OLD[1], 140).await?;
    let amsterdam = write(&mut c, NEW[0], 10).await?;
    let ten = write(&mut c, NEW[1], 9).await?;
    let listed = c
        .memories
        .list_conflicts(ListConflictsRequest::default())
        .await?
        .into_inner();
    let pairs: Vec<(&str, &str)> = (listed.conflicts.iter())
        .map(|p| (p.new_id.as_str(), p.old_id.as_str()))
        .collect();
    assert!(
        pairs.contains(&(ten.as_str(), standup.as_str())),
        "{listed:?}"
    );
    assert!(
        pairs.contains(&(amsterdam.as_str(), berlin.as_str())),
        "{listed:?}"
    );
    let moved = (listed.conflicts.iter())
        .find(|p| p.new_id == amsterdam)
        .ok_or_else(|| anyhow::anyhow!("listed"))?;
    assert_eq!(
        (moved.new_content.as_str(), moved.old_content.as_str()),
        (NEW[0], OLD[0])
    );
    assert!(
        moved.score >= 0.6 && moved.reason.contains("amsterdam"),
        "{moved:?}"
    );
    assert!(moved.old_closed, "auto-supersede closed Berlin");

    // Reject: the edge goes, Berlin is current again, and a rewrite of the
    // newer memory does not flag the pair again.
    let r = c
        .memories
        .review_conflict(review(&amsterdam, &berlin, ConflictDecision::Reject))
        .await?
        .into_inner();
    assert!(r.conflict.is_none());
    assert!(
        !pending(&mut c)
            .await?
            .contains(&(amsterdam.clone(), berlin.clone()))
    );
    let got = c
        .memories
        .get(GetRequest {
            ids: vec![berlin.clone()],
            ..Default::default()
        })
        .await?
        .into_inner();
    assert!(
        got.memories[0].valid_to.is_none(),
        "the rejected pair's close is undone"
    );
    let rewrite = Memory {
        id: amsterdam.clone(),
        content: "Priya now lives in Amsterdam.".into(),
        memory_type: "semantic".into(),
        event_time: Some(at(10)),
        ..Default::default()
    };
    c.memories
        .upsert(UpsertRequest {
            memories: vec![rewrite],
        })
        .await?;
    // The same words in a new memory are flagged: the detector would flag
    // the rewrite too, were the pair not rejected.
    let control = write(&mut c, "Priya now lives in Amsterdam.", 8).await?;
    let now_pending = pending(&mut c).await?;
    assert!(
        now_pending.contains(&(control, berlin.clone())),
        "{now_pending:?}"
    );
    assert!(
        !now_pending.contains(&(amsterdam.clone(), berlin.clone())),
        "a rejected pair is never flagged again"
    );
    let again = c
        .memories
        .review_conflict(review(&amsterdam, &berlin, ConflictDecision::Confirm))
        .await;
    assert_eq!(
        again.map_err(|s| s.code()).err(),
        Some(tonic::Code::NotFound)
    );

    // Confirm: the pair stays, marked, and leaves the pending list.
    let r = c
        .memories
        .review_conflict(review(&ten, &standup, ConflictDecision::Confirm))
        .await?
        .into_inner();
    let confirmed = r
        .conflict
        .ok_or_else(|| anyhow::anyhow!("confirmed pair"))?;
    assert!(confirmed.confirmed_at.is_some() && confirmed.old_closed);
    assert!(
        !pending(&mut c)
            .await?
            .contains(&(ten.clone(), standup.clone()))
    );
    let all = c
        .memories
        .list_conflicts(ListConflictsRequest {
            include_confirmed: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    assert!(
        all.conflicts
            .iter()
            .any(|p| p.new_id == ten && p.confirmed_at.is_some())
    );

    // Bad input names its field.
    let bad = c
        .memories
        .review_conflict(review("nope", &standup, ConflictDecision::Reject))
        .await
        .err()
        .ok_or_else(|| anyhow::anyhow!("refused"))?;
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    assert!(bad.message().contains("new_id"), "{}", bad.message());
    ts.shutdown().await;
    Ok(())
}

/// A key below a pair's trust level neither sees the pair nor can review
/// it; another tenant's key sees nothing.
#[tokio::test]
async fn a_lower_trust_key_cannot_see_or_review_a_higher_trust_conflict() -> anyhow::Result<()> {
    let mut settings = engram_tests::settings().await?;
    settings.search.update_detection = true;
    settings.search.update_detection_queue = 0; // the edge (or none) at the ack
    let (stack, uri, keys) = engram_tests::stack_with_keys(
        settings,
        &[("t", "sensitive"), ("t", "public"), ("u", "sensitive")],
    )
    .await?;
    let mut high = Client::connect(&uri, &keys[0]).await?;
    let mut low = Client::connect(&uri, &keys[1]).await?;
    let mut other = Client::connect(&uri, &keys[2]).await?;
    let sensitive = engram_proto::AccessLevel::Sensitive;
    let old = write_at(&mut high, OLD[0], 100, sensitive).await?;
    let new = write(&mut high, NEW[0], 1).await?;
    assert!(
        pending(&mut high)
            .await?
            .contains(&(new.clone(), old.clone()))
    );
    assert!(
        pending(&mut low).await?.is_empty(),
        "the sensitive side is hidden"
    );
    assert!(
        pending(&mut other).await?.is_empty(),
        "another tenant sees nothing"
    );
    for (who, client) in [("public key", &mut low), ("other tenant", &mut other)] {
        let e = client
            .memories
            .review_conflict(review(&new, &old, ConflictDecision::Reject))
            .await
            .err()
            .ok_or_else(|| anyhow::anyhow!("{who} must be refused"))?;
        assert_eq!(e.code(), tonic::Code::NotFound, "{who}: {e:?}");
    }
    assert!(
        pending(&mut high).await?.contains(&(new, old)),
        "the pair is untouched"
    );
    stack.shutdown().await;
    Ok(())
}
