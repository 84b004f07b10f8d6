//! The lab's command line (`engram eval`, `tune`, `bench`) and the commands
//! themselves. The `engram` binary flattens [`LabCommand`] into its own
//! subcommands and hands each one to [`run`].

use std::path::PathBuf;

use anyhow::Context;
use engram_common::Settings;
use engram_proto::{RetrievalMode, RetrieveRequest};
use engram_stack::client::Client;
use engram_stack::stack::{self, Service, Stack, StackOptions};
use engram_stack::{out, outln};

/// The lab's subcommands, with their flags as `engram` has always taken them.
#[derive(Debug, clap::Subcommand)]
pub enum LabCommand {
    /// Recall and latency through the public API (see docs/benchmarks.md).
    Eval {
        #[command(subcommand)]
        dataset: EvalDataset,
    },
    /// Fit the per-route fusion weights on the dev halves; writes a config file.
    Tune {
        /// Where to write the fitted `[pipeline.weights.*]` config.
        #[arg(long, default_value = "engram.tune.toml")]
        out: PathBuf,
        /// Also write every question's rankings and evidence (JSON lines).
        #[arg(long)]
        samples: Option<PathBuf>,
        /// Fit the fusion only, without the cross-encoder pass.
        #[arg(long)]
        skip_rerank: bool,
        /// Only the first N questions per data set (per conversation for LoCoMo).
        #[arg(long)]
        limit: Option<usize>,
        /// Also write the Stage 4 ranker fitted on all four dev sets (JSON;
        /// the repository's is models/ranker/default.json).
        #[arg(long)]
        ranker_out: Option<PathBuf>,
    },
    /// The learned Stage 4 ranker (see docs/benchmarks.md, "Stage 4").
    Ranker {
        #[command(subcommand)]
        action: RankerAction,
    },
    /// Latency and throughput on a synthetic tenant (see docs/benchmarks.md).
    Bench {
        #[arg(long, default_value_t = 10_000)]
        memories: usize,
        #[arg(long, default_value_t = 500)]
        queries: usize,
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        #[arg(long)]
        json: bool,
        /// All services in this process (one RSS figure) instead of one
        /// child process per service.
        #[arg(long)]
        in_process: bool,
        /// Only the ingest figures (1,000 passages with server-side
        /// embeddings and their breakdown, then the short facts), without
        /// building the synthetic tenant.
        #[arg(long)]
        ingest_only: bool,
        /// With --in-process: profile the no-rerank query mix on the CPU
        /// instead (per stage and per crate, Postgres apart) and write its
        /// folded stacks to this file (docs/benchmarks.md, "CPU profile").
        #[arg(long)]
        profile: Option<PathBuf>,
        /// The bench tenant's texts: every dev corpus with names and
        /// numbers varied (mixed), or ~2,000 2Wiki passages repeated, the
        /// corpus of the numbers before 25 November 2026 (repeated).
        #[arg(long, value_enum, default_value = "mixed")]
        corpus: crate::bench::CorpusKind,
    },
    /// Reliability in figures: noisy neighbour, kill -9 mid-load, a slowed
    /// downstream and a soak, one process per service (docs/reliability.md).
    Soak {
        /// Seconds per phase of noisy and per service of faults / slow.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        /// Seconds of the soak scenario's mixed load.
        #[arg(long, default_value_t = 300)]
        soak_seconds: u64,
        /// Tenant B's steady read rate.
        #[arg(long, default_value_t = 20.0)]
        qps: f64,
        /// Scenarios to run, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "noisy,faults,slow,soak")]
        only: Vec<String>,
        /// Stage 3 on, so a rerank-svc fault reaches answers (off by
        /// default, as in the product).
        #[arg(long)]
        cross_encoder: bool,
        /// Keep every soak write until the end, so B's corpus grows by the
        /// write rate (the soak before it was held at a constant size).
        #[arg(long)]
        soak_growing: bool,
        /// Tenant A's concurrent flood loops in `noisy`.
        #[arg(long, default_value_t = 8)]
        flood_workers: usize,
        /// Which of A's requests the flood loops cycle through,
        /// comma-separated (default: every attack; `plain` is an ordinary
        /// question, to see what a well-behaved neighbour costs).
        #[arg(long, value_delimiter = ',')]
        attacks: Vec<String>,
        /// Nice value of A's flood threads (0: as the services); the
        /// attacker's client stands in for another machine.
        #[arg(long, default_value_t = 19)]
        flood_nice: i32,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum RankerAction {
    /// Fit a model from the feedback examples in Postgres and write it
    /// where `pipeline.ranker.model_path_opt` points (the gateway reloads it).
    Train {
        /// Only this tenant's feedback (a per-tenant model: write it to
        /// `<pipeline.ranker.tenant_models_dir_opt>/<tenant>.json`).
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long, default_value = "engram.ranker.json")]
        out: PathBuf,
        /// Every feature, not only the two that transfer across corpora.
        #[arg(long)]
        all_features: bool,
        /// An identity counts at most this many times the median identity.
        #[arg(long, default_value_t = 2.0)]
        identity_share: f64,
    },
}

/// Runs one lab command. `bench` without `--in-process` starts the services
/// as `engram serve --services <one>` (`split::engram_exe` finds `engram`).
pub async fn run(settings: Settings, command: LabCommand) -> anyhow::Result<()> {
    match command {
        LabCommand::Eval { dataset } => eval(settings, dataset).await,
        LabCommand::Tune {
            out,
            samples,
            skip_rerank,
            limit,
            ranker_out,
        } => {
            let files = TuneFiles {
                out: &out,
                samples_opt: samples.as_deref(),
                ranker_opt: ranker_out.as_deref(),
            };
            tune(settings, files, limit, skip_rerank).await
        }
        LabCommand::Ranker {
            action:
                RankerAction::Train {
                    tenant,
                    out,
                    all_features,
                    identity_share,
                },
        } => {
            let opts = crate::ranker::TrainOptions {
                tenant_opt: tenant,
                tenants: Vec::new(),
                since_opt: None,
                out,
                all_features,
                identity_share,
            };
            ranker_train(settings, &opts).await
        }
        LabCommand::Bench {
            memories,
            queries,
            concurrency,
            json,
            in_process,
            ingest_only,
            profile,
            corpus,
        } => {
            let shape = BenchShape {
                memories,
                queries,
                concurrency,
                in_process,
                ingest_only,
                profile_opt: profile,
                corpus,
            };
            bench(settings, shape, json).await
        }
        LabCommand::Soak {
            seconds,
            soak_seconds,
            qps,
            only,
            cross_encoder,
            soak_growing,
            flood_workers,
            attacks,
            flood_nice,
        } => {
            let defaults = crate::soak::SoakArgs::default();
            let args = crate::soak::SoakArgs {
                seconds,
                soak_seconds,
                qps,
                scenarios: only,
                cross_encoder,
                growing: soak_growing,
                flood_workers,
                flood_nice,
                attacks: if attacks.is_empty() {
                    defaults.attacks.clone()
                } else {
                    crate::soak::checked_attacks(attacks)?
                },
                ..defaults
            };
            crate::soak::run(settings, args).await
        }
    }
}

/// What `engram eval` measures.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum EvalDataset {
    /// 2WikiMultihopQA: HippoRAG's corpus and questions (dev half by default).
    #[command(name = "2wiki")]
    TwoWiki(CorpusFiles),
    /// LoCoMo conversations: one tenant per conversation, one memory per turn.
    Locomo {
        #[arg(long)]
        data: Option<PathBuf>,
        #[arg(long, default_value = "0-4")]
        conversations: String,
        #[command(flatten)]
        common: EvalCommon,
    },
    /// MuSiQue: corpus = the questions' paragraphs, gold = is_supporting.
    Musique {
        #[arg(long)]
        questions: Option<PathBuf>,
        /// HippoRAG's OpenIE output: entities and triples supplied at ingest.
        #[arg(long)]
        openie: Option<PathBuf>,
        #[command(flatten)]
        common: EvalCommon,
    },
    /// HotpotQA (HippoRAG's train sample): gold = supporting-fact titles.
    Hotpotqa(CorpusFiles),
    /// LongMemEval: one tenant per question, one memory per haystack turn,
    /// gold = the `has_answer` turns. Only a one-record sample ships, so
    /// point --data at your copy of the full set.
    Longmemeval {
        /// Default: <shared>/data/longmemeval/longmemeval_single.json.
        #[arg(long)]
        data: Option<PathBuf>,
        #[command(flatten)]
        common: EvalCommon,
    },
    /// Calibrates `nothing_relevant`: LoCoMo 0–4 and 2Wiki questions asked
    /// of their own tenant and of one that does not hold their answer.
    Abstain {
        /// Questions per LoCoMo conversation and from 2Wiki.
        #[arg(long, default_value_t = 150)]
        limit: usize,
    },
    /// What is true now: ordered fact streams and assistants' notes
    /// (lab/data/current/*.jsonl unless --data is given), each in a tenant
    /// of its own: current fact at #1, stale at #1, past, many-valued,
    /// chains and abstention per set (current_eval.rs).
    Current {
        /// Set files or folders of them.
        #[arg(long)]
        data: Vec<PathBuf>,
        #[arg(long)]
        json: bool,
        /// Print every question whose #1 is not gold, with its top 3.
        #[arg(long)]
        verbose: bool,
        /// Write each answer as a JSON line here (records with their
        /// event time, fused score, query cosine, strategy ranks and embedding).
        #[arg(long)]
        dump: Option<PathBuf>,
    },
    /// Write-time update detection: precision / recall per domain on the
    /// labelled pairs of lab/data/updates_dev.jsonl (the committed copy
    /// unless --data is given), at `search.update_threshold` and a sweep.
    Updates {
        #[arg(long)]
        data: Option<PathBuf>,
        #[arg(long)]
        json: bool,
        /// Also write every pair with its cosine as JSON lines to this
        /// file (to study features outside the build).
        #[arg(long)]
        dump: Option<PathBuf>,
        /// Fit the detector's model on all the pairs and print it as the
        /// Rust source of `search_svc::updates::MODEL` (on stderr).
        #[arg(long)]
        fit: bool,
    },
}

// The arguments of a data set in HippoRAG's layout: a corpus file and a
// questions file.
#[derive(Debug, Clone, clap::Args)]
pub struct CorpusFiles {
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    #[arg(long)]
    pub questions: Option<PathBuf>,
    #[command(flatten)]
    pub common: EvalCommon,
}

impl CorpusFiles {
    /// The files given, else these defaults under `<shared>/data`.
    fn paths(&self, corpus: &str, questions: &str) -> (PathBuf, PathBuf) {
        let or = |given: &Option<PathBuf>, default| {
            given
                .clone()
                .unwrap_or_else(|| crate::eval::data_path(default))
        };
        (or(&self.corpus, corpus), or(&self.questions, questions))
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct EvalCommon {
    /// Print one JSON object (the contract in docs/benchmarks.md).
    #[arg(long)]
    pub json: bool,
    /// Only the first N questions (per conversation for LoCoMo; LongMemEval
    /// has one per record, so its first N records).
    #[arg(long)]
    pub limit: Option<usize>,
    /// Concurrent queries for the single-strategy settings (the pipeline
    /// setting always runs one at a time so its latency is clean).
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Also ask every question through RetrieveAgentic (rule-based
    /// decomposition, reasoning_effort medium), reported as `agentic`.
    #[arg(long)]
    pub agentic: bool,
    /// The agentic request's `mode` (auto, keyword, vector, hybrid; empty =
    /// the API's default, auto).
    #[arg(long, default_value = "")]
    pub agentic_mode: String,
    /// Write one JSON line per question and setting here: the ranked corpus
    /// indices with scores and text, the gold and the route (for
    /// prototyping a ranking change outside the service).
    #[arg(long)]
    pub dump: Option<PathBuf>,
    /// After the eval, replay every question through the public API and
    /// send its gold memories as helpful (the rest as not) through the real
    /// Feedback RPC, then train the Stage 4 ranker from that feedback and
    /// write it here; evaluate it on another set with
    /// `ENGRAM__PIPELINE__RANKER__MODEL_PATH_OPT=FILE engram eval <other>`.
    #[arg(long)]
    pub feedback_out: Option<PathBuf>,
    /// With --feedback-out: fit every feature, not only the two that
    /// transfer across corpora.
    #[arg(long)]
    pub all_features: bool,
}

/// (api key, tenant, agent, trust): one fresh key per evaluation tenant.
type TenantKey = (String, String, String, String);

fn tenant_keys<'a>(
    parts: impl Iterator<Item = &'a crate::eval::Part>,
    agent: &str,
) -> Vec<TenantKey> {
    parts
        .map(|p| {
            (
                stack::random_token(),
                p.tenant.clone(),
                agent.to_string(),
                "sensitive".to_string(),
            )
        })
        .collect()
}

/// eval / tune: every service on ephemeral ports, only the given keys.
fn keyed_stack(keys: &[TenantKey]) -> StackOptions {
    StackOptions {
        ephemeral_ports: true,
        dev_api_key: false,
        extra_keys: keys.to_vec(),
        ..Default::default()
    }
}

/// `engram eval`: an in-process stack on ephemeral ports (the persistent
/// embedded data dir, so corpora are reused), one key per eval tenant.
async fn eval(settings: Settings, dataset: EvalDataset) -> anyhow::Result<()> {
    use crate::eval as ev;
    let (name, parts, common) = match dataset {
        EvalDataset::Abstain { limit } => return abstain(settings, limit).await,
        EvalDataset::Current {
            data,
            json,
            verbose,
            dump,
        } => {
            return crate::current_eval::run(settings, data, json, verbose, dump).await;
        }
        EvalDataset::Updates {
            data,
            json,
            dump,
            fit,
        } => {
            let (data, dump) = (data.as_deref(), dump.as_deref());
            return crate::updates_eval::run(settings, data, json, dump, fit).await;
        }
        EvalDataset::TwoWiki(files) => {
            let (c, q) = files.paths(
                "hipporag/2wikimultihopqa_corpus.json",
                "hipporag/2wiki_dev.jsonl",
            );
            let part = ev::load_2wiki(&c, &q, files.common.limit)?;
            ("2wiki", vec![part], files.common)
        }
        EvalDataset::Locomo {
            data,
            conversations,
            common,
        } => {
            let d = data.unwrap_or_else(|| ev::data_path("locomo/locomo10.json"));
            let (lo, hi) = ev::parse_range(&conversations)?;
            ("locomo", ev::load_locomo(&d, lo, hi, common.limit)?, common)
        }
        EvalDataset::Musique {
            questions,
            openie,
            common,
        } => {
            let q = questions.unwrap_or_else(|| ev::data_path("hipporag/musique_train.json"));
            (
                "musique",
                vec![ev::load_musique(&q, openie.as_deref(), common.limit)?],
                common,
            )
        }
        EvalDataset::Hotpotqa(files) => {
            let (c, q) = files.paths(
                "hipporag/hotpotqa_train_corpus.json",
                "hipporag/hotpotqa_train.json",
            );
            let part = ev::load_hotpotqa(&c, &q, files.common.limit)?;
            ("hotpotqa", vec![part], files.common)
        }
        EvalDataset::Longmemeval { data, common } => {
            let d = data.unwrap_or_else(|| ev::data_path("longmemeval/longmemeval_single.json"));
            let parts = crate::longmemeval::load(&d, common.limit)?;
            ("longmemeval", parts, common)
        }
    };
    let progress = !common.json;
    let keys = tenant_keys(parts.iter(), "eval");
    let stack = Stack::start(settings, keyed_stack(&keys)).await?;
    // Feedback this run sends is what --feedback-out trains on.
    let started = chrono::Utc::now();
    let result = async {
        let uri = stack.gateway_uri().context("no gateway")?;
        let mut clients = std::collections::HashMap::new();
        for (key, tenant, _, _) in &keys {
            clients.insert(tenant.clone(), Client::connect(&uri, key).await?);
        }
        let mut tally = ev::Tally::default();
        let mut dump_opt = (common.dump.as_ref())
            .map(|path| {
                let file = std::fs::File::create(path);
                file.with_context(|| format!("--dump {}", path.display()))
            })
            .transpose()?
            .map(std::io::BufWriter::new);
        for part in &parts {
            let client = clients.get_mut(&part.tenant).context("client")?;
            let (ingested, secs) = ev::ensure_ingested(client, part, progress).await?;
            if ingested {
                tracing::info!(tenant = %part.tenant, docs = part.docs.len(), secs, rate = part.docs.len() as f64 / secs.max(1e-9), "ingested corpus");
            }
            // Also after a restart: graph-svc loads a tenant on first use.
            wait_for_graph(client, part).await;
            ev::run_part(
                &clients,
                part,
                &mut tally,
                common.concurrency.max(1),
                common.agentic.then_some(common.agentic_mode.as_str()),
                dump_opt.as_mut().map(|w| w as &mut dyn std::io::Write),
                progress,
            )
            .await?;
            if common.feedback_out.is_some() {
                let client = clients.get(&part.tenant).context("client")?;
                ev::send_gold_feedback(client, part).await?;
            }
        }
        if let Some(w) = dump_opt.as_mut() {
            std::io::Write::flush(w).context("--dump")?;
        }
        if let Some(out) = &common.feedback_out {
            let opts = crate::ranker::TrainOptions {
                tenant_opt: None,
                tenants: parts.iter().map(|p| p.tenant.clone()).collect(),
                since_opt: Some(started),
                out: out.clone(),
                all_features: common.all_features,
                identity_share: 2.0,
            };
            let url = stack.database_url_opt().context("no database")?;
            let report = train_on(url, &opts).await?;
            eprintln!("ranker trained from feedback: {report:?}");
        }
        anyhow::Ok(tally)
    }
    .await;
    stack.shutdown().await;
    let tally = result?;
    if common.json {
        outln!("{}", ev::report_json(name, &tally))?;
    } else {
        out::print(&ev::report_table(name, &tally))?;
    }
    Ok(())
}

/// `engram tune`: the dev halves of every data set through an in-process
/// stack, the per-route fusion weights fitted offline (tune.rs), written to
/// `out` as a config file; prints the per-data-set report as JSON.
async fn tune(
    settings: Settings,
    files: TuneFiles<'_>,
    limit_opt: Option<usize>,
    skip_rerank: bool,
) -> anyhow::Result<()> {
    use crate::eval as ev;
    let TuneFiles {
        out,
        samples_opt,
        ranker_opt,
    } = files;
    let mut sets: Vec<(&'static str, Vec<ev::Part>)> = vec![
        (
            "2wiki",
            vec![ev::load_2wiki(
                &ev::data_path("hipporag/2wikimultihopqa_corpus.json"),
                &ev::data_path("hipporag/2wiki_dev.jsonl"),
                limit_opt,
            )?],
        ),
        (
            "locomo",
            ev::load_locomo(&ev::data_path("locomo/locomo10.json"), 0, 4, limit_opt)?,
        ),
        (
            "musique",
            vec![ev::load_musique(
                &ev::data_path("hipporag/musique_train.json"),
                None,
                limit_opt,
            )?],
        ),
        (
            "hotpotqa",
            vec![ev::load_hotpotqa(
                &ev::data_path("hipporag/hotpotqa_train_corpus.json"),
                &ev::data_path("hipporag/hotpotqa_train.json"),
                limit_opt,
            )?],
        ),
    ];
    let keys = tenant_keys(sets.iter().flat_map(|(_, parts)| parts.iter()), "tune");
    let default_k = settings.pipeline.rrf_k;
    let current = settings.pipeline.weights.clone();
    let stack = Stack::start(settings.clone(), keyed_stack(&keys)).await?;
    let result = async {
        let uri = stack.gateway_uri().context("no gateway")?;
        let graph_uri = stack
            .addr(Service::Graph)
            .map(|a| format!("http://{a}"))
            .context("no graph-svc")?;
        let token = stack
            .settings
            .auth
            .internal_token_opt
            .clone()
            .unwrap_or_default();
        let mut samples = Vec::new();
        for (name, parts) in &mut sets {
            for part in parts.iter() {
                let (key, ..) = keys
                    .iter()
                    .find(|(_, t, ..)| *t == part.tenant)
                    .context("key")?;
                let mut client = Client::connect(&uri, key).await?;
                ev::ensure_ingested(&mut client, part, true).await?;
                // Also after a restart: graph-svc loads a tenant on first use.
                wait_for_graph(&mut client, part).await;
                let s = crate::tune::collect(&client, &graph_uri, &token, &settings, name, part)
                    .await?;
                eprintln!("  {name} {}: {} questions collected", part.tenant, s.len());
                samples.extend(s);
            }
        }
        let fits = crate::tune::fit(&samples, &current, default_k);
        let tuned = crate::tune::to_weights(&fits, &current);
        // Stage 3/4 on the fitted fusion: the cross-encoder over its top 20.
        let rerank_opt = match (skip_rerank, stack.addr(Service::Rerank)) {
            (false, Some(addr)) => {
                let parts: Vec<&ev::Part> = sets.iter().flat_map(|(_, p)| p.iter()).collect();
                eprintln!(
                    "  scoring the fused top {} with the cross-encoder",
                    crate::tune::RERANK_DEPTH
                );
                let rr = crate::tune::collect_relevance(
                    &format!("http://{addr}"),
                    &token,
                    &samples,
                    &parts,
                    &tuned,
                    default_k,
                )
                .await?;
                let fit = crate::tune::fit_rerank(&samples, &rr);
                let report = crate::tune::rerank_report(&samples, &rr, &fit);
                let cross = crate::tune::rerank_cross_fitted(&samples, &rr);
                Some((
                    fit,
                    serde_json::json!({"in_sample": report, "cross_fitted": cross}),
                ))
            }
            _ => None,
        };
        anyhow::Ok((samples, fits, tuned, rerank_opt))
    }
    .await;
    stack.shutdown().await;
    let (samples, fits, tuned, rerank_opt) = result?;
    if let Some(path) = samples_opt {
        let lines: Vec<String> = samples.iter().map(|s| s.to_json().to_string()).collect();
        std::fs::write(path, lines.join("\n"))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let mut toml = crate::tune::to_toml(&fits);
    if let Some((f, _)) = &rerank_opt {
        toml.push_str(&format!(
            "\n[pipeline]\nrerank_top_n = {}\nrelevance_threshold = {}\nrerank_blend_k = {}\nrerank_weight = {}\n",
            f.top_n, f.threshold, f.blend_k, f.weight
        ));
    }
    std::fs::write(out, toml).with_context(|| format!("cannot write {}", out.display()))?;
    let report = serde_json::json!({
        "config": out.display().to_string(),
        "fits": fits.iter().map(|f| serde_json::json!({
            "route": format!("{:?}", f.route),
            "questions": f.questions,
            "weights": f.weights,
            "rrf_k": f.k,
        })).collect::<Vec<_>>(),
        "before": crate::tune::report(&samples, &current, default_k),
        "after": crate::tune::report(&samples, &tuned, default_k),
        "cross_fitted": crate::tune::cross_fitted(&samples, &current, default_k),
        "ranker": ranker_report(&samples, &sets, &tuned, default_k, ranker_opt)?,
        "rerank": rerank_opt.as_ref().map(|(f, r)| serde_json::json!({
            "top_n": f.top_n,
            "relevance_threshold": f.threshold,
            "blend_k": f.blend_k,
            "weight": f.weight,
            "by_dataset": r,
        })),
    });
    outln!("{}", serde_json::to_string_pretty(&report)?)?;
    Ok(())
}

/// `engram ranker train`: the model from the feedback in this deployment's
/// Postgres (embedded or DATABASE_URL), written to `opts.out`.
async fn ranker_train(
    settings: Settings,
    opts: &crate::ranker::TrainOptions,
) -> anyhow::Result<()> {
    let db = engram_common::db::Database::open(&settings)
        .await
        .context("database")?;
    let result = crate::ranker::train_from_feedback(&db.pool, opts).await;
    db.close().await;
    let report = result?;
    outln!("{}", serde_json::to_string_pretty(&report)?)?;
    let c = &report.check;
    match c.winner {
        crate::ranker::Winner::New => eprintln!(
            "ranker: wrote {} ({}): {:.3} on {} held-out answers, {} {:.3}",
            opts.out.display(),
            report.version,
            c.new_quality,
            c.held_out,
            c.live,
            c.live_quality
        ),
        crate::ranker::Winner::Live => eprintln!(
            "ranker: kept {} ({}): the new model {:.3} on {} held-out answers, not above {:.3}",
            opts.out.display(),
            c.live,
            c.new_quality,
            c.held_out,
            c.live_quality
        ),
    }
    Ok(())
}

/// The ranker from the feedback the eval just sent (its own tenants,
/// since it started: another run's examples may share the database).
async fn train_on(
    url: &str,
    opts: &crate::ranker::TrainOptions,
) -> anyhow::Result<crate::ranker::TrainReport> {
    let pool = engram_common::db::connect(url, 2).await?;
    let report = crate::ranker::train_from_feedback(&pool, opts).await;
    pool.close().await;
    report
}

/// Where `engram tune` writes what it fitted.
struct TuneFiles<'a> {
    out: &'a std::path::Path,
    samples_opt: Option<&'a std::path::Path>,
    ranker_opt: Option<&'a std::path::Path>,
}

/// The Stage 4 ranker, leave-one-dataset-out over the candidates of the
/// fusion being shipped (`tuned`), and the fit on all four sets written
/// to `ranker_opt`.
fn ranker_report(
    samples: &[crate::tune::Sample],
    sets: &[(&'static str, Vec<crate::eval::Part>)],
    tuned: &engram_common::settings::FusionWeights,
    default_k: f32,
    ranker_opt: Option<&std::path::Path>,
) -> anyhow::Result<serde_json::Value> {
    let parts: Vec<&crate::eval::Part> = sets.iter().flat_map(|(_, p)| p.iter()).collect();
    let labelled = crate::ranker::label_all(samples, &parts, tuned, default_k)?;
    let all_features: Vec<&str> = retrieval_svc::lab::RANK_FEATURES.to_vec();
    let report = serde_json::json!({
        "shipped_features": crate::ranker::cross_fitted(&labelled, &crate::ranker::SHIPPED)?,
        "all_features": crate::ranker::cross_fitted(&labelled, &all_features)?,
    });
    if let Some(path) = ranker_opt {
        crate::ranker::write_models(&labelled, path)?;
    }
    Ok(report)
}

/// `engram eval abstain`: every question of its own tenant and of a foreign
/// one; prints the calibration report (lab/src/abstain.rs) as JSON.
async fn abstain(settings: Settings, limit: usize) -> anyhow::Result<()> {
    use crate::eval as ev;
    let mut parts = ev::load_locomo(&ev::data_path("locomo/locomo10.json"), 0, 4, Some(limit))?;
    let wiki = ev::load_2wiki(
        &ev::data_path("hipporag/2wikimultihopqa_corpus.json"),
        &ev::data_path("hipporag/2wiki_dev.jsonl"),
        Some(limit),
    )?;
    parts.push(wiki);
    let keys = tenant_keys(parts.iter(), "abstain");
    let configured = retrieval_svc::lab::Calibration {
        names: settings.pipeline.abstain.names_weight,
        terms: settings.pipeline.abstain.terms_weight,
        cosine: settings.pipeline.abstain.cosine_weight,
        threshold: settings.pipeline.abstain.threshold,
    };
    let stack = Stack::start(settings, keyed_stack(&keys)).await?;
    let result = async {
        let uri = stack.gateway_uri().context("no gateway")?;
        let mut clients = Vec::new();
        for (part, (key, ..)) in parts.iter().zip(&keys) {
            let mut client = Client::connect(&uri, key).await?;
            ev::ensure_ingested(&mut client, part, true).await?;
            wait_for_graph(&mut client, part).await;
            clients.push(client);
        }
        let conversations = parts.len() - 1;
        let mut rows = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let questions: Vec<String> = part.questions.iter().map(|q| q.text.clone()).collect();
            // LoCoMo: the next conversation; 2Wiki: the first conversation.
            let (dataset, foreign) = match i < conversations {
                true => ("locomo", (i + 1) % conversations),
                false => ("2wiki", 0),
            };
            rows.extend(crate::abstain::collect(&clients[i], dataset, true, &questions).await?);
            rows.extend(
                crate::abstain::collect(&clients[foreign], dataset, false, &questions).await?,
            );
            eprintln!(
                "  {dataset} {}: {} questions asked twice",
                part.tenant,
                questions.len()
            );
        }
        anyhow::Ok(rows)
    }
    .await;
    stack.shutdown().await;
    let rows = result?;
    let report = crate::abstain::report(&rows, &configured);
    outln!("{}", serde_json::to_string_pretty(&report)?)?;
    Ok(())
}

/// After a fresh ingest graph-svc rebuilds from change events; wait (up to
/// a minute) until a graph-only query for the first question answers.
async fn wait_for_graph(client: &mut Client, part: &crate::eval::Part) {
    let Some(q) = part.questions.first() else {
        return;
    };
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while tokio::time::Instant::now() < deadline {
        let req = RetrieveRequest {
            text: q.text.clone(),
            limit: Some(5),
            mode: RetrievalMode::Graph as i32,
            no_cache: true,
            ..Default::default()
        };
        if let Ok(r) = client.retrieval.retrieve(req).await
            && !r.into_inner().records.is_empty()
        {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    tracing::warn!(tenant = %part.tenant, "graph strategy still empty after ingest; continuing");
}

/// What `engram bench` was asked to run.
struct BenchShape {
    memories: usize,
    queries: usize,
    concurrency: usize,
    in_process: bool,
    ingest_only: bool,
    profile_opt: Option<PathBuf>,
    corpus: crate::bench::CorpusKind,
}

/// `engram bench`: one process per service (or all in this one with
/// `in_process`), a synthetic tenant, the query mix.
async fn bench(mut settings: Settings, shape: BenchShape, json: bool) -> anyhow::Result<()> {
    let BenchShape {
        memories,
        queries,
        concurrency,
        in_process,
        ingest_only,
        profile_opt,
        corpus,
    } = shape;
    if profile_opt.is_some() && !in_process {
        anyhow::bail!("--profile needs --in-process: the profiler samples this process");
    }
    if memories == 0 || queries == 0 {
        anyhow::bail!("--memories and --queries must be at least 1");
    }
    // The bench measures both: each query says whether it skips the
    // cross-encoder, so the stack must have it on.
    settings.pipeline.cross_encoder = true;
    // The repeated corpus keeps the tenant name its numbers were taken on.
    let tenant = match corpus {
        crate::bench::CorpusKind::Repeated => format!("bench-{memories}"),
        crate::bench::CorpusKind::Mixed => format!("bench-mixed-{memories}"),
    };
    let key = stack::random_token();
    let target = if in_process {
        let opts = StackOptions {
            ephemeral_ports: true,
            dev_api_key: false,
            extra_keys: vec![(
                key.clone(),
                tenant.clone(),
                "bench".into(),
                "sensitive".into(),
            )],
            ..Default::default()
        };
        crate::bench::Target::InProcess(Stack::start(settings, opts).await?)
    } else {
        crate::bench::Target::Split(crate::split::SplitStack::start(settings, &key, &tenant).await?)
    };
    let result = async {
        if ingest_only {
            return crate::bench::ingest_only(&target, 1000).await;
        }
        let mut client =
            Client::connect(&target.gateway_uri().context("no gateway")?, &key).await?;
        let args = crate::bench::BenchArgs {
            memories,
            queries,
            concurrency,
            base_texts: 2000,
            write_concurrency: 3,
            ingest_sample: 1000,
            corpus,
        };
        if let Some(out) = &profile_opt {
            return crate::bench::profile(&target, &mut client, &tenant, &args, out, !json).await;
        }
        crate::bench::run(&target, &mut client, &tenant, &args, !json).await
    }
    .await;
    target.shutdown().await;
    let report = result?;
    if json {
        outln!("{report}")?;
    } else {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}
