//! The graph `engram bench` builds, reproduced in-process (no Postgres):
//! N memories whose texts are the first `base` 2Wiki passages replicated
//! (title `"{title} #{j}"`, content `"{text} (record {j})"`), entities from
//! the built-in extractor (so every passage entity is shared by N / base
//! memories: hubs), 5 typed edges per memory to random memories, queries
//! = 2Wiki dev questions with 3 memory seeds each, as the bench sends them.
//! Falls back to a purely synthetic graph when the 2Wiki files are absent.

#![allow(dead_code)]

use std::sync::Arc;

use engram_common::entities::extract;
use graph_svc::graph::{Dictionary, Graph, GraphBuilder};
use rand::{Rng, SeedableRng};
use uuid::Uuid;

const EDGE_TYPES: [&str; 5] = ["related", "related", "related", "causes", "part_of"];

pub struct Shape {
    pub graph: Graph,
    pub questions: Vec<String>,
    pub memories: usize,
}

impl Shape {
    /// The request the bench sends as query `i`: one of the questions, with
    /// three memory seeds (ids are `j`) spread over the tenant.
    pub fn request(&self, i: usize) -> engram_proto::PprRequest {
        engram_proto::PprRequest {
            query_text: self.questions[i % self.questions.len()].clone(),
            seeds: (0..3)
                .map(|s| engram_proto::Seed {
                    memory_id: Uuid::from_u128(((i * 7919 + s * 104_729) % self.memories) as u128)
                        .to_string(),
                    weight: 1.0,
                })
                .collect(),
            ..Default::default()
        }
    }
}

fn data_dir() -> std::path::PathBuf {
    std::env::var_os("ENGRAM_2WIKI_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from("/work/shared/data/hipporag"))
}

/// (title, text) passages.
type Docs = Vec<(String, String)>;

fn read_2wiki(base: usize) -> Option<(Docs, Vec<String>)> {
    let dir = data_dir();
    let corpus: Vec<serde_json::Value> = serde_json::from_str(
        &std::fs::read_to_string(dir.join("2wikimultihopqa_corpus.json")).ok()?,
    )
    .ok()?;
    let docs: Vec<(String, String)> = corpus
        .iter()
        .take(base)
        .map(|p| {
            (
                p["title"].as_str().unwrap_or("").to_string(),
                p["text"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let questions: Vec<String> = std::fs::read_to_string(dir.join("2wiki_dev.jsonl"))
        .ok()?
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|q| q["question"].as_str().map(str::to_string))
        .collect();
    (!docs.is_empty() && !questions.is_empty()).then_some((docs, questions))
}

/// The bench tenant at `memories` memories over `base` base passages.
pub fn bench_tenant(memories: usize, base: usize) -> Shape {
    let (docs, questions) = read_2wiki(base).unwrap_or_else(|| {
        let docs = (0..base)
            .map(|b| {
                (
                    format!("Topic {b}"),
                    format!(
                        "Topic {b} is linked to Person {} and Place {} in Region {}.",
                        b % 997,
                        b % 211,
                        b % 17
                    ),
                )
            })
            .collect();
        let questions = (0..500)
            .map(|q| format!("Where did Person {} meet Place {}?", q % 997, q % 211))
            .collect();
        (docs, questions)
    });
    let texts: Vec<(String, String)> = (0..memories)
        .map(|j| {
            let (t, c) = &docs[j % docs.len()];
            (format!("{t} #{j}"), format!("{c} (record {j})"))
        })
        .collect();
    let mut dict = Dictionary::default();
    for (t, c) in &texts {
        for e in extract(t, c) {
            dict.add_normalized(e.name, &e.display);
        }
    }
    let dict = Arc::new(dict);
    let mut b = GraphBuilder::new(dict.clone(), 5.0);
    for (j, (t, c)) in texts.iter().enumerate() {
        // Every 100th memory is confidential: trust 4 (the bench's) still
        // sees everything, trust 1 exercises the restricted-view path.
        let level = if j % 100 == 99 { 3 } else { 1 };
        let m = b.add_memory(Uuid::from_u128(j as u128), "default", level, None, false);
        for (e, home) in dict.match_text(t, c) {
            b.add_mention(m, e, home);
        }
    }
    for j in 0..memories {
        let mut r = rand::rngs::StdRng::seed_from_u64(j as u64);
        for t in EDGE_TYPES {
            let dst = r.random_range(0..memories);
            if dst != j {
                b.add_typed_edge(j as u32, dst as u32, t, 1.0);
            }
        }
    }
    Shape {
        graph: b.build(),
        questions,
        memories,
    }
}
