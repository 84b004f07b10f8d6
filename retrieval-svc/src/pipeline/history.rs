//! Stage 5, history: the earlier contents of the edited memories among an
//! answer's records (issue 46 item 4, edits are versions), so the context
//! block and `explain` show what a memory said before it was rewritten.
//!
//! Read only when someone will look at it (`explain`, or a context block
//! asked for) and only when a record was edited (version > 1): a plain
//! query pays nothing. One Get of the edited ids, under the caller's
//! tenant and trust (search-svc shows a version only at or under the level
//! it was written at) and, for an as-of read, as recorded then. A failed
//! read reports `history` degraded and the answer stands without it.

use engram_proto::{Filters, GetRequest, ScoredMemory};

use super::ctx::{Ctx, StageTrace};
use super::later::stage_deadline;
use crate::downstream::call_until;

/// Whether the answer to this query shows history at all.
pub fn wanted(ctx: &Ctx<'_>) -> bool {
    ctx.query.explain || ctx.query.token_budget > 0
}

/// Fills `memory.history` of the edited records; returns how many got one.
pub async fn run(
    ctx: &Ctx<'_>,
    trace: &mut StageTrace,
    records: &mut [ScoredMemory],
    filters: &Filters,
) -> usize {
    let ids = edited(records);
    if ids.is_empty() || !wanted(ctx) {
        return 0;
    }
    let req = GetRequest {
        ids,
        omit_entities: true,
        include_history: true,
        as_of_ingestion: filters.as_of_ingestion,
        ..Default::default()
    };
    let deadline = stage_deadline(ctx.deadline);
    let read = match call_until(&ctx.ds.get, &ctx.identity, deadline, req).await {
        Ok(r) => r.memories,
        Err(e) => {
            tracing::warn!(error = %e, "reading the records' earlier versions failed");
            trace.degraded.push("history".into());
            return 0;
        }
    };
    attach(records, read)
}

/// Ids of the records whose memory was edited since it was first written.
fn edited(records: &[ScoredMemory]) -> Vec<String> {
    (records.iter())
        .filter_map(|r| r.memory.as_ref())
        .filter(|m| m.version > 1)
        .map(|m| m.id.clone())
        .collect()
}

/// Gives each record the history read for its id, only when the version
/// read is the one the record holds (an edit in between would pair the
/// record with versions it does not follow).
fn attach(records: &mut [ScoredMemory], read: Vec<engram_proto::Memory>) -> usize {
    let mut n = 0;
    for got in read.into_iter().filter(|m| !m.history.is_empty()) {
        let record = (records.iter_mut())
            .filter_map(|r| r.memory.as_mut())
            .find(|m| m.id == got.id && m.version == got.version);
        if let Some(m) = record {
            m.history = got.history;
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use engram_proto::{Memory, MemoryVersion};

    fn record(id: &str, version: i32) -> ScoredMemory {
        ScoredMemory {
            memory: Some(Memory {
                id: id.into(),
                version,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn read(id: &str, version: i32) -> Memory {
        Memory {
            id: id.into(),
            version,
            history: vec![MemoryVersion {
                version: version - 1,
                content: "before".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn only_edited_records_are_read_and_only_their_own_version_is_attached() {
        let mut records = vec![record("a", 1), record("b", 2), record("c", 3)];
        assert_eq!(edited(&records), ["b", "c"]);
        // c was edited again between the search and this read: its
        // history belongs to version 4, not to the version 3 answered.
        let n = attach(&mut records, vec![read("b", 2), read("c", 4)]);
        assert_eq!(n, 1);
        let history = |i: usize| records[i].memory.as_ref().map(|m| m.history.len());
        assert_eq!(
            (history(0), history(1), history(2)),
            (Some(0), Some(1), Some(0))
        );
    }
}
