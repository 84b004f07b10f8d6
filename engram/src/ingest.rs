//! The JSONL ingest format (`engram ingest FILE.jsonl`, the demo sample).
//!
//! One JSON object per line, either a memory:
//! `{"id","title","content","memory_type","namespace","access_level",
//!   "source_confidence","event_time","valid_to","supersedes","consolidated",
//!   "metadata","source","entities":[..],"triples":[[s,p,o],..],
//!   "turn":{"session_id","turn_index","speaker","caption"}}`
//! (only `content` is required; `turn` makes it a conversation turn,
//! docs/conversations.md) or an edge:
//! `{"edge":{"src","dst","type","weight"}}`.
//! Ids may be UUIDs or any other string; a non-UUID id is mapped to a stable
//! UUID (v8) keyed by the deployment's id secret ([`IdKey`]): re-ingesting
//! a file updates instead of duplicating, two tenants can load the same
//! file (ids are global), and no tenant can predict another's ids to take
//! them first.

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
    /// A conversation turn: {"session_id", "turn_index", "speaker", "caption"}.
    turn: Option<TurnLine>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TurnLine {
    session_id: String,
    #[serde(default)]
    turn_index: u32,
    #[serde(default)]
    speaker: String,
    #[serde(default)]
    caption: String,
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
    /// Where each memory came from, same order: errors name the file line
    /// and the id the user wrote, never a batch index and a derived UUID.
    pub origins: Vec<Origin>,
}

#[derive(Debug, Clone, Default)]
pub struct Origin {
    /// `file:line`.
    pub at: String,
    pub id_opt: Option<String>,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.id_opt {
            Some(id) => write!(f, "{} (id {id:?})", self.at),
            None => f.write_str(&self.at),
        }
    }
}

impl Batch {
    /// The memories in write order, as waves of indices: a memory comes in
    /// the wave after the one holding what it supersedes (a `supersedes`
    /// target must exist before the write that closes it), so a file may
    /// supersede its own earlier lines. A cycle is an error naming a line.
    pub fn waves(&self) -> anyhow::Result<Vec<Vec<usize>>> {
        let by_id: std::collections::HashMap<&str, usize> = (self.memories.iter().enumerate())
            .filter(|(_, m)| !m.id.is_empty())
            .map(|(i, m)| (m.id.as_str(), i))
            .collect();
        let mut depth: Vec<Option<usize>> = vec![None; self.memories.len()];
        for start in 0..self.memories.len() {
            // Walk the supersedes chain up to a memory of known depth, or
            // one whose target is not in this file (depth 0).
            let mut chain: Vec<usize> = Vec::new();
            let mut seen = std::collections::HashSet::new();
            let mut i = start;
            let base_opt = loop {
                if let Some(d) = depth[i] {
                    break Some(d);
                }
                if !seen.insert(i) {
                    bail!(
                        "{}: supersedes forms a cycle within the file",
                        self.origins[i]
                    );
                }
                chain.push(i);
                match by_id.get(self.memories[i].supersedes.as_str()) {
                    Some(&t) => i = t,
                    None => break None,
                }
            };
            // chain[k] supersedes chain[k + 1]: depths rise towards the start.
            let first = base_opt.map_or(0, |b| b + 1);
            for (d, &j) in (first..).zip(chain.iter().rev()) {
                depth[j] = Some(d);
            }
        }
        let mut waves: Vec<Vec<usize>> = Vec::new();
        for (i, d) in depth.into_iter().enumerate() {
            let d = d.unwrap_or(0);
            if waves.len() <= d {
                waves.resize(d + 1, Vec::new());
            }
            waves[d].push(i);
        }
        Ok(waves)
    }
}

/// The key of derived ids: the deployment's `auth.id_secret_opt`, or the
/// secret kept in `<home>/id-secret`.
#[derive(Clone)]
pub struct IdKey(Vec<u8>);

impl std::fmt::Debug for IdKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdKey(..)")
    }
}

impl IdKey {
    pub fn new(secret: &[u8]) -> Self {
        Self(secret.to_vec())
    }

    /// The deployment's key: from settings, else the data directory's
    /// secret file (created, mode 0600, on first use).
    pub fn for_deployment(settings: &engram_common::Settings) -> anyhow::Result<Self> {
        if let Some(s) = settings.auth.id_secret_opt.as_deref() {
            return Ok(Self::new(s.as_bytes()));
        }
        let path = settings.home.join("id-secret");
        if let Ok(s) = std::fs::read_to_string(&path)
            && !s.trim().is_empty()
        {
            return Ok(Self::new(s.trim().as_bytes()));
        }
        let secret = format!(
            "{}{}",
            engram_stack::stack::random_token(),
            engram_stack::stack::random_token()
        );
        write_private(&path, &secret)?;
        Ok(Self::new(secret.as_bytes()))
    }

    /// The demo sample's ids: a public key, since the sample is public.
    pub fn demo() -> Self {
        Self::new(b"engram demo sample: public ids, not a secret")
    }
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    writeln!(f, "{text}")?;
    Ok(())
}

/// A stable UUID for any id string within a tenant (UUIDs pass through):
/// the first 16 bytes of HMAC-SHA256(key, tenant, id) as a UUID v8.
pub fn memory_id(key: &IdKey, tenant: &str, id: &str) -> String {
    use hmac::Mac;
    if let Ok(u) = uuid::Uuid::parse_str(id) {
        return u.to_string();
    }
    // HMAC takes keys of any length; the error type exists for fixed-size MACs.
    let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key.0) else {
        return uuid::Uuid::nil().to_string();
    };
    for part in [tenant, id] {
        mac.update(&(part.len() as u64).to_le_bytes());
        mac.update(part.as_bytes());
    }
    let digest = mac.finalize().into_bytes();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Uuid::new_v8(bytes).to_string()
}

pub fn parse_file(path: &Path, tenant: &str, key: &IdKey) -> anyhow::Result<Batch> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse_str(&text, &path.display().to_string(), tenant, key)
}

/// Parses JSONL; errors name the file and line.
pub fn parse_str(text: &str, name: &str, tenant: &str, key: &IdKey) -> anyhow::Result<Batch> {
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
                src_id: memory_id(key, tenant, &e.edge.src),
                dst_id: memory_id(key, tenant, &e.edge.dst),
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
        batch.origins.push(Origin {
            at: at(),
            id_opt: m.id.clone(),
        });
        batch.memories.push(Memory {
            id: m
                .id
                .as_deref()
                .map(|k| memory_id(key, tenant, k))
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
                .map(|k| memory_id(key, tenant, k))
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
            turn: m.turn.map(|t| engram_proto::Turn {
                session_id: t.session_id,
                turn_index: t.turn_index,
                speaker: t.speaker,
                caption: t.caption,
            }),
            ..Default::default()
        });
    }
    Ok(batch)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> IdKey {
        IdKey::new(b"a test secret of at least 32 bytes")
    }

    #[test]
    fn a_file_may_supersede_its_own_earlier_lines_in_any_order() {
        let text = "{\"id\":\"v3\",\"content\":\"c\",\"supersedes\":\"v2\"}\n\
                    {\"id\":\"v1\",\"content\":\"a\"}\n\
                    {\"id\":\"v2\",\"content\":\"b\",\"supersedes\":\"v1\"}\n\
                    {\"id\":\"other\",\"content\":\"d\",\"supersedes\":\"elsewhere\"}\n";
        let b = parse_str(text, "f.jsonl", "t", &key()).expect("parse");
        assert_eq!(
            b.waves().expect("no cycle"),
            vec![vec![1, 3], vec![2], vec![0]]
        );
        assert_eq!(b.origins[2].to_string(), "f.jsonl:3 (id \"v2\")");
        let cycle = "{\"id\":\"a\",\"content\":\"x\",\"supersedes\":\"b\"}\n\
                     {\"id\":\"b\",\"content\":\"y\",\"supersedes\":\"a\"}\n";
        let b = parse_str(cycle, "g.jsonl", "t", &key()).expect("parse");
        let err = b.waves().expect_err("cycle");
        assert!(err.to_string().contains("g.jsonl:"), "{err}");
    }

    #[test]
    fn derived_ids_depend_on_the_deployment_secret() {
        let other = IdKey::new(b"another deployment's secret, 32+ bytes");
        let id = memory_id(&key(), "t1", "note-1");
        assert_ne!(id, memory_id(&other, "t1", "note-1"));
        assert_eq!(id, memory_id(&key(), "t1", "note-1"));
        // Not the old public derivation, and a v8 UUID.
        let v5 = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_URL, b"engram:t1:note-1");
        assert_ne!(id, v5.to_string());
        assert_eq!(
            uuid::Uuid::parse_str(&id).map(|u| u.get_version_num()).ok(),
            Some(8)
        );
        // UUIDs pass through untouched.
        let u = uuid::Uuid::new_v4().to_string();
        assert_eq!(memory_id(&key(), "t1", &u), u);
    }

    #[test]
    fn parses_memories_and_edges() {
        let b = parse_str(
            "{\"id\":\"a\",\"content\":\"x\",\"access_level\":\"internal\"}\n\n{\"edge\":{\"src\":\"a\",\"dst\":\"b\",\"type\":\"contradicts\"}}\n",
            "t.jsonl",
            "t1",
            &key(),
        )
        .expect("parse");
        assert_eq!(b.memories.len(), 1);
        assert_eq!(b.memories[0].id, memory_id(&key(), "t1", "a"));
        assert_ne!(memory_id(&key(), "t1", "a"), memory_id(&key(), "t2", "a"));
        assert_eq!(b.memories[0].access_level, AccessLevel::Internal as i32);
        assert_eq!(b.edges[0].dst_id, memory_id(&key(), "t1", "b"));
    }

    #[test]
    fn errors_name_file_and_line() {
        let err = parse_str(
            "{\"content\":\"ok\"}\n{\"content\": 3}\n",
            "f.jsonl",
            "t",
            &key(),
        )
        .expect_err("bad");
        assert!(format!("{err:#}").contains("f.jsonl:2"), "{err:#}");
        let err = parse_str("{nope\n", "g.jsonl", "t", &key()).expect_err("bad");
        assert!(format!("{err:#}").contains("g.jsonl:1"), "{err:#}");
    }
}
