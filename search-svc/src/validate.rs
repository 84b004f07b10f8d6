//! Request validation at the boundary: every proto message is destructured
//! whole into a checked domain type, so handlers never see unchecked input and
//! a bad field is reported by name (`memories[3].content: ...`).

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use engram_common::AccessLevel;
use engram_common::convert::{struct_to_json, ts_to_chrono};
use engram_common::text::{MAX_NAMESPACE_CHARS, check_struct_text, check_text, check_timestamp};
use engram_proto as pb;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::turns::Turn;

use crate::error::{Error, Result};

pub const EMBEDDING_DIM: usize = 384;
pub const MAX_BATCH: usize = 1000;
pub const MAX_CONTENT_BYTES: usize = 64 * 1024;
pub const MAX_QUERY_CHARS: usize = 4096;
pub const MAX_K: u32 = 200;
const MAX_TITLE_BYTES: usize = 4096;
const MAX_SOURCE_BYTES: usize = 4096;
const MAX_ENTITIES: usize = 256;
const MAX_NAME_BYTES: usize = 512;
const MAX_METADATA_BYTES: usize = 16 * 1024;
const MAX_EMBED_TEXTS: usize = 256;
const MAX_FEEDBACK: usize = 1000;

/// One memory to write, checked.
#[derive(Debug, Clone)]
pub struct NewMemory {
    pub id: Uuid,
    pub namespace: String,
    pub memory_type: String,
    pub content: String,
    pub title: String,
    pub access_level: AccessLevel,
    pub source_confidence: f32,
    pub event_time_opt: Option<DateTime<Utc>>,
    pub valid_from_opt: Option<DateTime<Utc>>,
    pub valid_to_opt: Option<DateTime<Utc>>,
    pub supersedes_opt: Option<Uuid>,
    pub consolidated: bool,
    pub metadata: serde_json::Value,
    pub source: String,
    pub entities: Vec<String>,
    pub triples: Vec<(String, String, String)>,
    pub embedding_opt: Option<Vec<f32>>,
    /// Set for a conversation turn (crate::turns).
    pub turn_opt: Option<Turn>,
    /// sha256 of the text that is embedded, so an unchanged memory is never re-embedded.
    pub content_hash: Vec<u8>,
}

impl NewMemory {
    /// The text the embedding is computed from: title and body, like the
    /// reference dense baseline (`title + "\n" + text`).
    /// A turn embeds as said ("speaker: text").
    pub fn embedding_text(&self) -> String {
        match &self.turn_opt {
            Some(t) => embedding_text(&self.title, &t.said(&self.content)),
            None => embedding_text(&self.title, &self.content),
        }
    }
}

pub fn embedding_text(title: &str, content: &str) -> String {
    if title.is_empty() {
        content.to_string()
    } else {
        format!("{title}\n{content}")
    }
}

pub fn content_hash(title: &str, content: &str) -> Vec<u8> {
    let mut h = Sha256::new();
    h.update(title.as_bytes());
    h.update([0u8]);
    h.update(content.as_bytes());
    h.finalize().to_vec()
}

/// A page size: `default` when unset, else within 1..=`max`.
pub fn page_size(page_size_opt: Option<u32>, default: u32, max: u32) -> Result<u32> {
    let page_size = page_size_opt.unwrap_or(default);
    if !(1..=max).contains(&page_size) {
        return Err(Error::invalid("page_size", format!("must be in 1..={max}")));
    }
    Ok(page_size)
}

pub fn parse_uuid(field: &str, s: &str) -> Result<Uuid> {
    Uuid::parse_str(s).map_err(|_| Error::invalid(field, "must be a UUID"))
}

fn timestamp(field: &str, ts_opt: Option<prost_types::Timestamp>) -> Result<Option<DateTime<Utc>>> {
    match ts_opt {
        None => Ok(None),
        Some(ts) => {
            check_timestamp(&ts).map_err(|rule| Error::invalid(field, rule))?;
            ts_to_chrono(&ts)
                .map(Some)
                .ok_or_else(|| Error::invalid(field, "is not a valid timestamp"))
        }
    }
}

pub fn check_label(field: &str, s: &str) -> Result<()> {
    let ok = !s.is_empty()
        && s.len() <= 32
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(field, "must match [a-z0-9_]{1,32}"))
    }
}

pub fn check_embedding(field: &str, v: &[f32]) -> Result<()> {
    if v.len() != EMBEDDING_DIM {
        return Err(Error::invalid(
            field,
            format!("must have {EMBEDDING_DIM} values, got {}", v.len()),
        ));
    }
    if v.iter().any(|x| !x.is_finite()) {
        return Err(Error::invalid(field, "must contain only finite numbers"));
    }
    if v.iter().all(|x| *x == 0.0) {
        return Err(Error::invalid(field, "must not be all zeros"));
    }
    // The dense indexes hold half-precision copies (migration 0010): a
    // larger value fails the index expression in Postgres, and a vector
    // whose values all round to zero there drops out of the index.
    let largest = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    if largest > HALF_MAX {
        return Err(Error::invalid(
            field,
            format!("values must be within ±{HALF_MAX} (half precision)"),
        ));
    }
    if largest < HALF_MIN_LARGEST {
        return Err(Error::invalid(
            field,
            format!(
                "its largest value must be at least {HALF_MIN_LARGEST} in magnitude (half precision)"
            ),
        ));
    }
    Ok(())
}

/// The largest finite half-precision value.
const HALF_MAX: f32 = 65504.0;
/// Below ~3e-8 a value rounds to zero in half precision; a vector needs
/// one value well above that to keep its direction in the index.
const HALF_MIN_LARGEST: f32 = 1e-6;

fn check_unit(field: &str, v: f32) -> Result<()> {
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(Error::invalid(field, "must be in 0..=1"))
    }
}

/// No control characters (engram_common::text): Postgres refuses NUL, and
/// a refused write must be the caller's error, not a database failure.
fn check_plain(field: &str, s: &str) -> Result<()> {
    check_text(s).map_err(|rule| Error::invalid(field, rule))
}

fn check_name(field: &str, s: &str) -> Result<()> {
    check_plain(field, s)?;
    if s.trim().is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if s.len() > MAX_NAME_BYTES {
        return Err(Error::invalid(
            field,
            format!("must be at most {MAX_NAME_BYTES} bytes"),
        ));
    }
    Ok(())
}

fn metadata_json(field: &str, s_opt: Option<prost_types::Struct>) -> Result<serde_json::Value> {
    if let Some(s) = &s_opt {
        check_struct_text(s).map_err(|rule| Error::invalid(field, rule))?;
    }
    let v = s_opt
        .map(|s| struct_to_json(&s))
        .unwrap_or_else(|| serde_json::Value::Object(Default::default()));
    if v.to_string().len() > MAX_METADATA_BYTES {
        return Err(Error::invalid(
            field,
            format!("must be at most {MAX_METADATA_BYTES} bytes as JSON"),
        ));
    }
    Ok(v)
}

impl NewMemory {
    pub fn from_proto(m: pb::Memory, idx: usize) -> Result<Self> {
        let f = |name: &str| format!("memories[{idx}].{name}");
        let pb::Memory {
            id,
            namespace,
            agent_id: _,
            memory_type,
            content,
            title,
            access_level,
            source_confidence,
            decay_score: _,
            event_time,
            ingestion_time: _,
            valid_from,
            valid_to,
            recorded_at: _,
            retracted_at: _,
            version: _,
            supersedes,
            consolidated,
            metadata,
            source,
            entities,
            triples,
            embedding,
            tenant_id: _,
            turn,
            history: _,
        } = m;
        let id = if id.is_empty() {
            Uuid::new_v4()
        } else {
            parse_uuid(&f("id"), &id)?
        };
        let namespace = if namespace.is_empty() {
            "default".to_string()
        } else {
            namespace
        };
        check_plain(&f("namespace"), &namespace)?;
        if namespace.chars().count() > MAX_NAMESPACE_CHARS {
            return Err(Error::invalid(
                f("namespace"),
                format!("must be at most {MAX_NAMESPACE_CHARS} characters"),
            ));
        }
        let memory_type = if memory_type.is_empty() {
            "episodic".to_string()
        } else {
            memory_type
        };
        check_label(&f("memory_type"), &memory_type)?;
        check_plain(&f("content"), &content)?;
        check_plain(&f("title"), &title)?;
        check_plain(&f("source"), &source)?;
        if content.trim().is_empty() {
            return Err(Error::invalid(f("content"), "must not be empty"));
        }
        if content.len() > MAX_CONTENT_BYTES {
            return Err(Error::invalid(
                f("content"),
                format!("must be at most {MAX_CONTENT_BYTES} bytes"),
            ));
        }
        if title.len() > MAX_TITLE_BYTES {
            return Err(Error::invalid(
                f("title"),
                format!("must be at most {MAX_TITLE_BYTES} bytes"),
            ));
        }
        let access_level = AccessLevel::from_proto(access_level)
            .ok_or_else(|| Error::invalid(f("access_level"), "unknown access level"))?;
        let source_confidence = source_confidence.unwrap_or(1.0);
        check_unit(&f("source_confidence"), source_confidence)?;
        let event_time_opt = timestamp(&f("event_time"), event_time)?;
        let valid_from_opt = timestamp(&f("valid_from"), valid_from)?;
        let valid_to_opt = timestamp(&f("valid_to"), valid_to)?;
        if let (Some(to), Some(from)) = (valid_to_opt, valid_from_opt.or(event_time_opt))
            && to <= from
        {
            return Err(Error::invalid(f("valid_to"), "must be after valid_from"));
        }
        let supersedes_opt = if supersedes.is_empty() {
            None
        } else {
            let s = parse_uuid(&f("supersedes"), &supersedes)?;
            if s == id {
                return Err(Error::invalid(
                    f("supersedes"),
                    "must not be the memory itself",
                ));
            }
            Some(s)
        };
        let metadata = metadata_json(&f("metadata"), metadata)?;
        if source.len() > MAX_SOURCE_BYTES {
            return Err(Error::invalid(
                f("source"),
                format!("must be at most {MAX_SOURCE_BYTES} bytes"),
            ));
        }
        if entities.len() > MAX_ENTITIES {
            return Err(Error::invalid(
                f("entities"),
                format!("must have at most {MAX_ENTITIES} items"),
            ));
        }
        for (i, e) in entities.iter().enumerate() {
            check_name(&f(&format!("entities[{i}]")), e)?;
        }
        if triples.len() > MAX_ENTITIES {
            return Err(Error::invalid(
                f("triples"),
                format!("must have at most {MAX_ENTITIES} items"),
            ));
        }
        let mut checked_triples = Vec::with_capacity(triples.len());
        for (i, t) in triples.into_iter().enumerate() {
            let pb::Triple {
                subject,
                relation,
                object,
            } = t;
            check_name(&f(&format!("triples[{i}].subject")), &subject)?;
            check_name(&f(&format!("triples[{i}].relation")), &relation)?;
            check_name(&f(&format!("triples[{i}].object")), &object)?;
            checked_triples.push((subject, relation, object));
        }
        let embedding_opt = if embedding.is_empty() {
            None
        } else {
            check_embedding(&f("embedding"), &embedding)?;
            Some(embedding)
        };
        let turn_opt = turn.map(|t| Turn::from_proto(&f("turn"), t)).transpose()?;
        // A turn's hash covers its speaker: the embedded text changes with it.
        let content_hash = match &turn_opt {
            Some(t) => content_hash(&title, &t.said(&content)),
            None => content_hash(&title, &content),
        };
        Ok(Self {
            id,
            namespace,
            memory_type,
            content,
            title,
            access_level,
            source_confidence,
            event_time_opt,
            valid_from_opt,
            valid_to_opt,
            supersedes_opt,
            consolidated,
            metadata,
            source,
            entities,
            triples: checked_triples,
            embedding_opt,
            turn_opt,
            content_hash,
        })
    }
}

/// A checked upsert batch: 1..=1000 memories with distinct ids.
#[derive(Debug)]
pub struct UpsertBatch(pub Vec<NewMemory>);

impl TryFrom<pb::UpsertRequest> for UpsertBatch {
    type Error = Error;

    fn try_from(r: pb::UpsertRequest) -> Result<Self> {
        let pb::UpsertRequest { memories } = r;
        if memories.is_empty() {
            return Err(Error::invalid("memories", "must not be empty"));
        }
        if memories.len() > MAX_BATCH {
            return Err(Error::invalid(
                "memories",
                format!("must have at most {MAX_BATCH} items"),
            ));
        }
        let mut out = Vec::with_capacity(memories.len());
        let mut seen = std::collections::HashSet::new();
        for (i, m) in memories.into_iter().enumerate() {
            let m = NewMemory::from_proto(m, i)?;
            if !seen.insert(m.id) {
                return Err(Error::invalid(
                    format!("memories[{i}].id"),
                    "appears more than once in the batch",
                ));
            }
            out.push(m);
        }
        Ok(Self(out))
    }
}

fn id_list(field: &str, ids: Vec<String>) -> Result<Vec<Uuid>> {
    if ids.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if ids.len() > MAX_BATCH {
        return Err(Error::invalid(
            field,
            format!("must have at most {MAX_BATCH} items"),
        ));
    }
    let mut out: Vec<Uuid> = ids
        .iter()
        .enumerate()
        .map(|(i, s)| parse_uuid(&format!("{field}[{i}]"), s))
        .collect::<Result<_>>()?;
    out.sort();
    out.dedup();
    Ok(out)
}

/// Ids to delete, checked, sorted and deduplicated.
#[derive(Debug)]
pub struct DeleteIds(pub Vec<Uuid>);

impl TryFrom<pb::DeleteRequest> for DeleteIds {
    type Error = Error;
    fn try_from(r: pb::DeleteRequest) -> Result<Self> {
        let pb::DeleteRequest { ids } = r;
        Ok(Self(id_list("ids", ids)?))
    }
}

#[derive(Debug)]
pub struct GetQuery {
    pub ids: Vec<Uuid>,
    pub include_embedding: bool,
    pub omit_entities: bool,
    pub vectors_only: bool,
    pub include_history: bool,
    pub as_of_ingestion_opt: Option<DateTime<Utc>>,
}

impl TryFrom<pb::GetRequest> for GetQuery {
    type Error = Error;
    fn try_from(r: pb::GetRequest) -> Result<Self> {
        let pb::GetRequest {
            ids,
            include_embedding,
            omit_entities,
            vectors_only,
            include_history,
            as_of_ingestion,
        } = r;
        Ok(Self {
            ids: id_list("ids", ids)?,
            include_embedding,
            omit_entities,
            vectors_only,
            include_history,
            as_of_ingestion_opt: timestamp("as_of_ingestion", as_of_ingestion)?,
        })
    }
}

#[derive(Debug, Clone)]
pub struct NewEdge {
    pub src: Uuid,
    pub dst: Uuid,
    pub edge_type: String,
    pub weight: f32,
}

#[derive(Debug)]
pub struct EdgeBatch(pub Vec<NewEdge>);

impl TryFrom<pb::AddEdgesRequest> for EdgeBatch {
    type Error = Error;
    fn try_from(r: pb::AddEdgesRequest) -> Result<Self> {
        let pb::AddEdgesRequest { edges } = r;
        check_edge_count(edges.len())?;
        let mut out = Vec::with_capacity(edges.len());
        for (i, e) in edges.into_iter().enumerate() {
            let pb::Edge {
                src_id,
                dst_id,
                edge_type,
                weight,
            } = e;
            let src = parse_uuid(&format!("edges[{i}].src_id"), &src_id)?;
            let dst = parse_uuid(&format!("edges[{i}].dst_id"), &dst_id)?;
            if src == dst {
                return Err(Error::invalid(
                    format!("edges[{i}].dst_id"),
                    "must differ from src_id",
                ));
            }
            check_label(&format!("edges[{i}].edge_type"), &edge_type)?;
            let weight = if weight == 0.0 { 1.0 } else { weight };
            if !weight.is_finite() || weight <= 0.0 {
                return Err(Error::invalid(
                    format!("edges[{i}].weight"),
                    "must be a finite number > 0",
                ));
            }
            out.push(NewEdge {
                src,
                dst,
                edge_type,
                weight,
            });
        }
        Ok(Self(out))
    }
}

/// AddEdges and DeleteEdges name 1..=MAX_BATCH edges.
fn check_edge_count(n: usize) -> Result<()> {
    if n == 0 {
        return Err(Error::invalid("edges", "must not be empty"));
    }
    if n > MAX_BATCH {
        return Err(Error::invalid(
            "edges",
            format!("must have at most {MAX_BATCH} items"),
        ));
    }
    Ok(())
}

/// The edges a DeleteEdges names, checked and deduplicated in (src, dst,
/// type) order: the order concurrent deletes lock them in.
#[derive(Debug)]
pub struct EdgeKeys(pub Vec<(Uuid, Uuid, String)>);

impl TryFrom<pb::DeleteEdgesRequest> for EdgeKeys {
    type Error = Error;
    fn try_from(r: pb::DeleteEdgesRequest) -> Result<Self> {
        let pb::DeleteEdgesRequest { edges } = r;
        check_edge_count(edges.len())?;
        let mut out = BTreeSet::new();
        for (i, e) in edges.into_iter().enumerate() {
            let pb::EdgeKey {
                src_id,
                dst_id,
                edge_type,
            } = e;
            let src = parse_uuid(&format!("edges[{i}].src_id"), &src_id)?;
            let dst = parse_uuid(&format!("edges[{i}].dst_id"), &dst_id)?;
            let field = format!("edges[{i}].edge_type");
            check_label(&field, &edge_type)?;
            if edge_type == "supersedes" {
                return Err(Error::invalid(
                    field,
                    "a supersedes edge follows the memory's supersedes field and is not deleted alone",
                ));
            }
            out.insert((src, dst, edge_type));
        }
        Ok(Self(out.into_iter().collect()))
    }
}

/// Filters shared by dense and keyword search, checked.
#[derive(Debug, Clone, Default)]
pub struct SearchFilters {
    pub memory_types: Vec<String>,
    pub time_start_opt: Option<DateTime<Utc>>,
    pub time_end_opt: Option<DateTime<Utc>>,
    pub agent_scope: Vec<String>,
    pub namespace_opt: Option<String>,
    pub include_consolidated: bool,
    pub include_historical: bool,
    pub min_confidence: f32,
    pub as_of_event_opt: Option<DateTime<Utc>>,
    pub as_of_ingestion_opt: Option<DateTime<Utc>>,
    pub metadata_opt: Option<serde_json::Value>,
    pub decay_floor_opt: Option<f32>,
}

impl SearchFilters {
    pub fn from_proto(field: &str, f_opt: Option<pb::Filters>) -> Result<Self> {
        let Some(f) = f_opt else {
            return Ok(Self::default());
        };
        let pb::Filters {
            memory_types,
            time_range,
            agent_scope,
            namespace,
            include_consolidated,
            include_historical,
            min_confidence,
            as_of_event,
            as_of_ingestion,
            metadata,
            decay_floor,
        } = f;
        let n = |name: &str| format!("{field}.{name}");
        if memory_types.len() > 64 {
            return Err(Error::invalid(
                n("memory_types"),
                "must have at most 64 items",
            ));
        }
        for (i, t) in memory_types.iter().enumerate() {
            check_label(&n(&format!("memory_types[{i}]")), t)?;
        }
        let (time_start_opt, time_end_opt) = match time_range {
            None => (None, None),
            Some(pb::TimeRange { start, end }) => {
                let s = timestamp(&n("time_range.start"), start)?;
                let e = timestamp(&n("time_range.end"), end)?;
                if let (Some(s), Some(e)) = (s, e)
                    && e <= s
                {
                    return Err(Error::invalid(
                        n("time_range.end"),
                        "must be after time_range.start",
                    ));
                }
                (s, e)
            }
        };
        if agent_scope.len() > 256 {
            return Err(Error::invalid(
                n("agent_scope"),
                "must have at most 256 items",
            ));
        }
        check_plain(&n("namespace"), &namespace)?;
        for (i, a) in agent_scope.iter().enumerate() {
            check_plain(&n(&format!("agent_scope[{i}]")), a)?;
        }
        if namespace.chars().count() > MAX_NAMESPACE_CHARS {
            return Err(Error::invalid(
                n("namespace"),
                format!("must be at most {MAX_NAMESPACE_CHARS} characters"),
            ));
        }
        if !min_confidence.is_finite() || !(0.0..=1.0).contains(&min_confidence) {
            return Err(Error::invalid(n("min_confidence"), "must be in 0..=1"));
        }
        if !decay_floor.is_finite() || !(0.0..=1.0).contains(&decay_floor) {
            return Err(Error::invalid(n("decay_floor"), "must be in 0..=1"));
        }
        let metadata_opt = match metadata {
            Some(s) if !s.fields.is_empty() => Some(metadata_json(&n("metadata"), Some(s))?),
            _ => None,
        };
        Ok(Self {
            memory_types,
            time_start_opt,
            time_end_opt,
            agent_scope,
            namespace_opt: (!namespace.is_empty()).then_some(namespace),
            include_consolidated,
            include_historical,
            min_confidence,
            as_of_event_opt: timestamp(&n("as_of_event"), as_of_event)?,
            as_of_ingestion_opt: timestamp(&n("as_of_ingestion"), as_of_ingestion)?,
            metadata_opt,
            decay_floor_opt: (decay_floor > 0.0).then_some(decay_floor),
        })
    }
}

fn check_k(k: u32) -> Result<u32> {
    if (1..=MAX_K).contains(&k) {
        Ok(k)
    } else {
        Err(Error::invalid("k", format!("must be in 1..={MAX_K}")))
    }
}

fn check_query_text(text: &str) -> Result<()> {
    check_plain("text", text)?;
    if text.chars().count() > MAX_QUERY_CHARS {
        return Err(Error::invalid(
            "text",
            format!("must be at most {MAX_QUERY_CHARS} characters"),
        ));
    }
    Ok(())
}

#[derive(Debug, Clone)]
pub struct VectorQuery {
    pub text: String,
    pub embedding_opt: Option<Vec<f32>>,
    pub filters: SearchFilters,
    pub k: u32,
    /// Sentences to return beside the hits (0 = none).
    pub fact_k: u32,
}

/// Most sentences one vector search returns as facts.
pub const MAX_FACT_K: u32 = 50;

impl TryFrom<pb::VectorSearchRequest> for VectorQuery {
    type Error = Error;
    fn try_from(r: pb::VectorSearchRequest) -> Result<Self> {
        let pb::VectorSearchRequest {
            text,
            embedding,
            filters,
            k,
            fact_k,
        } = r;
        check_query_text(&text)?;
        if fact_k > MAX_FACT_K {
            return Err(Error::invalid(
                "fact_k",
                format!("must be at most {MAX_FACT_K}"),
            ));
        }
        let embedding_opt = if embedding.is_empty() {
            if text.trim().is_empty() {
                return Err(Error::invalid(
                    "text",
                    "must not be empty when embedding is empty",
                ));
            }
            None
        } else {
            check_embedding("embedding", &embedding)?;
            Some(embedding)
        };
        Ok(Self {
            text,
            embedding_opt,
            filters: SearchFilters::from_proto("filters", filters)?,
            k: check_k(k)?,
            fact_k,
        })
    }
}

#[derive(Debug, Clone)]
pub struct KeywordQuery {
    pub text: String,
    pub filters: SearchFilters,
    pub k: u32,
}

impl TryFrom<pb::KeywordSearchRequest> for KeywordQuery {
    type Error = Error;
    fn try_from(r: pb::KeywordSearchRequest) -> Result<Self> {
        let pb::KeywordSearchRequest { text, filters, k } = r;
        check_query_text(&text)?;
        if text.trim().is_empty() {
            return Err(Error::invalid("text", "must not be empty"));
        }
        Ok(Self {
            text,
            filters: SearchFilters::from_proto("filters", filters)?,
            k: check_k(k)?,
        })
    }
}

#[derive(Debug)]
pub struct EmbedTexts(pub Vec<String>);

impl TryFrom<pb::EmbedRequest> for EmbedTexts {
    type Error = Error;
    fn try_from(r: pb::EmbedRequest) -> Result<Self> {
        let pb::EmbedRequest { texts } = r;
        if texts.is_empty() {
            return Err(Error::invalid("texts", "must not be empty"));
        }
        if texts.len() > MAX_EMBED_TEXTS {
            return Err(Error::invalid(
                "texts",
                format!("must have at most {MAX_EMBED_TEXTS} items"),
            ));
        }
        for (i, t) in texts.iter().enumerate() {
            check_plain(&format!("texts[{i}]"), t)?;
            if t.len() > MAX_CONTENT_BYTES {
                return Err(Error::invalid(
                    format!("texts[{i}]"),
                    format!("must be at most {MAX_CONTENT_BYTES} bytes"),
                ));
            }
        }
        Ok(Self(texts))
    }
}

#[derive(Debug)]
pub struct FeedbackItem {
    pub query_id: String,
    pub memory_id: Uuid,
    pub signal: String,
    pub value: bool,
}

/// A Stage 4 training example (migrations/0003_ranker_examples.sql).
#[derive(Debug)]
pub struct RankExample {
    pub query_id: String,
    pub memory_id: Uuid,
    pub features: Vec<f32>,
    pub relevant: bool,
}

/// Features per example: the gateway computes 13; room to grow, no room
/// for a payload.
const MAX_RANK_FEATURES: usize = 64;

#[derive(Debug)]
pub struct FeedbackBatch(pub Vec<FeedbackItem>, pub Vec<RankExample>);

fn rank_example(i: usize, e: pb::RankExample) -> Result<RankExample> {
    let pb::RankExample {
        query_id,
        memory_id,
        features,
        relevant,
    } = e;
    check_plain(&format!("examples[{i}].query_id"), &query_id)?;
    if query_id.is_empty() || query_id.len() > 128 {
        return Err(Error::invalid(
            format!("examples[{i}].query_id"),
            "must be 1..=128 bytes",
        ));
    }
    let memory_id = parse_uuid(&format!("examples[{i}].memory_id"), &memory_id)?;
    if features.is_empty() || features.len() > MAX_RANK_FEATURES {
        return Err(Error::invalid(
            format!("examples[{i}].features"),
            format!("must hold 1..={MAX_RANK_FEATURES} values"),
        ));
    }
    if features.iter().any(|x| !x.is_finite()) {
        return Err(Error::invalid(
            format!("examples[{i}].features"),
            "must be finite numbers",
        ));
    }
    Ok(RankExample {
        query_id,
        memory_id,
        features,
        relevant,
    })
}

impl TryFrom<pb::StoreFeedbackRequest> for FeedbackBatch {
    type Error = Error;
    fn try_from(r: pb::StoreFeedbackRequest) -> Result<Self> {
        let pb::StoreFeedbackRequest { items, examples } = r;
        if examples.len() > MAX_FEEDBACK {
            return Err(Error::invalid(
                "examples",
                format!("must have at most {MAX_FEEDBACK} items"),
            ));
        }
        let examples = (examples.into_iter().enumerate())
            .map(|(i, e)| rank_example(i, e))
            .collect::<Result<Vec<_>>>()?;
        if items.is_empty() {
            return Err(Error::invalid("items", "must not be empty"));
        }
        if items.len() > MAX_FEEDBACK {
            return Err(Error::invalid(
                "items",
                format!("must have at most {MAX_FEEDBACK} items"),
            ));
        }
        let mut out = Vec::with_capacity(items.len());
        for (i, it) in items.into_iter().enumerate() {
            let pb::StoredFeedback {
                query_id,
                memory_id,
                signal,
                value,
            } = it;
            check_plain(&format!("items[{i}].query_id"), &query_id)?;
            if query_id.is_empty() || query_id.len() > 128 {
                return Err(Error::invalid(
                    format!("items[{i}].query_id"),
                    "must be 1..=128 bytes",
                ));
            }
            let memory_id = parse_uuid(&format!("items[{i}].memory_id"), &memory_id)?;
            check_label(&format!("items[{i}].signal"), &signal)?;
            out.push(FeedbackItem {
                query_id,
                memory_id,
                signal,
                value,
            });
        }
        Ok(Self(out, examples))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(content: &str) -> pb::Memory {
        pb::Memory {
            content: content.into(),
            ..Default::default()
        }
    }

    #[test]
    fn embeddings_outside_half_precision_are_refused_by_name() {
        let mut v = vec![0.05f32; EMBEDDING_DIM];
        assert!(check_embedding("embedding", &v).is_ok());
        v[7] = 70_000.0;
        let big = check_embedding("embedding", &v).expect_err("too large");
        assert_eq!(
            big.to_string(),
            "embedding: values must be within ±65504 (half precision)"
        );
        let tiny = vec![1e-9f32; EMBEDDING_DIM];
        let small = check_embedding("query_embedding", &tiny).expect_err("rounds to zero");
        assert!(
            small
                .to_string()
                .starts_with("query_embedding: its largest value")
        );
    }

    #[test]
    fn a_batch_over_the_maximum_names_memories_and_the_max() {
        let req = pb::UpsertRequest {
            memories: vec![mem("a"); MAX_BATCH + 1],
        };
        let err = UpsertBatch::try_from(req).expect_err("too many");
        assert!(matches!(err, Error::InvalidArgument(_)));
        assert_eq!(err.to_string(), "memories: must have at most 1000 items");
    }

    #[test]
    fn oversized_content_names_the_field() {
        let big = "x".repeat(MAX_CONTENT_BYTES + 1);
        let req = pb::UpsertRequest {
            memories: vec![mem("a"), mem("b"), mem("c"), mem(&big)],
        };
        let err = UpsertBatch::try_from(req).expect_err("too big");
        assert_eq!(
            err.to_string(),
            "memories[3].content: must be at most 65536 bytes"
        );
    }

    #[test]
    fn bad_fields_are_named() {
        let cases: Vec<(pb::Memory, &str)> = vec![
            (
                pb::Memory {
                    id: "nope".into(),
                    ..mem("a")
                },
                "memories[0].id",
            ),
            (
                pb::Memory {
                    memory_type: "Bad-Type".into(),
                    ..mem("a")
                },
                "memories[0].memory_type",
            ),
            (
                pb::Memory {
                    source_confidence: Some(1.5),
                    ..mem("a")
                },
                "memories[0].source_confidence",
            ),
            (
                pb::Memory {
                    embedding: vec![0.5; 3],
                    ..mem("a")
                },
                "memories[0].embedding",
            ),
            (mem(""), "memories[0].content"),
            (mem("nul \0 byte"), "memories[0].content"),
            (
                pb::Memory {
                    namespace: "ns\u{1b}".into(),
                    ..mem("a")
                },
                "memories[0].namespace",
            ),
            (
                pb::Memory {
                    event_time: Some(prost_types::Timestamp {
                        seconds: -1_000_000_000_000,
                        nanos: 0,
                    }),
                    ..mem("a")
                },
                "memories[0].event_time",
            ),
        ];
        for (m, field) in cases {
            let err =
                UpsertBatch::try_from(pb::UpsertRequest { memories: vec![m] }).expect_err(field);
            assert!(err.to_string().starts_with(field), "{err}");
        }
    }
}
