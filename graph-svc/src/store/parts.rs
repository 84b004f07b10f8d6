//! What a tenant's graph is built from, kept beside the graph it built.
//!
//! A full load reads every memory's text from Postgres and matches it
//! against the entity dictionary: at 100K memories that is ~6–8 s of the
//! ~8–9 s a rebuild took, against ~1.5 s for laying out the graph. Keeping
//! the matched rows lets a change re-read only the memories it names (and,
//! for a new entity name, the memories whose text may hold it; see
//! [`super::delta`]), then lay the graph out again from these parts. Full
//! loads and applied changes both build through [`Parts::build`], so the two
//! paths cannot drift apart in how a graph is made from rows.

use std::collections::{BTreeMap, HashMap};
use std::mem::size_of;
use std::sync::Arc;

use uuid::Uuid;

use crate::graph::{Dictionary, Graph, GraphBuilder};

/// One memory as the graph sees it.
#[derive(Debug, Clone)]
pub struct MemoryRow {
    pub namespace: String,
    pub access_level: i16,
    pub valid_to_opt: Option<i64>,
    pub retracted: bool,
    /// Dictionary names its title and content hold (`Dictionary::match_text`).
    pub text_mentions: Vec<(u32, bool)>,
    /// Mentions the write path stored (`memory_entities`).
    pub stored_mentions: Vec<(u32, bool)>,
    /// Caller-given facts (`triples`): (subject, object) entities.
    pub triples: Vec<(u32, u32)>,
}

/// A typed memory–memory edge (`edges`); kept even while an end is not
/// (yet) among the memories, exactly as a full load would drop it.
#[derive(Debug, Clone)]
pub struct TypedEdge {
    pub src: Uuid,
    pub dst: Uuid,
    pub edge_type: String,
    pub weight: f32,
}

/// Every row a tenant's graph is built from.
#[derive(Debug, Clone, Default)]
pub struct Parts {
    pub dict: Arc<Dictionary>,
    /// `entities.id` → dictionary index, for stored mentions and triples.
    pub by_db: HashMap<i64, u32>,
    /// Entity rows read (the dictionary refuses some) and their largest id:
    /// what a change's new rows are counted against.
    pub entity_rows: usize,
    pub max_entity_id: i64,
    /// In id order, the order a full load reads them in.
    pub memories: BTreeMap<Uuid, MemoryRow>,
    pub edges: Vec<TypedEdge>,
}

impl Parts {
    /// Lays the graph out from the parts.
    pub fn build(&self, home_weight: f32) -> Graph {
        let mut b = GraphBuilder::new(self.dict.clone(), home_weight);
        for (id, row) in &self.memories {
            let m = b.add_memory(
                *id,
                &row.namespace,
                row.access_level,
                row.valid_to_opt,
                row.retracted,
            );
            for &(e, home) in row.text_mentions.iter().chain(&row.stored_mentions) {
                b.add_mention(m, e, home);
            }
            for &(s, o) in &row.triples {
                b.add_triple(m, s, o);
            }
        }
        for edge in &self.edges {
            if let (Some(a), Some(c)) = (b.memory(&edge.src), b.memory(&edge.dst)) {
                b.add_typed_edge(a, c, &edge.edge_type, edge.weight);
            }
        }
        b.build()
    }

    /// Heap bytes beyond the dictionary (which the graph shares and counts).
    pub fn estimated_bytes(&self) -> u64 {
        let per_memory = size_of::<Uuid>() + size_of::<MemoryRow>() + 32;
        let rows: usize = self
            .memories
            .values()
            .map(|r| {
                per_memory
                    + r.namespace.capacity()
                    + (r.text_mentions.capacity() + r.stored_mentions.capacity())
                        * size_of::<(u32, bool)>()
                    + r.triples.capacity() * size_of::<(u32, u32)>()
            })
            .sum();
        let edges: usize = self
            .edges
            .iter()
            .map(|e| size_of::<TypedEdge>() + e.edge_type.capacity())
            .sum();
        (rows + edges + self.by_db.capacity() * (size_of::<(i64, u32)>() + 8)) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(text: Vec<(u32, bool)>) -> MemoryRow {
        MemoryRow {
            namespace: "default".into(),
            access_level: 1,
            valid_to_opt: None,
            retracted: false,
            text_mentions: text,
            stored_mentions: Vec::new(),
            triples: Vec::new(),
        }
    }

    #[test]
    fn a_build_keeps_id_order_and_drops_edges_to_absent_memories() {
        let mut dict = Dictionary::default();
        dict.add("alpha");
        let mut parts = Parts {
            dict: Arc::new(dict),
            ..Parts::default()
        };
        let (a, b, absent) = (Uuid::from_u128(2), Uuid::from_u128(1), Uuid::from_u128(9));
        parts.memories.insert(a, row(vec![(0, true)]));
        parts.memories.insert(b, row(vec![(0, false)]));
        for (src, dst) in [(a, b), (a, absent)] {
            parts.edges.push(TypedEdge {
                src,
                dst,
                edge_type: "related".into(),
                weight: 1.0,
            });
        }
        let g = parts.build(5.0);
        assert_eq!(g.memory_id(0), b, "memories are laid out in id order");
        assert_eq!(g.memory_count(), 2);
        // alpha–a, alpha–b and a–b.
        assert_eq!(g.edge_count(), 3);
    }
}
