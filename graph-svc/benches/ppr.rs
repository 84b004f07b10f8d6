//! PPR at 100K memories, two graphs:
//! - `ppr_100k_memories_500k_edges`: synthetic, 100K memories / 500K typed
//!   edges plus 20K entities (3 mentions per memory), seeded with 3
//!   entities, damping 0.85, max_iter 100, tol 1e-6, 1000 nodes, 4 hops.
//! - `ppr_bench_shape_*`: the tenant `engram bench --memories 100000`
//!   builds (see `support/shape.rs`: 2,000 2Wiki passages replicated 50×,
//!   so passage entities are hubs of degree up to ~22K, 5 typed edges per
//!   memory), through the service path (`run_ppr`: linking, seeding, walk,
//!   conversion) with the bench's queries and memory seeds, cycling over
//!   300 queries; `trust4` sees everything (the bench's identity), `trust1`
//!   does not (1% of memories are confidential). Before criterion runs, the
//!   per-call p50/p95 over those 300 queries are printed.
//!
//!   cargo bench -p graph-svc --bench ppr

#[path = "support/shape.rs"]
mod shape;

use std::sync::Arc;
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use engram_common::settings::GraphSettings;
use graph_svc::graph::{Dictionary, Graph, GraphBuilder, NodeBudget, PprParams};
use graph_svc::service::{PprQuery, run_ppr};
use rand::{Rng, SeedableRng};
use uuid::Uuid;

const MEMORIES: u32 = 100_000;
const EDGES_PER_MEMORY: u32 = 5;
const ENTITIES: u32 = 20_000;
const QUERIES: usize = 300;

fn synthetic() -> Graph {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut dict = Dictionary::default();
    for e in 0..ENTITIES {
        dict.add(&format!("Entity {e}"));
    }
    let mut b = GraphBuilder::new(Arc::new(dict), 2.0);
    for i in 0..MEMORIES {
        b.add_memory(
            Uuid::from_u128(u128::from(i) + 1),
            "default",
            1,
            None,
            false,
        );
    }
    for i in 0..MEMORIES {
        b.add_mention(i, i % ENTITIES, true);
        for _ in 0..2 {
            b.add_mention(i, rng.random_range(0..ENTITIES), false);
        }
        for _ in 0..EDGES_PER_MEMORY {
            b.add_typed_edge(i, rng.random_range(0..MEMORIES), "related", 1.0);
        }
    }
    b.build()
}

fn bench_synthetic(c: &mut Criterion) {
    let g = synthetic();
    let view = g.view(4, None, false);
    let params = PprParams {
        damping: 0.85,
        max_iter: 100,
        tol: 1e-6,
        max_nodes: 1000,
        max_hops: 4,
        k: 50,
        budget: NodeBudget::AllNodes,
        deadline_opt: None,
    };
    let seeds: Vec<(u32, f64)> = [11, 4_242, 17_000]
        .iter()
        .map(|&e| (g.entity_node(e), 1.0))
        .collect();
    c.bench_function("ppr_100k_memories_500k_edges", |b| {
        b.iter(|| g.ppr(std::hint::black_box(&seeds), &view, &params))
    });
}

fn queries(s: &shape::Shape, settings: &GraphSettings) -> Vec<PprQuery> {
    (0..QUERIES)
        .filter_map(|i| {
            let req = s.request(i);
            PprQuery::from_proto(req, settings).ok()
        })
        .collect()
}

fn bench_shape(c: &mut Criterion) {
    let started = Instant::now();
    let s = shape::bench_tenant(MEMORIES as usize, 2000);
    let g = &s.graph;
    eprintln!(
        "bench shape: {} memories, {} entities, {} edges, built in {:.1}s",
        g.memory_count(),
        g.entity_count(),
        g.edge_count(),
        started.elapsed().as_secs_f64()
    );
    let settings = GraphSettings::default();
    let qs = queries(&s, &settings);
    let msw = settings.memory_seed_weight;
    for trust in [4i16, 1] {
        let view = g.view(trust, None, false);
        let mut ms: Vec<f64> = qs
            .iter()
            .map(|q| {
                let t = Instant::now();
                std::hint::black_box(run_ppr(g, q, &view, msw, None));
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        ms.sort_by(|a, b| a.total_cmp(b));
        let pct = |p: f64| ms[((ms.len() as f64 - 1.0) * p).round() as usize];
        eprintln!(
            "bench shape trust {trust}: {} queries, p50 {:.2} ms, p95 {:.2} ms, max {:.2} ms",
            ms.len(),
            pct(0.5),
            pct(0.95),
            pct(1.0)
        );
        let mut i = 0usize;
        c.bench_function(&format!("ppr_bench_shape_100k_trust{trust}"), |b| {
            b.iter(|| {
                i = (i + 1) % qs.len();
                run_ppr(g, std::hint::black_box(&qs[i]), &view, msw, None)
            })
        });
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = bench_synthetic, bench_shape
}
criterion_main!(benches);
