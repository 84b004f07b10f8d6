//! What a graph costs in memory, estimated from its containers' capacities,
//! so graph-svc can keep the graphs it holds within a byte budget.
//!
//! An estimate, not an allocator count: a hash map is taken as its capacity
//! times (key + value + one control byte), a string as its capacity, and
//! allocator overhead is ignored. It is within tens of percent of the
//! resident size, which is what a budget needs.

use std::collections::HashMap;
use std::mem::size_of;

use super::{Dictionary, Graph, LevelCount, LevelTable, Scratch};

fn vec_bytes<T>(v: &Vec<T>) -> u64 {
    (v.capacity() * size_of::<T>()) as u64
}

fn strings_bytes(v: &Vec<String>) -> u64 {
    vec_bytes(v) + v.iter().map(|s| s.capacity() as u64).sum::<u64>()
}

fn map_bytes<K, V, S>(m: &HashMap<K, V, S>) -> u64 {
    (m.capacity() * (size_of::<K>() + size_of::<V>() + 1)) as u64
}

impl Dictionary {
    /// Names, display forms and the name index (whose keys are strings too).
    pub fn estimated_bytes(&self) -> u64 {
        strings_bytes(&self.names)
            + strings_bytes(&self.displays)
            + map_bytes(&self.index)
            + self.index.keys().map(|k| k.capacity() as u64).sum::<u64>()
            + vec_bytes(&self.synonym_keys)
            + self
                .synonym_keys
                .iter()
                .map(|k| k.as_ref().map_or(0, |k| k.len() as u64))
                .sum::<u64>()
    }
}

impl LevelTable {
    fn estimated_bytes(&self) -> u64 {
        size_of::<Self>() as u64
            + vec_bytes(&self.vdeg)
            + vec_bytes(&self.df)
            + vec_bytes(&self.has_home)
    }
}

impl LevelCount {
    fn estimated_bytes(&self) -> u64 {
        size_of::<Self>() as u64 + vec_bytes(&self.valid_to)
    }
}

impl Scratch {
    fn estimated_bytes(&self) -> u64 {
        vec_bytes(&self.bits) + vec_bytes(&self.slot) + vec_bytes(&self.touched)
    }
}

impl Graph {
    /// Bytes the graph holds once built: nodes, the CSR, per-level tables,
    /// strings and indexes. Fixed for the graph's life, so it is computed
    /// once when the graph is installed.
    pub fn estimated_bytes(&self) -> u64 {
        let csr = vec_bytes(&self.offsets)
            + vec_bytes(&self.targets)
            + vec_bytes(&self.weights)
            + vec_bytes(&self.gates)
            + vec_bytes(&self.kinds)
            + vec_bytes(&self.wdeg);
        let nodes = vec_bytes(&self.memory_ids)
            + map_bytes(&self.memory_index)
            + vec_bytes(&self.attrs)
            + vec_bytes(&self.levels)
            + vec_bytes(&self.mention_df)
            + vec_bytes(&self.has_home);
        let tables = self.level_tables.iter().map(LevelTable::estimated_bytes);
        let counts = self.counts.iter().map(LevelCount::estimated_bytes);
        size_of::<Self>() as u64
            + csr
            + nodes
            + strings_bytes(&self.namespaces)
            + strings_bytes(&self.edge_types)
            + self.dict.estimated_bytes()
            + tables.chain(counts).sum::<u64>()
    }

    /// Bytes of the walk scratch maps pooled now: they grow with the number
    /// of concurrent walks (each about 4 bytes per node), so they are read
    /// when the budget is checked rather than fixed at install.
    pub fn scratch_bytes(&self) -> u64 {
        self.scratch
            .lock()
            .iter()
            .map(Scratch::estimated_bytes)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use uuid::Uuid;

    use super::*;
    use crate::graph::{GraphBuilder, NodeBudget, PprParams};

    fn graph(memories: u128, entities: usize) -> Graph {
        let mut dict = Dictionary::default();
        for e in 0..entities {
            dict.add(&format!("entity number {e}"));
        }
        let mut b = GraphBuilder::new(Arc::new(dict), 5.0);
        for i in 0..memories {
            let m = b.add_memory(Uuid::from_u128(i + 1), "default", 1, None, false);
            b.add_mention(m, (i as usize % entities) as u32, i == 0);
            b.add_mention(m, ((i as usize + 1) % entities) as u32, false);
        }
        b.build()
    }

    #[test]
    fn the_estimate_counts_nodes_edges_and_strings() {
        let (m, e) = (1000u64, 100u64);
        let g = graph(m as u128, e as usize);
        let bytes = g.estimated_bytes();
        // At least: a uuid and its index entry per memory, both CSR
        // directions of each mention edge (target, weight, gate, kind),
        // and every entity name twice (normalised and display).
        let edges = 2 * m;
        let floor = m * (16 + 16 + 4) + 2 * edges * (4 + 4 + 4 + 2) + e * 2 * 15;
        assert!(bytes >= floor, "{bytes} < {floor}");
        // And not wildly more: under 1 KB per node for this small graph.
        assert!(bytes < (m + e) * 1024, "{bytes} too large");
    }

    #[test]
    fn the_estimate_grows_with_the_graph() {
        let small = graph(100, 10).estimated_bytes();
        let large = graph(10_000, 1000).estimated_bytes();
        assert!(large > 50 * small, "small {small}, large {large}");
    }

    #[test]
    fn walks_add_scratch_that_is_counted_apart() {
        let g = graph(1000, 100);
        assert_eq!(g.scratch_bytes(), 0);
        let params = PprParams {
            damping: 0.5,
            max_iter: 10,
            tol: 1e-6,
            max_nodes: 100,
            max_hops: 2,
            k: 5,
            budget: NodeBudget::AllNodes,
            deadline_opt: None,
        };
        let view = g.view(1, None, false);
        g.ppr(&[(g.entity_node(0), 1.0)], &view, &params);
        // One walk's map: about 4 bytes per node.
        assert!(g.scratch_bytes() >= 4 * 1100, "{}", g.scratch_bytes());
    }
}
