//! The JSONL ingest format (`engram ingest FILE.jsonl`, the demo sample).
//!
//! One JSON object per line, either a memory:
//! `{"id","title","content","memory_type","namespace","access_level",
//!   "source_confidence","event_time","valid_to","supersedes","consolidated",
//!   "metadata","source","entities":[..],"triples":[[s,p,o],..]}`
//! (only `content` is required) or an edge:
//! `{"edge":{"src","dst","type","weight"}}`.
//! Ids may be UUIDs or any other string; a non-UUID id is mapped to a stable
//! UUID v5 of (tenant, id), so re-ingesting a file updates instead of
//! duplicating, and two tenants can load the same file (ids are global).

use std::path::Path;

use anyhow::{Context, bail};
use engram_common::convert::{chrono_to_ts, json_to_struct};
use engram_proto::{AccessLevel, Edge, Memory, Triple};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MemoryLine {
    id: Option<String>,
    #[serde(default)]
    title: String,
    content: String,
    #[serde(default)]
    memory_type: String,
    #[serde(default)]
    namespace: String,
    access_level: Option<String>,
    source_confidence: Option<f32>,
    event_time: Option<chrono::DateTime<chrono::Utc>>,
    valid_to: Option<chrono::DateTime<chrono::Utc>>,
    supersedes: Option<String>,
    #[serde(default)]
    consolidated: bool,
    metadata: Option<serde_json::Value>,
    #[serde(default)]
    source: String,
    #[serde(default)]
    entities: Vec<String>,
    #[serde(default)]
    triples: Vec<[String; 3]>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EdgeLine {
    src: String,
    dst: String,
    #[serde(rename = "type")]
    edge_type: String,
    weight: Option<f32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EdgeWrapper {
    edge: EdgeLine,
}

#[derive(Debug, Default)]
pub struct Batch {
    pub memories: Vec<Memory>,
    pub edges: Vec<Edge>,
}

/// A stable UUID for any id string within a tenant (UUIDs pass through).
pub fn memory_id(tenant: &str, key: &str) -> String {
    match uuid::Uuid::parse_str(key) {
        Ok(u) => u.to_string(),
        Err(_) => uuid::Uuid::new_v5(
            &uuid::Uuid::NAMESPACE_URL,
            format!("engram:{tenant}:{key}").as_bytes(),
        )
        .to_string(),
    }
}

pub fn parse_file(path: &Path, tenant: &str) -> anyhow::Result<Batch> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse_str(&text, &path.display().to_string(), tenant)
}

/// Parses JSONL; errors name the file and line.
pub fn parse_str(text: &str, name: &str, tenant: &str) -> anyhow::Result<Batch> {
    let mut batch = Batch::default();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with("//") {
            continue;
        }
        let at = || format!("{name}:{}", i + 1);
        let value: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{}: not valid JSON", at()))?;
        if value.get("edge").is_some() {
            let e: EdgeWrapper =
                serde_json::from_value(value).with_context(|| format!("{}: bad edge", at()))?;
            batch.edges.push(Edge {
                src_id: memory_id(tenant, &e.edge.src),
                dst_id: memory_id(tenant, &e.edge.dst),
                edge_type: e.edge.edge_type,
                weight: e.edge.weight.unwrap_or(1.0),
            });
            continue;
        }
        let m: MemoryLine =
            serde_json::from_value(value).with_context(|| format!("{}: bad memory", at()))?;
        let access_level = match m.access_level.as_deref() {
            None => AccessLevel::Public,
            Some(s) => match s.to_ascii_lowercase().as_str() {
                "public" => AccessLevel::Public,
                "internal" => AccessLevel::Internal,
                "confidential" => AccessLevel::Confidential,
                "sensitive" => AccessLevel::Sensitive,
                other => bail!(
                    "{}: access_level {other:?} must be public, internal, confidential or sensitive",
                    at()
                ),
            },
        };
        batch.memories.push(Memory {
            id: m
                .id
                .as_deref()
                .map(|k| memory_id(tenant, k))
                .unwrap_or_default(),
            namespace: m.namespace,
            memory_type: m.memory_type,
            content: m.content,
            title: m.title,
            access_level: access_level as i32,
            source_confidence: m.source_confidence,
            event_time: m.event_time.map(chrono_to_ts),
            valid_to: m.valid_to.map(chrono_to_ts),
            supersedes: m
                .supersedes
                .as_deref()
                .map(|k| memory_id(tenant, k))
                .unwrap_or_default(),
            consolidated: m.consolidated,
            metadata: m.metadata.as_ref().map(json_to_struct),
            source: m.source,
            entities: m.entities,
            triples: m
                .triples
                .into_iter()
                .map(|[subject, relation, object]| Triple {
                    subject,
                    relation,
                    object,
                })
                .collect(),
            ..Default::default()
        });
    }
    Ok(batch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_memories_and_edges() {
        let b = parse_str(
            "{\"id\":\"a\",\"content\":\"x\",\"access_level\":\"internal\"}\n\n{\"edge\":{\"src\":\"a\",\"dst\":\"b\",\"type\":\"contradicts\"}}\n",
            "t.jsonl",
            "t1",
        )
        .expect("parse");
        assert_eq!(b.memories.len(), 1);
        assert_eq!(b.memories[0].id, memory_id("t1", "a"));
        assert_ne!(memory_id("t1", "a"), memory_id("t2", "a"));
        assert_eq!(b.memories[0].access_level, AccessLevel::Internal as i32);
        assert_eq!(b.edges[0].dst_id, memory_id("t1", "b"));
    }

    #[test]
    fn errors_name_file_and_line() {
        let err =
            parse_str("{\"content\":\"ok\"}\n{\"content\": 3}\n", "f.jsonl", "t").expect_err("bad");
        assert!(format!("{err:#}").contains("f.jsonl:2"), "{err:#}");
        let err = parse_str("{nope\n", "g.jsonl", "t").expect_err("bad");
        assert!(format!("{err:#}").contains("g.jsonl:1"), "{err:#}");
    }
}
