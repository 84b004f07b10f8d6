"""Builds and installs the Python client (clients/python) for its tests.

Run by tests/python_client.rs before pytest, so plain `cargo test` works on a
fresh checkout. Two project-local directories under ENGRAM_HOME:

  pyclient-tools/  the build and test tools, exact pins, dependencies
                   included, installed with --no-deps (reproducible; only
                   PyPI is used), reused while the pins are unchanged;
  pyclient/site/   the engram-retrieval wheel built from clients/python with
                   `python -m build --wheel --no-isolation` (stubs generated
                   from proto/ by the package's own build hook) and
                   installed with pip --target; rebuilt only when the
                   client's sources, the protos or the pins change.

Both are replaced atomically (built beside, then renamed): a half-finished
install is never seen, and a concurrent installer with the same inputs is
harmless. Warm runs only hash a few files.

Usage: python3 tests/py/install_client.py ENGRAM_HOME
Prints one JSON line: {"pythonpath": "<site>:<tools>", "wheel": "<file>"}.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ beside the scripts
from _pinned import fresh_tmp, install_pins, is_current, pip_target, read, swap_in

# The closure of grpcio, grpcio-tools, protobuf, hatchling, build, pytest,
# pytest-asyncio, and the frameworks the integrations are tested with
# (langchain-core, llama-index-core), for CPython 3.11 on Linux, resolved
# once and pinned.
PINS = [
    "aiohappyeyeballs==2.7.1",
    "aiohttp==3.14.5",
    "aiosignal==1.4.0",
    "aiosqlite==0.22.1",
    "annotated-types==0.8.0",
    "anyio==4.16.0",
    "attrs==26.1.0",
    "banks==2.5.1",
    "build==1.6.1",
    "certifi==2026.10.19.post1",
    "charset-normalizer==3.5.3",
    "click==8.5.1",
    "cloudpickle==3.1.3",
    "colorama==0.4.6",
    "dataclasses-json==0.6.7",
    "defusedxml==0.7.1",
    "deprecated==1.3.1",
    "dirtyjson==1.0.8",
    "distro==1.9.0",
    "filetype==1.2.0",
    "frozenlist==1.8.0",
    "fsspec==2026.9.0",
    "greenlet==3.5.6",
    "griffe==2.4.1",
    "griffecli==2.4.1",
    "griffelib==2.4.1",
    "grpcio==1.85.1",
    "grpcio-tools==1.85.1",
    "h11==0.16.0",
    "hatchling==1.33.0",
    "httpcore==1.0.9",
    "httpcore2==2.16.2",
    "httpx==0.28.1",
    "httpx2==2.16.2",
    "idna==3.20",
    "iniconfig==2.3.1",
    "jinja2==3.1.6",
    "joblib==1.6.0",
    "jsonpatch==1.48",
    "jsonpointer==3.12",
    "langchain-core==1.8.3",
    "langchain-protocol==0.0.20",
    "langsmith==0.15.1",
    "llama-index-core==0.14.25",
    "llama-index-instrumentation==0.6.0",
    "llama-index-workflows==2.26.1",
    "markupsafe==3.0.4",
    "marshmallow==3.26.2",
    "multidict==7.2.1",
    "mypy-extensions==1.2.0",
    "nest-asyncio==1.6.0",
    "networkx==3.6.1",
    "nltk==3.10.4",
    "numpy==2.4.6",
    "orjson==3.13.0",
    "packaging==26.3",
    "pathspec==1.1.1",
    "pillow==13.0.0",
    "platformdirs==4.14.8",
    "pluggy==1.7.0",
    "propcache==0.5.4",
    "protobuf==7.36.2",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "pygments==2.21.0",
    "pyproject-hooks==1.3.3",
    "pytest==9.2.0",
    "pytest-asyncio==1.5.0",
    "pyyaml==6.0.4",
    "regex==2026.11.19",
    "requests==2.34.2",
    "requests-toolbelt==1.0.0",
    "setuptools==84.2.1",
    "sniffio==1.3.1",
    "sqlalchemy==2.1.9",
    "tenacity==9.2.1",
    "tiktoken==0.14.0",
    "tinytag==2.3.2",
    "tomlkit==0.15.2",
    "tqdm==4.70.1",
    "trove-classifiers==2026.9.21.13",
    "truststore==0.10.5",
    "typing-extensions==4.16.0",
    "typing-inspect==0.9.0",
    "typing-inspection==0.4.5",
    "urllib3==2.8.0",
    "uuid-utils==0.19.0",
    "websockets==17.4",
    "wrapt==2.5.2",
    "xxhash==4.1.0",
    "yarl==1.25.1",
    "zstandard==0.25.0",
]
MARKER = ".engram-pyclient"
# What goes into the wheel: sources, build config, the public protos.
PACKAGE_INPUTS = ["pyproject.toml", "hatch_build.py", "README.md", "src"]
PROTOS = ["common.proto", "retrieval.proto", "foundry.proto"]


def install_tools(home):
    return install_pins(os.path.join(home, "pyclient-tools"), PINS, MARKER)


def fingerprint(client_dir, proto_dir):
    """sha256 over the pins and every input of the wheel."""
    h = hashlib.sha256("\n".join(PINS).encode())
    files = []
    for name in PACKAGE_INPUTS:
        path = os.path.join(client_dir, name)
        if os.path.isdir(path):
            for d, dirs, fs in os.walk(path):
                dirs[:] = sorted(x for x in dirs if x != "__pycache__")
                files += [os.path.join(d, f) for f in sorted(fs) if not f.endswith(".pyc")]
        else:
            files.append(path)
    files += [os.path.join(proto_dir, "engram", "v1", p) for p in PROTOS]
    for path in files:
        h.update(os.path.relpath(path, client_dir).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read())
        h.update(b"\0")
    return h.hexdigest()


def install_client(home, tools, client_dir, proto_dir):
    target = os.path.join(home, "pyclient", "site")
    wanted = fingerprint(client_dir, proto_dir)
    if is_current(target, MARKER, wanted):
        return target, read(os.path.join(target, ".wheel")) or ""
    tmp = fresh_tmp(target)
    dist = os.path.join(home, "pyclient", "dist")
    os.makedirs(dist, exist_ok=True)
    out = tempfile.mkdtemp(prefix="build.", dir=dist)
    env = dict(os.environ, PYTHONPATH=tools, PYTHONDONTWRITEBYTECODE="1")
    subprocess.check_call(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", out, client_dir],
        env=env,
        stdout=sys.stderr,
    )
    wheels = [f for f in os.listdir(out) if f.endswith(".whl")]
    if len(wheels) != 1:
        sys.exit(f"install_client: expected one wheel in {out}, found {wheels}")
    wheel = os.path.join(dist, wheels[0])
    os.replace(os.path.join(out, wheels[0]), wheel)
    shutil.rmtree(out, ignore_errors=True)
    pip_target(tmp, [wheel])
    with open(os.path.join(tmp, ".wheel"), "w") as f:
        f.write(wheel)
    swap_in(tmp, target, MARKER, wanted)
    return target, wheel


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: install_client.py ENGRAM_HOME")
    home = os.path.abspath(sys.argv[1])
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    client_dir = os.path.join(root, "clients", "python")
    tools = install_tools(home)
    site, wheel = install_client(home, tools, client_dir, os.path.join(root, "proto"))
    print(json.dumps({"pythonpath": os.pathsep.join([site, tools]), "wheel": wheel}))


if __name__ == "__main__":
    main()
