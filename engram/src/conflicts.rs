//! `engram conflicts list|confirm|reject`: review the updates engram
//! detected at write time (`search.update_detection`, issue 21). The
//! tenant is the API key's, as for `engram memories`; the key sees only
//! pairs whose both memories are at or below its trust level.

use engram_common::Settings;
use engram_common::convert::ts_to_chrono;
use engram_proto::{
    ConflictDecision, DetectedConflict, ListConflictsRequest, ReviewConflictRequest,
};
use engram_stack::outln;
use std::io::Write;

use crate::memories::{KeyArgs, Session, status_error};

#[derive(Debug, Clone, clap::Subcommand)]
pub enum ConflictsCommand {
    /// Detected updates awaiting review, newest first.
    List {
        /// Only this namespace's pairs.
        #[arg(long)]
        namespace: Option<String>,
        /// Also pairs already confirmed.
        #[arg(long)]
        include_confirmed: bool,
        /// Pairs per page (1..=200).
        #[arg(long)]
        page_size: Option<u32>,
        /// Follow every page instead of printing the next page's token.
        #[arg(long)]
        all: bool,
        /// One JSON object per pair.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        key: KeyArgs,
    },
    /// The newer memory does replace the older one: the older one stops
    /// being current (kept as history).
    Confirm {
        new_id: String,
        old_id: String,
        #[command(flatten)]
        key: KeyArgs,
    },
    /// Not an update: the edge goes, and the pair is never flagged again.
    Reject {
        new_id: String,
        old_id: String,
        #[command(flatten)]
        key: KeyArgs,
    },
}

pub async fn run(settings: Settings, command: ConflictsCommand) -> anyhow::Result<()> {
    match command {
        ConflictsCommand::List {
            namespace,
            include_confirmed,
            page_size,
            all,
            json,
            key,
        } => {
            let mut s = Session::open(&settings, key).await?;
            let mut req = ListConflictsRequest {
                page_size,
                namespace: namespace.unwrap_or_default(),
                include_confirmed,
                ..Default::default()
            };
            loop {
                let page = (s.client.memories.list_conflicts(req.clone()).await)
                    .map_err(status_error)?
                    .into_inner();
                // `engram conflicts list | head` closes our stdout: a
                // write error ends the listing quietly, never a panic.
                let mut out = std::io::stdout().lock();
                for c in &page.conflicts {
                    let written = match json {
                        true => writeln!(out, "{}", as_json(c)),
                        false => writeln!(out, "{}", as_text(c)),
                    };
                    if let Err(e) = written {
                        return crate::memories::quiet_on_broken_pipe(Err(e.into()));
                    }
                }
                match (page.next_page_token.is_empty(), all) {
                    (true, _) => break,
                    (false, true) => req.page_token = page.next_page_token,
                    (false, false) => {
                        eprintln!("more: run again with --all");
                        break;
                    }
                }
            }
            Ok(())
        }
        ConflictsCommand::Confirm {
            new_id,
            old_id,
            key,
        } => review(&settings, key, new_id, old_id, ConflictDecision::Confirm).await,
        ConflictsCommand::Reject {
            new_id,
            old_id,
            key,
        } => review(&settings, key, new_id, old_id, ConflictDecision::Reject).await,
    }
}

async fn review(
    settings: &Settings,
    key: KeyArgs,
    new_id: String,
    old_id: String,
    decision: ConflictDecision,
) -> anyhow::Result<()> {
    let mut s = Session::open(settings, key).await?;
    let req = ReviewConflictRequest {
        new_id: new_id.clone(),
        old_id: old_id.clone(),
        decision: decision as i32,
    };
    let r = (s.client.memories.review_conflict(req).await)
        .map_err(status_error)?
        .into_inner();
    match r.conflict {
        Some(c) => outln!("confirmed: {}", as_text(&c))?,
        None => outln!("rejected: {new_id} no longer updates {old_id}")?,
    }
    Ok(())
}

/// A proto time field, `c.field.as_ref().and_then(ts_to_chrono)`, as a date.
fn date(t_opt: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t_opt
        .map(|d| d.format("%Y-%m-%d").to_string())
        .unwrap_or_default()
}

fn as_text(c: &DetectedConflict) -> String {
    let state = match (&c.confirmed_at, c.old_closed) {
        (Some(_), _) => "confirmed",
        (None, true) => "closed",
        (None, false) => "pending",
    };
    format!(
        "{new} updates {old} (score {score:.2}, {state})\n  new {nd}: {nc}\n  old {od}: {oc}",
        new = c.new_id,
        old = c.old_id,
        score = c.score,
        nd = date(c.new_event_time.as_ref().and_then(ts_to_chrono)),
        nc = c.new_content,
        od = date(c.old_event_time.as_ref().and_then(ts_to_chrono)),
        oc = c.old_content,
    )
}

fn as_json(c: &DetectedConflict) -> serde_json::Value {
    serde_json::json!({
        "new_id": c.new_id, "old_id": c.old_id, "score": c.score, "reason": c.reason,
        "new_content": c.new_content, "old_content": c.old_content,
        "new_event_time": date(c.new_event_time.as_ref().and_then(ts_to_chrono)), "old_event_time": date(c.old_event_time.as_ref().and_then(ts_to_chrono)),
        "confirmed": c.confirmed_at.is_some(), "old_closed": c.old_closed,
    })
}
