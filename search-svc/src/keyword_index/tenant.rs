//! One tenant's keyword index: a tantivy index in memory over every row of
//! the tenant (what its `tsv` holds as one field, the access level and the
//! row's ordinal as fast fields), built from Postgres and then changed in
//! place: [`TenantIndex::updater`] deletes changed memories' documents and
//! adds their new versions as one more segment, leaving the index it came
//! from untouched for the searches still using it. Scoring is tantivy's BM25 (k1 1.2, b 0.75) with block-max WAND, so
//! a question's common words cost little and no candidate budget is needed.
//!
//! A caller who may not read every level the tenant holds is scored with
//! collection statistics of the levels it may read only ([`Visible`]): a
//! record above the caller's trust never shifts the caller's ranks, as in
//! the SQL BM25 (`keyword.rs`). Such a search cannot use WAND pruning (the
//! level filter sits in the collector) and counts each query term's
//! postings once; both are cheap next to the SQL it replaces.

use std::collections::{BTreeSet, HashMap};
use std::sync::LazyLock;

use tantivy::collector::{FilterCollector, TopDocs};
use tantivy::columnar::Column;
use tantivy::indexer::NoMergePolicy;
use tantivy::query::{Bm25StatisticsProvider, BooleanQuery, Occur, Query, TermQuery};
use tantivy::schema::{
    FAST, Field, INDEXED, IndexRecordOption, Schema, TextFieldIndexing, TextOptions,
};
use tantivy::tokenizer::{
    AsciiFoldingFilter, Language, LowerCaser, RemoveLongFilter, SimpleTokenizer, Stemmer,
    StopWordFilter, TextAnalyzer,
};
use tantivy::{
    DocAddress, DocSet, Index, IndexReader, IndexWriter, ReloadPolicy, Searcher, TERMINATED,
    TantivyDocument, Term,
};
use uuid::Uuid;

const ANALYZER_NAME: &str = "engram_en";
/// The indexing thread's arena; a larger tenant is flushed in segments.
const WRITER_HEAP_BYTES: usize = 64 << 20;
/// An update's arena (tantivy's least).
const UPDATE_HEAP_BYTES: usize = 15 << 20;
/// Access levels are 1..=4 (`AccessLevel`); index 0 stays empty.
const LEVELS: usize = 5;
const LEVEL: &str = "level";
const ORD: &str = "ord";
/// Distinct words of a query that score (a query holds at most 4,096
/// characters; a longer list of words only costs time).
const MAX_TERMS: usize = 64;

/// Postgres' `english.stop` (the Snowball English list, 127 words), so the
/// index drops what the SQL keyword search drops. Lucene's shorter list,
/// tantivy's default, keeps question words ("who", "which", "when"): on
/// 2Wiki dev that cost keyword R@5 (docs/benchmarks.md).
const STOP_WORDS: &str = include_str!("english.stop");

/// English words as Postgres' `english` configuration sees them, near
/// enough: split on anything but letters and digits, lower-cased,
/// diacritics folded ("Tekezé" and "Tekeze" are one word: people type
/// names without them; Postgres would keep them apart), the
/// Snowball English stop words dropped, the Snowball English stem kept.
/// Tokens over 40 bytes (hashes, URLs run together) are dropped. Built
/// once; indexes, builders and queries take clones.
static ANALYZER: LazyLock<TextAnalyzer> = LazyLock::new(analyzer);

fn analyzer() -> TextAnalyzer {
    let stop_words = StopWordFilter::remove(STOP_WORDS.split_whitespace().map(str::to_string));
    TextAnalyzer::builder(SimpleTokenizer::default())
        .filter(RemoveLongFilter::limit(40))
        .filter(LowerCaser)
        .filter(AsciiFoldingFilter)
        .filter(stop_words)
        .filter(Stemmer::new(Language::English))
        .build()
}

#[derive(Debug, Clone, Copy)]
struct Fields {
    text: Field,
    level: Field,
    ord: Field,
}

fn schema() -> (Schema, Fields) {
    let mut b = Schema::builder();
    let indexing = TextFieldIndexing::default()
        .set_tokenizer(ANALYZER_NAME)
        .set_index_option(IndexRecordOption::WithFreqs);
    let text = b.add_text_field(
        "text",
        TextOptions::default().set_indexing_options(indexing),
    );
    let level = b.add_u64_field(LEVEL, FAST);
    // Indexed too: an update deletes a memory's document by its ordinal.
    let ord = b.add_u64_field(ORD, FAST | INDEXED);
    (b.build(), Fields { text, level, ord })
}

/// Adds rows one by one, then [`Builder::finish`] commits them into a
/// searchable [`TenantIndex`]. Blocking work: run it off the async threads.
pub struct Builder {
    index: Index,
    writer: IndexWriter<TantivyDocument>,
    fields: Fields,
    docs: Docs,
    totals: LevelTotals,
    /// Counts the tokens the index will hold, for exact per-level totals.
    counter: TextAnalyzer,
    /// In-place updates since the last full build.
    updates: u32,
}

/// Every document ever added, by ordinal, and the live one of each memory.
#[derive(Debug, Clone, Default)]
struct Docs {
    ids: Vec<Uuid>,
    live: HashMap<Uuid, u64>,
    /// Text added, deleted documents' included (what the cache weighs).
    text_bytes: u64,
}

/// What a memory's keyword index holds: the same columns as its `tsv` in
/// Postgres (migrations/0005): title; speaker, content and caption; the
/// session context search-svc gave a turn (only text at or below the
/// turn's own level, turns.rs).
#[derive(Debug, Clone, Default)]
pub struct Searchable {
    pub title: String,
    pub body: String,
    pub context: String,
}

impl Searchable {
    fn values(&self) -> [&str; 3] {
        [&self.title, &self.body, &self.context]
    }
}

impl Builder {
    pub fn new() -> tantivy::Result<Self> {
        let (schema, fields) = schema();
        let index = Index::create_in_ram(schema);
        index.tokenizers().register(ANALYZER_NAME, ANALYZER.clone());
        let writer = index.writer_with_num_threads(1, WRITER_HEAP_BYTES)?;
        Ok(Self {
            index,
            writer,
            fields,
            docs: Docs::default(),
            totals: LevelTotals::default(),
            counter: ANALYZER.clone(),
            updates: 0,
        })
    }

    /// Bytes of text added so far.
    pub fn text_bytes(&self) -> u64 {
        self.docs.text_bytes
    }

    /// Deletes `id`'s document, if the index holds one. The document stays
    /// counted in the per-level totals, as in tantivy's own statistics
    /// (documents and postings) until a full build: the two must agree, or
    /// a term's document frequency could pass the document count.
    pub fn remove(&mut self, id: Uuid) {
        let Some(ord) = self.docs.live.remove(&id) else {
            return;
        };
        self.writer
            .delete_term(Term::from_field_u64(self.fields.ord, ord));
    }

    /// Adds `id`'s document (after [`Builder::remove`] when it changed).
    pub fn add(&mut self, id: Uuid, level: i16, text: &Searchable) -> tantivy::Result<()> {
        let level = u64::try_from(level).unwrap_or(u64::MAX);
        let ord = self.docs.ids.len() as u64;
        let mut doc = TantivyDocument::default();
        let mut tokens = 0;
        for value in text.values() {
            doc.add_text(self.fields.text, value);
            self.docs.text_bytes += value.len() as u64;
            let mut stream = self.counter.token_stream(value);
            while stream.advance() {
                tokens += 1;
            }
        }
        doc.add_u64(self.fields.level, level);
        doc.add_u64(self.fields.ord, ord);
        self.writer.add_document(doc)?;
        self.docs.ids.push(id);
        self.docs.live.insert(id, ord);
        self.totals.docs[level_index(level)] += 1;
        self.totals.tokens[level_index(level)] += tokens;
        Ok(())
    }

    pub fn finish(mut self) -> tantivy::Result<TenantIndex> {
        self.writer.commit()?;
        self.writer.wait_merging_threads()?;
        let reader: IndexReader = self
            .index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()?;
        let searcher = reader.searcher();
        let totals = self.totals;
        let columns = |name: &str| {
            (searcher.segment_readers().iter())
                .map(|segment| segment.fast_fields().u64(name))
                .collect::<tantivy::Result<Vec<_>>>()
        };
        let (ords, levels) = (columns(ORD)?, columns(LEVEL)?);
        Ok(TenantIndex {
            index: self.index,
            _reader: reader,
            ords,
            levels,
            searcher,
            fields: self.fields,
            docs: self.docs,
            totals,
            updates: self.updates,
        })
    }
}

/// Documents and tokens per access level, counted exactly as they were
/// added, for [`Visible`]: the same numbers tantivy's own statistics give
/// when every level is visible, so a caller's scores do not tell whether
/// levels above it hold anything.
#[derive(Debug, Default, Clone, Copy)]
struct LevelTotals {
    docs: [u64; LEVELS],
    tokens: [u64; LEVELS],
}

impl LevelTotals {
    fn max_level(&self) -> u64 {
        (0..LEVELS).rev().find(|&l| self.docs[l] > 0).unwrap_or(0) as u64
    }
}

fn level_index(level: u64) -> usize {
    usize::try_from(level).unwrap_or(LEVELS - 1).min(LEVELS - 1)
}

/// A search's hits in score order, and whether they are every match the
/// caller may see (fewer than asked for).
#[derive(Debug, Default)]
pub struct Found {
    pub hits: Vec<(Uuid, f32)>,
    pub exhausted: bool,
}

pub struct TenantIndex {
    /// For updates; shared by every version of the tenant's index.
    index: Index,
    /// Kept with the searcher it handed out, so the segments stay open.
    _reader: IndexReader,
    /// Per segment, opened once: each document's ordinal and level.
    ords: Vec<Column<u64>>,
    levels: Vec<Column<u64>>,
    searcher: Searcher,
    fields: Fields,
    docs: Docs,
    totals: LevelTotals,
    updates: u32,
}

impl std::fmt::Debug for TenantIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantIndex")
            .field("docs", &self.docs.live.len())
            .field("updates", &self.updates)
            .finish_non_exhaustive()
    }
}

impl TenantIndex {
    /// Memories the index holds.
    pub fn docs(&self) -> usize {
        self.docs.live.len()
    }

    /// Documents ever added, deleted ones included: what the cache weighs
    /// beside the text.
    pub fn documents(&self) -> usize {
        self.docs.ids.len()
    }

    /// Bytes of text indexed, deleted documents' included.
    pub fn text_bytes(&self) -> u64 {
        self.docs.text_bytes
    }

    /// In-place updates since the index was last built in full.
    pub fn updates(&self) -> u32 {
        self.updates
    }

    /// A builder that changes a copy of this index in place: its commit
    /// adds one segment (never merged, so the statistics stay those the
    /// per-level totals mirror); this index keeps serving meanwhile.
    /// Blocking work.
    pub fn updater(&self) -> tantivy::Result<Builder> {
        let writer: IndexWriter<TantivyDocument> =
            self.index.writer_with_num_threads(1, UPDATE_HEAP_BYTES)?;
        writer.set_merge_policy(Box::new(NoMergePolicy));
        Ok(Builder {
            index: self.index.clone(),
            writer,
            fields: self.fields,
            docs: self.docs.clone(),
            totals: self.totals,
            counter: ANALYZER.clone(),
            updates: self.updates + 1,
        })
    }

    /// The `limit` best memories at or below `trust` for `text`'s words
    /// (OR semantics, as the SQL keyword search).
    pub fn search(&self, trust: i16, text: &str, limit: usize) -> tantivy::Result<Found> {
        let Some(query) = self.query(text) else {
            return Ok(Found {
                hits: Vec::new(),
                exhausted: true,
            });
        };
        let trust = u64::try_from(trust).unwrap_or(0);
        let top = TopDocs::with_limit(limit.max(1)).order_by_score();
        let docs = match trust >= self.totals.max_level() {
            true => self.searcher.search(&query, &top)?,
            false => {
                let visible = Visible { index: self, trust };
                let filtered =
                    FilterCollector::new(LEVEL.to_string(), move |l: u64| l <= trust, top);
                self.searcher
                    .search_with_statistics_provider(&query, &filtered, &visible)?
            }
        };
        let exhausted = docs.len() < limit;
        let hits = docs
            .into_iter()
            .map(|(score, addr)| Ok((self.id_of(addr)?, score)))
            .collect::<tantivy::Result<Vec<_>>>()?;
        Ok(Found { hits, exhausted })
    }

    /// The query's distinct terms OR-ed; None when no word survives the
    /// analyzer (only stop words or punctuation).
    fn query(&self, text: &str) -> Option<BooleanQuery> {
        let mut analyzer = ANALYZER.clone();
        let mut stream = analyzer.token_stream(text);
        let mut words = BTreeSet::new();
        while stream.advance() && words.len() < MAX_TERMS {
            words.insert(stream.token().text.clone());
        }
        let clauses: Vec<(Occur, Box<dyn Query>)> = words
            .into_iter()
            .map(|w| {
                let term = Term::from_field_text(self.fields.text, &w);
                let q: Box<dyn Query> =
                    Box::new(TermQuery::new(term, IndexRecordOption::WithFreqs));
                (Occur::Should, q)
            })
            .collect();
        (!clauses.is_empty()).then(|| BooleanQuery::new(clauses))
    }

    fn id_of(&self, addr: DocAddress) -> tantivy::Result<Uuid> {
        let column = self.ords.get(addr.segment_ord as usize);
        let ord = column.and_then(|c| c.first(addr.doc_id));
        ord.and_then(|o| self.docs.ids.get(usize::try_from(o).ok()?).copied())
            .ok_or_else(|| tantivy::TantivyError::InternalError(format!("no id for {addr:?}")))
    }
}

/// BM25's collection statistics over the levels at or below `trust`.
struct Visible<'a> {
    index: &'a TenantIndex,
    trust: u64,
}

impl Visible<'_> {
    fn levels(&self) -> std::ops::RangeInclusive<usize> {
        0..=level_index(self.trust)
    }
}

impl Bm25StatisticsProvider for Visible<'_> {
    fn total_num_tokens(&self, _field: Field) -> tantivy::Result<u64> {
        Ok(self.levels().map(|l| self.index.totals.tokens[l]).sum())
    }

    fn total_num_docs(&self) -> tantivy::Result<u64> {
        Ok(self.levels().map(|l| self.index.totals.docs[l]).sum())
    }

    fn doc_freq(&self, term: &Term) -> tantivy::Result<u64> {
        let mut n = 0;
        let segments = self.index.searcher.segment_readers().iter();
        for (segment, levels) in segments.zip(&self.index.levels) {
            let inverted = segment.inverted_index(term.field())?;
            let Some(mut postings) = inverted.read_postings(term, IndexRecordOption::Basic)? else {
                continue;
            };
            let mut doc = postings.doc();
            while doc != TERMINATED {
                if levels.first(doc).is_some_and(|l| l <= self.trust) {
                    n += 1;
                }
                doc = postings.advance();
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(title: &str, body: &str) -> Searchable {
        Searchable {
            title: title.to_string(),
            body: body.to_string(),
            context: String::new(),
        }
    }

    fn build(rows: &[(i16, &str, &str)]) -> (TenantIndex, Vec<Uuid>) {
        let mut b = Builder::new().expect("builder");
        let ids: Vec<Uuid> = rows.iter().map(|_| Uuid::new_v4()).collect();
        for (id, (level, title, content)) in ids.iter().zip(rows) {
            b.add(*id, *level, &text(title, content)).expect("add");
        }
        (b.finish().expect("finish"), ids)
    }

    #[test]
    fn finds_stemmed_words_in_title_or_content_by_bm25() {
        let (index, ids) = build(&[
            (1, "Paris", "Paris is the capital of France."),
            (1, "Bananas", "Bananas are rich in potassium."),
            (
                1,
                "Capitals",
                "Capital cities of Europe and their capitals.",
            ),
        ]);
        let found = index
            .search(4, "What is the capital of France?", 10)
            .expect("search");
        let order: Vec<Uuid> = found.hits.iter().map(|h| h.0).collect();
        assert_eq!(order, vec![ids[0], ids[2]], "banana matches no word");
        assert!(found.exhausted);
        assert!(found.hits[0].1 > found.hits[1].1);
    }

    #[test]
    fn names_match_with_or_without_their_diacritics() {
        let (index, ids) = build(&[
            (
                1,
                "Tekezé River",
                "The Tekezé River rises in the Ethiopian Highlands.",
            ),
            (1, "Other", "Nothing about rivers of Ethiopia."),
        ]);
        for q in ["Where does the Tekeze flow?", "Where does the Tekezé flow?"] {
            let found = index.search(4, q, 10).expect("search");
            assert_eq!(found.hits.first().map(|h| h.0), Some(ids[0]), "{q}");
        }
    }

    #[test]
    fn a_query_of_stop_words_finds_nothing() {
        let (index, _) = build(&[(1, "", "the and of it")]);
        let found = index.search(4, "the of and", 10).expect("search");
        assert!(found.hits.is_empty() && found.exhausted);
    }

    #[test]
    fn records_above_the_callers_trust_are_neither_found_nor_counted() {
        // Level 4 holds "falcon" many times over: were it counted, the
        // public record's idf for "falcon" would fall and its score with it.
        let mut rows = vec![(1, "Falcon", "Project Falcon is owned by Ada.")];
        rows.extend(std::iter::repeat_n(
            (4, "Falcon", "falcon falcon secret"),
            20,
        ));
        rows.push((1, "Other", "Nothing about birds."));
        let (index, ids) = build(&rows);
        let low = index.search(1, "falcon", 50).expect("search");
        assert_eq!(
            low.hits.iter().map(|h| h.0).collect::<Vec<_>>(),
            vec![ids[0]]
        );
        let (alone, _) = build(&[
            (1, "Falcon", "Project Falcon is owned by Ada."),
            (1, "Other", "Nothing about birds."),
        ]);
        let same = alone.search(4, "falcon", 50).expect("search");
        assert!(
            (low.hits[0].1 - same.hits[0].1).abs() < 1e-4,
            "{low:?} vs {same:?}"
        );
        let high = index.search(4, "falcon", 50).expect("search");
        assert_eq!(high.hits.len(), 21);
    }

    /// The ids of the top 10 hits of `q` for a caller at `trust`.
    fn hit_ids(index: &TenantIndex, trust: i16, q: &str) -> Vec<Uuid> {
        let found = index.search(trust, q, 10).expect("search");
        found.hits.iter().map(|h| h.0).collect()
    }

    #[test]
    fn an_update_replaces_documents_in_a_copy_and_the_old_index_keeps_serving() {
        let (old, ids) = build(&[(1, "Owl", "an owl hoots"), (1, "Crow", "a crow caws")]);
        let mut updater = old.updater().expect("updater");
        updater.remove(ids[0]);
        updater
            .add(ids[0], 1, &text("Hawk", "a hawk soars"))
            .expect("add");
        updater.remove(ids[1]);
        let new = updater.finish().expect("finish");
        assert_eq!((new.docs(), new.updates()), (1, 1));
        let hits = |index: &TenantIndex, q: &str| hit_ids(index, 4, q);
        assert_eq!(hits(&new, "hawk"), vec![ids[0]]);
        assert!(hits(&new, "owl").is_empty() && hits(&new, "crow").is_empty());
        assert_eq!(hits(&old, "owl"), vec![ids[0]]);
        assert_eq!(hits(&old, "crow"), vec![ids[1]]);
        assert!(hits(&old, "hawk").is_empty());
    }

    #[test]
    fn a_low_trust_search_after_an_edit_counts_as_tantivy_does() {
        // An edit leaves the old document's postings until a full build; a
        // caller below the tenant's top level must still be answered (a
        // document count below a term's frequency failed an assert).
        let (old, ids) = build(&[(1, "Heron", "a heron"), (4, "Secret", "secret heron")]);
        let mut updater = old.updater().expect("updater");
        updater.remove(ids[0]);
        updater
            .add(ids[0], 1, &text("Heron", "a grey heron"))
            .expect("add");
        let new = updater.finish().expect("finish");
        assert_eq!(hit_ids(&new, 1, "heron"), vec![ids[0]]);
        let all = new.search(4, "heron", 10).expect("search");
        assert_eq!(all.hits.len(), 2);
    }

    #[test]
    fn a_limit_below_the_matches_is_not_exhausted() {
        let rows: Vec<(i16, &str, &str)> = (0..5).map(|_| (1, "t", "owl")).collect();
        let (index, _) = build(&rows);
        let found = index.search(1, "owl", 3).expect("search");
        assert_eq!(found.hits.len(), 3);
        assert!(!found.exhausted);
    }
}
