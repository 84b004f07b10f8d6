//! Through a real server on port 0 against the shared test Postgres: rows
//! inserted with SQL in a fresh tenant, NOTIFY, then queries with the
//! internal token.

use std::time::Duration;

use engram_common::{AccessLevel, Identity};
use engram_proto::graph_service_client::GraphServiceClient;
use engram_proto::{ContradictionsRequest, LinkQueryRequest, PprRequest, StatsRequest};
use sqlx::PgPool;
use tonic::transport::Channel;
use uuid::Uuid;

const TOKEN: &str = "test-internal-token";

async fn insert_memory(
    pool: &PgPool,
    tenant: &str,
    title: &str,
    content: &str,
    level: i16,
) -> Uuid {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO memories (id, tenant_id, agent_id, title, content, content_hash, access_level, event_time, valid_from) \
         VALUES ($1, $2, 'agent', $3, $4, '\\x00'::bytea, $5, now(), now())",
    )
    .bind(id)
    .bind(tenant)
    .bind(title)
    .bind(content)
    .bind(level)
    .execute(pool)
    .await
    .expect("insert memory");
    for e in engram_common::entities::extract(title, content) {
        let (eid,): (i64,) = sqlx::query_as(
            "INSERT INTO entities (tenant_id, name, display) VALUES ($1, $2, $3) \
             ON CONFLICT (tenant_id, name) DO UPDATE SET display = entities.display RETURNING id",
        )
        .bind(tenant)
        .bind(&e.name)
        .bind(&e.display)
        .fetch_one(pool)
        .await
        .expect("insert entity");
        sqlx::query(
            "INSERT INTO memory_entities (memory_id, entity_id, is_home) VALUES ($1, $2, $3)",
        )
        .bind(id)
        .bind(eid)
        .bind(e.is_home)
        .execute(pool)
        .await
        .expect("insert mention");
    }
    id
}

/// A change notification as search-svc sends it; `write` is the gateway's
/// id of the write call.
async fn notify(pool: &PgPool, tenant: &str, op: &str, write: &str) {
    let payload =
        serde_json::json!({"tenant": tenant, "op": op, "ids": [], "write": write}).to_string();
    sqlx::query("SELECT pg_notify('engram_changes', $1)")
        .bind(payload)
        .execute(pool)
        .await
        .expect("notify");
}

fn req<T>(msg: T, tenant: &str, trust: AccessLevel) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    Identity {
        tenant: tenant.into(),
        agent_id: "agent".into(),
        trust,
    }
    .write_internal(r.metadata_mut(), TOKEN);
    r
}

/// PPR hit ids; a query that arrives while the tenant's first load is
/// still running is answered RESOURCE_EXHAUSTED and asked again.
async fn ppr_ids(
    c: &mut GraphServiceClient<Channel>,
    tenant: &str,
    trust: AccessLevel,
    q: &str,
) -> Vec<String> {
    for _ in 0..100 {
        let msg = PprRequest {
            query_text: q.into(),
            ..Default::default()
        };
        match c.personalized_page_rank(req(msg, tenant, trust)).await {
            Ok(r) => {
                return r
                    .into_inner()
                    .hits
                    .into_iter()
                    .map(|h| h.memory_id)
                    .collect();
            }
            Err(s) if s.code() == tonic::Code::ResourceExhausted => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(s) => panic!("ppr: {s}"),
        }
    }
    panic!("the tenant's graph never loaded")
}

/// A graph-svc on port 0, once its health says SERVING (its change
/// listener listens): the client, the stop signal and the server task.
async fn serve(
    settings: engram_common::settings::Settings,
    pool: &PgPool,
) -> (
    GraphServiceClient<Channel>,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(graph_svc::run(
        listener,
        settings,
        pool.clone(),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect_timeout(Duration::from_secs(5));
    let mut connected = None;
    for _ in 0..50 {
        if let Ok(ch) = channel.connect().await {
            connected = Some(ch);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ch = connected.expect("server up");
    // SERVING once the listener listens.
    let mut health = tonic_health::pb::health_client::HealthClient::new(ch.clone());
    let mut serving = false;
    for _ in 0..50 {
        let st = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: graph_svc::SERVICE_NAME.into(),
            })
            .await
            .map(|r| r.into_inner().status)
            .ok();
        if st == Some(tonic_health::pb::health_check_response::ServingStatus::Serving as i32) {
            serving = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(serving, "health never became SERVING");
    (GraphServiceClient::new(ch), stop_tx, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graph_follows_postgres_through_notifications() {
    let pool = engram_common::db::test_database()
        .await
        .expect("test database");
    let tenant = format!("t-{}", Uuid::new_v4());
    let other = format!("t-{}", Uuid::new_v4());
    let lothair = insert_memory(
        &pool,
        &tenant,
        "Lothair II",
        "Lothair II was a king. His mother was Ermengarde of Tours.",
        1,
    )
    .await;
    let ermengarde = insert_memory(
        &pool,
        &tenant,
        "Ermengarde of Tours",
        "Ermengarde of Tours died on 20 March 851.",
        1,
    )
    .await;
    let secret = insert_memory(
        &pool,
        &tenant,
        "Lothair Files",
        "Lothair II kept secrets with Ermengarde of Tours.",
        4,
    )
    .await;
    let foreign = insert_memory(
        &pool,
        &other,
        "Lothair II",
        "Lothair II in another tenant.",
        1,
    )
    .await;
    sqlx::query("INSERT INTO edges (tenant_id, src_id, dst_id, edge_type) VALUES ($1, $2, $3, 'contradicts')")
        .bind(&tenant)
        .bind(lothair)
        .bind(ermengarde)
        .execute(&pool)
        .await
        .expect("edge");

    let mut settings = engram_common::db::test_settings();
    settings.auth.internal_token_opt = Some(TOKEN.into());
    settings.graph.debounce_ms = 50;
    let (mut c, stop_tx, server) = serve(settings, &pool).await;

    // No token: refused.
    let err = c
        .stats(tonic::Request::new(StatsRequest {}))
        .await
        .expect_err("no token");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);

    let q = "When did Lothair II's mother die?";
    let public = ppr_ids(&mut c, &tenant, AccessLevel::Public, q).await;
    assert!(public.contains(&lothair.to_string()), "{public:?}");
    assert!(public.contains(&ermengarde.to_string()), "{public:?}");
    assert!(
        !public.contains(&secret.to_string()),
        "restricted memory leaked"
    );
    assert!(
        !public.contains(&foreign.to_string()),
        "other tenant leaked"
    );
    let all = ppr_ids(&mut c, &tenant, AccessLevel::Sensitive, q).await;
    assert!(all.contains(&secret.to_string()));
    assert!(!all.contains(&foreign.to_string()));

    let link = c
        .link_query(req(
            LinkQueryRequest { text: q.into() },
            &tenant,
            AccessLevel::Public,
        ))
        .await
        .expect("link")
        .into_inner();
    assert!(
        link.entities
            .iter()
            .any(|e| e.name == "lothair ii" && e.has_home && e.df == 1),
        "{link:?}"
    );
    assert_eq!(link.memory_count, 2);

    let pairs = c
        .contradictions(req(
            ContradictionsRequest {
                memory_ids: vec![lothair.to_string(), ermengarde.to_string()],
            },
            &tenant,
            AccessLevel::Public,
        ))
        .await
        .expect("contradictions")
        .into_inner()
        .pairs;
    assert_eq!(pairs.len(), 1);
    // The walk says whether a tenant's graph holds any contradicts edge,
    // so the gateway can skip that call: this one does, the other none.
    for (t, none) in [(&tenant, false), (&other, true)] {
        ppr_ids(&mut c, t, AccessLevel::Public, q).await;
        let msg = PprRequest {
            query_text: q.into(),
            ..Default::default()
        };
        let r = c
            .personalized_page_rank(req(msg, t, AccessLevel::Public))
            .await
            .expect("ppr")
            .into_inner();
        assert_eq!(r.no_contradicts_edges, none, "{t}");
    }

    // A new memory appears after NOTIFY (debounced rebuild).
    let added = insert_memory(
        &pool,
        &tenant,
        "Boso the Elder",
        "Boso the Elder was related to Lothair II.",
        1,
    )
    .await;
    notify(&pool, &tenant, "upsert", "").await;
    let mut seen = false;
    for _ in 0..100 {
        if ppr_ids(
            &mut c,
            &tenant,
            AccessLevel::Public,
            "Who was Boso the Elder?",
        )
        .await
        .contains(&added.to_string())
        {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen, "notification did not refresh the graph");
    let stats = c
        .stats(req(StatsRequest {}, &tenant, AccessLevel::Public))
        .await
        .expect("stats")
        .into_inner();
    assert!(
        stats.loaded && stats.memories == 4 && stats.loaded_tenants >= 1,
        "{stats:?}"
    );

    // Bad input names the field.
    let err = c
        .personalized_page_rank(req(
            PprRequest {
                max_nodes: 5000,
                ..Default::default()
            },
            &tenant,
            AccessLevel::Public,
        ))
        .await
        .expect_err("too many nodes");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().starts_with("max_nodes"), "{}", err.message());

    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
}

/// Whether graph-svc calls its answer stale when it must reflect `write`.
async fn stale_after(c: &mut GraphServiceClient<Channel>, tenant: &str, write: &str) -> bool {
    ppr_ids(c, tenant, AccessLevel::Public, "Lothair II").await;
    let msg = PprRequest {
        query_text: "Lothair II".into(),
        after_write: write.into(),
        ..Default::default()
    };
    c.personalized_page_rank(req(msg, tenant, AccessLevel::Public))
        .await
        .expect("ppr")
        .into_inner()
        .stale
}

/// A gateway that has just written names its write; until graph-svc has
/// heard the write's notification, its answer is stale (not to be cached
/// as fresh), and only the named tenant's notification counts (issue 47,
/// item 20).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_is_stale_until_the_write_it_must_reflect_is_heard() {
    let pool = engram_common::db::test_database()
        .await
        .expect("test database");
    let tenant = format!("t-{}", Uuid::new_v4());
    let other = format!("t-{}", Uuid::new_v4());
    insert_memory(&pool, &tenant, "Lothair II", "Lothair II was a king.", 1).await;
    let mut settings = engram_common::db::test_settings();
    settings.auth.internal_token_opt = Some(TOKEN.into());
    settings.graph.debounce_ms = 50;
    let (mut c, stop_tx, server) = serve(settings, &pool).await;

    assert!(!stale_after(&mut c, &tenant, "").await, "no write named");
    let write = Uuid::new_v4().simple().to_string();
    // The row is committed, its notification not yet sent: the graph
    // cannot know of it.
    let added = insert_memory(
        &pool,
        &tenant,
        "Teutberga",
        "Teutberga married Lothair II.",
        1,
    )
    .await;
    assert!(stale_after(&mut c, &tenant, &write).await);
    // Another tenant's notification with the same id says nothing.
    notify(&pool, &other, "upsert", &write).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(stale_after(&mut c, &tenant, &write).await);
    notify(&pool, &tenant, "upsert", &write).await;
    let mut fresh = false;
    for _ in 0..100 {
        if !stale_after(&mut c, &tenant, &write).await {
            fresh = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        fresh,
        "the write was heard and rebuilt, yet answers stay stale"
    );
    let hits = ppr_ids(&mut c, &tenant, AccessLevel::Public, "Teutberga").await;
    assert!(
        hits.contains(&added.to_string()),
        "the fresh answer holds the write: {hits:?}"
    );

    let err = c
        .personalized_page_rank(req(
            PprRequest {
                after_write: "w".repeat(65),
                ..Default::default()
            },
            &tenant,
            AccessLevel::Public,
        ))
        .await
        .expect_err("an over-long write id");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().starts_with("after_write"),
        "{}",
        err.message()
    );
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preloaded_tenants_are_loaded_before_any_query() {
    let pool = engram_common::db::test_database()
        .await
        .expect("test database");
    let tenant = format!("t-{}", Uuid::new_v4());
    let lazy = format!("t-{}", Uuid::new_v4());
    insert_memory(&pool, &tenant, "Lothair II", "Lothair II was a king.", 1).await;
    insert_memory(
        &pool,
        &tenant,
        "Teutberga",
        "Teutberga married Lothair II.",
        3,
    )
    .await;
    insert_memory(&pool, &lazy, "Boso", "Boso the Elder.", 1).await;

    let mut settings = engram_common::db::test_settings();
    settings.auth.internal_token_opt = Some(TOKEN.into());
    settings.graph.preload_tenants = vec![tenant.clone()];
    let (mut c, stop_tx, server) = serve(settings, &pool).await;
    // Stats never loads a graph: only the preload can make it loaded.
    let mut stats = None;
    for _ in 0..100 {
        let s = c
            .stats(req(StatsRequest {}, &tenant, AccessLevel::Public))
            .await
            .expect("stats")
            .into_inner();
        if s.loaded {
            stats = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stats = stats.expect("preloaded tenant never loaded");
    // Counts are the tenant's whole graph, whatever the caller's trust.
    assert_eq!(stats.memories, 2, "{stats:?}");
    assert!(stats.entities >= 2 && stats.edges >= 2, "{stats:?}");
    let other = c
        .stats(req(StatsRequest {}, &lazy, AccessLevel::Public))
        .await
        .expect("stats")
        .into_inner();
    assert!(!other.loaded, "a tenant not preloaded loaded: {other:?}");
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
}

/// A tenant of more than two pages (store::PAGE is 2,000): every memory is
/// loaded and every one's text matched, whichever page it came in, while
/// the next page was being fetched.
#[tokio::test]
async fn a_tenant_of_several_pages_loads_every_memory_and_mention() {
    let pool = engram_common::db::test_database()
        .await
        .expect("test database");
    let tenant = format!("t-{}", Uuid::new_v4());
    insert_memory(
        &pool,
        &tenant,
        "Zebulon Quill",
        "Zebulon Quill keeps notes.",
        1,
    )
    .await;
    sqlx::query(
        "INSERT INTO memories (id, tenant_id, agent_id, title, content, content_hash, access_level, event_time, valid_from) \
         SELECT gen_random_uuid(), $1, 'agent', 'note ' || g, 'Zebulon Quill wrote note ' || g, '\\x00'::bytea, 1, now(), now() \
         FROM generate_series(1, 4500) g",
    )
    .bind(&tenant)
    .execute(&pool)
    .await
    .expect("insert pages");
    let graph = graph_svc::store::load_tenant(&pool, &tenant, 1.0)
        .await
        .expect("load");
    assert_eq!(graph.memory_count(), 4501);
    let names: Vec<u32> = (0..graph.entity_count() as u32)
        .filter(|&e| graph.entity_name(e).contains("zebulon"))
        .collect();
    assert_eq!(names.len(), 1, "one entity for the name");
    // Every memory mentions it: its node has an edge to each of them.
    assert_eq!(graph.degree(graph.entity_node(names[0])), 4501);
}

/// Everything a graph is built from, by entity name instead of index, so
/// parts read in different orders compare equal.
fn canonical(parts: &graph_svc::store::Parts) -> Vec<String> {
    let name = |e: u32| parts.dict.names[e as usize].clone();
    let mut out: Vec<String> = parts
        .memories
        .iter()
        .map(|(id, r)| {
            let mut text: Vec<(String, bool)> =
                r.text_mentions.iter().map(|&(e, h)| (name(e), h)).collect();
            let mut stored: Vec<(String, bool)> = r
                .stored_mentions
                .iter()
                .map(|&(e, h)| (name(e), h))
                .collect();
            let mut facts: Vec<(String, String)> =
                r.triples.iter().map(|&(s, o)| (name(s), name(o))).collect();
            text.sort();
            stored.sort();
            facts.sort();
            format!(
                "{id} {} {} {:?} {} {text:?} {stored:?} {facts:?}",
                r.namespace, r.access_level, r.valid_to_opt, r.retracted
            )
        })
        .collect();
    let mut edges: Vec<String> = parts
        .edges
        .iter()
        .map(|e| format!("edge {} {} {} {}", e.src, e.dst, e.edge_type, e.weight))
        .collect();
    edges.sort();
    let mut names = parts.dict.names.clone();
    names.sort();
    out.extend(edges);
    out.push(format!("names {names:?}"));
    out
}

async fn insert_edge(pool: &PgPool, tenant: &str, src: Uuid, dst: Uuid) {
    sqlx::query(
        "INSERT INTO edges (tenant_id, src_id, dst_id, edge_type, weight) VALUES ($1, $2, $3, 'related', 2)",
    )
    .bind(tenant)
    .bind(src)
    .bind(dst)
    .execute(pool)
    .await
    .expect("insert edge");
}

#[tokio::test]
async fn changes_applied_in_place_give_the_parts_a_full_load_reads() {
    let pool = engram_common::db::test_database()
        .await
        .expect("test database");
    let tenant = format!("t-{}", Uuid::new_v4());
    let base = insert_memory(
        &pool,
        &tenant,
        "Alpha Base",
        "Alpha Base hosts the Zephyr Array.",
        1,
    )
    .await;
    // Mentions a name in lower case, so no entity is made for it yet.
    let note = insert_memory(
        &pool,
        &tenant,
        "Visit note",
        "Visitors reach Alpha Base by train; the falcon project meets there.",
        1,
    )
    .await;
    let secret = insert_memory(
        &pool,
        &tenant,
        "Vault",
        "The Zephyr Array key sits in the Vault.",
        4,
    )
    .await;
    insert_edge(&pool, &tenant, note, base).await;
    insert_edge(&pool, &tenant, secret, base).await;
    let mut parts = graph_svc::store::load_parts(&pool, &tenant)
        .await
        .expect("load");
    assert_eq!(parts.memories.len(), 3);

    // A new memory whose title is a new name the old note holds; an edit;
    // a delete (its edges go with it); a new edge.
    let falcon = insert_memory(
        &pool,
        &tenant,
        "Falcon Project",
        "Falcon Project is run from Alpha Base.",
        2,
    )
    .await;
    sqlx::query("UPDATE memories SET content = 'Alpha Base closed; it hosted the Zephyr Array.', valid_to = now() WHERE id = $1")
        .bind(base)
        .execute(&pool)
        .await
        .expect("edit");
    sqlx::query("DELETE FROM memories WHERE id = $1")
        .bind(secret)
        .execute(&pool)
        .await
        .expect("delete");
    insert_edge(&pool, &tenant, falcon, note).await;
    // The note is not named: only the new name's word brings it back.
    let changed = [falcon, base, secret];

    // With no room to re-match, the new name asks for a full load.
    let mut tight = parts.clone();
    let outcome = graph_svc::store::delta::apply(&pool, &tenant, &mut tight, &changed, 0)
        .await
        .expect("apply");
    assert_eq!(
        outcome,
        Err(graph_svc::store::delta::FullLoad::TooManyToRematch)
    );

    let outcome = graph_svc::store::delta::apply(&pool, &tenant, &mut parts, &changed, 100)
        .await
        .expect("apply");
    assert_eq!(outcome, Ok(()));
    let full = graph_svc::store::load_parts(&pool, &tenant)
        .await
        .expect("reload");
    assert_eq!(canonical(&parts), canonical(&full));
    // The untouched note was matched again for the new name.
    let falcon_e = parts.dict.index["falcon project"];
    assert!(
        parts.memories[&note]
            .text_mentions
            .contains(&(falcon_e, false))
    );

    // The laid-out graphs walk the same.
    let (a, b) = (parts.build(5.0), full.build(5.0));
    assert_eq!(
        (a.memory_count(), a.entity_count(), a.edge_count()),
        (b.memory_count(), b.entity_count(), b.edge_count())
    );
    let params = graph_svc::graph::PprParams {
        damping: 0.5,
        max_iter: 100,
        tol: 1e-9,
        max_nodes: 1000,
        max_hops: 4,
        k: 10,
        budget: graph_svc::graph::NodeBudget::AllNodes,
        deadline_opt: None,
    };
    let walk = |g: &graph_svc::graph::Graph| {
        let e = g
            .entity(&engram_common::entities::normalize("Falcon Project"))
            .expect("entity");
        let view = g.view(4, None, true);
        g.ppr(&[(g.entity_node(e), 1.0)], &view, &params)
            .hits
            .iter()
            .map(|h| (g.memory_id(h.memory), (h.score * 1e9).round() as i64))
            .collect::<Vec<_>>()
    };
    assert_eq!(walk(&a), walk(&b));

    // An entity row below the largest id read (committed out of order)
    // would be numbered apart from a full load's order: read in full.
    sqlx::query(
        "INSERT INTO entities (id, tenant_id, name, display) \
         SELECT min(id) - 1, $1, 'late name', 'Late Name' FROM entities",
    )
    .bind(&tenant)
    .execute(&pool)
    .await
    .expect("late entity");
    let outcome = graph_svc::store::delta::apply(&pool, &tenant, &mut parts, &[], 100)
        .await
        .expect("apply");
    assert_eq!(
        outcome,
        Err(graph_svc::store::delta::FullLoad::EntitiesOutOfOrder)
    );
}

#[tokio::test]
async fn a_notification_naming_its_memories_is_applied_in_place() {
    let pool = engram_common::db::test_database()
        .await
        .expect("test database");
    let tenant = format!("t-{}", Uuid::new_v4());
    insert_memory(
        &pool,
        &tenant,
        "Quillon Ridge",
        "Quillon Ridge is a hill.",
        1,
    )
    .await;
    let registry = std::sync::Arc::new(graph_svc::Registry::new(
        pool.clone(),
        engram_common::settings::GraphSettings::default(),
    ));
    assert_eq!(
        registry.graph(&tenant).await.expect("load").memory_count(),
        1
    );
    let added = insert_memory(
        &pool,
        &tenant,
        "Vessel Moor",
        "Vessel Moor lies below Quillon Ridge.",
        1,
    )
    .await;
    assert!(registry.note_change(&tenant, Some(&[added])));
    registry.rebuild(&tenant).await.expect("rebuild");
    let g = registry.graph(&tenant).await.expect("graph");
    assert_eq!(g.memory_count(), 2);
    assert_eq!(registry.applied_in_place(&tenant), Some(1));
    // Nothing pending: the graph is kept (no full read, which would reset
    // the count).
    registry.rebuild(&tenant).await.expect("rebuild");
    assert_eq!(registry.applied_in_place(&tenant), Some(1));
    // A change without its memories reads the whole tenant.
    assert!(registry.note_change(&tenant, None));
    registry.rebuild(&tenant).await.expect("rebuild");
    assert_eq!(registry.applied_in_place(&tenant), Some(0));
}
