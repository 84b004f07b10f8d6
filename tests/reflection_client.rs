//! Reflection and health through clients that share no code with the server:
//! Python grpcio (always; pip-installed on first use) and `buf curl` (when
//! npm is on the machine). Both learn the engram API only through server
//! reflection, as an operator's grpcurl would.

use std::path::{Path, PathBuf};
use std::process::Output;

use engram::stack::Service;
use engram_tests::TestStack;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The external clients, installed by the same script `scripts/test` runs,
/// so plain `cargo test` works on a fresh checkout too. Returns the
/// `PYTHONPATH` for the probe and the buf binary if npm could provide one.
async fn ensure_clients(root: &Path) -> anyhow::Result<(PathBuf, Option<PathBuf>)> {
    let home = engram_tests::install_pytools(root).await?;
    let buf = home.join("node/node_modules/.bin/buf");
    Ok((home.join("pytools"), buf.is_file().then_some(buf)))
}

fn describe(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `buf curl` over plain HTTP/2 with reflection for the schema.
async fn buf_curl(
    buf: &Path,
    addr: std::net::SocketAddr,
    method: &str,
    body: &str,
    key_opt: Option<&str>,
) -> anyhow::Result<serde_json::Value> {
    let mut cmd = tokio::process::Command::new(buf);
    cmd.args(["curl", "--protocol", "grpc", "--http2-prior-knowledge"]);
    if let Some(key) = key_opt {
        cmd.args(["-H", &format!("authorization: Bearer {key}")]);
    }
    let out = cmd
        .args(["-d", body, &format!("http://{addr}/{method}")])
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "buf curl {method}: {}",
        describe(&out)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reflection_and_health_through_independent_clients() -> anyhow::Result<()> {
    let root = workspace_root();
    let (pytools, buf_opt) = ensure_clients(&root).await?;
    let ts = TestStack::start("sensitive").await?;
    let gw = ts
        .stack
        .addr(Service::Retrieval)
        .ok_or_else(|| anyhow::anyhow!("no gateway"))?;

    let t0 = std::time::Instant::now();
    let out = tokio::process::Command::new("python3")
        .arg(root.join("tests/py/grpc_probe.py"))
        .arg(gw.to_string())
        .arg(&ts.key)
        .env("PYTHONPATH", &pytools)
        .output()
        .await?;
    anyhow::ensure!(out.status.success(), "grpc_probe.py: {}", describe(&out));
    eprintln!("python grpcio probe took {:?}", t0.elapsed());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    for name in [
        "engram.v1.RetrievalService",
        "engram.v1.MemoryService",
        "grpc.health.v1.Health",
    ] {
        assert!(
            v["services"]
                .as_array()
                .is_some_and(|s| s.iter().any(|x| x == name)),
            "{name} not listed: {v}"
        );
    }
    let id = v["upsert"]["results"][0]["id"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("no upserted id in {v}"))?
        .to_string();
    let records = v["retrieve"]["records"]
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("no records in {v}"))?;
    let hit = records
        .iter()
        .find(|r| r["memory"]["id"] == id.as_str())
        .ok_or_else(|| anyhow::anyhow!("upserted {id} not retrieved: {v}"))?;
    assert!(
        hit["memory"]["content"]
            .as_str()
            .is_some_and(|c| c.contains("green tea")),
        "{hit}"
    );
    assert_eq!(hit["memory"]["tenantId"], ts.tenant.as_str(), "{hit}");

    // The same client with a key the server does not know: reflection and
    // health still answer (they are unauthenticated), the write is refused.
    let out = tokio::process::Command::new("python3")
        .arg(root.join("tests/py/grpc_probe.py"))
        .arg(gw.to_string())
        .arg("k-not-a-key")
        .env("PYTHONPATH", &pytools)
        .output()
        .await?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("UNAUTHENTICATED"),
        "bad key: {}",
        describe(&out)
    );

    // buf (Go, connect-go) when npm could install it: reflection v1 with its
    // own fallback, standard health, and the memory the probe wrote.
    match buf_opt {
        Some(buf) => {
            let h = buf_curl(
                &buf,
                gw,
                "grpc.health.v1.Health/Check",
                r#"{"service":"engram.v1.RetrievalService"}"#,
                None,
            )
            .await?;
            assert_eq!(h["status"], "SERVING", "{h}");
            let r = buf_curl(
                &buf,
                gw,
                "engram.v1.MemoryService/Get",
                &serde_json::json!({ "ids": [id] }).to_string(),
                Some(&ts.key),
            )
            .await?;
            assert!(r.to_string().contains("green tea"), "{r}");
            eprintln!("buf curl: health and get ok");
        }
        None => eprintln!("npm not available: buf curl skipped"),
    }
    ts.shutdown().await;
    Ok(())
}

/// The services reflection lists on `addr`, through v1 and through v1alpha
/// (grpcurl 1.8 speaks the latter).
async fn listed_services(addr: std::net::SocketAddr) -> anyhow::Result<[Vec<String>; 2]> {
    use tonic_reflection::pb::{v1, v1alpha};
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let req = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut s = v1::server_reflection_client::ServerReflectionClient::new(channel.clone())
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await?
        .into_inner();
    let v1_names = match s.message().await?.and_then(|r| r.message_response) {
        Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(l)) => {
            l.service.into_iter().map(|x| x.name).collect()
        }
        other => anyhow::bail!("v1: expected a service list, got {other:?}"),
    };
    let req = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut s = v1alpha::server_reflection_client::ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await?
        .into_inner();
    let alpha_names = match s.message().await?.and_then(|r| r.message_response) {
        Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(l)) => {
            l.service.into_iter().map(|x| x.name).collect()
        }
        other => anyhow::bail!("v1alpha: expected a service list, got {other:?}"),
    };
    Ok([v1_names, alpha_names])
}

/// Issue 24: reflection on the public port lists what the port answers,
/// not the internal services (Search, Listing, Graph, Rerank) that answer
/// Unimplemented there.
/// The gateway names its services in `ServeOptions::reflect`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reflection_on_the_public_port_lists_only_public_services() -> anyhow::Result<()> {
    let ts = TestStack::start("sensitive").await?;
    let gw = ts
        .stack
        .addr(Service::Retrieval)
        .ok_or_else(|| anyhow::anyhow!("no gateway"))?;
    let public = [
        "engram.v1.RetrievalService",
        "engram.v1.MemoryService",
        "engram.v1.WorkingMemoryService",
        "engram.v1.KnowledgeFoundryService",
        "grpc.health.v1.Health",
    ];
    for listed in listed_services(gw).await? {
        for name in public {
            assert!(listed.iter().any(|s| s == name), "{name} not in {listed:?}");
        }
        let internal: Vec<&String> = listed
            .iter()
            .filter(|s| s.starts_with("engram.") && !public.contains(&s.as_str()))
            .collect();
        assert!(
            internal.is_empty(),
            "the public port lists internal services: {internal:?}"
        );
    }
    ts.shutdown().await;
    Ok(())
}
