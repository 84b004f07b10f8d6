//! `engram memories list|get|delete|export|import|wipe`: what a tenant's
//! agents stored, seen and cleaned through the gateway (docs/memories.md).
//!
//! The tenant is the API key's, always: the gateway takes it from the key.
//! `--tenant` is only a safety check, never a choice. Every command first
//! asks the gateway whose key it holds (`ListMemoriesResponse.tenant`) and
//! stops when `--tenant` names another tenant, so a script pointed at the
//! wrong key fails before it lists, exports or deletes anything.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use chrono::{DateTime, Utc};
use engram_common::AccessLevel;
use engram_common::Settings;
use engram_common::convert::{chrono_to_ts, struct_to_json, ts_to_chrono};
use engram_proto::{
    DeleteRequest, GetRequest, ListMemoriesRequest, ListMemoriesResponse, Memory, TimeRange,
};
use engram_stack::client::Client;

use crate::commands::{self, Conn};
use crate::ingest;

/// Ids per Delete / Get call: the gateway's write batch bound.
const ID_BATCH: usize = 1000;

/// Where the gateway is and which key to use; `--tenant` only checks it.
#[derive(Debug, Clone, clap::Args)]
pub struct KeyArgs {
    /// Gateway URI; default: http://<listen.retrieval>.
    #[arg(long)]
    pub addr: Option<String>,
    /// API key; default: ENGRAM_API_KEY, else <home>/dev-api-key written by `engram up`.
    #[arg(long, env = "ENGRAM_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Refuse to run unless the key belongs to this tenant (the tenant is
    /// always the key's; this flag cannot choose another).
    #[arg(long)]
    pub tenant: Option<String>,
}

impl KeyArgs {
    /// The gateway's URI: `--addr`, else `http://<listen.retrieval>`.
    pub fn uri(&self, settings: &Settings) -> String {
        self.addr
            .clone()
            .unwrap_or_else(|| format!("http://{}", settings.listen.retrieval))
    }

    /// The key: `--api-key` / ENGRAM_API_KEY, else the dev key `engram up`
    /// wrote, which belongs to tenant `default`.
    pub fn api_key(&self, settings: &Settings) -> anyhow::Result<String> {
        if let Some(k) = &self.api_key {
            return Ok(k.clone());
        }
        let path = settings.home.join("dev-api-key");
        std::fs::read_to_string(&path)
            .map(|k| k.trim().to_string())
            .map_err(|_| {
                anyhow::anyhow!(
                    "no API key: pass --api-key or ENGRAM_API_KEY, or start `engram up` (it writes {})",
                    path.display()
                )
            })
    }
}

/// Which memories a listing, export or wipe covers.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Filters {
    /// Only this namespace (default: every namespace).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Only this memory type; repeat for several.
    #[arg(long = "type", value_name = "TYPE")]
    pub memory_types: Vec<String>,
    /// Event time at or after this RFC 3339 instant.
    #[arg(long, value_parser = parse_time)]
    pub since: Option<DateTime<Utc>>,
    /// Event time before this RFC 3339 instant.
    #[arg(long, value_parser = parse_time)]
    pub until: Option<DateTime<Utc>>,
    /// Also superseded, retracted, decayed and consolidated memories.
    #[arg(long)]
    pub include_historical: bool,
}

fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("expected an RFC 3339 time such as 2025-01-31T00:00:00Z: {e}"))
}

impl Filters {
    /// The first page's request with these filters.
    pub fn request(&self, page_size_opt: Option<u32>, newest_first: bool) -> ListMemoriesRequest {
        let time_range = (self.since.is_some() || self.until.is_some()).then(|| TimeRange {
            start: self.since.map(chrono_to_ts),
            end: self.until.map(chrono_to_ts),
        });
        ListMemoriesRequest {
            page_size: page_size_opt,
            page_token: String::new(),
            namespace: self.namespace.clone().unwrap_or_default(),
            memory_types: self.memory_types.clone(),
            time_range,
            include_historical: self.include_historical,
            include_consolidated: self.include_historical,
            newest_first,
        }
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum MemoriesCommand {
    /// One page of memories (or every page with --all), oldest first.
    List {
        #[command(flatten)]
        filters: Filters,
        /// 1..=1000 per page (default 100).
        #[arg(long)]
        page_size: Option<u32>,
        /// Continue after a previous page (its next_page_token).
        #[arg(long)]
        page_token: Option<String>,
        /// Follow next_page_token to the end.
        #[arg(long)]
        all: bool,
        #[arg(long)]
        newest_first: bool,
        /// One JSON object per memory.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        key: KeyArgs,
    },
    /// Memories by id (UUIDs, or the ids an ingest file gave them).
    Get {
        #[arg(required = true)]
        ids: Vec<String>,
        #[command(flatten)]
        key: KeyArgs,
    },
    /// Delete memories by id (UUIDs, or the ids an ingest file gave them).
    Delete {
        #[arg(required = true)]
        ids: Vec<String>,
        #[command(flatten)]
        key: KeyArgs,
    },
    /// Every matching memory as ingest JSONL (`engram memories import` and
    /// `engram ingest` read it back).
    Export {
        #[command(flatten)]
        filters: Filters,
        /// Write here instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
        #[command(flatten)]
        key: KeyArgs,
    },
    /// Load an ingest JSONL file (an export, or any `engram ingest` file).
    Import {
        file: PathBuf,
        #[command(flatten)]
        key: KeyArgs,
    },
    /// Delete every memory of one namespace (or of all, by name) of the
    /// key's tenant, historical versions included. Needs --yes.
    Wipe {
        /// The namespace to empty.
        #[arg(
            long,
            conflicts_with = "all_namespaces",
            required_unless_present = "all_namespaces"
        )]
        namespace: Option<String>,
        /// Every namespace of the tenant.
        #[arg(long)]
        all_namespaces: bool,
        /// Really delete; without it wipe only counts.
        #[arg(long)]
        yes: bool,
        #[command(flatten)]
        key: KeyArgs,
    },
}

/// A connection whose tenant is known (and matched `--tenant`).
pub struct Session {
    pub client: Client,
    pub tenant: String,
    key: KeyArgs,
}

impl Session {
    /// Connects with the key, asks the gateway whose it is, and refuses a
    /// `--tenant` that is not that tenant.
    pub async fn open(settings: &Settings, key: KeyArgs) -> anyhow::Result<Self> {
        // `Conn` resolves the key (flag, env, dev key); its own tenant
        // check only guards the dev key, so it gets the dev key's tenant.
        let conn = Conn {
            addr: key.addr.clone(),
            api_key: key.api_key.clone(),
            tenant: "default".into(),
        };
        let mut client = conn.connect(settings).await?;
        let probe = ListMemoriesRequest {
            page_size: Some(1),
            ..Default::default()
        };
        let tenant = client
            .memories
            .list_memories(probe)
            .await
            .map_err(status_error)?
            .into_inner()
            .tenant;
        if let Some(wanted) = &key.tenant
            && *wanted != tenant
        {
            anyhow::bail!(
                "--tenant {wanted:?}: the API key belongs to tenant {tenant:?}; nothing was done"
            );
        }
        Ok(Self {
            client,
            tenant,
            key,
        })
    }

    pub async fn page(&mut self, req: ListMemoriesRequest) -> anyhow::Result<ListMemoriesResponse> {
        Ok(self
            .client
            .memories
            .list_memories(req)
            .await
            .map_err(status_error)?
            .into_inner())
    }

    /// Every page from `req`'s, handing each to `f` in order.
    pub async fn each_page(
        &mut self,
        mut req: ListMemoriesRequest,
        mut f: impl AsyncFnMut(&mut Self, Vec<Memory>) -> anyhow::Result<()>,
    ) -> anyhow::Result<usize> {
        let mut n = 0;
        loop {
            let page = self.page(req.clone()).await?;
            n += page.memories.len();
            f(self, page.memories).await?;
            if page.next_page_token.is_empty() {
                return Ok(n);
            }
            req.page_token = page.next_page_token;
        }
    }

    /// Every memory matching `filters`, in pages of 1000.
    pub async fn all(&mut self, filters: &Filters) -> anyhow::Result<Vec<Memory>> {
        let mut out = Vec::new();
        let req = filters.request(Some(1000), false);
        self.each_page(req, async |_, page| {
            out.extend(page);
            Ok(())
        })
        .await?;
        Ok(out)
    }

    /// User-facing ids (UUIDs, or the ids of an ingest file) as stored ids.
    fn stored_ids(&self, settings: &Settings, ids: &[String]) -> anyhow::Result<Vec<String>> {
        if ids.iter().all(|i| uuid::Uuid::parse_str(i).is_ok()) {
            return Ok(ids.to_vec());
        }
        let key = ingest::IdKey::for_deployment(settings)?;
        Ok(ids
            .iter()
            .map(|i| ingest::memory_id(&key, &self.tenant, i))
            .collect())
    }

    pub async fn get(
        &mut self,
        settings: &Settings,
        ids: &[String],
    ) -> anyhow::Result<Vec<Memory>> {
        let ids = self.stored_ids(settings, ids)?;
        let mut out = Vec::new();
        for chunk in ids.chunks(ID_BATCH) {
            let req = GetRequest {
                ids: chunk.to_vec(),
                include_history: true,
                ..Default::default()
            };
            let r = self.client.memories.get(req).await.map_err(status_error)?;
            out.extend(r.into_inner().memories);
        }
        Ok(out)
    }

    pub async fn delete(&mut self, settings: &Settings, ids: &[String]) -> anyhow::Result<u64> {
        let ids = self.stored_ids(settings, ids)?;
        self.delete_stored(ids).await
    }

    async fn delete_stored(&mut self, ids: Vec<String>) -> anyhow::Result<u64> {
        let mut deleted = 0;
        for chunk in ids.chunks(ID_BATCH) {
            let req = DeleteRequest {
                ids: chunk.to_vec(),
            };
            let r = self
                .client
                .memories
                .delete(req)
                .await
                .map_err(status_error)?;
            deleted += u64::from(r.into_inner().deleted);
        }
        Ok(deleted)
    }

    /// Every matching memory as ingest JSONL into `out`; returns the count.
    pub async fn export(
        &mut self,
        filters: &Filters,
        out: &mut dyn Write,
    ) -> anyhow::Result<usize> {
        let req = filters.request(Some(1000), false);
        self.each_page(req, async |_, page| {
            for m in &page {
                writeln!(out, "{}", export_line(m))?;
            }
            Ok(())
        })
        .await
    }

    /// Loads an ingest file with `engram ingest`'s code: non-UUID ids are
    /// derived for this session's tenant, supersedes chains go in order.
    pub async fn import(&self, settings: Settings, file: &Path) -> anyhow::Result<()> {
        let conn = Conn {
            addr: self.key.addr.clone(),
            api_key: self.key.api_key.clone(),
            tenant: self.tenant.clone(),
        };
        commands::ingest(settings, file, conn).await
    }

    /// Deletes every memory of `namespace_opt` (None = every namespace)
    /// the key can see, historical versions included, page by page; with
    /// `yes` false only counts. Returns (matched, deleted).
    pub async fn wipe(
        &mut self,
        namespace_opt: Option<&str>,
        yes: bool,
    ) -> anyhow::Result<(usize, u64)> {
        let filters = Filters {
            namespace: namespace_opt.map(str::to_string),
            include_historical: true,
            ..Default::default()
        };
        let req = filters.request(Some(1000), false);
        if !yes {
            let n = self.each_page(req, async |_, _| Ok(())).await?;
            return Ok((n, 0));
        }
        // Each page is deleted as it comes: keyset paging continues after
        // the last row's position, deleted or not.
        let mut deleted = 0;
        let n = self
            .each_page(req, async |s, page| {
                deleted += s
                    .delete_stored(page.into_iter().map(|m| m.id).collect())
                    .await?;
                Ok(())
            })
            .await?;
        Ok((n, deleted))
    }
}

/// The ids the user asked for (`asked`, stored as `stored`, same order)
/// that `found` does not hold, as the user wrote them.
fn missing_ids(asked: &[String], stored: &[String], found: &[Memory]) -> Vec<String> {
    let have: std::collections::HashSet<&str> = found.iter().map(|m| m.id.as_str()).collect();
    (asked.iter().zip(stored))
        .filter(|(_, s)| !have.contains(s.as_str()))
        .map(|(a, _)| a.clone())
        .collect()
}

pub fn status_error(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", s.code(), s.message())
}

/// A proto time field, `m.field.as_ref().and_then(ts_to_chrono)`, as RFC 3339.
fn time(t_opt: Option<DateTime<Utc>>) -> Option<String> {
    t_opt.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
}

/// One memory in the ingest format (`ingest.rs`): only the fields ingest
/// reads, so the line loads back; empty ones are left out. Output-only
/// fields (version, ingestion and record times, decay) are not carried:
/// an import writes new rows.
pub fn export_line(m: &Memory) -> serde_json::Value {
    let mut o = serde_json::Map::new();
    let mut put = |k: &str, v: serde_json::Value| {
        o.insert(k.into(), v);
    };
    put("id", m.id.clone().into());
    if !m.title.is_empty() {
        put("title", m.title.clone().into());
    }
    put("content", m.content.clone().into());
    put("memory_type", m.memory_type.clone().into());
    put("namespace", m.namespace.clone().into());
    let level = AccessLevel::from_proto(m.access_level).unwrap_or(AccessLevel::Public);
    put("access_level", level.name().into());
    if let Some(c) = m.source_confidence {
        put("source_confidence", serde_json::json!(c));
    }
    if let Some(t) = time(m.event_time.as_ref().and_then(ts_to_chrono)) {
        put("event_time", t.into());
    }
    if let Some(t) = time(m.valid_to.as_ref().and_then(ts_to_chrono)) {
        put("valid_to", t.into());
    }
    if !m.supersedes.is_empty() {
        put("supersedes", m.supersedes.clone().into());
    }
    if m.consolidated {
        put("consolidated", true.into());
    }
    if let Some(md) = m.metadata.as_ref().filter(|s| !s.fields.is_empty()) {
        put("metadata", struct_to_json(md));
    }
    if !m.source.is_empty() {
        put("source", m.source.clone().into());
    }
    if !m.entities.is_empty() {
        put("entities", m.entities.clone().into());
    }
    if !m.triples.is_empty() {
        let t: Vec<[&str; 3]> = (m.triples.iter())
            .map(|t| [&*t.subject, &*t.relation, &*t.object])
            .collect();
        put("triples", serde_json::json!(t));
    }
    serde_json::Value::Object(o)
}

/// `list --json` and `get`: the export line plus what only the store knows.
pub fn show_line(m: &Memory) -> serde_json::Value {
    let mut v = export_line(m);
    if let Some(o) = v.as_object_mut() {
        o.insert("agent_id".into(), m.agent_id.clone().into());
        o.insert("version".into(), m.version.into());
        o.insert("decay_score".into(), serde_json::json!(m.decay_score));
        if let Some(t) = time(m.ingestion_time.as_ref().and_then(ts_to_chrono)) {
            o.insert("ingestion_time".into(), t.into());
        }
        if let Some(t) = time(m.retracted_at.as_ref().and_then(ts_to_chrono)) {
            o.insert("retracted_at".into(), t.into());
        }
        if !m.history.is_empty() {
            let at = |t: &Option<prost_types::Timestamp>| time(t.as_ref().and_then(ts_to_chrono));
            let history = (m.history.iter())
                .map(|h| {
                    serde_json::json!({
                        "version": h.version, "title": h.title, "content": h.content,
                        "recorded_at": at(&h.recorded_at), "replaced_at": at(&h.replaced_at),
                    })
                })
                .collect::<Vec<_>>();
            o.insert("history".into(), history.into());
        }
    }
    v
}

/// One line for people: id, namespace/type, ingestion time, the text.
fn show_short(m: &Memory) -> String {
    let text: String = m.content.chars().take(80).collect();
    let text = text.replace(['\n', '\r', '\t'], " ");
    let more = if m.content.chars().count() > 80 {
        "…"
    } else {
        ""
    };
    let at = time(m.ingestion_time.as_ref().and_then(ts_to_chrono)).unwrap_or_default();
    format!(
        "{}  {}/{}  {at}  {text}{more}",
        m.id, m.namespace, m.memory_type
    )
}

/// Runs one `engram memories` command, printing to stdout. A reader that
/// went away (`engram memories list | head`) ends the command quietly: what
/// it wanted was read.
pub async fn run(settings: Settings, command: MemoriesCommand) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout();
    quiet_on_broken_pipe(run_to(settings, command, &mut stdout).await)
}

/// `Ok` when `r` failed only because the reader of our output closed it.
pub fn quiet_on_broken_pipe(r: anyhow::Result<()>) -> anyhow::Result<()> {
    match r {
        Err(e) if engram_stack::out::is_broken_pipe(&e) => Ok(()),
        other => other,
    }
}

/// [`run`] with its stdout as `out`; a write error (a closed pipe among
/// them) is returned, never a panic.
pub async fn run_to(
    settings: Settings,
    command: MemoriesCommand,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    match command {
        MemoriesCommand::List {
            filters,
            page_size,
            page_token,
            all,
            newest_first,
            json,
            key,
        } => {
            let mut s = Session::open(&settings, key).await?;
            let mut req = filters.request(page_size, newest_first);
            req.page_token = page_token.unwrap_or_default();
            loop {
                let page = s.page(req.clone()).await?;
                for m in &page.memories {
                    match json {
                        true => writeln!(out, "{}", show_line(m))?,
                        false => writeln!(out, "{}", show_short(m))?,
                    }
                }
                out.flush()?;
                match (page.next_page_token.is_empty(), all) {
                    (true, _) => break,
                    (false, true) => req.page_token = page.next_page_token,
                    (false, false) => {
                        eprintln!("more: --page-token {}", page.next_page_token);
                        break;
                    }
                }
            }
            Ok(())
        }
        MemoriesCommand::Get { ids, key } => {
            let mut s = Session::open(&settings, key).await?;
            let found = s.get(&settings, &ids).await?;
            for m in &found {
                writeln!(out, "{}", show_line(m))?;
            }
            out.flush()?;
            let missing = missing_ids(&ids, &s.stored_ids(&settings, &ids)?, &found);
            if !missing.is_empty() {
                anyhow::bail!(
                    "{} of {} ids not found (or above this key's trust): {}",
                    missing.len(),
                    ids.len(),
                    missing.join(", ")
                );
            }
            Ok(())
        }
        MemoriesCommand::Delete { ids, key } => {
            let mut s = Session::open(&settings, key).await?;
            let n = s.delete(&settings, &ids).await?;
            writeln!(
                out,
                "deleted {n} of {} from tenant {:?}",
                ids.len(),
                s.tenant
            )?;
            Ok(())
        }
        MemoriesCommand::Export {
            filters,
            out: path_opt,
            key,
        } => {
            let mut s = Session::open(&settings, key).await?;
            let n = match &path_opt {
                Some(path) => {
                    let f = std::fs::File::create(path)
                        .with_context(|| format!("cannot write {}", path.display()))?;
                    let mut w = std::io::BufWriter::new(f);
                    let n = s.export(&filters, &mut w).await?;
                    w.flush()?;
                    n
                }
                None => {
                    let mut w = std::io::BufWriter::new(&mut *out);
                    let n = s.export(&filters, &mut w).await?;
                    w.flush()?;
                    n
                }
            };
            eprintln!("exported {n} memories of tenant {:?}", s.tenant);
            Ok(())
        }
        MemoriesCommand::Import { file, key } => {
            let s = Session::open(&settings, key).await?;
            s.import(settings, &file).await
        }
        MemoriesCommand::Wipe {
            namespace,
            all_namespaces: _,
            yes,
            key,
        } => {
            let mut s = Session::open(&settings, key).await?;
            let scope = match &namespace {
                Some(ns) => format!("namespace {ns:?} of tenant {:?}", s.tenant),
                None => format!("every namespace of tenant {:?}", s.tenant),
            };
            let (n, deleted) = s.wipe(namespace.as_deref(), yes).await?;
            if !yes {
                anyhow::bail!("wipe would delete {n} memories in {scope}; pass --yes to do it");
            }
            writeln!(out, "wiped {deleted} memories in {scope}")?;
            Ok(())
        }
    }
}
