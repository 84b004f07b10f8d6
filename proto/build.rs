//! Compiles the .proto files with protox (pure Rust), so a fresh machine
//! needs no `protoc`. The descriptor set is also embedded for server reflection.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "engram/v1/common.proto",
        "engram/v1/retrieval.proto",
        "engram/v1/search.proto",
        "engram/v1/graph.proto",
        "engram/v1/rerank.proto",
        "engram/v1/foundry.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["."])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("engram_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
