//! Calibrated abstention (issue 18): an answer says `nothing_relevant`
//! when the tenant holds nothing about the question, and not when it does;
//! the records come back either way. Rates on the dev sets come from
//! `engram eval abstain` (docs/benchmarks.md).

use engram_proto::RetrieveRequest;
use engram_tests::TestStack;

fn ask(text: &str) -> RetrieveRequest {
    RetrieveRequest {
        text: text.into(),
        limit: Some(5),
        no_cache: true,
        ..Default::default()
    }
}

/// A stack whose tenant holds the demo's sample memories.
async fn sample() -> anyhow::Result<(TestStack, engram::client::Client)> {
    let ts = TestStack::start("sensitive").await?;
    let mut c = ts.client().await?;
    engram::demo::load_sample(&mut c, &ts.tenant).await?;
    Ok((ts, c))
}

#[tokio::test]
async fn a_question_about_someone_this_tenant_never_met_is_flagged() -> anyhow::Result<()> {
    let (ts, mut c) = sample().await?;
    let foreign = c
        .retrieval
        .retrieve(ask("When did Caroline go to the LGBTQ support group?"))
        .await?
        .into_inner();
    assert!(foreign.nothing_relevant, "{foreign:?}");
    assert!(!foreign.records.is_empty(), "records still come back");
    for q in [
        "When does Alice prefer to have meetings?",
        "What is the deadline for the Atlas migration?",
    ] {
        let own = c.retrieval.retrieve(ask(q)).await?.into_inner();
        assert!(!own.nothing_relevant, "{q}: {own:?}");
        assert!(own.evidence_score > foreign.evidence_score, "{q}");
    }
    ts.shutdown().await;
    Ok(())
}

/// Issue 46 item 6: a person the tenant knows well, asked for something
/// no memory holds. The question's form says what the answer looks like
/// (a phone number, an e-mail address, a birthday, a colour, a time zone);
/// no memory about the person holds
/// one, so nothing is relevant — while a question whose answer is there,
/// in the shape it asks for, is not flagged.
#[tokio::test]
async fn a_known_persons_unknown_number_is_flagged() -> anyhow::Result<()> {
    let (ts, mut c) = sample().await?;
    for q in [
        "What is Bob Martinez's phone number?",
        "What's Dana Okafor's email address?",
        "What's Dana Okafor's Slack handle?",
        "What is Bob Martinez's blood type?",
        "What's Bob Martinez's home address?",
        "When is Bob Martinez's birthday?",
        "What's Dana Okafor's favourite colour?",
        "What time zone is Dana Okafor in?",
    ] {
        let r = c.retrieval.retrieve(ask(q)).await?.into_inner();
        assert!(r.nothing_relevant, "{q}: {r:?}");
        assert!(!r.records.is_empty(), "records still come back");
    }
    for q in [
        "When is the Atlas cutover?",
        "What time does Bob Martinez prefer calls?",
        // "works from Madrid … 15:00 CET"
        "What time zone is Bob Martinez in?",
    ] {
        let r = c.retrieval.retrieve(ask(q)).await?.into_inner();
        assert!(!r.nothing_relevant, "{q}: {r:?}");
    }
    ts.shutdown().await;
    Ok(())
}

/// The same questions once a memory holds the answer in its shape: not
/// flagged.
#[tokio::test]
async fn a_known_persons_number_once_written_is_not_flagged() -> anyhow::Result<()> {
    let (ts, mut c) = sample().await?;
    let note = "Dana Okafor is @dana.ok on Slack; she sits at 12 Harbour Street, blood type O+.";
    engram_tests::remember(&mut c, note).await?;
    for q in [
        "What's Dana Okafor's Slack handle?",
        "What's Dana Okafor's home address?",
        "What is Dana Okafor's blood type?",
    ] {
        let r = c.retrieval.retrieve(ask(q)).await?.into_inner();
        assert!(!r.nothing_relevant, "{q}: {r:?}");
    }
    ts.shutdown().await;
    Ok(())
}
