//! PPR on a synthetic graph of 100K memories / 500K typed edges plus 20K
//! entities (3 mentions per memory), seeded with 3 entities, service
//! defaults (damping 0.85, max_iter 100, tol 1e-6, 1000 nodes, 4 hops).
//!
//!   cargo bench -p graph-svc --bench ppr

use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use graph_svc::graph::{Dictionary, Graph, GraphBuilder, NodeBudget, PprParams};
use rand::{Rng, SeedableRng};
use uuid::Uuid;

const MEMORIES: u32 = 100_000;
const EDGES_PER_MEMORY: u32 = 5;
const ENTITIES: u32 = 20_000;

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

fn bench(c: &mut Criterion) {
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

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = bench
}
criterion_main!(benches);
