//! `engram memories` (engram/src/memories.rs) and the `ListMemories` RPC it
//! stands on, on the real stack: paging, filters, export → wipe → import
//! round trip, the key's tenant as the only tenant, and bad input named.

use std::collections::BTreeSet;

use engram::memories::{self, Filters, KeyArgs, MemoriesCommand, Session};
use engram_proto::{ListMemoriesRequest, Memory, TimeRange, Triple, UpsertRequest};
use engram_tests::{authed, settings, stack_with_keys};

fn key_args(uri: &str, key: &str, tenant_opt: Option<&str>) -> KeyArgs {
    KeyArgs {
        addr: Some(uri.to_string()),
        api_key: Some(key.to_string()),
        tenant: tenant_opt.map(str::to_string),
    }
}

/// `n` memories in `namespace`, alternating two types; the first carries
/// entities, a triple and metadata so the export has them to carry.
fn notes(namespace: &str, n: usize) -> Vec<Memory> {
    (0..n)
        .map(|i| Memory {
            id: uuid::Uuid::new_v4().to_string(),
            namespace: namespace.into(),
            memory_type: if i % 2 == 0 { "episodic" } else { "semantic" }.into(),
            content: format!("{namespace} note {i}: Ada met Grace on day {i}."),
            entities: if i == 0 {
                vec!["Ada".into(), "Grace".into()]
            } else {
                Vec::new()
            },
            triples: if i == 0 {
                vec![Triple {
                    subject: "Ada".into(),
                    relation: "met".into(),
                    object: "Grace".into(),
                }]
            } else {
                Vec::new()
            },
            source: format!("test://{namespace}/{i}"),
            ..Default::default()
        })
        .collect()
}

fn ids(ms: &[Memory]) -> BTreeSet<String> {
    ms.iter().map(|m| m.id.clone()).collect()
}

fn in_namespace(ns: &str) -> Filters {
    Filters {
        namespace: Some(ns.into()),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn list_pages_filter_export_wipe_and_import_round_trip() -> anyhow::Result<()> {
    let settings = settings().await?;
    let (stack, uri, keys) =
        stack_with_keys(settings.clone(), &[("a", "sensitive"), ("b", "sensitive")]).await?;
    let mut s = Session::open(&settings, key_args(&uri, &keys[0], None)).await?;
    assert!(s.tenant.starts_with("t-a-"), "{}", s.tenant);
    let (ns1, ns2) = (notes("ns1", 15), notes("ns2", 10));
    for batch in [&ns1, &ns2] {
        s.client
            .memories
            .upsert(UpsertRequest {
                memories: batch.clone(),
            })
            .await?;
    }

    // Paging: every memory exactly once, in order, pages bounded.
    let mut req = Filters::default().request(Some(7), false);
    let mut seen = Vec::new();
    let mut sizes = Vec::new();
    loop {
        let page = s.page(req.clone()).await?;
        assert_eq!(page.tenant, s.tenant);
        sizes.push(page.memories.len());
        seen.extend(page.memories);
        if page.next_page_token.is_empty() {
            break;
        }
        req.page_token = page.next_page_token;
    }
    assert_eq!(sizes, vec![7, 7, 7, 4]);
    let all: BTreeSet<String> = ids(&ns1).union(&ids(&ns2)).cloned().collect();
    assert_eq!(ids(&seen), all);
    assert_eq!(seen.len(), 25, "no memory twice");
    let times: Vec<_> = seen
        .iter()
        .map(|m| m.ingestion_time.map(|t| (t.seconds, t.nanos)))
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "oldest first");
    assert!(seen.iter().all(|m| m.embedding.is_empty()));
    let newest = s.page(Filters::default().request(Some(25), true)).await?;
    let mut reversed: Vec<String> = newest.memories.iter().map(|m| m.id.clone()).collect();
    reversed.reverse();
    assert_eq!(
        reversed,
        seen.iter().map(|m| m.id.clone()).collect::<Vec<_>>()
    );

    // Filters: namespace, type, event time.
    assert_eq!(ids(&s.all(&in_namespace("ns2")).await?), ids(&ns2));
    let semantic = Filters {
        memory_types: vec!["semantic".into()],
        ..in_namespace("ns1")
    };
    assert_eq!(s.all(&semantic).await?.len(), 7);
    let mut future = Filters::default().request(None, false);
    let tomorrow = std::time::SystemTime::now() + std::time::Duration::from_secs(86_400);
    future.time_range = Some(TimeRange {
        start: Some(prost_types::Timestamp::from(tomorrow)),
        end: None,
    });
    assert!(s.page(future).await?.memories.is_empty());

    // Export ns1, wipe it (a count first, then --yes), import it back.
    let mut out = Vec::new();
    assert_eq!(s.export(&in_namespace("ns1"), &mut out).await?, 15);
    let text = String::from_utf8(out)?;
    assert_eq!(text.lines().count(), 15);
    assert!(
        text.contains("\"triples\":[[\"Ada\",\"met\",\"Grace\"]]"),
        "{text}"
    );
    assert_eq!(s.wipe(Some("ns1"), false).await?, (15, 0));
    assert_eq!(
        s.all(&in_namespace("ns1")).await?.len(),
        15,
        "a count deletes nothing"
    );
    let refused = memories::run(
        settings.clone(),
        MemoriesCommand::Wipe {
            namespace: Some("ns1".into()),
            all_namespaces: false,
            yes: false,
            key: key_args(&uri, &keys[0], None),
        },
    )
    .await
    .expect_err("wipe without --yes");
    assert!(refused.to_string().contains("--yes"), "{refused}");
    assert_eq!(s.wipe(Some("ns1"), true).await?, (15, 15));
    assert!(s.all(&in_namespace("ns1")).await?.is_empty());
    assert_eq!(
        s.all(&in_namespace("ns2")).await?.len(),
        10,
        "wipe stays in its namespace"
    );

    let dir = tempfile::tempdir()?;
    let file = dir.path().join("ns1.jsonl");
    std::fs::write(&file, &text)?;
    s.import(settings.clone(), &file).await?;
    let back = s.all(&in_namespace("ns1")).await?;
    assert_eq!(ids(&back), ids(&ns1), "same ids after the round trip");
    let first = back
        .iter()
        .find(|m| m.id == ns1[0].id)
        .ok_or_else(|| anyhow::anyhow!("first note missing"))?;
    assert_eq!(first.content, ns1[0].content);
    assert_eq!(first.source, ns1[0].source);
    assert_eq!(first.memory_type, "episodic");
    assert!(
        first.entities.iter().any(|e| e == "Ada"),
        "{:?}",
        first.entities
    );
    assert_eq!(first.triples.len(), 1);
    let mut again = Vec::new();
    s.export(&in_namespace("ns1"), &mut again).await?;
    let sorted = |t: &str| t.lines().map(str::to_string).collect::<BTreeSet<_>>();
    assert_eq!(
        sorted(&String::from_utf8(again)?),
        sorted(&text),
        "export is stable"
    );

    // get / delete by id.
    let got = s.get(&settings, &[ns2[0].id.clone()]).await?;
    assert_eq!(got.len(), 1);
    assert_eq!(s.delete(&settings, &[ns2[0].id.clone()]).await?, 1);
    assert_eq!(s.all(&in_namespace("ns2")).await?.len(), 9);

    stack.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_lists_and_wipes_only_its_own_tenant() -> anyhow::Result<()> {
    let settings = settings().await?;
    let (stack, uri, keys) =
        stack_with_keys(settings.clone(), &[("a", "sensitive"), ("b", "sensitive")]).await?;
    let mut a = Session::open(&settings, key_args(&uri, &keys[0], None)).await?;
    a.client
        .memories
        .upsert(UpsertRequest {
            memories: notes("shared-name", 5),
        })
        .await?;
    let a_page = a.page(Filters::default().request(Some(2), false)).await?;
    assert_eq!(a_page.memories.len(), 2);

    let mut b = Session::open(&settings, key_args(&uri, &keys[1], None)).await?;
    assert_ne!(b.tenant, a.tenant);
    assert!(b.all(&Filters::default()).await?.is_empty());
    // A's page token positions B's walk; it never opens A's rows.
    let mut req = Filters::default().request(Some(10), false);
    req.page_token = a_page.next_page_token.clone();
    assert!(b.page(req).await?.memories.is_empty());
    let ids: Vec<String> = a_page.memories.iter().map(|m| m.id.clone()).collect();
    assert!(b.get(&settings, &ids).await?.is_empty());
    assert_eq!(b.wipe(None, true).await?, (0, 0));
    assert_eq!(b.delete(&settings, &ids).await?, 0);
    assert_eq!(
        a.all(&Filters::default()).await?.len(),
        5,
        "A's memories stay"
    );

    // --tenant checks the key, it never chooses the tenant.
    let e = Session::open(&settings, key_args(&uri, &keys[1], Some(&a.tenant)))
        .await
        .err()
        .ok_or_else(|| anyhow::anyhow!("B's key with --tenant A was accepted"))?;
    assert!(e.to_string().contains(&b.tenant), "{e}");
    let same = Session::open(&settings, key_args(&uri, &keys[0], Some(&a.tenant))).await?;
    assert_eq!(same.tenant, a.tenant);
    stack.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_listings_are_invalid_arguments_naming_the_field() -> anyhow::Result<()> {
    let settings = settings().await?;
    let (stack, uri, keys) = stack_with_keys(settings, &[("a", "sensitive")]).await?;
    let mut client =
        engram_proto::memory_service_client::MemoryServiceClient::connect(uri.clone()).await?;
    let cases = [
        (
            ListMemoriesRequest {
                page_size: Some(0),
                ..Default::default()
            },
            "page_size",
        ),
        (
            ListMemoriesRequest {
                page_size: Some(1001),
                ..Default::default()
            },
            "page_size",
        ),
        (
            ListMemoriesRequest {
                page_token: "not-a-token".into(),
                ..Default::default()
            },
            "page_token",
        ),
        (
            ListMemoriesRequest {
                memory_types: vec!["Not A Type".into()],
                ..Default::default()
            },
            "memory_types",
        ),
    ];
    for (req, field) in cases {
        let status = client
            .list_memories(authed(&keys[0], req))
            .await
            .expect_err(field);
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(field), "{status:?}");
    }
    let status = client
        .list_memories(tonic::Request::new(ListMemoriesRequest::default()))
        .await
        .expect_err("no key");
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    stack.shutdown().await;
    Ok(())
}

/// stdout of a command whose reader went away (`engram memories list | head`).
struct ClosedPipe;

impl std::io::Write for ClosedPipe {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::ErrorKind::BrokenPipe.into())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Err(std::io::ErrorKind::BrokenPipe.into())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn get_of_a_missing_id_fails_and_a_closed_pipe_ends_a_listing_quietly() -> anyhow::Result<()>
{
    let settings = settings().await?;
    let (stack, uri, keys) = stack_with_keys(settings.clone(), &[("a", "sensitive")]).await?;
    let mut s = Session::open(&settings, key_args(&uri, &keys[0], None)).await?;
    let stored = notes("ns", 3);
    s.client
        .memories
        .upsert(UpsertRequest {
            memories: stored.clone(),
        })
        .await?;
    let key = || key_args(&uri, &keys[0], None);

    // A missing id is an error (exit 1) naming it; the found one is printed.
    let missing = uuid::Uuid::new_v4().to_string();
    let mut out = Vec::new();
    let e = memories::run_to(
        settings.clone(),
        MemoriesCommand::Get {
            ids: vec![stored[0].id.clone(), missing.clone()],
            key: key(),
        },
        &mut out,
    )
    .await
    .expect_err("a missing id");
    assert!(e.to_string().contains("1 of 2 ids not found"), "{e}");
    assert!(e.to_string().contains(&missing), "{e}");
    let printed = String::from_utf8(out)?;
    assert_eq!(printed.lines().count(), 1);
    assert!(printed.contains(&stored[0].id), "{printed}");

    // `list | head`: the write fails with a broken pipe, never a panic, and
    // the command ends with success.
    let list = || MemoriesCommand::List {
        filters: Filters::default(),
        page_size: None,
        page_token: None,
        all: true,
        newest_first: false,
        json: false,
        key: key(),
    };
    let closed = memories::run_to(settings.clone(), list(), &mut ClosedPipe).await;
    let e = closed.as_ref().expect_err("the write failed");
    assert!(e.to_string().to_lowercase().contains("pipe"), "{e}");
    assert!(memories::quiet_on_broken_pipe(closed).is_ok());
    // Other errors stay errors.
    assert!(memories::quiet_on_broken_pipe(Err(anyhow::anyhow!("boom"))).is_err());
    stack.shutdown().await;
    Ok(())
}
