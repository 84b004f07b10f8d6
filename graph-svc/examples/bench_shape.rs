//! PPR latency on the graph `engram bench` builds, in-process:
//! `cargo run --release -p graph-svc --example bench_shape -- [MEMORIES] [QUERIES]`.
//! Prints build time, graph size, hub degrees and p50/p95/max per call of
//! the service path (`run_ppr`: linking, seeding, walk, conversion), for a
//! caller who sees everything and for one who does not (trust 1 on a graph
//! with a few restricted memories).

#[path = "../benches/support/shape.rs"]
mod shape;

use std::time::Instant;

use engram_common::settings::GraphSettings;
use graph_svc::service::{PprQuery, run_ppr};

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let memories: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let nq: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(300);
    let t0 = Instant::now();
    let s = shape::bench_tenant(memories, 2000);
    let g = &s.graph;
    println!(
        "built in {:.1}s: memories {} entities {} edges {} ~{} MB | max entity degree {}",
        t0.elapsed().as_secs_f64(),
        g.memory_count(),
        g.entity_count(),
        g.edge_count(),
        g.estimated_bytes() >> 20,
        (0..g.entity_count() as u32)
            .map(|e| g.degree(g.entity_node(e)))
            .max()
            .unwrap_or(0)
    );
    let settings = GraphSettings::default();
    for trust in [4i16, 1] {
        let view = g.view(trust, None, false);
        let mut lat = Vec::with_capacity(nq);
        let mut touched = Vec::with_capacity(nq);
        for i in 0..nq {
            let req = s.request(i);
            let q = PprQuery::from_proto(req, &settings)?;
            let t = Instant::now();
            let resp = run_ppr(g, &q, &view, settings.memory_seed_weight, None);
            lat.push(t.elapsed().as_secs_f64() * 1e3);
            touched.push(resp.nodes_touched as f64);
        }
        println!(
            "trust {trust}: ppr ms p50 {:.2} p95 {:.2} max {:.2} | nodes touched p50 {} max {}",
            pct(&mut lat, 0.5),
            pct(&mut lat, 0.95),
            pct(&mut lat, 1.0),
            pct(&mut touched, 0.5),
            pct(&mut touched, 1.0),
        );
    }
    Ok(())
}
