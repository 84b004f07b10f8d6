//! The next hop by name (issue 19): a multi-hop answer searches the keyword
//! index once more, for the question and the names its first memory adds
//! (retrieval-svc pipeline/hop.rs), and what that finds takes the place
//! after Stage 4b's slots. Its recall is measured by `engram eval`
//! (docs/benchmarks.md, "The next hop by name"); these tests keep the
//! wiring and its access rule: the second search runs as the caller, so it
//! finds nothing the caller may not read.

use engram_proto::memory_service_client::MemoryServiceClient;
use engram_proto::retrieval_service_client::RetrievalServiceClient;
use engram_proto::{
    AccessLevel, Memory, RetrievalMode, RetrieveRequest, RetrieveResponse, UpsertRequest,
};
use engram_tests::{authed, stack_with_keys};

const QUESTION: &str = "What country was the author of Brand a citizen of?";

fn page(title: &str, content: &str, level: AccessLevel) -> Memory {
    Memory {
        id: uuid::Uuid::new_v4().to_string(),
        title: title.into(),
        content: content.into(),
        memory_type: "semantic".into(),
        access_level: level as i32,
        ..Default::default()
    }
}

/// The pages: the first hop, the second (at `ibsen_level`), and others
/// about countries, citizens and authors (titled so the question names
/// only the first hop's page: the answer opens with it).
fn pages(ibsen_level: AccessLevel) -> Vec<Memory> {
    let public = AccessLevel::Public;
    vec![
        page(
            "Brand (play)",
            "Brand is a verse tragedy by the Norwegian playwright Henrik Ibsen, \
             first staged in Stockholm.",
            public,
        ),
        page(
            "Henrik Ibsen",
            "Henrik Ibsen lived for decades in Italy and Germany, and wrote most \
             of his plays abroad.",
            ibsen_level,
        ),
        page(
            "Nationality law",
            "Citizenship is the status of a person recognised by a country's law \
             as one of its citizens.",
            public,
        ),
        page(
            "Writers",
            "An author is the creator of a written work such as a book or a play.",
            public,
        ),
        page(
            "Nation states",
            "A country is a distinct part of the world, such as a state or nation.",
            public,
        ),
    ]
}

/// The whole stack with one key per (tenant tag, trust), and its clients.
struct Env {
    _stack: engram::stack::Stack,
    keys: Vec<String>,
    mem: MemoryServiceClient<tonic::transport::Channel>,
    client: RetrievalServiceClient<tonic::transport::Channel>,
}

async fn start(keys: &[(&str, &str)]) -> anyhow::Result<Env> {
    let settings = engram_tests::settings().await?;
    let (stack, uri, keys) = stack_with_keys(settings, keys).await?;
    Ok(Env {
        _stack: stack,
        keys,
        mem: MemoryServiceClient::connect(uri.clone()).await?,
        client: RetrievalServiceClient::connect(uri).await?,
    })
}

/// `title` is neither in the answer nor among the candidates the gateway
/// dropped for access: search-svc never returned it to this caller.
fn never_offered(r: &RetrieveResponse, title: &str) {
    let found = titles(r);
    assert!(!found.iter().any(|t| t == title), "{found:?}");
    assert!(
        r.dropped.iter().all(|d| d.stage != "access"),
        "{:?}",
        r.dropped
    );
}

async fn ask(
    client: &mut RetrievalServiceClient<tonic::transport::Channel>,
    key: &str,
    mode: RetrievalMode,
) -> anyhow::Result<RetrieveResponse> {
    let req = RetrieveRequest {
        text: QUESTION.into(),
        mode: mode as i32,
        limit: Some(5),
        no_cache: true,
        skip_rerank: true,
        explain: true,
        ..Default::default()
    };
    Ok(client.retrieve(authed(key, req)).await?.into_inner())
}

fn titles(r: &RetrieveResponse) -> Vec<String> {
    (r.records.iter())
        .filter_map(|s| s.memory.as_ref())
        .map(|m| m.title.clone())
        .collect()
}

fn searched_again(r: &RetrieveResponse) -> bool {
    r.stage_latencies.iter().any(|s| s.stage == "hop")
}

#[tokio::test]
async fn a_multi_hop_answer_holds_the_page_its_first_memory_names() -> anyhow::Result<()> {
    let mut env = start(&[("a", "sensitive")]).await?;
    let key = &env.keys[0];
    let memories = pages(AccessLevel::Public);
    env.mem
        .upsert(authed(key, UpsertRequest { memories }))
        .await?;
    let client = &mut env.client;

    let multi = ask(client, key, RetrievalMode::MultiHop).await?;
    assert!(
        searched_again(&multi),
        "{:?} {:?}",
        multi.stage_latencies,
        titles(&multi)
    );
    assert!(
        multi.degraded_stages.is_empty(),
        "{:?}",
        multi.degraded_stages
    );
    let found = titles(&multi);
    let at = found.iter().position(|t| t == "Henrik Ibsen");
    assert!(at.is_some_and(|i| i < 4), "{found:?}");
    // The second search found it: its provenance says so.
    let ibsen = multi
        .records
        .iter()
        .find(|r| r.memory.as_ref().is_some_and(|m| m.title == "Henrik Ibsen"));
    let strategies: Vec<&str> = (ibsen.and_then(|r| r.provenance.as_ref()))
        .map(|p| p.strategies.iter().map(|h| h.strategy.as_str()).collect())
        .unwrap_or_default();
    assert!(strategies.contains(&"hop"), "{strategies:?}");

    // A simple answer is not a chain: no second search.
    let simple = ask(client, key, RetrievalMode::Simple).await?;
    assert!(!searched_again(&simple), "{:?}", simple.stage_latencies);
    Ok(())
}

#[tokio::test]
async fn the_second_search_finds_nothing_above_the_callers_trust() -> anyhow::Result<()> {
    let mut env = start(&[("a", "sensitive"), ("a", "public")]).await?;
    let (high, low) = (&env.keys[0], &env.keys[1]);
    let memories = pages(AccessLevel::Sensitive);
    env.mem
        .upsert(authed(high, UpsertRequest { memories }))
        .await?;
    let client = &mut env.client;

    let seen_low = ask(client, low, RetrievalMode::MultiHop).await?;
    assert!(searched_again(&seen_low), "{:?}", seen_low.stage_latencies);
    never_offered(&seen_low, "Henrik Ibsen");
    let found = titles(&seen_low);
    assert!(found.iter().any(|t| t == "Brand (play)"), "{found:?}");

    let seen_high = ask(client, high, RetrievalMode::MultiHop).await?;
    let found = titles(&seen_high);
    assert!(found.iter().any(|t| t == "Henrik Ibsen"), "{found:?}");
    Ok(())
}

#[tokio::test]
async fn the_second_search_never_reaches_another_tenant() -> anyhow::Result<()> {
    let mut env = start(&[("a", "sensitive"), ("b", "sensitive")]).await?;
    let (a, b) = (&env.keys[0], &env.keys[1]);
    // Tenant a holds the first hop and the others; only tenant b holds the
    // page the first hop names.
    let (ibsen, rest): (Vec<Memory>, Vec<Memory>) = pages(AccessLevel::Public)
        .into_iter()
        .partition(|m| m.title == "Henrik Ibsen");
    let mem = &mut env.mem;
    mem.upsert(authed(a, UpsertRequest { memories: rest }))
        .await?;
    mem.upsert(authed(b, UpsertRequest { memories: ibsen }))
        .await?;

    let r = ask(&mut env.client, a, RetrievalMode::MultiHop).await?;
    assert!(searched_again(&r), "{:?}", r.stage_latencies);
    never_offered(&r, "Henrik Ibsen");
    Ok(())
}

#[tokio::test]
async fn a_hostile_memory_or_deadline_never_breaks_the_second_search() -> anyhow::Result<()> {
    let mut env = start(&[("a", "sensitive")]).await?;
    let key = &env.keys[0];
    // The first hop's page names a 4,200-letter word first: the second
    // search's text would pass search-svc's 4,096 characters, so it is not
    // sent (search-svc would refuse it, and the answer would be degraded).
    let mut memories = pages(AccessLevel::Public);
    let huge = format!("Z{}", "z".repeat(4_200));
    memories[0].content = format!("Brand is a play by {huge}, who was Norwegian.");
    env.mem
        .upsert(authed(key, UpsertRequest { memories }))
        .await?;
    let client = &mut env.client;
    let r = ask(client, key, RetrievalMode::MultiHop).await?;
    assert_eq!(titles(&r).first().map(String::as_str), Some("Brand (play)"));
    assert!(!searched_again(&r), "{:?}", r.stage_latencies);
    assert!(r.degraded_stages.is_empty(), "{:?}", r.degraded_stages);

    // Deadlines gone on arrival: an answer or the deadline's error, nothing
    // else, and the next answer is whole (no breaker opened).
    for _ in 0..8 {
        let req = RetrieveRequest {
            text: QUESTION.into(),
            mode: RetrievalMode::MultiHop as i32,
            no_cache: true,
            ..Default::default()
        };
        let mut req = authed(key, req);
        req.set_timeout(std::time::Duration::from_millis(1));
        // Cancelled: the client's own timer fired first.
        if let Err(status) = client.retrieve(req).await {
            let code = status.code();
            let gone = [tonic::Code::DeadlineExceeded, tonic::Code::Cancelled];
            assert!(gone.contains(&code), "{status:?}");
        }
    }
    let after = ask(client, key, RetrievalMode::MultiHop).await?;
    assert!(
        after.degraded_stages.is_empty(),
        "{:?}",
        after.degraded_stages
    );
    Ok(())
}
