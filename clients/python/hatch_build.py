"""Generates the gRPC stubs into the wheel at build time.

The public protos (common, retrieval, foundry; the internal search, graph and
rerank services are not part of the client) are compiled with grpcio-tools
into a scratch directory, their `engram.v1` imports rewritten to live under
`engram_client._pb`, and the results force-included into the wheel. Nothing
generated is ever written into the source tree.

The protos come from `proto/` beside this file when building from an sdist
(which carries a copy), else from the repository's `../../proto`.
"""

import os
import re
import shutil
import sys
import tempfile

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PUBLIC_PROTOS = ["common.proto", "retrieval.proto", "foundry.proto"]
PACKAGE = "engram_client/_pb"
_IMPORT = re.compile(r"^from engram\.v1 import ", re.MULTILINE)


def _proto_root(root):
    for cand in (os.path.join(root, "proto"), os.path.join(root, "..", "..", "proto")):
        if all(os.path.isfile(os.path.join(cand, "engram", "v1", p)) for p in PUBLIC_PROTOS):
            return os.path.abspath(cand)
    raise RuntimeError(
        f"engram protos not found under {root}/proto or {root}/../../proto "
        f"(need engram/v1/{', '.join(PUBLIC_PROTOS)})"
    )


def generate(proto_root, out_dir):
    """Runs protoc; returns {path in wheel: generated file}."""
    from grpc_tools import protoc

    try:
        from importlib.resources import files

        wkt = str(files("grpc_tools") / "_proto")
    except Exception:  # pragma: no cover - very old importlib
        import grpc_tools

        wkt = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    os.makedirs(out_dir, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"-I{wkt}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
    ] + [os.path.join(proto_root, "engram", "v1", p) for p in PUBLIC_PROTOS]
    if protoc.main(args) != 0:
        raise RuntimeError(f"grpc_tools.protoc failed: {' '.join(args)}")
    gen = os.path.join(out_dir, "engram", "v1")
    mapping = {}
    for name in sorted(os.listdir(gen)):
        path = os.path.join(gen, name)
        with open(path) as f:
            text = f.read()
        text = _IMPORT.sub("from engram_client._pb import ", text)
        with open(path, "w") as f:
            f.write(text)
        mapping[f"{PACKAGE}/{name}"] = path
    init = os.path.join(gen, "__init__.py")
    with open(init, "w") as f:
        f.write('"""Generated at build time from proto/engram/v1 (public services only)."""\n')
    mapping[f"{PACKAGE}/__init__.py"] = init
    return mapping


class CustomBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version, build_data):
        if self.target_name != "wheel":
            return
        self._scratch = tempfile.mkdtemp(prefix="engram-client-pb-")
        mapping = generate(_proto_root(self.root), self._scratch)
        for dest, src in mapping.items():
            build_data["force_include"][src] = dest
        # The stubs are pure Python, but keep the wheel honest about needing
        # the protobuf runtime it was generated for.
        build_data.setdefault("pure_python", True)

    def finalize(self, version, build_data, artifact_path):
        scratch = getattr(self, "_scratch", None)
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":  # manual check: python hatch_build.py OUTDIR
    out = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
    for k, v in generate(_proto_root(os.path.dirname(os.path.abspath(__file__))), out).items():
        print(k, "<-", v)
