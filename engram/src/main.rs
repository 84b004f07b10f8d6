//! `engram`: run any set of services, the demo, ingest, query, eval, bench.
//! Commands live in the library (`engram::commands`); this file only parses.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "engram",
    version,
    about = "Retrieval for AI agents' long-term memory"
)]
struct Cli {
    /// TOML config file (default: ./engram.toml when present; env ENGRAM__SECTION__KEY overrides).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// All services in one process on the embedded Postgres (or DATABASE_URL).
    Up,
    /// Any subset of services: --services retrieval,search,graph,rerank.
    Serve {
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "retrieval,search,graph,rerank"
        )]
        services: Vec<String>,
    },
    /// Start everything, load a small sample, run a few queries, print them.
    Demo,
    /// Load a JSONL file of memories (and edges) through the gateway.
    Ingest {
        file: PathBuf,
        #[command(flatten)]
        conn: engram::commands::Conn,
    },
    /// Recall and latency through the public API (see docs/benchmarks.md).
    Eval {
        #[command(subcommand)]
        dataset: engram::commands::EvalDataset,
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
    },
    /// Ask the gateway one question.
    Query {
        text: String,
        #[arg(long, default_value_t = 10)]
        limit: u32,
        /// auto | simple | multi_hop | exploratory | vector | keyword | graph | hybrid
        #[arg(long, default_value = "auto")]
        mode: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: engram::commands::Conn,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match engram_common::Settings::load(cli.config.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("engram: {e}");
            return ExitCode::from(2);
        }
    };
    engram_common::telemetry::init(&settings.log);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("engram: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    use engram::commands;
    let result = rt.block_on(async move {
        match cli.command {
            Command::Up => commands::up(settings, None).await,
            Command::Serve { services } => commands::up(settings, Some(services)).await,
            Command::Demo => commands::demo(settings).await,
            Command::Ingest { file, conn } => commands::ingest(settings, &file, conn).await,
            Command::Eval { dataset } => commands::eval(settings, dataset).await,
            Command::Tune {
                out,
                samples,
                skip_rerank,
                limit,
            } => commands::tune(settings, &out, samples.as_deref(), limit, skip_rerank).await,
            Command::Bench {
                memories,
                queries,
                concurrency,
                json,
                in_process,
            } => commands::bench(settings, memories, queries, concurrency, json, in_process).await,
            Command::Query {
                text,
                limit,
                mode,
                json,
                conn,
            } => commands::query(settings, &text, limit, &mode, json, conn).await,
        }
    });
    // Flush the spans still batched for the OTLP exporter (no-op without it).
    engram_common::telemetry::shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("engram: {e:#}");
            ExitCode::FAILURE
        }
    }
}
