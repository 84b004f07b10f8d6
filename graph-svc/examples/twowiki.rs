//! Graph-only recall on 2Wiki dev, built in-process from the files (no
//! Postgres): `cargo run --release -p graph-svc --example twowiki -- CORPUS QUESTIONS [N]`.
//! Env knobs: HOME_W (home edge weight, default 5), MAX_NODES (1000),
//! HOPS (4), BUDGET (all | mem), NO_NUMBERS=1 (drop numeric entities).

use std::sync::Arc;
use std::time::Instant;

use engram_common::entities::extract;
use engram_common::settings::GraphSettings;
use graph_svc::graph::{Dictionary, GraphBuilder, NodeBudget};
use graph_svc::service::{PprQuery, run_ppr_with};

fn env<T: std::str::FromStr>(k: &str, d: T) -> T {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let corpus_path = args.get(1).map_or(
        "/work/shared/data/hipporag/2wikimultihopqa_corpus.json",
        |s| s.as_str(),
    );
    let q_path = args
        .get(2)
        .map_or("/work/shared/data/hipporag/2wiki_dev.jsonl", |s| s.as_str());
    let n_q: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(500);
    let corpus: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(corpus_path)?)?;
    let no_numbers = std::env::var("NO_NUMBERS").is_ok();
    let t0 = Instant::now();
    let mut dict = Dictionary::default();
    let passages: Vec<(String, String)> = corpus
        .iter()
        .map(|p| {
            (
                p["title"].as_str().unwrap_or("").to_string(),
                p["text"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    for (title, text) in &passages {
        for e in extract(title, text) {
            if no_numbers && e.name.chars().next().is_some_and(|c| c.is_ascii_digit()) && !e.is_home
            {
                continue;
            }
            dict.add_normalized(e.name, &e.display);
        }
    }
    let dict = Arc::new(dict);
    let mut b = GraphBuilder::new(dict.clone(), env("HOME_W", 5.0f32));
    for (i, (title, text)) in passages.iter().enumerate() {
        let m = b.add_memory(uuid::Uuid::from_u128(i as u128), "default", 1, None, false);
        for (e, home) in dict.match_text(title, text) {
            b.add_mention(m, e, home);
        }
    }
    let g = b.build();
    println!(
        "built: memories {} entities {} edges {} in {:.2}s",
        g.memory_count(),
        g.entity_count(),
        g.edge_count(),
        t0.elapsed().as_secs_f64()
    );
    let settings = GraphSettings {
        max_nodes: env("MAX_NODES", 1000u32),
        max_hops: env("HOPS", 4u32),
        ..GraphSettings::default()
    };
    let budget = match std::env::var("BUDGET").as_deref() {
        Ok("mem") => NodeBudget::MemoryNodes,
        _ => NodeBudget::AllNodes,
    };
    let view = g.view(4, None, true);
    let text = std::fs::read_to_string(q_path)?;
    let (mut r2, mut r5, mut n) = (0f64, 0f64, 0usize);
    let mut lat = Vec::new();
    let mut touched = Vec::new();
    let mut no_link = 0;
    for line in text.lines().take(n_q) {
        let q: serde_json::Value = serde_json::from_str(line)?;
        let gold: Vec<u128> = q["gold_passage_idx"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_u64())
                    .map(u128::from)
                    .collect()
            })
            .unwrap_or_default();
        let req = engram_proto::PprRequest {
            query_text: q["question"].as_str().unwrap_or("").to_string(),
            ..Default::default()
        };
        let pq = PprQuery::from_proto(req, &settings)?;
        let t = Instant::now();
        let resp = run_ppr_with(&g, &pq, &view, settings.memory_seed_weight, None, budget);
        lat.push(t.elapsed().as_secs_f64() * 1e3);
        touched.push(resp.nodes_touched);
        if resp.linked_entities.is_empty() {
            no_link += 1;
        }
        let ids: Vec<u128> = resp
            .hits
            .iter()
            .filter_map(|h| uuid::Uuid::parse_str(&h.memory_id).ok())
            .map(|u| u.as_u128())
            .collect();
        let rec = |k: usize| {
            gold.iter()
                .filter(|gd| ids.iter().take(k).any(|i| i == *gd))
                .count() as f64
                / gold.len().max(1) as f64
        };
        r2 += rec(2);
        r5 += rec(5);
        n += 1;
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    touched.sort();
    let pct = |v: &[f64], p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
    println!(
        "questions {n} R@2 {:.1} R@5 {:.1} | ppr ms p50 {:.2} p95 {:.2} | nodes_touched p50 {} max {} | no linked entity {no_link} | budget {:?} max_nodes {} hops {}",
        100.0 * r2 / n as f64,
        100.0 * r5 / n as f64,
        pct(&lat, 0.5),
        pct(&lat, 0.95),
        touched[touched.len() / 2],
        touched.last().copied().unwrap_or(0),
        budget,
        settings.max_nodes,
        settings.max_hops
    );
    Ok(())
}
