use super::*;
use proptest::prelude::*;

fn params(max_nodes: usize, max_hops: u8) -> PprParams {
    PprParams {
        damping: 0.5,
        max_iter: 1000,
        tol: 1e-12,
        max_nodes,
        max_hops,
        k: 50,
        budget: NodeBudget::AllNodes,
        deadline_opt: None,
    }
}

/// (memories as (namespace, access, retracted), entity count, mentions, triples).
#[derive(Debug, Clone)]
struct Spec {
    mems: Vec<(u32, i16, bool)>,
    ents: usize,
    mentions: Vec<(u32, u32, bool)>,
    typed: Vec<(u32, u32)>,
}

fn build(spec: &Spec, keep: impl Fn(u32) -> bool) -> (Graph, Vec<Option<u32>>) {
    let mut dict = Dictionary::default();
    for e in 0..spec.ents {
        dict.add(&format!("entity{e}"));
    }
    let mut b = GraphBuilder::new(Arc::new(dict), 5.0);
    let mut map = Vec::new();
    for (i, &(ns, level, retracted)) in spec.mems.iter().enumerate() {
        if keep(i as u32) {
            let ns = format!("ns{ns}");
            map.push(Some(b.add_memory(
                Uuid::from_u128(i as u128 + 1),
                &ns,
                level,
                None,
                retracted,
            )));
        } else {
            map.push(None);
        }
    }
    for &(m, e, home) in &spec.mentions {
        if let Some(mm) = map[m as usize] {
            b.add_mention(mm, e, home);
        }
    }
    for &(a, c) in &spec.typed {
        if let (Some(a), Some(c)) = (map[a as usize], map[c as usize]) {
            b.add_typed_edge(a, c, "related", 2.0);
        }
    }
    (b.build(), map)
}

/// Dense reference: x = (1-d)s + d Pᵀx over the full weighted adjacency.
#[allow(clippy::needless_range_loop)]
fn dense_ppr(g: &Graph, seeds: &[(u32, f64)], d: f64) -> Vec<f64> {
    let n = g.wdeg.len();
    let total: f64 = seeds.iter().map(|s| s.1).sum();
    let mut s = vec![0.0; n];
    for &(u, w) in seeds {
        s[u as usize] += w / total;
    }
    let mut x = s.clone();
    for _ in 0..2000 {
        let mut next: Vec<f64> = s.iter().map(|v| (1.0 - d) * v).collect();
        for u in 0..n {
            let deg = f64::from(g.wdeg[u]);
            if deg == 0.0 {
                continue;
            }
            for e in g.edges(u as u32) {
                next[g.targets[e] as usize] += d * x[u] * f64::from(g.weights[e]) / deg;
            }
        }
        x = next;
    }
    x
}

#[test]
fn two_node_graph_has_the_closed_form() {
    let spec = Spec {
        mems: vec![(0, 1, false)],
        ents: 1,
        mentions: vec![(0, 0, false)],
        typed: vec![],
    };
    let (g, _) = build(&spec, |_| true);
    let view = g.view(4, None, false);
    let out = g.ppr(&[(g.entity_node(0), 1.0)], &view, &params(1000, 4));
    // x_e = (1-d) + d x_m, x_m = d x_e  =>  x_m = d / (1 + d) = 1/3.
    assert_eq!(out.hits.len(), 1);
    assert!(
        (out.hits[0].score - 1.0 / 3.0).abs() < 1e-9,
        "{}",
        out.hits[0].score
    );
    assert_eq!(out.hits[0].via_entities, vec![0]);
}

#[test]
fn unbounded_walk_matches_dense_power_iteration() {
    // Two "documents" per entity, a home edge, a typed edge, a synonym.
    let spec = Spec {
        mems: (0..6).map(|_| (0, 1, false)).collect(),
        ents: 4,
        mentions: vec![
            (0, 0, true),
            (0, 1, false),
            (1, 1, true),
            (1, 2, false),
            (2, 2, true),
            (3, 0, false),
            (3, 3, false),
            (4, 3, true),
            (5, 1, false),
        ],
        typed: vec![(2, 5)],
    };
    let (g, _) = build(&spec, |_| true);
    let view = g.view(4, None, false);
    let seeds = [
        (g.entity_node(0), 1.0),
        (g.entity_node(2), 0.5),
        (3u32, 0.2),
    ];
    let dense = dense_ppr(&g, &seeds, 0.5);
    let out = g.ppr(&seeds, &view, &params(1000, 50));
    assert_eq!(out.hits.len(), 6);
    for h in &out.hits {
        let want = dense[h.memory as usize];
        assert!(
            (h.score - want).abs() < 1e-9,
            "memory {} {} vs {}",
            h.memory,
            h.score,
            want
        );
    }
    // Ranked by score.
    assert!(out.hits.windows(2).all(|w| w[0].score >= w[1].score));
}

/// HippoRAG 2's passage nodes (issue 19): the question names entity 0,
/// which two memories mention; each leads on, through its other entity,
/// to one more memory: the bridge (memory 1) and a distractor (memory 3),
/// placed symmetrically so entity seeds alone cannot tell them apart. A
/// memory seed on the dense top hit (memory 0, weight 0.05 as the
/// gateway sends) is what ranks the bridge above the distractor. Both
/// walks equal the dense reference.
#[test]
fn only_the_memory_seed_finds_the_bridge() {
    let spec = Spec {
        mems: (0..4).map(|_| (0, 1, false)).collect(),
        ents: 3,
        mentions: vec![
            (0, 0, false),
            (0, 1, false),
            (1, 1, true),
            (2, 0, false),
            (2, 2, false),
            (3, 2, true),
        ],
        typed: vec![],
    };
    let (g, _) = build(&spec, |_| true);
    let view = g.view(4, None, false);
    let score = |seeds: &[(u32, f64)], m: u32| -> f64 {
        let dense = dense_ppr(&g, seeds, 0.5);
        let out = g.ppr(seeds, &view, &params(1000, 50));
        let hit = out
            .hits
            .iter()
            .find(|h| h.memory == m)
            .map_or(0.0, |h| h.score);
        assert!(
            (hit - dense[m as usize]).abs() < 1e-9,
            "memory {m}: {hit} vs {}",
            dense[m as usize]
        );
        hit
    };
    let entity_only = [(g.entity_node(0), 1.0)];
    assert!(
        (score(&entity_only, 1) - score(&entity_only, 3)).abs() < 1e-12,
        "entity seeds alone: a tie"
    );
    let with_passage = [(g.entity_node(0), 1.0), (0u32, 0.05)];
    assert!(
        score(&with_passage, 1) > score(&with_passage, 3) + 1e-6,
        "the memory seed ranks the bridge first"
    );
}

#[test]
fn star_with_a_million_leaves_touches_at_most_the_budget() {
    let n = 1_000_000u32;
    let mut dict = Dictionary::default();
    dict.add("hub");
    let mut b = GraphBuilder::new(Arc::new(dict), 5.0);
    for i in 0..n {
        let m = b.add_memory(
            Uuid::from_u128(u128::from(i) + 1),
            "default",
            1,
            None,
            false,
        );
        b.add_mention(m, 0, false);
    }
    let g = b.build();
    let view = g.view(4, None, false);
    let mut p = params(1000, 4);
    p.tol = 1e-6;
    p.max_iter = 100;
    for seed in [g.entity_node(0), 17] {
        let started = Instant::now();
        let out = g.ppr(&[(seed, 1.0)], &view, &p);
        assert!(out.nodes_touched <= 1000, "{}", out.nodes_touched);
        assert!(!out.hits.is_empty());
        assert!(out.hits.len() <= 50);
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}

#[test]
fn hops_bound_the_walk() {
    // A chain m0 - e0 - m1 - e1 - m2 - e2 - m3.
    let spec = Spec {
        mems: (0..4).map(|_| (0, 1, false)).collect(),
        ents: 3,
        mentions: vec![
            (0, 0, false),
            (1, 0, false),
            (1, 1, false),
            (2, 1, false),
            (2, 2, false),
            (3, 2, false),
        ],
        typed: vec![],
    };
    let (g, _) = build(&spec, |_| true);
    let view = g.view(4, None, false);
    let found = |hops| -> Vec<u32> {
        let mut v: Vec<u32> = g
            .ppr(&[(0, 1.0)], &view, &params(1000, hops))
            .hits
            .iter()
            .map(|h| h.memory)
            .collect();
        v.sort();
        v
    };
    assert_eq!(found(2), vec![0, 1]);
    assert_eq!(found(4), vec![0, 1, 2]);
}

#[test]
fn neighbors_and_contradictions_respect_types_and_trust() {
    let mut dict = Dictionary::default();
    dict.add("shared");
    let mut b = GraphBuilder::new(Arc::new(dict), 5.0);
    let ms: Vec<u32> = (0..4)
        .map(|i| {
            b.add_memory(
                Uuid::from_u128(i + 1),
                "default",
                if i == 3 { 4 } else { 1 },
                None,
                false,
            )
        })
        .collect();
    b.add_typed_edge(ms[0], ms[1], "contradicts", 1.0);
    b.add_typed_edge(ms[1], ms[2], "causes", 1.0);
    b.add_typed_edge(ms[0], ms[3], "contradicts", 1.0);
    b.add_mention(ms[2], 0, false);
    b.add_mention(ms[3], 0, false);
    let g = b.build();
    let public = g.view(1, None, false);
    let all = g.view(4, None, false);
    let hits = g.neighbors(&[ms[0]], 2, 100, None, &public);
    assert_eq!(
        hits.iter().map(|h| (h.memory, h.depth)).collect::<Vec<_>>(),
        vec![(1, 1), (2, 2)]
    );
    let hits = g.neighbors(&[ms[0]], 4, 100, None, &all);
    assert!(hits.iter().any(|h| h.memory == 3 && h.depth == 1));
    let only: HashSet<String> = ["causes".to_string()].into_iter().collect();
    assert!(g.neighbors(&[ms[0]], 4, 100, Some(&only), &all).is_empty());
    assert_eq!(g.contradictions(&ms, &public), vec![(0, 1, 1.0)]);
    assert_eq!(g.contradictions(&ms, &all).len(), 2);
    assert!(g.has_edge_type("contradicts") && g.has_edge_type("causes"));
    assert!(!g.has_edge_type("part_of"));
}

#[test]
fn a_graph_without_contradicts_edges_finds_no_contradiction() {
    let mut b = GraphBuilder::new(Arc::new(Dictionary::default()), 5.0);
    let ms: Vec<u32> = (0..3)
        .map(|i| b.add_memory(Uuid::from_u128(i + 1), "default", 1, None, false))
        .collect();
    b.add_typed_edge(ms[0], ms[1], "related", 1.0);
    b.add_typed_edge(ms[1], ms[2], "causes", 1.0);
    let g = b.build();
    // What lets the gateway skip its Contradictions call on this graph.
    assert!(!g.has_edge_type("contradicts"));
    assert!(g.contradictions(&ms, &g.view(4, None, false)).is_empty());
}

#[test]
fn linking_counts_only_visible_mentions() {
    let mut dict = Dictionary::default();
    dict.add("Project Falcon");
    dict.add("Paris");
    let mut b = GraphBuilder::new(Arc::new(dict), 5.0);
    let secret = b.add_memory(Uuid::from_u128(1), "default", 4, None, false);
    let open = b.add_memory(Uuid::from_u128(2), "default", 1, None, false);
    b.add_mention(secret, 0, true);
    b.add_mention(secret, 1, false);
    b.add_mention(open, 1, false);
    let g = b.build();
    let public = g.link("Is Project Falcon in Paris?", &g.view(1, None, false));
    assert_eq!(
        public
            .iter()
            .map(|l| (l.name.as_str(), l.df))
            .collect::<Vec<_>>(),
        vec![("paris", 1)]
    );
    let all = g.link("Is Project Falcon in Paris?", &g.view(4, None, false));
    assert_eq!(all.len(), 2);
    assert!(all.iter().any(|l| l.name == "project falcon" && l.has_home));
}

#[test]
fn names_link_with_or_without_their_diacritics() {
    let mut dict = Dictionary::default();
    let tekeze = dict.add("Tekezé River").expect("a name");
    let zurich = dict.add("Zurich").expect("a name");
    let soren = dict.add("Søren Kierkegaard").expect("a name");
    let mut b = GraphBuilder::new(Arc::new(dict), 5.0);
    let m = b.add_memory(Uuid::from_u128(1), "default", 1, None, false);
    b.add_mention(m, tekeze, true);
    b.add_mention(m, zurich, false);
    b.add_mention(m, soren, false);
    let g = b.build();
    let view = g.view(4, None, false);
    let linked = |q: &str| {
        g.link(q, &view)
            .iter()
            .map(|l| l.entity)
            .collect::<Vec<_>>()
    };
    assert_eq!(linked("Where does the Tekeze River flow?"), vec![tekeze]);
    assert_eq!(linked("Where does the Tekezé River flow?"), vec![tekeze]);
    assert_eq!(linked("Is it far from Zürich?"), vec![zurich]);
    assert!(linked("Where does the Tekezo River flow?").is_empty());
    // A letter without a decomposition, folded as the keyword index does.
    assert_eq!(linked("What did Soren Kierkegaard write?"), vec![soren]);
}

fn arb_spec() -> impl Strategy<Value = Spec> {
    (2usize..14, 1usize..6).prop_flat_map(|(m, e)| {
        (
            proptest::collection::vec((0u32..2, 1i16..5, proptest::bool::weighted(0.2)), m),
            Just(e),
            proptest::collection::vec((0..m as u32, 0..e as u32, proptest::bool::ANY), 1..30),
            proptest::collection::vec((0..m as u32, 0..m as u32), 0..4),
        )
            .prop_map(|(mems, ents, mentions, typed)| Spec {
                mems,
                ents,
                mentions,
                typed,
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// A caller never gets a memory above their trust level, outside the
    /// namespace or historical when not asked; and hidden memories are
    /// absent: the walk equals the walk on the graph built without them.
    #[test]
    fn restricted_memories_are_absent(
        spec in arb_spec(),
        trust in 1i16..5,
        ns_filter in proptest::option::of(0u32..2),
        historical in proptest::bool::ANY,
        seed_ents in proptest::collection::vec(0u32..6, 1..3),
    ) {
        let (g, _) = build(&spec, |_| true);
        let ns_name = ns_filter.map(|n| format!("ns{n}"));
        let view = g.view(trust, ns_name.as_deref(), historical);
        let visible = |i: u32| {
            let (ns, level, retracted) = spec.mems[i as usize];
            level <= trust && ns_filter.is_none_or(|f| f == ns) && (historical || !retracted)
        };
        let (h, map) = build(&spec, visible);
        let hview = h.view(4, None, true);
        let seeds: Vec<(u32, f64)> = seed_ents
            .iter()
            .filter(|&&e| (e as usize) < spec.ents)
            .map(|&e| (g.entity_node(e), 1.0))
            .collect();
        let hseeds: Vec<(u32, f64)> = seeds
            .iter()
            .map(|&(n, w)| (n - g.memory_count() as u32 + h.memory_count() as u32, w))
            .collect();
        let out = g.ppr(&seeds, &view, &params(1000, 50));
        let want = h.ppr(&hseeds, &hview, &params(1000, 50));
        for hit in &out.hits {
            prop_assert!(visible(hit.memory), "memory {} leaked", hit.memory);
        }
        let mut got: Vec<(u32, f64)> = out.hits.iter().map(|x| (x.memory, x.score)).collect();
        got.sort_by_key(|x| x.0);
        let mut exp: Vec<(u32, f64)> = want
            .hits
            .iter()
            .map(|x| {
                let orig = map.iter().position(|m| *m == Some(x.memory)).unwrap_or(usize::MAX);
                (orig as u32, x.score)
            })
            .collect();
        exp.sort_by_key(|x| x.0);
        prop_assert_eq!(got.len(), exp.len());
        for (a, b) in got.iter().zip(&exp) {
            prop_assert_eq!(a.0, b.0);
            prop_assert!((a.1 - b.1).abs() < 1e-9, "{} vs {}", a.1, b.1);
        }
        // Linking and neighbours obey the same view.
        for n in g.neighbors(&(0..g.memory_count() as u32).collect::<Vec<_>>(), 4, 1000, None, &view) {
            prop_assert!(visible(n.memory));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Issue 19's fact seeds and passage seeds obey trust: a fact naming
    /// entities that only hidden memories mention, or a memory seed on a
    /// hidden memory, changes nothing. The whole request (query, facts,
    /// memory seeds) through the service's `run_ppr` equals the same
    /// request on the graph built without the hidden memories.
    #[test]
    fn facts_and_memory_seeds_of_hidden_memories_seed_nothing(
        spec in arb_spec(),
        trust in 1i16..5,
        query_ents in proptest::collection::vec(0u32..6, 0..2),
        fact_ents in proptest::collection::vec((0u32..6, 0.05f32..1.0), 1..4),
        memory_seeds in proptest::collection::vec((0u32..14, 0.1f32..1.0), 0..3),
    ) {
        use crate::service::{PprQuery, run_ppr};
        let (g, _) = build(&spec, |_| true);
        let view = g.view(trust, None, true);
        let visible = |i: u32| spec.mems[i as usize].1 <= trust;
        let (h, _) = build(&spec, visible);
        let hview = h.view(4, None, true);
        let name = |e: &u32| format!("entity{e}");
        let req = engram_proto::PprRequest {
            query_text: query_ents.iter().map(name).collect::<Vec<_>>().join(" "),
            seeds: memory_seeds
                .iter()
                .filter(|(m, _)| (*m as usize) < spec.mems.len())
                .map(|&(m, w)| engram_proto::Seed {
                    memory_id: Uuid::from_u128(u128::from(m) + 1).to_string(),
                    weight: w,
                })
                .collect(),
            facts: fact_ents
                .iter()
                .map(|(e, w)| engram_proto::FactSeed { text: name(e), weight: *w })
                .collect(),
            ..Default::default()
        };
        let settings = engram_common::settings::GraphSettings::default();
        let q = PprQuery::from_proto(req, &settings).expect("valid");
        let got = run_ppr(&g, &q, &view, settings.memory_seed_weight, None);
        let want = run_ppr(&h, &q, &hview, settings.memory_seed_weight, None);
        prop_assert_eq!(got.hits.len(), want.hits.len());
        for (a, b) in got.hits.iter().zip(&want.hits) {
            prop_assert_eq!(&a.memory_id, &b.memory_id);
            prop_assert!((a.score - b.score).abs() < 1e-5, "{} vs {}", a.score, b.score);
        }
    }
}

#[test]
fn deadline_in_the_past_returns_partial_results_fast() {
    let spec = Spec {
        mems: (0..3).map(|_| (0, 1, false)).collect(),
        ents: 1,
        mentions: vec![(0, 0, false), (1, 0, false), (2, 0, false)],
        typed: vec![],
    };
    let (g, _) = build(&spec, |_| true);
    let mut p = params(1000, 4);
    p.deadline_opt = Some(Instant::now());
    let out = g.ppr(&[(g.entity_node(0), 1.0)], &g.view(4, None, false), &p);
    assert!(out.deadline_hit);
}

use std::time::Duration;

/// A graph with hubs: `hubs` entities each mentioned by most memories,
/// some rarer entities, typed edges, a synonym pair, gated triples, mixed
/// access levels, namespaces and historical memories.
#[derive(Debug, Clone)]
struct Wide {
    mems: Vec<(u32, i16, bool, Option<i64>)>,
    mentions: Vec<(u32, u32, bool)>,
    typed: Vec<(u32, u32, f32)>,
    triples: Vec<(u32, u32, u32)>,
}

fn build_wide(w: &Wide, ents: usize) -> Graph {
    let mut dict = Dictionary::default();
    for e in 0..ents {
        dict.add(&format!("entity{e}"));
    }
    // Synonyms of entity0 ("Entity0 (film)" meets "entity0").
    dict.add("Entity0 (film)");
    let mut b = GraphBuilder::new(Arc::new(dict), 5.0);
    for (i, &(ns, level, retracted, valid_to_opt)) in w.mems.iter().enumerate() {
        b.add_memory(
            Uuid::from_u128(i as u128 + 1),
            &format!("ns{ns}"),
            level,
            valid_to_opt,
            retracted,
        );
    }
    for &(m, e, home) in &w.mentions {
        b.add_mention(m, e, home);
    }
    for &(a, c, wt) in &w.typed {
        b.add_typed_edge(a, c, if wt > 1.5 { "causes" } else { "related" }, wt);
    }
    for &(m, s, o) in &w.triples {
        b.add_triple(m, s, o);
    }
    b.build()
}

const WIDE_ENTS: usize = 12;

fn arb_wide() -> impl Strategy<Value = Wide> {
    (20usize..120).prop_flat_map(|m| {
        let now = unix_now();
        (
            proptest::collection::vec(
                (
                    0u32..2,
                    1i16..5,
                    proptest::bool::weighted(0.1),
                    proptest::option::weighted(0.1, (now - 1000)..(now + 1000)),
                ),
                m,
            ),
            // Entities 0..3 are hubs: each memory mentions one or two.
            proptest::collection::vec(
                (0..m as u32, 0u32..3, proptest::bool::weighted(0.1)),
                m..2 * m,
            ),
            proptest::collection::vec(
                (
                    0..m as u32,
                    3u32..WIDE_ENTS as u32,
                    proptest::bool::weighted(0.3),
                ),
                0..m,
            ),
            proptest::collection::vec((0..m as u32, 0..m as u32, 0.5f32..3.0), 0..2 * m),
            proptest::collection::vec(
                (0..m as u32, 0u32..WIDE_ENTS as u32, 0u32..WIDE_ENTS as u32),
                0..6,
            ),
        )
            .prop_map(
                move |(mems, hub_mentions, mut mentions, mut typed, mut triples)| {
                    mentions.extend(hub_mentions);
                    // Hub–hub edges: facts between the hub entities, and two
                    // hub memories linked to each other and to many others.
                    triples.extend([(1, 0, 1), (m as u32 - 1, 1, 2), (2, 2, 0)]);
                    typed.push((0, 1, 1.0));
                    typed.extend((2..m as u32).step_by(2).map(|j| (0, j, 1.0)));
                    typed.extend((3..m as u32).step_by(3).map(|j| (1, j, 2.0)));
                    Wide {
                        mems,
                        mentions,
                        typed,
                        triples,
                    }
                },
            )
    })
}

fn same_outcome(a: &PprOutcome, b: &PprOutcome) -> Result<(), TestCaseError> {
    let key = |o: &PprOutcome| -> Vec<(u32, u64, Vec<u32>)> {
        o.hits
            .iter()
            .map(|h| (h.memory, h.score.to_bits(), h.via_entities.clone()))
            .collect()
    };
    prop_assert_eq!(key(a), key(b));
    prop_assert_eq!(a.nodes_touched, b.nodes_touched);
    prop_assert_eq!(a.memories_touched, b.memories_touched);
    Ok(())
}

/// The same view resolved without the per-level tables (rows rescanned).
fn general(view: &View) -> View {
    View {
        level_opt: None,
        ..view.clone()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// The optimised walk (bitmap index, one pass per push, hub rows read
    /// through their neighbours, per-level degrees) returns exactly, bit
    /// for bit, what the walk as first written returns: same node set,
    /// same scores, same order, same via entities, under every budget.
    #[test]
    fn walk_equals_the_reference_walk(
        w in arb_wide(),
        trust in 1i16..5,
        ns_filter in proptest::option::weighted(0.2, 0u32..2),
        historical in proptest::bool::ANY,
        max_nodes in prop_oneof![Just(4usize), Just(9), Just(25), Just(60), Just(1000)],
        hops in 1u8..5,
        mem_budget in proptest::bool::weighted(0.2),
        seed_ents in proptest::collection::vec((0u32..WIDE_ENTS as u32 + 1, 0.1f64..2.0), 0..4),
        seed_mems in proptest::collection::vec((0u32..20, 0.01f64..1.0), 0..3),
    ) {
        let g = build_wide(&w, WIDE_ENTS);
        let ns = ns_filter.map(|n| format!("ns{n}"));
        let view = g.view(trust, ns.as_deref(), historical);
        let mut seeds: Vec<(u32, f64)> =
            seed_ents.iter().map(|&(e, x)| (g.entity_node(e), x)).collect();
        seeds.extend(seed_mems.iter().copied());
        let p = PprParams {
            damping: 0.5,
            max_iter: 100,
            tol: 1e-6,
            max_nodes,
            max_hops: hops,
            k: 50,
            budget: if mem_budget { NodeBudget::MemoryNodes } else { NodeBudget::AllNodes },
            deadline_opt: None,
        };
        let fast = g.ppr(&seeds, &view, &p);
        same_outcome(&fast, &g.ppr_reference(&seeds, &view, &p))?;
        // Per-level tables change nothing but speed.
        let slow = general(&view);
        same_outcome(&fast, &g.ppr(&seeds, &slow, &p))?;
        same_outcome(&fast, &g.ppr_reference(&seeds, &slow, &p))?;
        let key = |v: &View| -> Vec<(u32, u32, bool)> {
            g.link("entity0 entity1 and entity5 or entity9", v)
                .iter()
                .map(|l| (l.entity, l.df, l.has_home))
                .collect()
        };
        prop_assert_eq!(key(&view), key(&slow));
        for n in 0..(g.memory_count() + g.entity_count()) as u32 {
            prop_assert_eq!(
                g.visible_degree(n, &view).to_bits(),
                g.visible_degree(n, &slow).to_bits()
            );
        }
        // The maintained visible count equals counting every memory.
        let counted = (0..g.memory_count() as u32)
            .filter(|&m| g.memory_visible(m, &view))
            .count();
        prop_assert_eq!(g.visible_memory_count(&view), counted);
        // Scratch reuse: a second walk on the same graph agrees.
        same_outcome(&fast, &g.ppr(&seeds, &view, &p))?;
    }
}

#[test]
fn walks_on_a_hub_heavy_graph_equal_the_reference() {
    // 3,000 memories over 60 base passages: entities shared by 50 memories,
    // three hubs every memory mentions, 5 typed edges per memory.
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let (m, base) = (3000u32, 60u32);
    let mut dict = Dictionary::default();
    for e in 0..(base * 4 + 3) {
        dict.add(&format!("entity{e}"));
    }
    let mut b = GraphBuilder::new(Arc::new(dict), 5.0);
    for j in 0..m {
        let level = if j % 100 == 99 { 3 } else { 1 };
        b.add_memory(
            Uuid::from_u128(u128::from(j) + 1),
            "default",
            level,
            None,
            false,
        );
        let p = j % base;
        for k in 0..4 {
            b.add_mention(j, 3 + p * 4 + k, k == 0);
        }
        b.add_mention(j, j % 3, false);
    }
    for j in 0..m {
        for _ in 0..5 {
            b.add_typed_edge(j, rng.random_range(0..m), "related", 1.0);
        }
    }
    let g = b.build();
    let p = PprParams {
        damping: 0.5,
        max_iter: 100,
        tol: 1e-6,
        max_nodes: 1000,
        max_hops: 4,
        k: 50,
        budget: NodeBudget::AllNodes,
        deadline_opt: None,
    };
    for trust in [4, 1] {
        let view = g.view(trust, None, false);
        assert_eq!(view.level_opt.is_some(), trust == 1);
        for q in 0..40u32 {
            let seeds = vec![
                (g.entity_node(q % 3), 0.2),
                (g.entity_node(3 + (q * 7) % (base * 4)), 1.0),
                ((q * 7919) % m, 0.05),
            ];
            let fast = g.ppr(&seeds, &view, &p);
            let slow = g.ppr_reference(&seeds, &general(&view), &p);
            assert!(fast.nodes_touched <= 1000);
            let key = |o: &PprOutcome| -> Vec<(u32, u64)> {
                o.hits
                    .iter()
                    .map(|h| (h.memory, h.score.to_bits()))
                    .collect()
            };
            assert_eq!(key(&fast), key(&slow), "trust {trust} query {q}");
        }
    }
}

#[test]
fn synonyms_gather_around_the_plain_name_whatever_the_order() {
    let mut dict = Dictionary::default();
    for name in ["Foo (film)", "Foo (band)", "The Who", "Foo", "Bar"] {
        dict.add(name);
    }
    let g = GraphBuilder::new(Arc::new(dict), 5.0).build();
    let node = |name: &str| g.entity_node(g.entity(name).expect("entity"));
    // "foo" anchors both parentheticals; "bar" and the stopword-only key
    // of "the who" join nothing.
    assert_eq!(g.degree(node("foo")), 2);
    assert_eq!(g.degree(node("foo film")), 1);
    assert_eq!(g.degree(node("foo band")), 1);
    assert_eq!(g.degree(node("bar")), 0);
    assert_eq!(g.edge_count(), 2);
}
