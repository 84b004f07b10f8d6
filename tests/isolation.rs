//! One tenant cannot hurt another (issue 16): each test reproduces what a
//! hostile or hasty tenant did to everyone else, on the real stack (every
//! service on port 0, the shared test Postgres).

use std::time::Duration;

use engram::client::Client;
use engram::stack::Stack;
use engram_common::convert::json_to_struct;
use engram_proto::memory_service_client::MemoryServiceClient;
use engram_proto::working_memory_service_client::WorkingMemoryServiceClient;
use engram_proto::{
    AccessLevel, DeleteRequest, GetMemoryRequest, Memory, RetrieveRequest, UpsertRequest,
};
use engram_tests::{authed, metric_lines, stack_with_agents, stack_with_keys};

/// The whole stack with two tenants, each with its own key.
async fn two_tenants() -> anyhow::Result<(Stack, Client, Client)> {
    two_tenants_with(engram_tests::settings().await?).await
}

async fn two_tenants_with(
    settings: engram_common::Settings,
) -> anyhow::Result<(Stack, Client, Client)> {
    let (stack, uri, keys) =
        stack_with_keys(settings, &[("a", "internal"), ("b", "internal")]).await?;
    let a = Client::connect(&uri, &keys[0]).await?;
    let b = Client::connect(&uri, &keys[1]).await?;
    Ok((stack, a, b))
}

fn query(text: &str) -> RetrieveRequest {
    RetrieveRequest {
        text: text.into(),
        no_cache: true,
        ..Default::default()
    }
}

#[tokio::test]
async fn a_tenants_cancelled_calls_never_open_anothers_breaker() -> anyhow::Result<()> {
    let (stack, mut a, mut b) = two_tenants().await?;
    let memories = (0..12)
        .map(|i| Memory {
            id: uuid::Uuid::new_v4().to_string(),
            memory_type: "semantic".into(),
            content: format!("Billing migration note {i}: Alice leads the rollout of step {i}."),
            ..Default::default()
        })
        .collect();
    a.memories.upsert(UpsertRequest { memories }).await?;

    // A deadline gone on arrival (grpc-timeout 1 ms): every downstream call
    // of the request runs out of the caller's time.
    for _ in 0..8 {
        let mut req = tonic::Request::new(query("who leads the billing migration?"));
        req.set_timeout(Duration::from_millis(1));
        let _ = a.retrieval.retrieve(req).await;
    }
    // A client that hangs up mid-request (cross-encoder usually in flight).
    for i in 0..8 {
        let text = format!("which step of the billing migration is number {i}?");
        let call = a.retrieval.retrieve(query(&text));
        let _ = tokio::time::timeout(Duration::from_millis(30), call).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let states = metric_lines(&stack, "engram_retrieval_circuit_state").await?;
    assert!(!states.is_empty());
    for line in &states {
        assert!(line.ends_with(" 0"), "a breaker opened: {states:#?}");
    }
    // The abandoned calls are counted, as the caller's deadline.
    let deadline = metric_lines(
        &stack,
        "engram_downstream_requests_total{outcome=\"deadline\"",
    )
    .await?;
    assert!(
        deadline.iter().any(|l| !l.ends_with(" 0")),
        "no deadline outcome counted: {deadline:#?}"
    );
    // Another tenant's ordinary query is answered in full.
    let r = b
        .retrieval
        .retrieve(query("what do we know about the rollout?"))
        .await?
        .into_inner();
    assert!(r.degraded_stages.is_empty(), "{:?}", r.degraded_stages);
    stack.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_nul_byte_or_an_impossible_time_is_the_callers_error_and_opens_no_breaker()
-> anyhow::Result<()> {
    let (stack, mut a, mut b) = two_tenants().await?;
    let far = prost_types::Timestamp {
        seconds: -1_000_000_000_000,
        nanos: 0,
    };
    let bad_reads = [
        ("text", query("who\0 leads?")),
        (
            "namespace",
            RetrieveRequest {
                namespace: "ns\0".into(),
                ..query("who leads?")
            },
        ),
        (
            "namespace",
            RetrieveRequest {
                namespace: "n".repeat(129),
                ..query("who leads?")
            },
        ),
        (
            "agent_scope",
            RetrieveRequest {
                agent_scope: vec!["a\0".into()],
                ..query("who leads?")
            },
        ),
        (
            "as_of_event",
            RetrieveRequest {
                as_of_event: Some(far),
                ..query("who leads?")
            },
        ),
    ];
    for _ in 0..3 {
        for (field, req) in bad_reads.clone() {
            let e = a.retrieval.retrieve(req).await.expect_err(field);
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{field}: {e:?}");
            assert!(e.message().contains(field), "{field}: {}", e.message());
        }
    }
    for _ in 0..6 {
        let m = Memory {
            content: "a NUL \0 in the content".into(),
            ..Default::default()
        };
        let e = a
            .memories
            .upsert(UpsertRequest { memories: vec![m] })
            .await
            .expect_err("nul content");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains("content"), "{}", e.message());
    }
    let states = metric_lines(&stack, "engram_retrieval_circuit_state").await?;
    for line in &states {
        assert!(line.ends_with(" 0"), "a breaker opened: {states:#?}");
    }
    // The other tenant still writes and reads.
    let m = Memory {
        content: "Bob owns the invoice service.".into(),
        ..Default::default()
    };
    b.memories
        .upsert(UpsertRequest { memories: vec![m] })
        .await?;
    let r = b
        .retrieval
        .retrieve(query("who owns the invoice service?"))
        .await?
        .into_inner();
    assert!(
        !r.records.is_empty() && r.degraded_stages.is_empty(),
        "{r:?}"
    );
    stack.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_public_key_cannot_overwrite_delete_or_count_an_agents_sensitive_fragments()
-> anyhow::Result<()> {
    // One agent with two keys: sensitive and public.
    let settings = engram_tests::settings().await?;
    let (stack, uri, keys) =
        stack_with_keys(settings, &[("a", "sensitive"), ("a", "public")]).await?;
    let (high, low) = (keys[0].clone(), keys[1].clone());
    let mut mem = MemoryServiceClient::connect(uri.clone()).await?;
    let mut wm = WorkingMemoryServiceClient::connect(uri).await?;
    let session = format!("s-{}", uuid::Uuid::new_v4().simple());
    let id = uuid::Uuid::new_v4().to_string();
    let note = |content: &str, level: AccessLevel| Memory {
        id: id.clone(),
        memory_type: "working".into(),
        content: content.into(),
        access_level: level as i32,
        metadata: Some(json_to_struct(
            &serde_json::json!({ "session_id": session }),
        )),
        ..Default::default()
    };
    let secret = note("The launch code is blue.", AccessLevel::Sensitive);
    mem.upsert(authed(
        &high,
        UpsertRequest {
            memories: vec![secret],
        },
    ))
    .await?;

    let overwrite = note("The launch code is red.", AccessLevel::Public);
    let e = mem
        .upsert(authed(
            &low,
            UpsertRequest {
                memories: vec![overwrite],
            },
        ))
        .await
        .expect_err("public overwrite of a sensitive fragment");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("memories[0].id"), "{}", e.message());
    let deleted = mem
        .delete(authed(
            &low,
            DeleteRequest {
                ids: vec![id.clone()],
            },
        ))
        .await?
        .into_inner();
    assert_eq!(deleted.deleted, 0);

    let get = |key: &str| {
        authed(
            key,
            GetMemoryRequest {
                query: "what is the launch code?".into(),
                session_id: session.clone(),
                compact: true,
                ..Default::default()
            },
        )
    };
    let seen_low = wm.get_memory(get(&low)).await?.into_inner();
    assert!(seen_low.items.iter().all(|i| i.id != id), "{seen_low:?}");
    assert_eq!(seen_low.working_candidates, 0, "{seen_low:?}");
    let seen_high = wm.get_memory(get(&high)).await?.into_inner();
    let item = seen_high.items.iter().find(|i| i.id == id);
    assert!(
        item.is_some_and(|i| i.content == "The launch code is blue."),
        "{seen_high:?}"
    );
    stack.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn raw_vectors_and_higher_supersedes_targets_never_leave_the_service() -> anyhow::Result<()> {
    let settings = engram_tests::settings().await?;
    let (stack, uri, keys) =
        stack_with_keys(settings, &[("a", "sensitive"), ("a", "public")]).await?;
    let (high, low) = (keys[0].clone(), keys[1].clone());
    let mut mem = MemoryServiceClient::connect(uri.clone()).await?;
    let (old_id, new_id) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let old = Memory {
        id: old_id.to_string(),
        content: "The vault combination is 4-8-15, noted by the security team.".into(),
        access_level: AccessLevel::Sensitive as i32,
        ..Default::default()
    };
    let new = Memory {
        id: new_id.to_string(),
        content: "The vault combination was changed; ask the security team.".into(),
        access_level: AccessLevel::Public as i32,
        supersedes: old_id.to_string(),
        ..Default::default()
    };
    mem.upsert(authed(
        &high,
        UpsertRequest {
            memories: vec![old],
        },
    ))
    .await?;
    mem.upsert(authed(
        &high,
        UpsertRequest {
            memories: vec![new],
        },
    ))
    .await?;

    let get = |key: &str| {
        authed(
            key,
            engram_proto::GetRequest {
                ids: vec![new_id.to_string()],
                include_embedding: true,
                omit_entities: false,
                vectors_only: false,
                ..Default::default()
            },
        )
    };
    let seen_low = mem.get(get(&low)).await?.into_inner().memories;
    assert_eq!(seen_low.len(), 1, "{seen_low:?}");
    assert!(
        seen_low[0].embedding.is_empty(),
        "an embedding left the service"
    );
    assert_eq!(seen_low[0].supersedes, "", "a sensitive id leaked");
    let seen_high = mem.get(get(&high)).await?.into_inner().memories;
    assert!(
        seen_high[0].embedding.is_empty(),
        "an embedding left the service"
    );
    assert_eq!(seen_high[0].supersedes, old_id.to_string());
    // A caller asking for the pipeline's internal vectors-only read gets
    // the whole row and still no vector.
    let hostile = authed(
        &low,
        engram_proto::GetRequest {
            ids: vec![new_id.to_string()],
            include_embedding: true,
            omit_entities: true,
            vectors_only: true,
            ..Default::default()
        },
    );
    let seen = mem.get(hostile).await?.into_inner().memories;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        seen[0].embedding.is_empty(),
        "an embedding left the service"
    );
    assert!(!seen[0].content.is_empty(), "the row was cut to its vector");

    let mut low_client = Client::connect(&uri, &low).await?;
    let r = low_client
        .retrieval
        .retrieve(query("what is the vault combination?"))
        .await?
        .into_inner();
    let found: Vec<_> = r.records.iter().filter_map(|s| s.memory.as_ref()).collect();
    assert!(
        found.iter().any(|m| m.id == new_id.to_string()),
        "{found:?}"
    );
    assert!(found.iter().all(|m| m.supersedes.is_empty()), "{found:?}");
    stack.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn an_id_held_by_another_tenant_or_above_trust_gets_one_answer() -> anyhow::Result<()> {
    let settings = engram_tests::settings().await?;
    let tenants = [("a", "sensitive"), ("a", "public"), ("b", "sensitive")];
    let (stack, uri, keys) = stack_with_keys(settings, &tenants).await?;
    let (a_high, a_low, b) = (keys[0].clone(), keys[1].clone(), keys[2].clone());
    let mut mem = MemoryServiceClient::connect(uri).await?;
    let id = uuid::Uuid::new_v4().to_string();
    let m = |content: &str| Memory {
        id: id.clone(),
        content: content.into(),
        access_level: AccessLevel::Sensitive as i32,
        ..Default::default()
    };
    let public = |mut m: Memory| {
        m.access_level = AccessLevel::Public as i32;
        m
    };
    mem.upsert(authed(
        &a_high,
        UpsertRequest {
            memories: vec![m("A's secret plan.")],
        },
    ))
    .await?;
    let mut answers = Vec::new();
    for (who, memory) in [
        (&b, m("B takes the id.")),
        (&a_low, public(m("A's public key overwrites."))),
    ] {
        let e = mem
            .upsert(authed(
                who,
                UpsertRequest {
                    memories: vec![memory],
                },
            ))
            .await
            .expect_err("an id the caller cannot use");
        answers.push((e.code(), e.message().to_string()));
    }
    assert_eq!(answers[0], answers[1], "the answer tells the cases apart");
    assert_eq!(answers[0].0, tonic::Code::PermissionDenied);
    assert!(answers[0].1.contains("memories[0].id"), "{answers:?}");
    stack.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_tenants_flood_is_refused_with_a_retry_hint_and_others_are_served() -> anyhow::Result<()>
{
    let mut settings = engram_tests::settings().await?;
    settings.tenant.requests_per_second = 1;
    settings.tenant.burst = 3;
    let (stack, mut a, mut b) = two_tenants_with(settings).await?;
    let mut refused = Vec::new();
    for i in 0..10 {
        let text = format!("flood question {i}?");
        if let Err(e) = a.retrieval.retrieve(query(&text)).await {
            refused.push(e);
        }
    }
    assert!(refused.len() >= 6, "{} refused", refused.len());
    for e in &refused {
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
        let hint = e
            .metadata()
            .get("retry-after-ms")
            .and_then(|v| v.to_str().ok());
        assert!(
            hint.and_then(|h| h.parse::<u64>().ok())
                .is_some_and(|ms| ms > 0),
            "{e:?}"
        );
    }
    let r = b
        .retrieval
        .retrieve(query("what about me?"))
        .await?
        .into_inner();
    assert!(r.degraded_stages.is_empty(), "{:?}", r.degraded_stages);
    stack.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_tenants_flood_of_large_answers_cannot_evict_anothers_cached_answer() -> anyhow::Result<()>
{
    let mut settings = engram_tests::settings().await?;
    // 1 MB per cache, a quarter of it per tenant; the flood below is ~40
    // answers of 100 memories of ~4 KB each, far past both.
    settings.pipeline.cache_max_bytes = 3 << 20;
    settings.pipeline.cache_tenant_share = 0.25;
    // Long enough that a slow CI machine's flood cannot outlive B's entry.
    settings.pipeline.cache_ttl_ms = 600_000;
    settings.tenant.requests_per_second = 1000;
    settings.tenant.burst = 1000;
    let (stack, mut a, mut b) = two_tenants_with(settings).await?;
    let big: Vec<Memory> = (0..100)
        .map(|i| Memory {
            content: format!("Flood note {i}: {}", "bulky words ".repeat(350)),
            ..Default::default()
        })
        .collect();
    a.memories.upsert(UpsertRequest { memories: big }).await?;
    engram_tests::remember(&mut b, "The launch code is kept in the blue binder.").await?;
    let cached = |text: &str| RetrieveRequest {
        text: text.into(),
        ..Default::default()
    };
    // Only a whole answer is cached: a degraded one (a stage timed out
    // under a loaded CI machine) is not. Ask until B's answer is cached,
    // so the assertion below tests eviction and nothing else.
    let mut warmed = false;
    for _ in 0..10 {
        let answer = b
            .retrieval
            .retrieve(cached("where is the launch code kept?"))
            .await?
            .into_inner();
        if answer.skip_reason == engram_proto::SkipReason::CacheHit as i32 {
            warmed = true;
            break;
        }
    }
    assert!(warmed, "B's answer was never cached");
    for i in 0..40 {
        let mut q = cached(&format!(
            "which flood note mentions bulky words number {i}?"
        ));
        q.limit = Some(100);
        a.retrieval.retrieve(q).await?;
    }
    let again = b
        .retrieval
        .retrieve(cached("where is the launch code kept?"))
        .await?
        .into_inner();
    assert_eq!(
        again.skip_reason,
        engram_proto::SkipReason::CacheHit as i32,
        "{again:?}"
    );
    // What the caches hold stays within the bytes they were given.
    for line in metric_lines(&stack, "engram_cache_bytes{").await? {
        let bytes: f64 = line.rsplit(' ').next().unwrap_or("").parse()?;
        assert!(bytes <= f64::from(1u32 << 20), "{line}");
    }
    assert_eq!(metric_lines(&stack, "engram_cache_bytes{").await?.len(), 3);
    stack.shutdown().await;
    Ok(())
}

/// A health check of `addr` through `endpoint`: the serving status, or why not.
async fn health_through(endpoint: tonic::transport::Endpoint) -> Result<i32, String> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let channel = endpoint.connect().await.map_err(|e| format!("{e:?}"))?;
    HealthClient::new(channel)
        .check(HealthCheckRequest::default())
        .await
        .map(|r| r.into_inner().status)
        .map_err(|e| format!("{e:?}"))
}

#[tokio::test]
async fn internal_calls_go_over_tls_and_refuse_plaintext_and_strangers() -> anyhow::Result<()> {
    let certs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tls");
    let mut settings = engram_tests::settings().await?;
    settings.tls.cert_path_opt = Some(certs.join("internal.pem"));
    settings.tls.key_path_opt = Some(certs.join("internal.key"));
    settings.tls.ca_path_opt = Some(certs.join("ca.pem"));
    let ts = engram_tests::TestStack::start_with(
        settings,
        engram::stack::Service::ALL.into_iter().collect(),
        "internal",
    )
    .await?;
    // The whole pipeline works across TLS hops.
    let mut c = ts.client().await?;
    engram_tests::remember(&mut c, "The backup key is in the grey safe.").await?;
    let r = c
        .retrieval
        .retrieve(query("where is the backup key?"))
        .await?
        .into_inner();
    assert!(r.degraded_stages.is_empty(), "{:?}", r.degraded_stages);
    assert!(!r.records.is_empty());
    for svc in [
        engram::stack::Service::Search,
        engram::stack::Service::Graph,
    ] {
        let addr = ts
            .stack
            .addr(svc)
            .ok_or_else(|| anyhow::anyhow!("{svc:?}"))?;
        // Plaintext: refused.
        let plain = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?;
        assert!(
            health_through(plain).await.is_err(),
            "{svc:?} spoke plaintext"
        );
        // A certificate from another CA: refused.
        let stranger = engram_common::settings::TlsSettings {
            ca_path_opt: Some(certs.join("other-ca.pem")),
            ..Default::default()
        };
        let https = engram_common::tls::uri(addr, &stranger);
        let untrusted = engram_common::tls::endpoint(&https, &stranger)?;
        assert!(
            health_through(untrusted).await.is_err(),
            "{svc:?} trusted a stranger's CA"
        );
        // The deployment's CA: served.
        let trusted = engram_common::tls::endpoint(&https, &ts.stack.settings.tls)?;
        assert_eq!(health_through(trusted).await, Ok(1), "{svc:?}");
    }
    ts.shutdown().await;
    Ok(())
}

/// An HS256 token over `claims`, as an identity provider would mint it.
fn jwt(secret: &[u8], claims: &serde_json::Value) -> anyhow::Result<String> {
    use base64::Engine;
    use hmac::Mac;
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let head = b64(br#"{"alg":"HS256","typ":"JWT"}"#);
    let body = b64(claims.to_string().as_bytes());
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret)?;
    mac.update(format!("{head}.{body}").as_bytes());
    Ok(format!(
        "{head}.{body}.{}",
        b64(&mac.finalize().into_bytes())
    ))
}

#[tokio::test]
async fn jwts_are_checked_on_the_real_stack_over_grpc_and_http() -> anyhow::Result<()> {
    let secret = b"an identity provider's secret of 32+ bytes";
    let mut settings = engram_tests::settings().await?;
    settings.auth.jwt_hs256_secret_opt = Some(String::from_utf8(secret.to_vec())?);
    settings.auth.jwt_audience_opt = Some("engram".into());
    settings.auth.jwt_issuer_opt = Some("https://idp.example".into());
    let ts = engram_tests::TestStack::start_with(
        settings,
        engram::stack::Service::ALL.into_iter().collect(),
        "internal",
    )
    .await?;
    let uri = ts
        .stack
        .gateway_uri()
        .ok_or_else(|| anyhow::anyhow!("no gateway"))?;
    let tenant = format!("t-jwt-{}", uuid::Uuid::new_v4().simple());
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs(),
    )?;
    let claims = |extra: serde_json::Value| {
        let mut c = serde_json::json!({
            "tenant": tenant, "sub": "agent-7", "trust": "internal",
            "exp": now + 300, "aud": "engram", "iss": "https://idp.example",
        });
        for (k, v) in extra.as_object().into_iter().flatten() {
            c[k] = v.clone();
        }
        c
    };
    let good = jwt(secret, &claims(serde_json::json!({})))?;
    let mut mem = MemoryServiceClient::connect(uri.clone()).await?;
    let note = Memory {
        content: "The JWT tenant keeps its notes in the teal binder.".into(),
        ..Default::default()
    };
    mem.upsert(authed(
        &good,
        UpsertRequest {
            memories: vec![note],
        },
    ))
    .await?;
    let mut retrieval =
        engram_proto::retrieval_service_client::RetrievalServiceClient::connect(uri).await?;
    let r = retrieval
        .retrieve(authed(&good, query("where are the notes kept?")))
        .await?
        .into_inner();
    assert!(
        r.records
            .iter()
            .filter_map(|s| s.memory.as_ref())
            .any(|m| m.content.contains("teal binder")),
        "{r:?}"
    );
    let refused = [
        (
            "wrong audience",
            jwt(secret, &claims(serde_json::json!({"aud": "other"})))?,
        ),
        (
            "wrong issuer",
            jwt(
                secret,
                &claims(serde_json::json!({"iss": "https://evil.example"})),
            )?,
        ),
        (
            "not yet valid",
            jwt(secret, &claims(serde_json::json!({"nbf": now + 3600})))?,
        ),
        (
            "expired",
            jwt(secret, &claims(serde_json::json!({"exp": now - 1})))?,
        ),
        (
            "forged",
            jwt(
                b"someone else's secret of 32+ bytes!",
                &claims(serde_json::json!({})),
            )?,
        ),
        ("padded", format!("{good}=")),
    ];
    for (why, token) in &refused {
        let e = retrieval
            .retrieve(authed(token, query("where are the notes kept?")))
            .await
            .expect_err(why);
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{why}: {e:?}");
    }
    // The HTTP surface accepts and refuses the same tokens.
    let http = ts
        .stack
        .http_addr_opt
        .ok_or_else(|| anyhow::anyhow!("no http"))?;
    let post = |token: String| {
        let body = serde_json::json!({
            "kb_id": uuid::Uuid::new_v4().to_string(),
            "query": "where are the notes kept?",
            "tenant_id": tenant,
        });
        reqwest::Client::new()
            .post(format!("http://{http}/api/v1/retrieve/basic"))
            .bearer_auth(token)
            .json(&body)
            .send()
    };
    assert_eq!(post(good.clone()).await?.status(), 200);
    assert_eq!(post(refused[0].1.clone()).await?.status(), 401);
    ts.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn feedback_is_refused_on_anothers_answer_or_on_memories_it_never_returned()
-> anyhow::Result<()> {
    use engram_proto::{FeedbackItem, FeedbackRequest, FeedbackSignal};
    let (stack, mut a, mut b) = two_tenants().await?;
    engram_tests::remember(&mut a, "The release train leaves every second Tuesday.").await?;
    let r = a
        .retrieval
        .retrieve(query("when does the release train leave?"))
        .await?
        .into_inner();
    let returned = r
        .records
        .first()
        .and_then(|s| s.memory.as_ref())
        .map(|m| m.id.clone())
        .ok_or_else(|| anyhow::anyhow!("no record"))?;
    let helpful = |memory_id: &str| FeedbackRequest {
        query_id: r.query_id.clone(),
        items: vec![FeedbackItem {
            memory_id: memory_id.into(),
            signal: FeedbackSignal::Helpful as i32,
            value: true,
        }],
    };
    // Another tenant cannot vote on A's answer.
    let foreign = b
        .retrieval
        .feedback(helpful(&returned))
        .await
        .expect_err("foreign");
    assert_eq!(foreign.code(), tonic::Code::PermissionDenied, "{foreign:?}");
    // A cannot vote up a memory the answer never held.
    let stranger = uuid::Uuid::new_v4().to_string();
    let planted = a
        .retrieval
        .feedback(helpful(&stranger))
        .await
        .expect_err("planted");
    assert_eq!(planted.code(), tonic::Code::InvalidArgument, "{planted:?}");
    assert!(planted.message().contains("items.memory_id"), "{planted:?}");
    // Its own feedback on what it was given is accepted.
    let ok = a.retrieval.feedback(helpful(&returned)).await?.into_inner();
    assert_eq!(ok.accepted, 1);
    stack.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_question_nothing_matches_reads_no_vectors() -> anyhow::Result<()> {
    use engram_proto::RetrievalMode;
    let (stack, _a, mut b) = two_tenants().await?;
    // B stores nothing: every strategy finds nothing, on the multi-hop
    // route that reads the candidates' vectors beside the graph's rows.
    for text in [
        "who leads the project that migrates billing?",
        "how is Alice related to Bob?",
    ] {
        let r = b
            .retrieval
            .retrieve(RetrieveRequest {
                mode: RetrievalMode::MultiHop as i32,
                ..query(text)
            })
            .await?
            .into_inner();
        assert!(r.records.is_empty(), "{r:?}");
        assert!(r.degraded_stages.is_empty(), "{:?}", r.degraded_stages);
    }
    // No Get with no ids was sent (search-svc refuses it: "ids: must not
    // be empty"), so none failed.
    let failed = metric_lines(
        &stack,
        "engram_downstream_requests_total{outcome=\"error\",stack=\"search.get\"}",
    )
    .await?;
    assert!(failed.iter().all(|l| l.ends_with(" 0")), "{failed:#?}");
    stack.shutdown().await;
    Ok(())
}

/// Issue 47, items 4 and 5: `used` votes from a public key, under an
/// invented query id, on a sensitive memory it cannot read (or on an id
/// nothing holds) are not kept, so they can neither keep that memory from
/// fading nor fill the feedback table; its vote on a memory it can read is.
#[tokio::test]
async fn feedback_on_a_memory_the_caller_cannot_read_is_not_kept() -> anyhow::Result<()> {
    use engram_proto::{FeedbackItem, FeedbackRequest, FeedbackSignal};
    let settings = engram_tests::settings().await?;
    let (stack, uri, keys) =
        stack_with_keys(settings, &[("a", "sensitive"), ("a", "public")]).await?;
    let (high, low) = (keys[0].clone(), keys[1].clone());
    let pool = engram_common::db::test_database().await?;
    let note = |content: &str, level: AccessLevel| Memory {
        id: uuid::Uuid::new_v4().to_string(),
        content: content.into(),
        access_level: level as i32,
        ..Default::default()
    };
    let secret = note(
        "The escrow account PIN is kept by legal.",
        AccessLevel::Sensitive,
    );
    let open = note("The lobby opens at eight.", AccessLevel::Public);
    let memories = vec![secret.clone(), open.clone()];
    let mut mem = MemoryServiceClient::connect(uri.clone()).await?;
    mem.upsert(authed(&high, UpsertRequest { memories }))
        .await?;

    let mut low_client = Client::connect(&uri, &low).await?;
    let stranger = uuid::Uuid::new_v4().to_string();
    let items = [&secret.id, &stranger, &open.id]
        .into_iter()
        .map(|id| FeedbackItem {
            memory_id: id.clone(),
            signal: FeedbackSignal::Used as i32,
            value: true,
        })
        .collect();
    let votes = FeedbackRequest {
        query_id: uuid::Uuid::new_v4().to_string(),
        items,
    };
    let accepted = low_client.retrieval.feedback(votes).await?.into_inner();
    assert_eq!(
        accepted.accepted, 3,
        "accepted on the hot path, judged when stored"
    );
    let rows = |id: &str| {
        let id = uuid::Uuid::parse_str(id).map(|u| u.to_string());
        let pool = pool.clone();
        async move {
            let n: i64 =
                sqlx::query_scalar("SELECT count(*) FROM feedback WHERE memory_id = $1::uuid")
                    .bind(id?)
                    .fetch_one(&pool)
                    .await?;
            anyhow::Ok(n)
        }
    };
    // The batch is stored in the background in one statement: once the
    // readable memory's row is there, the other two were judged.
    let mut waited = 0;
    while rows(&open.id).await? == 0 && waited < 200 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += 1;
    }
    assert_eq!(rows(&open.id).await?, 1, "the readable memory's vote");
    assert_eq!(rows(&secret.id).await?, 0, "a vote on an unreadable memory");
    assert_eq!(rows(&stranger).await?, 0, "a vote on an id nothing holds");
    stack.shutdown().await;
    Ok(())
}

/// Issue 47, item 14: a public key with the same agent id as a sensitive
/// key did not ask the sensitive key's question, so it may not vote on its
/// answer (and take its one-time training examples); the asker may.
#[tokio::test]
async fn feedback_on_an_answer_given_to_another_trust_level_is_refused() -> anyhow::Result<()> {
    use engram_proto::{FeedbackItem, FeedbackRequest, FeedbackSignal};
    let settings = engram_tests::settings().await?;
    let (stack, uri, keys) =
        stack_with_keys(settings, &[("a", "sensitive"), ("a", "public")]).await?;
    let mut high = Client::connect(&uri, &keys[0]).await?;
    let mut low = Client::connect(&uri, &keys[1]).await?;
    engram_tests::remember(&mut high, "The ferry to the island leaves at noon.").await?;
    let r = high
        .retrieval
        .retrieve(query("when does the ferry leave?"))
        .await?
        .into_inner();
    let returned = (r.records.first())
        .and_then(|s| s.memory.as_ref())
        .map(|m| m.id.clone())
        .ok_or_else(|| anyhow::anyhow!("no record"))?;
    let vote = FeedbackRequest {
        query_id: r.query_id.clone(),
        items: vec![FeedbackItem {
            memory_id: returned,
            signal: FeedbackSignal::Helpful as i32,
            value: true,
        }],
    };
    let refused = low
        .retrieval
        .feedback(vote.clone())
        .await
        .expect_err("another trust level");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    let ok = high.retrieval.feedback(vote).await?.into_inner();
    assert_eq!(ok.accepted, 1);
    stack.shutdown().await;
    Ok(())
}

/// The dense score of the first record whose content starts with `start`.
async fn dense_score(client: &mut Client, text: &str, start: &str) -> anyhow::Result<f32> {
    let r = client.retrieval.retrieve(query(text)).await?.into_inner();
    let hit = (r.records.iter())
        .find(|s| {
            s.memory
                .as_ref()
                .is_some_and(|m| m.content.starts_with(start))
        })
        .and_then(|s| s.provenance.as_ref())
        .and_then(|p| p.strategies.iter().find(|h| h.strategy == "vector"))
        .ok_or_else(|| anyhow::anyhow!("{start:?} not found by dense search: {r:?}"))?;
    Ok(hit.score)
}

#[tokio::test]
async fn a_lower_trust_writers_speakers_never_steer_a_higher_trust_query() -> anyhow::Result<()> {
    // Issue 47, item 6: a public key's turns spoken by "Bob Martinez" (or
    // by "Where") put a sensitive key's question about Bob Martinez in the
    // first person, and dense search lost the document about him.
    let settings = engram_tests::settings().await?;
    let keys = [("a", "sensitive", "agent-s"), ("a", "public", "agent-p")];
    let (stack, uri, keys) = stack_with_agents(settings, &keys).await?;
    let mut high = Client::connect(&uri, &keys[0]).await?;
    let mut low = Client::connect(&uri, &keys[1]).await?;
    engram_tests::remember(
        &mut high,
        "Bob Martinez lives in Lisbon, near the old tram depot.",
    )
    .await?;
    let question = "Where does Bob Martinez live?";
    let before = dense_score(&mut high, question, "Bob Martinez lives").await?;
    let turns = ["Bob Martinez", "Where"].map(|speaker| Memory {
        content: "I like the sea.".into(),
        turn: Some(engram_proto::Turn {
            session_id: "s".into(),
            turn_index: 0,
            speaker: speaker.into(),
            caption: String::new(),
        }),
        ..Default::default()
    });
    for m in turns {
        low.memories
            .upsert(UpsertRequest { memories: vec![m] })
            .await?;
    }
    let after = dense_score(&mut high, question, "Bob Martinez lives").await?;
    assert!(
        (after - before).abs() < 1e-3,
        "the public key's speakers changed the sensitive query: {before} -> {after}"
    );
    stack.shutdown().await;
    Ok(())
}

/// A metadata filter or metadata nested 40 deep is more than prost decodes
/// (100 levels of messages; a Struct takes three per level), so tonic
/// answered INTERNAL before any handler ran (`engram soak --only high`,
/// issue 47): the caller's input, now INVALID_ARGUMENT saying the rule.
#[tokio::test]
async fn a_request_nested_past_what_decodes_is_invalid_argument() -> anyhow::Result<()> {
    let ts = engram_tests::TestStack::start("internal").await?;
    let mut c = ts.client().await?;
    let mut deep = serde_json::json!(1);
    for _ in 0..40 {
        deep = serde_json::json!({ "k": deep });
    }
    let err = c
        .retrieval
        .retrieve(RetrieveRequest {
            text: "where is the ledger?".into(),
            metadata_filter: Some(json_to_struct(&deep)),
            ..Default::default()
        })
        .await
        .expect_err("too deep to decode");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("100 levels"), "{err:?}");
    let err = c
        .memories
        .upsert(UpsertRequest {
            memories: vec![engram_proto::Memory {
                content: "a note".into(),
                metadata: Some(json_to_struct(&deep)),
                ..Default::default()
            }],
        })
        .await
        .expect_err("too deep to decode");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    ts.shutdown().await;
    Ok(())
}
