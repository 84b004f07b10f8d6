"""Builds and installs the Python client (clients/python) for its tests.

Run by tests/python_client.rs before pytest, so plain `cargo test` works on a
fresh checkout. Two project-local directories under ENGRAM_HOME:

  pyclient-tools/  the build and test tools, exact pins, dependencies
                   included, installed with --no-deps (reproducible; only
                   PyPI is used), reused while the pins are unchanged;
  pyclient/site/   the engram-client wheel built from clients/python with
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

# The closure of grpcio, grpcio-tools, protobuf, hatchling, build, pytest and
# pytest-asyncio for CPython 3.11 on Linux, resolved once and pinned.
PINS = [
    "build==1.6.1",
    "grpcio==1.85.1",
    "grpcio-tools==1.85.1",
    "hatchling==1.33.0",
    "iniconfig==2.3.1",
    "packaging==26.3",
    "pathspec==1.1.1",
    "pluggy==1.7.0",
    "protobuf==7.36.2",
    "pygments==2.21.0",
    "pyproject-hooks==1.3.3",
    "pytest==9.2.0",
    "pytest-asyncio==1.5.0",
    "setuptools==84.2.1",
    "tomlkit==0.15.2",
    "trove-classifiers==2026.9.21.13",
    "typing-extensions==4.16.0",
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
