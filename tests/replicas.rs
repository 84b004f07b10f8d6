//! Gateway replicas (issue 48): what one replica knows about an answer,
//! another must know too. Two gateways over the same search, graph and
//! rerank services, as `engram serve --services retrieval` twice behind a
//! load balancer, with the same credentials.

use engram::client::Client;
use engram_proto::{FeedbackItem, FeedbackRequest, FeedbackSignal, RetrieveRequest};
use engram_tests::{TestStack, spawn_gateway};

fn helpful(query_id: &str, memory_id: &str) -> FeedbackRequest {
    FeedbackRequest {
        query_id: query_id.into(),
        items: vec![FeedbackItem {
            memory_id: memory_id.into(),
            signal: FeedbackSignal::Helpful as i32,
            value: true,
        }],
    }
}

/// Check 2 of issue 48: feedback sent to replica B on an answer replica A
/// gave, naming a memory A never returned, was accepted (A itself refused
/// it). The answer's query id is now its signed receipt, which B checks.
#[tokio::test]
async fn feedback_is_checked_on_a_replica_that_did_not_answer() -> anyhow::Result<()> {
    let ts = TestStack::start("internal").await?;
    let mut a = ts.client().await?;
    for content in [
        "The espresso machine on floor 3 was descaled on Monday.",
        "Priya prefers window seats on long flights.",
        "The quarterly review moved to Thursday at 10:00.",
    ] {
        engram_tests::remember(&mut a, content).await?;
    }
    let r = a
        .retrieval
        .retrieve(RetrieveRequest {
            text: "When was the espresso machine descaled?".into(),
            limit: Some(1),
            no_cache: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    let returned = (r.records.first())
        .and_then(|s| s.memory.as_ref())
        .map(|m| m.id.clone())
        .ok_or_else(|| anyhow::anyhow!("no record: {r:?}"))?;
    let listed = a
        .memories
        .list_memories(engram_proto::ListMemoriesRequest::default())
        .await?
        .into_inner();
    let other = (listed.memories.iter())
        .map(|m| m.id.clone())
        .find(|id| *id != returned)
        .ok_or_else(|| anyhow::anyhow!("no other memory"))?;

    let mut b = Client::connect(&spawn_gateway(ts.stack.settings.clone()).await?, &ts.key).await?;
    // A memory the answer never returned: refused on B as on A.
    for (name, c) in [("A", &mut a), ("B", &mut b)] {
        let err = c
            .retrieval
            .feedback(helpful(&r.query_id, &other))
            .await
            .expect_err("a memory the answer did not return");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{name}: {err:?}");
        assert!(err.message().contains("items.memory_id"), "{name}: {err:?}");
    }
    // An altered receipt does not verify anywhere.
    let (answer, body) = r.query_id.split_once('~').expect("a receipt");
    let forged = format!("{answer}~{}", body.chars().rev().collect::<String>());
    let err = b
        .retrieval
        .feedback(helpful(&forged, &returned))
        .await
        .expect_err("forged receipt");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    // The memory it did return: accepted on B.
    let ok = b
        .retrieval
        .feedback(helpful(&r.query_id, &returned))
        .await?
        .into_inner();
    assert_eq!(ok.accepted, 1);
    ts.shutdown().await;
    Ok(())
}
