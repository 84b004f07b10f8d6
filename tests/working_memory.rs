//! Issue 10 part 3, Layer 6, end to end on the real stack through the
//! generated gRPC clients: working memory written through MemoryService and
//! read first by GetMemory, the graph fallback with its causal chain and an
//! unresolved contradiction, compact mode, boundary validation, isolation
//! between tenants and agents, and the demand counters (RPC and /metrics).

use std::time::Duration;

use engram::stack::{Service, Stack, StackOptions};
use engram_common::convert::json_to_struct;
use engram_proto::memory_service_client::MemoryServiceClient;
use engram_proto::retrieval_service_client::RetrievalServiceClient;
use engram_proto::working_memory_service_client::WorkingMemoryServiceClient;
use engram_proto::{
    AddEdgesRequest, ConflictResolution, Edge, GetDemandRequest, GetMemoryRequest,
    GetMemoryResponse, Memory, MemoryOrigin, RetrieveRequest, UpsertRequest,
};
use engram_tests::authed;
use serde_json::json;
use tonic::Code;
use tonic::transport::Channel;

type Wm = WorkingMemoryServiceClient<Channel>;
type Mem = MemoryServiceClient<Channel>;

struct Keys {
    /// tenant A, agent-1
    a: String,
    /// tenant A, agent-2
    a2: String,
    /// tenant B, agent-1
    b: String,
}

async fn start(demand_threshold: u64) -> anyhow::Result<(Stack, Keys)> {
    let mut settings = engram_tests::settings().await?;
    settings.working.demand_threshold = demand_threshold;
    let ta = format!("t-{}", uuid::Uuid::new_v4().simple());
    let tb = format!("t-{}", uuid::Uuid::new_v4().simple());
    let keys = Keys {
        a: format!("k-{}", uuid::Uuid::new_v4().simple()),
        a2: format!("k-{}", uuid::Uuid::new_v4().simple()),
        b: format!("k-{}", uuid::Uuid::new_v4().simple()),
    };
    let opts = StackOptions {
        services: Service::ALL.into_iter().collect(),
        ephemeral_ports: true,
        dev_api_key: false,
        extra_keys: vec![
            (
                keys.a.clone(),
                ta.clone(),
                "agent-1".into(),
                "sensitive".into(),
            ),
            (keys.a2.clone(), ta, "agent-2".into(), "sensitive".into()),
            (keys.b.clone(), tb, "agent-1".into(), "sensitive".into()),
        ],
    };
    Ok((Stack::start(settings, opts).await?, keys))
}

fn uri(stack: &Stack) -> anyhow::Result<String> {
    stack
        .gateway_uri()
        .ok_or_else(|| anyhow::anyhow!("no gateway"))
}

fn note(session: &str, content: &str, confidence: f32) -> Memory {
    Memory {
        memory_type: "working".into(),
        content: content.into(),
        source_confidence: Some(confidence),
        metadata: Some(json_to_struct(&json!({ "session_id": session }))),
        ..Default::default()
    }
}

fn get(query: &str, session: &str) -> GetMemoryRequest {
    GetMemoryRequest {
        query: query.into(),
        session_id: session.into(),
        ..Default::default()
    }
}

fn invalid<T: std::fmt::Debug>(r: Result<tonic::Response<T>, tonic::Status>, field: &str) {
    match r {
        Err(s) => {
            assert_eq!(s.code(), Code::InvalidArgument, "{field}: {s:?}");
            assert!(s.message().contains(field), "{field}: {}", s.message());
        }
        Ok(r) => panic!("expected invalid {field}, got {:?}", r.into_inner()),
    }
}

fn id(seed: &str) -> String {
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, seed.as_bytes()).to_string()
}

/// A small causal story in the graph: the dam failed (claim), snowmelt
/// caused it, a warm February caused the snowmelt (depth 2), an inspection
/// report supports it, and another record contradicts it with the same
/// time and confidence (so the pipeline cannot settle it).
struct Story {
    claim: String,
    snowmelt: String,
    february: String,
    inspection: String,
    denial: String,
}

async fn seed_story(mem: &mut Mem, key: &str) -> anyhow::Result<Story> {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let s = Story {
        claim: id(&format!("{run}-claim")),
        snowmelt: id(&format!("{run}-snowmelt")),
        february: id(&format!("{run}-february")),
        inspection: id(&format!("{run}-inspection")),
        denial: id(&format!("{run}-denial")),
    };
    let when = prost_types::Timestamp {
        seconds: 1_553_000_000,
        nanos: 0,
    };
    let m = |id: &str, content: &str| Memory {
        id: id.into(),
        memory_type: "semantic".into(),
        content: content.into(),
        source_confidence: Some(0.8),
        event_time: Some(when),
        source: format!("https://example.org/hollowbrook/{id}"),
        ..Default::default()
    };
    mem.upsert(authed(
        key,
        UpsertRequest {
            memories: vec![
                m(
                    &s.claim,
                    "The Hollowbrook dam failed in March 2019 and flooded the valley below it.",
                ),
                m(
                    &s.snowmelt,
                    "Record snowmelt in the Kestrel range filled the upland reservoirs far above their design level.",
                ),
                m(
                    &s.february,
                    "An unusually warm February melted the Kestrel range snowpack weeks early.",
                ),
                m(
                    &s.inspection,
                    "Inspectors had reported cracks in the spillway concrete a year earlier.",
                ),
                m(
                    &s.denial,
                    "The Hollowbrook dam did not fail in March 2019; engineers breached it on purpose.",
                ),
            ],
        },
    ))
    .await?;
    let e = |src: &str, dst: &str, t: &str| Edge {
        src_id: src.into(),
        dst_id: dst.into(),
        edge_type: t.into(),
        weight: 1.0,
    };
    mem.add_edges(authed(
        key,
        AddEdgesRequest {
            edges: vec![
                e(&s.snowmelt, &s.claim, "causes"),
                e(&s.february, &s.snowmelt, "causes"),
                e(&s.inspection, &s.claim, "supports"),
                e(&s.claim, &s.denial, "contradicts"),
            ],
        },
    ))
    .await?;
    Ok(s)
}

/// Polls until the graph has caught up with the seeded edges (change
/// notifications are asynchronous).
async fn until(
    wm: &mut Wm,
    key: &str,
    req: GetMemoryRequest,
    ok: impl Fn(&GetMemoryResponse) -> bool,
) -> anyhow::Result<GetMemoryResponse> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = wm.get_memory(authed(key, req.clone())).await?.into_inner();
        if ok(&r) {
            return Ok(r);
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("condition never held; last response: {r:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn working_memory_first_then_graph_fallback() -> anyhow::Result<()> {
    let (stack, keys) = start(5).await?;
    let uri = uri(&stack)?;
    let mut wm = WorkingMemoryServiceClient::connect(uri.clone()).await?;
    let mut mem = MemoryServiceClient::connect(uri).await?;
    let session = format!("s-{}", uuid::Uuid::new_v4().simple());

    // Two notes on the same subject, the newer one less confident, plus an
    // unrelated one.
    let w = mem
        .upsert(authed(
            &keys.a,
            UpsertRequest {
                memories: vec![note(
                    &session,
                    "The user prefers window seats on flights.",
                    1.0,
                )],
            },
        ))
        .await?
        .into_inner();
    assert_eq!(w.results.len(), 1);
    assert!(w.results[0].created && w.results[0].embedded, "{w:?}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let w = mem
        .upsert(authed(
            &keys.a,
            UpsertRequest {
                memories: vec![
                    note(
                        &session,
                        "Update: the user now prefers aisle seats on long flights.",
                        0.6,
                    ),
                    note(&session, "Remember to order oat milk for the office.", 1.0),
                ],
            },
        ))
        .await?
        .into_inner();
    assert_eq!(w.results.len(), 2);
    let newer = w.results[0].id.clone();

    let story = seed_story(&mut mem, &keys.a).await?;

    // Working memory first, most recent note first despite lower confidence.
    let r = wm
        .get_memory(authed(
            &keys.a,
            GetMemoryRequest {
                include_sources: true,
                ..get("Which seats does the user prefer on flights?", &session)
            },
        ))
        .await?
        .into_inner();
    eprintln!("get_memory working path: {:.1} ms", r.latency_ms);
    assert_eq!(r.origin, MemoryOrigin::Working as i32, "{r:?}");
    assert_eq!(r.items.len(), 2, "{r:?}");
    assert_eq!(r.items[0].id, newer, "{r:?}");
    assert!(r.items[0].content.contains("aisle"));
    assert!(
        r.items
            .iter()
            .all(|i| i.memory_type == "working" && i.session_id == session)
    );
    assert!(r.items[0].score > r.items[1].score);
    assert!(
        r.items[0].similarity.is_some(),
        "embedding match ran: {r:?}"
    );
    assert_eq!(r.working_candidates, 3);
    assert_eq!(r.sources.len(), 2, "{r:?}");
    assert!(r.sources.iter().all(|s| s.found_by == ["working"]));
    assert!(r.causal_chain.is_empty() && r.contradictions.is_empty());

    // Compact on the working path: items only.
    let c = wm
        .get_memory(authed(
            &keys.a,
            GetMemoryRequest {
                compact: true,
                include_sources: true,
                ..get("Which seats does the user prefer on flights?", &session)
            },
        ))
        .await?
        .into_inner();
    assert_eq!(c.origin, MemoryOrigin::Working as i32);
    assert_eq!(c.items.len(), 2);
    assert!(c.sources.is_empty() && c.causal_chain.is_empty() && c.contradictions.is_empty());

    // min_confidence drops the newer, less confident note.
    let r = wm
        .get_memory(authed(
            &keys.a,
            GetMemoryRequest {
                min_confidence: Some(0.9),
                ..get("Which seats does the user prefer on flights?", &session)
            },
        ))
        .await?
        .into_inner();
    assert_eq!(r.origin, MemoryOrigin::Working as i32);
    assert_eq!(r.items.len(), 1);
    assert!(r.items[0].content.contains("window"));

    // The same session id is invisible to another tenant and another agent.
    for other in [&keys.b, &keys.a2] {
        let r = wm
            .get_memory(authed(
                other,
                get("Which seats does the user prefer on flights?", &session),
            ))
            .await?
            .into_inner();
        assert_ne!(r.origin, MemoryOrigin::Working as i32, "{r:?}");
        assert_eq!(r.working_candidates, 0);
        assert!(r.items.iter().all(|i| i.memory_type != "working"));
    }

    // No working match: the graph answers with the claim, its causes to
    // depth 2, the supporting report and the unresolved contradiction.
    let query = "Why did the Hollowbrook dam fail in March 2019?";
    // Two claims (the report and its denial): the rest must come from the
    // expansion, not from matching the query themselves.
    let full = GetMemoryRequest {
        include_sources: true,
        limit: Some(2),
        ..get(query, &session)
    };
    let r = until(&mut wm, &keys.a, full.clone(), |r| {
        r.causal_chain.len() >= 3 && !r.contradictions.is_empty()
    })
    .await?;
    eprintln!("get_memory graph fallback: {:.1} ms", r.latency_ms);
    assert_eq!(r.origin, MemoryOrigin::Graph as i32, "{r:?}");
    assert_eq!(r.working_candidates, 3, "session was searched first");
    assert!(r.items.iter().any(|i| i.id == story.claim), "{r:?}");
    let link = |id: &str| r.causal_chain.iter().find(|l| l.memory_id == id);
    let snow = link(&story.snowmelt).ok_or_else(|| anyhow::anyhow!("no snowmelt: {r:?}"))?;
    assert_eq!((snow.edge_type.as_str(), snow.depth), ("causes", 1));
    assert!(snow.content.contains("snowmelt"));
    assert_eq!(r.items.len(), 2, "{r:?}");
    assert!(r.items.iter().any(|i| i.id == story.denial), "{r:?}");
    let feb = link(&story.february).ok_or_else(|| anyhow::anyhow!("no february: {r:?}"))?;
    assert_eq!((feb.edge_type.as_str(), feb.depth), ("causes", 2));
    let insp = link(&story.inspection).ok_or_else(|| anyhow::anyhow!("no report: {r:?}"))?;
    assert_eq!(insp.edge_type, "supports");
    assert!(
        r.causal_chain.iter().all(|l| l.memory_id != story.denial),
        "contradicts is not a causal edge"
    );
    let pair = r
        .contradictions
        .iter()
        .find(|p| {
            [p.memory_a.as_str(), p.memory_b.as_str()].contains(&story.claim.as_str())
                && [p.memory_a.as_str(), p.memory_b.as_str()].contains(&story.denial.as_str())
        })
        .ok_or_else(|| anyhow::anyhow!("no claim/denial contradiction: {r:?}"))?;
    assert_eq!(pair.resolution, ConflictResolution::Unresolved as i32);
    assert!(pair.winner_id.is_empty());
    let src = r
        .sources
        .iter()
        .find(|s| s.memory_id == story.claim)
        .ok_or_else(|| anyhow::anyhow!("no source for the claim: {r:?}"))?;
    assert!(src.citation.contains("hollowbrook"), "{src:?}");
    assert!(!src.found_by.is_empty());
    assert!(
        r.sources
            .iter()
            .any(|s| s.memory_id == story.february && s.found_by == ["causes"]),
        "{r:?}"
    );

    // max_depth bounds the expansion.
    let r1 = wm
        .get_memory(authed(
            &keys.a,
            GetMemoryRequest {
                max_depth: Some(1),
                ..full.clone()
            },
        ))
        .await?
        .into_inner();
    assert!(r1.causal_chain.iter().all(|l| l.depth == 1), "{r1:?}");
    assert!(
        r1.causal_chain
            .iter()
            .any(|l| l.memory_id == story.snowmelt)
    );
    assert!(
        r1.causal_chain
            .iter()
            .all(|l| l.memory_id != story.february)
    );
    assert!(r1.sources.is_empty() || r1.sources.iter().all(|s| s.memory_id != story.february));

    // Without include_sources: chain and contradictions, no sources.
    let r2 = wm
        .get_memory(authed(
            &keys.a,
            GetMemoryRequest {
                include_sources: false,
                ..full.clone()
            },
        ))
        .await?
        .into_inner();
    assert!(r2.sources.is_empty());
    assert!(!r2.causal_chain.is_empty() && !r2.contradictions.is_empty());

    // Compact on the graph path omits sources, chain and contradictions.
    let c = wm
        .get_memory(authed(
            &keys.a,
            GetMemoryRequest {
                compact: true,
                ..full
            },
        ))
        .await?
        .into_inner();
    assert_eq!(c.origin, MemoryOrigin::Graph as i32);
    assert!(c.items.iter().any(|i| i.id == story.claim));
    assert!(c.sources.is_empty() && c.causal_chain.is_empty() && c.contradictions.is_empty());

    // Another tenant sees none of tenant A's graph.
    let r = wm
        .get_memory(authed(&keys.b, get(query, "")))
        .await?
        .into_inner();
    assert_eq!(r.origin, MemoryOrigin::None as i32, "{r:?}");
    assert!(r.items.is_empty());

    // Deleting a working note through MemoryService removes it.
    let d = mem
        .delete(authed(
            &keys.a,
            engram_proto::DeleteRequest {
                ids: vec![newer.clone()],
            },
        ))
        .await?
        .into_inner();
    assert_eq!(d.deleted, 1);
    let r = wm
        .get_memory(authed(
            &keys.a,
            get("Which seats does the user prefer on flights?", &session),
        ))
        .await?
        .into_inner();
    assert!(r.items.iter().all(|i| i.id != newer));

    stack.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn validation_defaults_and_demand_counters() -> anyhow::Result<()> {
    let (stack, keys) = start(3).await?;
    let uri = uri(&stack)?;
    let mut wm = WorkingMemoryServiceClient::connect(uri.clone()).await?;
    let mut mem = MemoryServiceClient::connect(uri.clone()).await?;
    let mut retrieval = RetrievalServiceClient::connect(uri.clone()).await?;

    // Health reports the new service.
    let mut health = tonic_health::pb::health_client::HealthClient::new(
        Channel::from_shared(uri)?.connect().await?,
    );
    let h = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "engram.v1.WorkingMemoryService".into(),
        })
        .await?
        .into_inner();
    assert_eq!(h.status, 1, "SERVING");

    // Field validation.
    invalid(
        wm.get_memory(authed(&keys.a, get("  ", "s"))).await,
        "query",
    );
    for limit in [0, 101] {
        invalid(
            wm.get_memory(authed(
                &keys.a,
                GetMemoryRequest {
                    limit: Some(limit),
                    ..get("q", "s")
                },
            ))
            .await,
            "limit",
        );
    }
    for depth in [0, 5] {
        invalid(
            wm.get_memory(authed(
                &keys.a,
                GetMemoryRequest {
                    max_depth: Some(depth),
                    ..get("q", "s")
                },
            ))
            .await,
            "max_depth",
        );
    }
    invalid(
        wm.get_memory(authed(
            &keys.a,
            GetMemoryRequest {
                min_confidence: Some(1.5),
                ..get("q", "s")
            },
        ))
        .await,
        "min_confidence",
    );
    invalid(
        wm.get_memory(authed(&keys.a, get("q", &"s".repeat(129))))
            .await,
        "session_id",
    );
    invalid(
        wm.get_demand(authed(&keys.a, GetDemandRequest { limit: Some(0) }))
            .await,
        "limit",
    );
    let no_session = Memory {
        memory_type: "working".into(),
        content: "a note without a session".into(),
        ..Default::default()
    };
    invalid(
        mem.upsert(authed(
            &keys.a,
            UpsertRequest {
                memories: vec![no_session],
            },
        ))
        .await,
        "memories.metadata.session_id",
    );
    let mut bad_ttl = note("s", "note", 1.0);
    bad_ttl.metadata = Some(json_to_struct(&json!({"session_id": "s", "ttl_ms": -5})));
    invalid(
        mem.upsert(authed(
            &keys.a,
            UpsertRequest {
                memories: vec![bad_ttl],
            },
        ))
        .await,
        "memories.metadata.ttl_ms",
    );
    let e = wm
        .get_memory(tonic::Request::new(get("q", "s")))
        .await
        .expect_err("no credentials");
    assert_eq!(e.code(), Code::Unauthenticated);

    // A mixed batch: the working note stays in the gateway, the episodic
    // one goes to Postgres; results keep the request order.
    let session = format!("s-{}", uuid::Uuid::new_v4().simple());
    let episodic = Memory {
        content: "The quarterly review is scheduled for the second week of June.".into(),
        ..Default::default()
    };
    let mut short = note(
        &session,
        "The quarterly review slides live in the team drive.",
        0.9,
    );
    short.metadata = Some(json_to_struct(
        &json!({"session_id": session, "ttl_ms": 600_000}),
    ));
    let r = mem
        .upsert(authed(
            &keys.a,
            UpsertRequest {
                memories: vec![episodic, short],
            },
        ))
        .await?
        .into_inner();
    assert_eq!(r.results.len(), 2);
    let wm_id = r.results[1].id.clone();
    let got = mem
        .get(authed(
            &keys.a,
            engram_proto::GetRequest {
                ids: vec![r.results[0].id.clone(), wm_id.clone()],
                include_embedding: false,
                omit_entities: false,
                vectors_only: false,
                ..Default::default()
            },
        ))
        .await?
        .into_inner();
    assert_eq!(got.memories.len(), 1, "working notes never reach Postgres");
    assert_eq!(got.memories[0].id, r.results[0].id);

    // Defaults: limit 10, TTL as written.
    let m = wm
        .get_memory(authed(
            &keys.a,
            get("Where are the quarterly review slides?", &session),
        ))
        .await?
        .into_inner();
    assert_eq!(m.origin, MemoryOrigin::Working as i32, "{m:?}");
    assert_eq!(m.items[0].id, wm_id);
    let item = &m.items[0];
    let (w, x) = (
        item.written_at
            .ok_or_else(|| anyhow::anyhow!("written_at"))?,
        item.expires_at
            .ok_or_else(|| anyhow::anyhow!("expires_at"))?,
    );
    assert_eq!(x.seconds - w.seconds, 600, "ttl_ms honoured: {item:?}");

    // Demand: the same GetMemory shape three times (threshold 3) makes a
    // concept candidate; one Retrieve is counted under its own shape.
    for _ in 0..2 {
        wm.get_memory(authed(
            &keys.a,
            get("Where are the quarterly review slides?", &session),
        ))
        .await?;
    }
    retrieval
        .retrieve(authed(
            &keys.a,
            RetrieveRequest {
                text: "When is the quarterly review scheduled?".into(),
                memory_types: vec!["episodic".into()],
                ..Default::default()
            },
        ))
        .await?;
    let d = wm
        .get_demand(authed(&keys.a, GetDemandRequest::default()))
        .await?
        .into_inner();
    assert_eq!(d.threshold, 3);
    let gm = d
        .shapes
        .iter()
        .find(|s| s.requested.iter().any(|p| p == "surface:get_memory"))
        .ok_or_else(|| anyhow::anyhow!("no get_memory shape: {d:?}"))?;
    assert_eq!(gm.count, 3, "{d:?}");
    assert!(gm.concept_candidate);
    assert_eq!(gm.observed_types, ["working"]);
    assert!(gm.requested.iter().any(|p| p == "session"));
    let rt = d
        .shapes
        .iter()
        .find(|s| s.requested.iter().any(|p| p == "surface:retrieve"))
        .ok_or_else(|| anyhow::anyhow!("no retrieve shape: {d:?}"))?;
    assert_eq!(rt.count, 1);
    assert!(!rt.concept_candidate);
    assert!(
        rt.requested.iter().any(|p| p == "memory_type:episodic"),
        "{rt:?}"
    );
    assert_eq!(d.concept_candidates, 1);
    assert!(d.observations >= 4);
    // Validation failures are not demand.
    assert_eq!(d.observations, 4, "{d:?}");

    // Another tenant's demand is its own.
    let other = wm
        .get_demand(authed(&keys.b, GetDemandRequest::default()))
        .await?
        .into_inner();
    assert!(other.shapes.is_empty() && other.observations == 0);

    // And the counters are on /metrics.
    let body = reqwest::get(format!("http://{}/metrics", stack.admin_addr))
        .await?
        .text()
        .await?;
    let value = |name: &str| -> f64 {
        body.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1.0)
    };
    assert_eq!(
        value("engram_demand_shape_total{surface=\"get_memory\"}"),
        3.0,
        "{body}"
    );
    assert_eq!(
        value("engram_demand_shape_total{surface=\"retrieve\"}"),
        1.0
    );
    assert_eq!(value("engram_demand_concept_candidates"), 1.0);
    assert!(value("engram_working_memory_fragments") >= 1.0, "{body}");
    assert!(body.contains("engram_retrieval_circuit_state{stage=\"graph.neighbors\"}"));

    stack.shutdown().await;
    Ok(())
}
