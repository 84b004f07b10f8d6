//! Weighted RRF of three strategy lists of 100 hits each (half overlapping).
//!
//!   cargo bench -p retrieval-svc --bench rrf

use criterion::{Criterion, criterion_group, criterion_main};
use retrieval_svc::lab::{Strategy, StrategyList, rrf};

fn lists() -> Vec<StrategyList> {
    [Strategy::Vector, Strategy::Keyword, Strategy::Graph]
        .into_iter()
        .enumerate()
        .map(|(s, strategy)| StrategyList {
            strategy,
            weight: 1.0 + s as f32 * 0.5,
            hits: (0..100)
                .map(|i| {
                    (
                        format!("memory-{}", i * (s + 1) % 150),
                        1.0 / (i as f32 + 1.0),
                    )
                })
                .collect(),
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let l = lists();
    c.bench_function("rrf_3x100", |b| {
        b.iter(|| rrf(std::hint::black_box(&l), 60.0))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
