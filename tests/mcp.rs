//! `engram mcp` (engram/src/mcp.rs) driven by the official MCP Python SDK
//! (`mcp` 2.3.0, pinned with its whole dependency tree by
//! tests/py/install_mcp.py) over both transports, against the real stack:
//! tools listed with schemas and descriptions, each tool called and its
//! content checked, bad arguments returned as tool errors naming them
//! (tests/py/mcp_probe.py).
//!
//! No libtest harness (`harness = false`): the SDK's stdio client spawns
//! the server as a process, and this binary is that process when started
//! with [`CHILD`]: it then runs `engram::mcp::run`, what `engram mcp`
//! runs, on its stdin/stdout, with the key from ENGRAM_API_KEY. A cargo
//! build of the `engram` binary from inside a test would wait on the lock
//! of the build that runs it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use engram::mcp::{EngramMcp, McpArgs};
use engram::memories::KeyArgs;
use engram_tests::TestStack;

/// argv[1] that makes this binary the stdio MCP server; argv[2] the gateway URI.
const CHILD: &str = "__engram_mcp_stdio_server__";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn engram_home() -> PathBuf {
    std::env::var_os("ENGRAM_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| engram_common::db::test_settings().home)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mcp: no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.get(1).map(String::as_str) == Some(CHILD) {
        let key = KeyArgs {
            addr: args.get(2).cloned(),
            api_key: std::env::var("ENGRAM_API_KEY").ok(),
            tenant: None,
        };
        let settings = engram_common::db::test_settings();
        let served = rt.block_on(engram::mcp::run(
            settings,
            McpArgs {
                http: None,
                allow_origins: Vec::new(),
                key,
            },
        ));
        return match served {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("engram mcp (test child): {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    // Like libtest: `--list` lists, a filter that names nothing here skips.
    if args.iter().any(|a| a == "--list") {
        println!("mcp_over_stdio_and_streamable_http: test");
        return ExitCode::SUCCESS;
    }
    let filters: Vec<&String> = args
        .iter()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let name = "mcp_over_stdio_and_streamable_http";
    if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
        println!("running 0 tests");
        return ExitCode::SUCCESS;
    }
    println!("running 1 test");
    match rt.block_on(mcp_over_stdio_and_streamable_http()) {
        Ok(()) => {
            println!("test {name} ... ok");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("test {name} ... FAILED\n{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Installs the pinned SDK; returns its directory for `PYTHONPATH`.
async fn install_sdk(root: &Path) -> anyhow::Result<String> {
    let out = tokio::process::Command::new("python3")
        .arg(root.join("tests/py/install_mcp.py"))
        .arg(engram_home())
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "install_mcp.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

/// Runs the probe; returns its JSON summary.
async fn probe(
    root: &Path,
    pythonpath: &str,
    key: &str,
    args: &[&str],
) -> anyhow::Result<serde_json::Value> {
    let out = tokio::process::Command::new("python3")
        .arg(root.join("tests/py/mcp_probe.py"))
        .args(args)
        .env("PYTHONPATH", pythonpath)
        .env("ENGRAM_API_KEY", key)
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "mcp_probe.py {args:?}: exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout)?;
    Ok(serde_json::from_str(line.trim())?)
}

fn check_summary(transport: &str, v: &serde_json::Value) -> anyhow::Result<()> {
    let tools = v["tools"].as_array().map(Vec::len).unwrap_or_default();
    anyhow::ensure!(tools == 5, "{transport}: tools {v}");
    let errors = v["errors"].as_array().map(Vec::len).unwrap_or_default();
    anyhow::ensure!(errors == 7, "{transport}: bad-argument checks {v}");
    println!("{transport}: {v}");
    Ok(())
}

async fn mcp_over_stdio_and_streamable_http() -> anyhow::Result<()> {
    let root = workspace_root();
    let pythonpath = install_sdk(&root).await?;
    let ts = TestStack::start("sensitive").await?;
    let uri = ts
        .stack
        .gateway_uri()
        .ok_or_else(|| anyhow::anyhow!("no gateway"))?;
    let result = async {
        // stdio: the SDK spawns this binary as the server.
        let exe = std::env::current_exe()?;
        let exe = exe.to_string_lossy();
        let ns = format!("mcp-stdio-{}", uuid::Uuid::new_v4().simple());
        let v = probe(
            &root,
            &pythonpath,
            &ts.key,
            &["stdio", &ns, &exe, CHILD, &uri],
        )
        .await?;
        check_summary("stdio", &v)?;

        // Streamable HTTP on loopback, served in this process.
        let server = EngramMcp::new(&uri, &ts.key)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/mcp", listener.local_addr()?);
        let stop = tokio_util::sync::CancellationToken::new();
        let stopped = stop.clone();
        let http = tokio::spawn(engram::mcp::serve_http_on(server, listener, async move {
            stopped.cancelled().await
        }));
        let ns = format!("mcp-http-{}", uuid::Uuid::new_v4().simple());
        let v = probe(&root, &pythonpath, "", &["http", &ns, &url]).await;
        stop.cancel();
        http.await??;
        check_summary("streamable HTTP", &v?)?;

        // Anyone who reaches the HTTP port acts with the server's key, so
        // it is served on loopback only.
        let open = tokio::net::TcpListener::bind("0.0.0.0:0").await?;
        let server = EngramMcp::new(&uri, &ts.key)?;
        let refused = engram::mcp::serve_http_on(server, open, async {}).await;
        let e = refused
            .err()
            .ok_or_else(|| anyhow::anyhow!("HTTP on 0.0.0.0 was served"))?;
        anyhow::ensure!(e.to_string().contains("loopback"), "{e}");
        anyhow::Ok(())
    }
    .await;
    ts.shutdown().await;
    result
}
