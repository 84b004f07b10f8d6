//! One tenant's memory graph, immutable once built (swapped whole on change)
//! and the walks over it.
//!
//! Nodes are memories (`0..M`) then entities (`M..M+E`); edges live in one
//! CSR with both directions stored. Every edge carries a *gate*: the memory
//! whose visibility it depends on (the triple's source memory for
//! entity–entity facts), so a caller never walks through what they may not
//! see. Memories the caller may not see are treated as absent: they get no
//! mass and are left out of their neighbours' degree.

use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use engram_common::entities::{self, for_each_ngram, normalize, strip_parentheticals};
use uuid::Uuid;

/// Gate value of edges visible whenever both endpoints are.
pub const NO_GATE: u32 = u32::MAX;
const KIND_MENTION: u16 = 0;
const KIND_HOME: u16 = 1;
const KIND_TRIPLE: u16 = 2;
const KIND_SYNONYM: u16 = 3;
/// Typed memory–memory edges: `KIND_TYPED + index into edge_types`.
const KIND_TYPED: u16 = 4;

/// Tenant-visible attributes of a memory, checked on every walk.
#[derive(Debug, Clone, Copy)]
pub struct MemoryAttrs {
    pub access_level: i16,
    pub namespace: u32,
    /// Unix seconds; a memory is historical from then on.
    pub valid_to_opt: Option<i64>,
    pub retracted: bool,
}

/// Who is looking: resolved once per request against one graph.
#[derive(Debug, Clone)]
pub struct View {
    trust: i16,
    /// None = every namespace; Some(None) = a namespace this graph lacks.
    namespace_opt: Option<Option<u32>>,
    include_historical: bool,
    now: i64,
    /// The caller sees every memory: degrees need no recount.
    sees_all: bool,
    /// Visibility is by access level alone (every namespace, nothing
    /// historical to hide): index of the [`LevelTable`] to read.
    level_opt: Option<usize>,
}

/// The tenant's entity names, fixed before memories are matched.
#[derive(Debug, Default, Clone)]
pub struct Dictionary {
    pub names: Vec<String>,
    pub displays: Vec<String>,
    /// Hashed with foldhash (seeded per map): a load looks up every word
    /// n-gram of every memory here, ~4 s of SipHash at 100K memories.
    pub index: HashMap<String, u32, foldhash::fast::RandomState>,
    /// Names with diacritics by their folded form
    /// (`entities::fold_diacritics`), the first such name winning: a query
    /// typed without them ("Tekeze River") still links the entity
    /// ("Tekezé River"). Only names that fold to something else are here.
    pub folded: HashMap<String, u32, foldhash::fast::RandomState>,
    /// Per entity, its synonym key (`entities::synonym_key` of its display)
    /// where that is not its name, `Some("")` where it has none (empty or
    /// stopwords only). Kept because every build groups synonyms over all
    /// names: computed at each build it was ~0.6 s of a 1.5 s layout at
    /// 100K memories (519K names), most of an in-place rebuild.
    synonym_keys: Vec<Option<Box<str>>>,
}

impl Dictionary {
    /// Adds a name (normalised here); stopword-only names are refused
    /// because they would link everything to everything.
    pub fn add(&mut self, display: &str) -> Option<u32> {
        self.add_normalized(normalize(display), display)
    }

    /// Adds an already normalised name (the `entities.name` column).
    pub fn add_normalized(&mut self, name: String, display: &str) -> Option<u32> {
        if name.is_empty() || entities::is_stopword_only(&name) {
            return None;
        }
        if let Some(&i) = self.index.get(&name) {
            return Some(i);
        }
        let i = u32::try_from(self.names.len()).ok()?;
        let key = entities::synonym_key(display);
        self.synonym_keys
            .push(if key.is_empty() || entities::is_stopword_only(&key) {
                Some("".into())
            } else if key == name {
                None
            } else {
                Some(key.into_boxed_str())
            });
        if let std::borrow::Cow::Owned(plain) = entities::fold_diacritics(&name) {
            self.folded.entry(plain).or_insert(i);
        }
        self.index.insert(name.clone(), i);
        self.names.push(name);
        self.displays.push(display.to_string());
        Some(i)
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The entity a query's normalised n-gram names: as written, else
    /// with diacritics folded on either side (the query's, the names').
    pub fn lookup(&self, gram: &str) -> Option<u32> {
        if let Some(&e) = self.index.get(gram) {
            return Some(e);
        }
        let plain = entities::fold_diacritics(gram);
        // A gram that folds to itself (any plain ASCII one) missed `index`
        // already; only the names' folded forms are left to try.
        let folded_hit = match &plain {
            std::borrow::Cow::Owned(p) => self.index.get(p.as_str()),
            std::borrow::Cow::Borrowed(_) => None,
        };
        (folded_hit.or_else(|| self.folded.get(plain.as_ref()))).copied()
    }

    /// Entity `e`'s synonym key; None when it has none.
    fn synonym_key(&self, e: usize) -> Option<&str> {
        match self.synonym_keys[e].as_deref() {
            None => Some(self.names[e].as_str()),
            Some("") => None,
            Some(key) => Some(key),
        }
    }

    /// Entities mentioned in a memory: every dictionary name occurring as a
    /// word n-gram (n ≤ 6) of title + content; the title's name is home.
    pub fn match_text(&self, title: &str, content: &str) -> Vec<(u32, bool)> {
        let home_opt = self
            .index
            .get(&normalize(&strip_parentheticals(title)))
            .copied();
        let text = normalize(&format!("{title} {content}"));
        let mut found: Vec<u32> = Vec::new();
        for_each_ngram(&text, entities::MEMORY_MAX_NGRAM, |g| {
            if let Some(&e) = self.index.get(g) {
                found.push(e);
            }
        });
        if let Some(h) = home_opt {
            found.push(h);
        }
        found.sort_unstable();
        found.dedup();
        found
            .into_iter()
            .map(|e| (e, Some(e) == home_opt))
            .collect()
    }
}

/// Collects rows, then lays out the CSR in [`GraphBuilder::build`].
pub struct GraphBuilder {
    dict: Arc<Dictionary>,
    home_weight: f32,
    memory_ids: Vec<Uuid>,
    memory_index: HashMap<Uuid, u32>,
    attrs: Vec<MemoryAttrs>,
    namespaces: Vec<String>,
    namespace_index: HashMap<String, u32>,
    mentions: Vec<(u32, u32, bool)>,
    triples: Vec<(u32, u32, u32)>,
    typed: Vec<(u32, u32, u16, f32)>,
    edge_types: Vec<String>,
}

impl GraphBuilder {
    pub fn new(dict: Arc<Dictionary>, home_weight: f32) -> Self {
        Self {
            dict,
            home_weight,
            memory_ids: Vec::new(),
            memory_index: HashMap::new(),
            attrs: Vec::new(),
            namespaces: Vec::new(),
            namespace_index: HashMap::new(),
            mentions: Vec::new(),
            triples: Vec::new(),
            typed: Vec::new(),
            edge_types: Vec::new(),
        }
    }

    pub fn dictionary(&self) -> &Arc<Dictionary> {
        &self.dict
    }

    /// Adds a memory (ids are unique; a repeat returns the first index).
    pub fn add_memory(
        &mut self,
        id: Uuid,
        namespace: &str,
        access_level: i16,
        valid_to_opt: Option<i64>,
        retracted: bool,
    ) -> u32 {
        if let Some(&i) = self.memory_index.get(&id) {
            return i;
        }
        let ns = match self.namespace_index.get(namespace) {
            Some(&n) => n,
            None => {
                let n = self.namespaces.len() as u32;
                self.namespaces.push(namespace.to_string());
                self.namespace_index.insert(namespace.to_string(), n);
                n
            }
        };
        let i = self.memory_ids.len() as u32;
        self.memory_ids.push(id);
        self.memory_index.insert(id, i);
        self.attrs.push(MemoryAttrs {
            access_level,
            namespace: ns,
            valid_to_opt,
            retracted,
        });
        i
    }

    pub fn memory(&self, id: &Uuid) -> Option<u32> {
        self.memory_index.get(id).copied()
    }

    pub fn add_mention(&mut self, memory: u32, entity: u32, is_home: bool) {
        self.mentions.push((memory, entity, is_home));
    }

    /// An entity–entity fact, visible only to callers who see `memory`.
    pub fn add_triple(&mut self, memory: u32, subject: u32, object: u32) {
        if subject != object {
            self.triples.push((subject, object, memory));
        }
    }

    pub fn add_typed_edge(&mut self, src: u32, dst: u32, edge_type: &str, weight: f32) {
        let t = match self.edge_types.iter().position(|t| t == edge_type) {
            Some(t) => t,
            None => {
                self.edge_types.push(edge_type.to_string());
                self.edge_types.len() - 1
            }
        };
        let w = if weight.is_finite() && weight > 0.0 {
            weight
        } else {
            1.0
        };
        if src != dst {
            self.typed.push((src, dst, t as u16, w));
        }
    }

    pub fn build(mut self) -> Graph {
        let m = self.memory_ids.len();
        let n_ent = self.dict.len();
        let n = m + n_ent;
        let ent = |e: u32| (m as u32) + e;
        // (a, b, weight, gate, kind), one per undirected edge.
        let mut und: Vec<(u32, u32, f32, u32, u16)> = Vec::new();
        self.mentions.sort_unstable();
        let mut last: Option<(u32, u32)> = None;
        for &(mem, e, home) in &self.mentions {
            if last == Some((mem, e)) {
                if home && let Some(edge) = und.last_mut() {
                    edge.2 = self.home_weight;
                    edge.4 = KIND_HOME;
                }
                continue;
            }
            last = Some((mem, e));
            let (w, kind) = if home {
                (self.home_weight, KIND_HOME)
            } else {
                (1.0, KIND_MENTION)
            };
            und.push((mem, ent(e), w, NO_GATE, kind));
        }
        // Mentions are sorted by memory; a later home flag may precede its
        // plain twin in the list only when both were added, handled above.
        for &(s, o, mem) in &self.triples {
            und.push((ent(s), ent(o), 1.0, mem, KIND_TRIPLE));
        }
        let dict = self.dict.clone();
        let mut by_key: HashMap<&str, u32> = HashMap::with_capacity(dict.len());
        for e in 0..dict.len() {
            let Some(key) = dict.synonym_key(e) else {
                continue;
            };
            match by_key.get(key) {
                Some(&first) if first != e as u32 => {
                    und.push((ent(first), ent(e as u32), 1.0, NO_GATE, KIND_SYNONYM));
                }
                Some(_) => {}
                None => {
                    // The plain name itself is the group's anchor when present.
                    let anchor = dict.index.get(key).copied().unwrap_or(e as u32);
                    by_key.insert(key, anchor);
                    if anchor != e as u32 {
                        und.push((ent(anchor), ent(e as u32), 1.0, NO_GATE, KIND_SYNONYM));
                    }
                }
            }
        }
        for &(a, b, t, w) in &self.typed {
            und.push((a, b, w, NO_GATE, KIND_TYPED + t));
        }
        let mut degree = vec![0usize; n + 1];
        for &(a, b, ..) in &und {
            degree[a as usize] += 1;
            degree[b as usize] += 1;
        }
        let mut offsets = vec![0usize; n + 1];
        for i in 0..n {
            offsets[i + 1] = offsets[i] + degree[i];
        }
        let total = offsets[n];
        let mut adj: Vec<(u32, f32, u32, u16)> = vec![(0, 0.0, NO_GATE, 0); total];
        let mut fill = offsets.clone();
        for &(a, b, w, g, k) in &und {
            adj[fill[a as usize]] = (b, w, g, k);
            fill[a as usize] += 1;
            adj[fill[b as usize]] = (a, w, g, k);
            fill[b as usize] += 1;
        }
        let mut wdeg = vec![0f32; n];
        for u in 0..n {
            let row = &mut adj[offsets[u]..offsets[u + 1]];
            // Parallel edges in a key both directions share, so an edge and
            // its twin sit at the same position among them (the walk relies
            // on it when it reads a hub's edges from its neighbours' rows).
            row.sort_unstable_by_key(|x| (x.0, x.3, x.2, x.1.to_bits()));
            wdeg[u] = row.iter().map(|x| x.1).sum();
        }
        let max_access = self.attrs.iter().map(|a| a.access_level).max().unwrap_or(1);
        let any_historical = self
            .attrs
            .iter()
            .any(|a| a.retracted || a.valid_to_opt.is_some());
        let mut mention_df = vec![0u32; n_ent];
        let mut has_home = vec![false; n_ent];
        for (e, (df, home)) in mention_df.iter_mut().zip(&mut has_home).enumerate() {
            let u = m + e;
            for k in &adj[offsets[u]..offsets[u + 1]] {
                if k.3 == KIND_MENTION || k.3 == KIND_HOME {
                    *df += 1;
                    *home |= k.3 == KIND_HOME;
                }
            }
        }
        let mut by_level: HashMap<(u32, i16), LevelCount> = HashMap::new();
        for a in &self.attrs {
            let c = by_level
                .entry((a.namespace, a.access_level))
                .or_insert_with(|| LevelCount {
                    namespace: a.namespace,
                    access_level: a.access_level,
                    all: 0,
                    current: 0,
                    valid_to: Vec::new(),
                });
            c.all += 1;
            if !a.retracted {
                match a.valid_to_opt {
                    None => c.current += 1,
                    Some(t) => c.valid_to.push(t),
                }
            }
        }
        let mut counts: Vec<LevelCount> = by_level.into_values().collect();
        counts.sort_by_key(|c| (c.namespace, c.access_level));
        for c in &mut counts {
            c.valid_to.sort_unstable();
        }
        let levels: Vec<i16> = self.attrs.iter().map(|a| a.access_level).collect();
        let mut distinct: Vec<i16> = levels.clone();
        distinct.sort_unstable();
        distinct.dedup();
        distinct.retain(|&l| l < max_access);
        if distinct.len() > MAX_LEVEL_TABLES {
            // Not the schema's 1..=4: restricted callers rescan rows.
            distinct.clear();
        }
        let level_tables: Vec<LevelTable> = distinct
            .iter()
            .copied()
            .map(|level| {
                let sees = |x: u32| x == NO_GATE || x as usize >= m || levels[x as usize] <= level;
                let vis = |k: &(u32, f32, u32, u16)| sees(k.2) && sees(k.0);
                let vdeg = (0..n)
                    .map(|u| {
                        adj[offsets[u]..offsets[u + 1]]
                            .iter()
                            .filter(|k| vis(k))
                            .map(|k| f64::from(k.1))
                            .sum()
                    })
                    .collect();
                let mut df = vec![0u32; n_ent];
                let mut has_home = vec![false; n_ent];
                for (e, (df, home)) in df.iter_mut().zip(&mut has_home).enumerate() {
                    let u = m + e;
                    for k in &adj[offsets[u]..offsets[u + 1]] {
                        if (k.3 == KIND_MENTION || k.3 == KIND_HOME) && vis(k) {
                            *df += 1;
                            *home |= k.3 == KIND_HOME;
                        }
                    }
                }
                LevelTable {
                    level,
                    vdeg,
                    df,
                    has_home,
                }
            })
            .collect();
        Graph {
            memory_ids: self.memory_ids,
            memory_index: self.memory_index,
            attrs: self.attrs,
            namespaces: self.namespaces,
            dict: self.dict,
            offsets,
            targets: adj.iter().map(|x| x.0).collect(),
            weights: adj.iter().map(|x| x.1).collect(),
            gates: adj.iter().map(|x| x.2).collect(),
            kinds: adj.iter().map(|x| x.3).collect(),
            wdeg,
            edge_types: self.edge_types,
            undirected_edges: und.len(),
            max_access,
            any_historical,
            mention_df,
            has_home,
            counts,
            levels,
            level_tables,
            scratch: parking_lot::Mutex::new(Vec::new()),
        }
    }
}

/// An immutable per-tenant graph; see the module doc.
pub struct Graph {
    memory_ids: Vec<Uuid>,
    memory_index: HashMap<Uuid, u32>,
    attrs: Vec<MemoryAttrs>,
    namespaces: Vec<String>,
    dict: Arc<Dictionary>,
    offsets: Vec<usize>,
    targets: Vec<u32>,
    weights: Vec<f32>,
    gates: Vec<u32>,
    kinds: Vec<u16>,
    wdeg: Vec<f32>,
    edge_types: Vec<String>,
    undirected_edges: usize,
    max_access: i16,
    any_historical: bool,
    /// Per entity: memories mentioning it and whether one is its home, for
    /// callers who see everything (linking a hub is then O(1)).
    mention_df: Vec<u32>,
    has_home: Vec<bool>,
    /// Memory counts by (namespace, access level), so the visible count
    /// (`PprResponse.memory_count`) never walks every memory.
    counts: Vec<LevelCount>,
    /// Access level per memory (compact, for level-only views).
    levels: Vec<i16>,
    /// One per access level below the highest (a few at most).
    level_tables: Vec<LevelTable>,
    /// Node-indexed scratch maps, one per concurrent walk, reused so a walk
    /// allocates nothing of graph size and never hashes.
    scratch: parking_lot::Mutex<Vec<Scratch>>,
}

/// What a caller who sees exactly the memories of level ≤ `level` sees,
/// precomputed so restricted walks never rescan a hub's row.
#[derive(Debug, Clone)]
struct LevelTable {
    level: i16,
    /// Visible weighted degree per node, summed as the walk would.
    vdeg: Vec<f64>,
    /// Per entity: visible mentions, and whether one is a home mention.
    df: Vec<u32>,
    has_home: Vec<bool>,
}

/// Memories of one (namespace, access level).
#[derive(Debug, Clone)]
struct LevelCount {
    namespace: u32,
    access_level: i16,
    all: usize,
    /// Neither retracted nor with an end of validity.
    current: usize,
    /// Ends of validity (sorted) of the unretracted memories that have one.
    valid_to: Vec<i64>,
}

/// Graph node → local index of the current walk. A bitmap says which nodes
/// are touched (27 KB at 200K nodes: it stays in L1, and most lookups of a
/// row scan are misses it answers); only touched nodes read `slot`. Both
/// are cleared through the touched list, so reuse costs O(touched).
#[derive(Default)]
struct Scratch {
    bits: Vec<u64>,
    slot: Vec<u32>,
    touched: Vec<u32>,
    walk: Walk,
}

/// A walk's per-local-node state and work lists, kept with its
/// [`Scratch`] so the next walk reuses their capacity: allocating and
/// growing them was ~3 % of the engram process's CPU samples under load
/// (docs/benchmarks.md, "Half-precision HNSW").
#[derive(Default)]
struct Walk {
    nodes: Vec<u32>,
    hop: Vec<u8>,
    resid: Vec<f64>,
    /// The degree the caller sees, read when a node is admitted.
    vdeg: Vec<f64>,
    /// Whether the node has pushed (a seed always pushes once).
    pushed: Vec<bool>,
    seed_mass: Vec<f64>,
    heap: BinaryHeap<(Pri, u32)>,
    /// (neighbour, first edge, end of its edges) of a push's new neighbours.
    new_runs: Vec<(u32, u32, u32)>,
    solve: Solve,
}

/// [`Graph::solve_local`]'s local transition matrix and iterates.
#[derive(Default)]
struct Solve {
    hub_slot: Vec<u32>,
    small_off: Vec<usize>,
    small: Vec<(u32, f64)>,
    from_hubs: Vec<(u32, u32, f64)>,
    off: Vec<usize>,
    to: Vec<u32>,
    prob: Vec<f64>,
    x: Vec<f64>,
    next: Vec<f64>,
}

/// Entries a kept walk buffer may hold on to: one walk over a hub can
/// grow the heap to millions, and 16 kept scratches must not keep that.
const KEEP_CAPACITY: usize = 1 << 16;

impl Walk {
    /// Empties every buffer for the next walk; one grown past
    /// [`KEEP_CAPACITY`] by an unusual walk is given back.
    fn clear(&mut self) {
        if self.heap.capacity() > KEEP_CAPACITY {
            self.heap = BinaryHeap::new();
        }
        let s = &mut self.solve;
        if [
            s.small.capacity(),
            s.from_hubs.capacity(),
            s.to.capacity(),
            s.prob.capacity(),
        ]
        .iter()
        .any(|&c| c > KEEP_CAPACITY)
        {
            self.solve = Solve::default();
        }
        self.nodes.clear();
        self.hop.clear();
        self.resid.clear();
        self.vdeg.clear();
        self.pushed.clear();
        self.seed_mass.clear();
        self.heap.clear();
        self.new_runs.clear();
    }
}

/// A walk's view of a [`Scratch`]: the touched set's node → local index.
struct LocalIndex {
    scratch: Scratch,
}

impl LocalIndex {
    fn new(mut scratch: Scratch, nodes: usize) -> Self {
        if scratch.slot.len() != nodes {
            scratch.bits = vec![0; nodes.div_ceil(64)];
            scratch.slot = vec![0; nodes];
            scratch.touched.clear();
        }
        Self { scratch }
    }

    #[inline]
    fn get(&self, v: u32) -> Option<u32> {
        let v = v as usize;
        (self.scratch.bits[v >> 6] & (1u64 << (v & 63)) != 0).then(|| self.scratch.slot[v])
    }

    #[inline]
    fn insert(&mut self, v: u32, li: u32) {
        let i = v as usize;
        self.scratch.bits[i >> 6] |= 1u64 << (i & 63);
        self.scratch.slot[i] = li;
        self.scratch.touched.push(v);
    }

    /// Empties the map for the next walk.
    fn finish(mut self) -> Scratch {
        for &v in &self.scratch.touched {
            self.scratch.bits[v as usize >> 6] = 0;
        }
        self.scratch.touched.clear();
        self.scratch
    }
}

/// A memory an entity walk found, with the entities that sent it most mass.
#[derive(Debug, Clone)]
pub struct Hit {
    pub memory: u32,
    pub score: f64,
    pub via_entities: Vec<u32>,
}

#[derive(Debug, Clone, Default)]
pub struct PprOutcome {
    pub hits: Vec<Hit>,
    pub nodes_touched: usize,
    /// Memory nodes among the touched ones.
    pub memories_touched: usize,
    pub deadline_hit: bool,
}

/// What [`PprParams::max_nodes`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeBudget {
    /// Memories and entities both count.
    AllNodes,
    /// Only memories count; entities are capped at `ENTITY_FACTOR ×` the
    /// budget so cost stays bounded.
    MemoryNodes,
}

const ENTITY_FACTOR: usize = 20;
/// Access levels below the highest that get precomputed degrees.
const MAX_LEVEL_TABLES: usize = 4;
/// Scratch maps kept per graph: more concurrent walks allocate their own.
const MAX_SCRATCH: usize = 16;

#[derive(Debug, Clone)]
pub struct PprParams {
    pub damping: f64,
    pub max_iter: u32,
    pub tol: f64,
    pub max_nodes: usize,
    pub max_hops: u8,
    pub k: usize,
    pub budget: NodeBudget,
    pub deadline_opt: Option<Instant>,
}

#[derive(Debug, Clone)]
pub struct LinkedEntity {
    pub entity: u32,
    pub name: String,
    pub df: u32,
    pub has_home: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NeighborHit {
    pub memory: u32,
    pub depth: u32,
    pub via: String,
}

/// Orders f64 priorities in the push heap (NaN never enters).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Pri(f64);
impl Eq for Pri {}
impl PartialOrd for Pri {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pri {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

impl Graph {
    /// Whether any typed edge of `edge_type` went into this graph (at any
    /// trust level; a self-loop counts, so false means surely none).
    pub fn has_edge_type(&self, edge_type: &str) -> bool {
        self.edge_types.iter().any(|t| t == edge_type)
    }

    pub fn memory_count(&self) -> usize {
        self.memory_ids.len()
    }

    pub fn entity_count(&self) -> usize {
        self.dict.len()
    }

    pub fn edge_count(&self) -> usize {
        self.undirected_edges
    }

    /// Number of stored edges at node `n` (both directions), for diagnostics.
    pub fn degree(&self, n: u32) -> usize {
        self.edges(n).len()
    }

    pub fn memory_id(&self, m: u32) -> Uuid {
        self.memory_ids[m as usize]
    }

    pub fn memory(&self, id: &Uuid) -> Option<u32> {
        self.memory_index.get(id).copied()
    }

    pub fn entity_name(&self, e: u32) -> &str {
        &self.dict.names[e as usize]
    }

    pub fn entity(&self, name: &str) -> Option<u32> {
        self.dict.index.get(name).copied()
    }

    /// Node index of entity `e`.
    pub fn entity_node(&self, e: u32) -> u32 {
        self.memory_ids.len() as u32 + e
    }

    fn is_memory_node(&self, n: u32) -> bool {
        (n as usize) < self.memory_ids.len()
    }

    fn edges(&self, n: u32) -> std::ops::Range<usize> {
        self.offsets[n as usize]..self.offsets[n as usize + 1]
    }

    pub fn view(&self, trust: i16, namespace_opt: Option<&str>, include_historical: bool) -> View {
        let namespace_opt = namespace_opt.map(|ns| {
            self.namespaces
                .iter()
                .position(|n| n == ns)
                .map(|p| p as u32)
        });
        let sees_all = trust >= self.max_access
            && (include_historical || !self.any_historical)
            && match namespace_opt {
                None => true,
                Some(Some(_)) => self.namespaces.len() <= 1,
                Some(None) => self.memory_ids.is_empty(),
            };
        let level_only = (include_historical || !self.any_historical)
            && match namespace_opt {
                None => true,
                Some(Some(_)) => self.namespaces.len() <= 1,
                Some(None) => false,
            };
        // The highest level at or below trust decides what a level-only
        // caller sees (tables cover every level below the highest).
        let level_opt = (level_only && !sees_all)
            .then(|| self.level_tables.iter().rposition(|t| t.level <= trust))
            .flatten();
        View {
            trust,
            namespace_opt,
            include_historical,
            now: unix_now(),
            sees_all,
            level_opt,
        }
    }

    pub fn memory_visible(&self, m: u32, view: &View) -> bool {
        let Some(a) = self.attrs.get(m as usize) else {
            return false;
        };
        if a.access_level > view.trust {
            return false;
        }
        match view.namespace_opt {
            Some(Some(ns)) if ns != a.namespace => return false,
            Some(None) => return false,
            _ => {}
        }
        view.include_historical || (!a.retracted && a.valid_to_opt.is_none_or(|t| t > view.now))
    }

    fn node_visible(&self, n: u32, view: &View) -> bool {
        !self.is_memory_node(n) || view.sees_all || self.memory_visible(n, view)
    }

    #[inline]
    fn edge_visible(&self, e: usize, view: &View) -> bool {
        if view.sees_all {
            return true;
        }
        let g = self.gates[e];
        if view.level_opt.is_some() {
            let t = self.targets[e] as usize;
            return (g == NO_GATE || self.levels[g as usize] <= view.trust)
                && (t >= self.levels.len() || self.levels[t] <= view.trust);
        }
        (g == NO_GATE || self.memory_visible(g, view)) && self.node_visible(self.targets[e], view)
    }

    /// Weighted degree counting only what the caller sees.
    fn visible_degree(&self, n: u32, view: &View) -> f64 {
        if view.sees_all {
            return f64::from(self.wdeg[n as usize]);
        }
        if let Some(t) = view.level_opt {
            return self.level_tables[t].vdeg[n as usize];
        }
        self.edges(n)
            .filter(|&e| self.edge_visible(e, view))
            .map(|e| f64::from(self.weights[e]))
            .sum()
    }

    pub fn visible_memory_count(&self, view: &View) -> usize {
        if view.sees_all {
            return self.memory_ids.len();
        }
        let ns_ok = |ns: u32| match view.namespace_opt {
            None => true,
            Some(Some(want)) => want == ns,
            Some(None) => false,
        };
        self.counts
            .iter()
            .filter(|c| c.access_level <= view.trust && ns_ok(c.namespace))
            .map(|c| {
                if view.include_historical {
                    c.all
                } else {
                    // Valid while `valid_to > now`.
                    c.current + c.valid_to.len() - c.valid_to.partition_point(|&t| t <= view.now)
                }
            })
            .sum()
    }

    /// Entities named in `text`, with their document frequency among the
    /// memories the caller sees; entities only restricted memories mention
    /// are not linked (their existence would leak).
    pub fn link(&self, text: &str, view: &View) -> Vec<LinkedEntity> {
        let found = entities::link(text, entities::QUERY_MAX_NGRAM, |g| self.dict.lookup(g));
        let mut out = Vec::new();
        for (name, e) in found {
            let (df, has_home) = if view.sees_all {
                (self.mention_df[e as usize], self.has_home[e as usize])
            } else if let Some(t) = view.level_opt {
                let t = &self.level_tables[t];
                (t.df[e as usize], t.has_home[e as usize])
            } else {
                let mut df = 0u32;
                let mut has_home = false;
                for idx in self.edges(self.entity_node(e)) {
                    let k = self.kinds[idx];
                    if (k == KIND_MENTION || k == KIND_HOME) && self.edge_visible(idx, view) {
                        df += 1;
                        has_home |= k == KIND_HOME;
                    }
                }
                (df, has_home)
            };
            if df > 0 {
                out.push(LinkedEntity {
                    entity: e,
                    name,
                    df,
                    has_home,
                });
            }
        }
        out
    }

    /// Bounded personalised PageRank from `seeds` (node, weight).
    ///
    /// Two phases so cost follows the touched set, never the graph:
    /// 1. discovery: a best-first forward push (Andersen–Chung–Lang) from
    ///    the seeds picks the node set: nodes within `max_hops` of a seed,
    ///    admitted in order of the residual mass reaching them, until the
    ///    node budget is spent. Thresholds and priorities divide by the
    ///    degree the caller sees, never the full one: hidden edges must
    ///    not decide which nodes a walk touches. A push that would admit more new neighbours
    ///    than the budget has left (a hub) only feeds nodes already admitted;
    ///    a seed hub still admits its heaviest neighbours (home edges first)
    ///    within half the remaining budget. On 2Wiki dev, counting every
    ///    node against 1000 (`AllNodes`) keeps R@5 at 92.4 (300 nodes: 92.3),
    ///    so the service uses the strict semantics.
    /// 2. solve: power iteration of `x = (1-d)s + d Pᵀx` on the induced
    ///    subgraph (transition probabilities keep the caller-visible degree,
    ///    so mass leaving the set is lost, never redistributed), up to
    ///    `max_iter` or an L1 change below `tol`.
    ///
    /// When the budget and hops cover the component this is exact PPR.
    ///
    /// Cost follows the touched set: the touched map is a reused bitmap +
    /// slot array (no hashing, nothing of graph size allocated per call),
    /// a push reads its row once, the local system reads a hub's edges from
    /// its touched neighbours' rows instead of searching the hub's row for
    /// every touched node, and restricted callers read precomputed
    /// per-level degrees. `reference::ppr_reference` (tests) is the walk as
    /// first written; the property test `walk_equals_the_reference_walk`
    /// holds the two bit-for-bit equal.
    pub fn ppr(&self, seeds: &[(u32, f64)], view: &View, p: &PprParams) -> PprOutcome {
        let mut scratch = self.scratch.lock().pop().unwrap_or_default();
        let mut walk = std::mem::take(&mut scratch.walk);
        walk.clear();
        let mut local = LocalIndex::new(scratch, self.wdeg.len());
        let out = self.ppr_in(&mut local, &mut walk, seeds, view, p);
        let mut returned = local.finish();
        returned.walk = walk;
        let mut pool = self.scratch.lock();
        if pool.len() < MAX_SCRATCH {
            pool.push(returned);
        }
        out
    }

    fn ppr_in(
        &self,
        local: &mut LocalIndex,
        walk: &mut Walk,
        seeds: &[(u32, f64)],
        view: &View,
        p: &PprParams,
    ) -> PprOutcome {
        let Walk {
            nodes,
            hop,
            resid,
            vdeg,
            pushed,
            seed_mass,
            heap,
            new_runs,
            solve,
        } = walk;
        let mut mem_count = 0usize;
        let mut ent_count = 0usize;
        let mem_cap = p.max_nodes;
        let ent_cap = match p.budget {
            NodeBudget::AllNodes => p.max_nodes,
            NodeBudget::MemoryNodes => p.max_nodes.saturating_mul(ENTITY_FACTOR),
        };
        let fits = |mem_count: usize, ent_count: usize, add_m: usize, add_e: usize| match p.budget {
            NodeBudget::AllNodes => mem_count + ent_count + add_m + add_e <= p.max_nodes,
            NodeBudget::MemoryNodes => mem_count + add_m <= mem_cap && ent_count + add_e <= ent_cap,
        };
        // Seeds the view hides carry no mass, not even in the total: they
        // would scale every visible score, and so tell a caller that a
        // hidden memory id exists.
        let in_view =
            |s: &&(u32, f64)| self.node_visible(s.0, view) && (s.0 as usize) < self.wdeg.len();
        let total_seed: f64 = seeds.iter().filter(in_view).map(|s| s.1.max(0.0)).sum();
        if total_seed <= 0.0 {
            return PprOutcome::default();
        }
        let mut deadline_hit = false;
        for &(n, w) in seeds.iter().filter(in_view) {
            if w <= 0.0 {
                continue;
            }
            let li = match local.get(n) {
                Some(li) => li,
                None => {
                    let is_mem = self.is_memory_node(n);
                    if !fits(
                        mem_count,
                        ent_count,
                        usize::from(is_mem),
                        usize::from(!is_mem),
                    ) {
                        continue;
                    }
                    if is_mem {
                        mem_count += 1;
                    } else {
                        ent_count += 1;
                    }
                    let li = nodes.len() as u32;
                    local.insert(n, li);
                    nodes.push(n);
                    hop.push(0);
                    resid.push(0.0);
                    vdeg.push(self.visible_degree(n, view));
                    pushed.push(false);
                    seed_mass.push(0.0);
                    li
                }
            };
            resid[li as usize] += w / total_seed;
            seed_mass[li as usize] += w / total_seed;
        }
        if nodes.is_empty() {
            return PprOutcome::default();
        }
        let d = p.damping;
        let eps = p.tol.max(1e-12);
        for li in 0..nodes.len() {
            heap.push((Pri(f64::INFINITY), li as u32));
        }
        let max_pushes = (p.max_iter as usize).max(1) * p.max_nodes.max(1);
        let max_scans = 4_000_000usize;
        let (mut pushes, mut scans) = (0usize, 0usize);
        while let Some((_, li)) = heap.pop() {
            let u = nodes[li as usize];
            let r = resid[li as usize];
            // Thresholds on the degree the caller sees: the full degree
            // would let hidden edges decide which nodes a walk touches, and
            // so move visible scores.
            let seen_deg = vdeg[li as usize].max(1e-12);
            // Seeds always spread once, whatever their degree.
            let unspread_seed = hop[li as usize] == 0 && !pushed[li as usize];
            if r <= eps * seen_deg && !unspread_seed || r <= 0.0 {
                continue;
            }
            if pushes >= max_pushes || scans >= max_scans {
                break;
            }
            if pushes % 32 == 0 && p.deadline_opt.is_some_and(|dl| Instant::now() >= dl) {
                deadline_hit = true;
                break;
            }
            pushes += 1;
            pushed[li as usize] = true;
            let deg = vdeg[li as usize];
            resid[li as usize] = 0.0;
            if deg <= 0.0 {
                continue;
            }
            let spread = d * r;
            let range = self.edges(u);
            // Hidden edges count too: this bounds the work, not the walk.
            scans += range.len();
            let can_grow = hop[li as usize] < p.max_hops;
            // One pass: neighbours already touched take their share now;
            // new visible ones (runs of edges to one target, rows being
            // sorted by target) wait for the admission decision below.
            new_runs.clear();
            let mut e = range.start;
            while e < range.end {
                let v = self.targets[e];
                let mut run_end = e + 1;
                while run_end < range.end && self.targets[run_end] == v {
                    run_end += 1;
                }
                match local.get(v) {
                    Some(lv) => self.spread_run(
                        e..run_end,
                        lv,
                        (spread, deg),
                        eps,
                        view,
                        (resid, vdeg),
                        heap,
                    ),
                    None if can_grow && (e..run_end).any(|x| self.edge_visible(x, view)) => {
                        new_runs.push((v, e as u32, run_end as u32));
                    }
                    None => {}
                }
                e = run_end;
            }
            let mut add_m = new_runs.iter().filter(|r| self.is_memory_node(r.0)).count();
            let mut add_e = new_runs.len() - add_m;
            let mut admit = can_grow && fits(mem_count, ent_count, add_m, add_e);
            if can_grow && !admit && hop[li as usize] == 0 {
                // A seed hub: its heaviest neighbours still deserve a look,
                // within half of what the budget has left; ties by node, the
                // first visible edge to a neighbour carrying its weight (a
                // hidden parallel edge must not rank it).
                let left = match p.budget {
                    NodeBudget::AllNodes => p.max_nodes.saturating_sub(mem_count + ent_count),
                    NodeBudget::MemoryNodes => mem_cap
                        .saturating_sub(mem_count)
                        .min(ent_cap.saturating_sub(ent_count)),
                };
                let keep = (left / 2).min(new_runs.len());
                let w = |r: &(u32, u32, u32)| {
                    (r.1 as usize..r.2 as usize)
                        .find(|&e| self.edge_visible(e, view))
                        .map_or(0.0, |e| self.weights[e])
                };
                let order = |a: &(u32, u32, u32), b: &(u32, u32, u32)| {
                    w(b).total_cmp(&w(a)).then(a.0.cmp(&b.0))
                };
                if keep > 0 && keep < new_runs.len() {
                    new_runs.select_nth_unstable_by(keep - 1, order);
                }
                new_runs.truncate(keep);
                new_runs.sort_unstable_by(order);
                add_m = new_runs.iter().filter(|r| self.is_memory_node(r.0)).count();
                add_e = new_runs.len() - add_m;
                admit = !new_runs.is_empty();
            }
            if admit {
                for &(v, lo, hi) in new_runs.iter() {
                    let lv = nodes.len() as u32;
                    local.insert(v, lv);
                    nodes.push(v);
                    hop.push(hop[li as usize] + 1);
                    resid.push(0.0);
                    vdeg.push(self.visible_degree(v, view));
                    pushed.push(false);
                    seed_mass.push(0.0);
                    self.spread_run(
                        lo as usize..hi as usize,
                        lv,
                        (spread, deg),
                        eps,
                        view,
                        (resid, vdeg),
                        heap,
                    );
                }
                mem_count += add_m;
                ent_count += add_e;
            }
        }
        self.solve_local(
            nodes,
            local,
            vdeg,
            seed_mass,
            view,
            p,
            &mut deadline_hit,
            solve,
        );
        let x = &solve.x;
        let mut mems: Vec<(u32, f64)> = (0..nodes.len())
            .filter(|&li| self.is_memory_node(nodes[li]) && x[li] > 0.0)
            .map(|li| (li as u32, x[li]))
            .collect();
        mems.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        mems.truncate(p.k);
        let hits = mems
            .iter()
            .map(|&(li, score)| {
                let m = nodes[li as usize];
                let mut via: Vec<(u32, f64)> = Vec::new();
                for e in self.edges(m) {
                    let v = self.targets[e];
                    if self.is_memory_node(v) || !self.edge_visible(e, view) {
                        continue;
                    }
                    if let Some(lv) = local.get(v) {
                        let deg = vdeg[lv as usize];
                        if deg > 0.0 {
                            via.push((
                                v - self.memory_ids.len() as u32,
                                x[lv as usize] * f64::from(self.weights[e]) / deg,
                            ));
                        }
                    }
                }
                via.sort_by(|a, b| b.1.total_cmp(&a.1));
                via.dedup_by_key(|v| v.0);
                Hit {
                    memory: m,
                    score,
                    via_entities: via.into_iter().take(3).map(|v| v.0).collect(),
                }
            })
            .collect();
        PprOutcome {
            hits,
            nodes_touched: nodes.len(),
            memories_touched: mem_count,
            deadline_hit,
        }
    }

    /// Adds a push's share along the visible edges `run` (all to local node
    /// `lv`), queueing `lv` when its residual is worth a push.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn spread_run(
        &self,
        run: std::ops::Range<usize>,
        lv: u32,
        (spread, deg): (f64, f64),
        eps: f64,
        view: &View,
        (resid, vdeg): (&mut [f64], &[f64]),
        heap: &mut BinaryHeap<(Pri, u32)>,
    ) {
        for e in run {
            if !self.edge_visible(e, view) {
                continue;
            }
            resid[lv as usize] += spread * f64::from(self.weights[e]) / deg;
            let v_seen_deg = vdeg[lv as usize].max(1e-12);
            if resid[lv as usize] > eps * v_seen_deg {
                heap.push((Pri(resid[lv as usize] / v_seen_deg), lv));
            }
        }
    }

    /// The walk's scores on the touched nodes alone, by power iteration
    /// over their local transition matrix; left in `solve.x`.
    #[allow(clippy::too_many_arguments)]
    fn solve_local(
        &self,
        nodes: &[u32],
        local: &LocalIndex,
        vdeg: &[f64],
        seed: &[f64],
        view: &View,
        p: &PprParams,
        deadline_hit: &mut bool,
        solve: &mut Solve,
    ) {
        let Solve {
            hub_slot,
            small_off,
            small,
            from_hubs,
            off,
            to,
            prob,
            x,
            next,
        } = solve;
        let n = nodes.len();
        // Local CSR of transition probabilities u -> v, sources in local
        // order, each source's entries in the order of its row. Hub rows
        // (longer than 4n) are never scanned: every edge is stored in both
        // directions, so a hub's edges to other nodes come from those
        // nodes' scans (a twin has the same weight, gate and position among
        // parallel edges); hub-to-hub edges are looked up in the hub's row.
        hub_slot.clear();
        let mut hubs = 0u32;
        hub_slot.extend(nodes.iter().map(|&u| {
            if self.edges(u).len() > 4 * n {
                hubs += 1;
                hubs - 1
            } else {
                u32::MAX
            }
        }));
        small_off.clear();
        small_off.resize(n + 1, 0);
        small.clear();
        // (hub slot, target, probability), in scan order.
        from_hubs.clear();
        for (li, &u) in nodes.iter().enumerate() {
            if hub_slot[li] == u32::MAX {
                let deg = vdeg[li];
                for e in self.edges(u) {
                    let Some(lv) = local.get(self.targets[e]) else {
                        continue;
                    };
                    if !self.edge_visible(e, view) {
                        continue;
                    }
                    let w = f64::from(self.weights[e]);
                    if deg > 0.0 {
                        small.push((lv, w / deg));
                    }
                    let (hs, vd) = (hub_slot[lv as usize], vdeg[lv as usize]);
                    if hs != u32::MAX && vd > 0.0 {
                        from_hubs.push((hs, li as u32, w / vd));
                    }
                }
            } else if vdeg[li] > 0.0 {
                let range = self.edges(u);
                let row = &self.targets[range.clone()];
                for (lv, &v) in nodes.iter().enumerate() {
                    if hub_slot[lv] == u32::MAX {
                        continue;
                    }
                    let lo = row.partition_point(|&t| t < v);
                    for e in range.start + lo..range.end {
                        if self.targets[e] != v {
                            break;
                        }
                        if self.edge_visible(e, view) {
                            from_hubs.push((
                                hub_slot[li],
                                lv as u32,
                                f64::from(self.weights[e]) / vdeg[li],
                            ));
                        }
                    }
                }
            }
            small_off[li + 1] = small.len();
        }
        // Stable: parallel edges keep their row order.
        from_hubs.sort_by_key(|h| (h.0, h.1));
        off.clear();
        to.clear();
        prob.clear();
        off.push(0usize);
        let mut h = 0usize;
        for li in 0..n {
            if hub_slot[li] == u32::MAX {
                for &(lv, pr) in &small[small_off[li]..small_off[li + 1]] {
                    to.push(lv);
                    prob.push(pr);
                }
            } else {
                while h < from_hubs.len() && from_hubs[h].0 == hub_slot[li] {
                    to.push(from_hubs[h].1);
                    prob.push(from_hubs[h].2);
                    h += 1;
                }
            }
            off.push(to.len());
        }
        let d = p.damping;
        x.clear();
        x.extend_from_slice(seed);
        next.clear();
        next.resize(n, 0.0);
        for _ in 0..p.max_iter.max(1) {
            for (v, s) in next.iter_mut().zip(seed) {
                *v = (1.0 - d) * s;
            }
            for u in 0..n {
                let xu = x[u];
                if xu == 0.0 {
                    continue;
                }
                for e in off[u]..off[u + 1] {
                    next[to[e] as usize] += d * xu * prob[e];
                }
            }
            let delta: f64 = x.iter().zip(next.iter()).map(|(a, b)| (a - b).abs()).sum();
            std::mem::swap(x, next);
            if delta < p.tol {
                break;
            }
            if p.deadline_opt.is_some_and(|dl| Instant::now() >= dl) {
                *deadline_hit = true;
                break;
            }
        }
    }

    /// Breadth-first memories around `starts` over typed edges and shared
    /// entities (most specific entities first), at most `max_nodes` found.
    pub fn neighbors(
        &self,
        starts: &[u32],
        depth: u32,
        max_nodes: usize,
        types_opt: Option<&HashSet<String>>,
        view: &View,
    ) -> Vec<NeighborHit> {
        let allow = |t: &str| types_opt.is_none_or(|s| s.contains(t));
        let shared = allow("shared_entity");
        let mut seen: HashSet<u32> = starts.iter().copied().collect();
        let mut frontier: Vec<u32> = starts
            .iter()
            .copied()
            .filter(|&m| self.memory_visible(m, view))
            .collect();
        let mut out = Vec::new();
        let mut scans = 0usize;
        'outer: for level in 1..=depth {
            let mut next = Vec::new();
            for &m in &frontier {
                let mut ents: Vec<u32> = Vec::new();
                for e in self.edges(m) {
                    let v = self.targets[e];
                    let k = self.kinds[e];
                    if k >= KIND_TYPED {
                        let t = &self.edge_types[(k - KIND_TYPED) as usize];
                        if allow(t) && self.memory_visible(v, view) && seen.insert(v) {
                            out.push(NeighborHit {
                                memory: v,
                                depth: level,
                                via: t.clone(),
                            });
                            next.push(v);
                        }
                    } else if shared && !self.is_memory_node(v) {
                        ents.push(v);
                    }
                    if out.len() >= max_nodes {
                        break 'outer;
                    }
                }
                ents.sort_by_key(|&v| self.offsets[v as usize + 1] - self.offsets[v as usize]);
                for ent in ents {
                    let range = self.edges(ent);
                    scans += range.len();
                    for e in range {
                        let v = self.targets[e];
                        if self.is_memory_node(v)
                            && self.edge_visible(e, view)
                            && self.memory_visible(v, view)
                            && seen.insert(v)
                        {
                            out.push(NeighborHit {
                                memory: v,
                                depth: level,
                                via: format!(
                                    "shared_entity:{}",
                                    self.entity_name(ent - self.memory_ids.len() as u32)
                                ),
                            });
                            next.push(v);
                            if out.len() >= max_nodes {
                                break 'outer;
                            }
                        }
                    }
                    if scans > 1_000_000 {
                        break 'outer;
                    }
                }
            }
            frontier = next;
        }
        out
    }

    /// `contradicts` edges among `ids`, each pair once (input order).
    pub fn contradictions(&self, ids: &[u32], view: &View) -> Vec<(u32, u32, f32)> {
        let Some(t) = self.edge_types.iter().position(|t| t == "contradicts") else {
            return Vec::new();
        };
        let kind = KIND_TYPED + t as u16;
        let pos: HashMap<u32, usize> = ids.iter().enumerate().map(|(i, &m)| (m, i)).collect();
        let mut out = Vec::new();
        for (i, &m) in ids.iter().enumerate() {
            if !self.memory_visible(m, view) {
                continue;
            }
            for e in self.edges(m) {
                let v = self.targets[e];
                if self.kinds[e] == kind
                    && pos.get(&v).is_some_and(|&j| j > i)
                    && self.memory_visible(v, view)
                    && !out.iter().any(|&(a, b, _)| a == m && b == v)
                {
                    out.push((m, v, self.weights[e]));
                }
            }
        }
        out
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod reference;
mod size;
#[cfg(test)]
mod tests;
