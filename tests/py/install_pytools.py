"""Installs the external gRPC clients the reflection test drives.

One installer for both `scripts/test` and `cargo test` (tests/reflection_client.rs)
so the pins live in one place. The clients must not share code with the
server (tonic), hence Python grpcio; buf is an extra when npm is on the machine,
because npm is not guaranteed on a fresh one.

Usage: python3 tests/py/install_pytools.py ENGRAM_HOME
Prints nothing on a warm run; exits non-zero only when the Python part fails.
"""

import os
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the scripts
from _pinned import install_pins, read

# Exact pins, dependencies included, installed with --no-deps so a fresh
# machine gets exactly what was tested.
PY_PKGS = [
    "grpcio==1.85.1",
    "grpcio-reflection==1.85.1",
    "grpcio-health-checking==1.85.1",
    "protobuf==7.36.2",
    "typing-extensions==4.16.0",
]
BUF_PKG = "@bufbuild/buf@1.75.0"
MARKER = ".engram-pytools"


def install_python(home):
    """Into HOME/pytools, atomically: a half-finished install is never seen."""
    return install_pins(os.path.join(home, "pytools"), PY_PKGS, MARKER)


def install_buf(home):
    """Best effort into HOME/node: returns the buf binary or None."""
    npm = shutil.which("npm")
    if npm is None:
        return None
    prefix = os.path.join(home, "node")
    buf = os.path.join(prefix, "node_modules", ".bin", "buf")
    marker = os.path.join(prefix, MARKER)
    if read(marker) == BUF_PKG and os.access(buf, os.X_OK):
        return buf
    try:
        subprocess.check_call(
            [npm, "install", "--prefix", prefix, "--no-audit", "--no-fund", "--silent",
             "--no-save", "--fetch-retries=1", "--fetch-retry-mintimeout=1000",
             "--fetch-retry-maxtimeout=2000", "--fetch-timeout=15000", BUF_PKG],
            stdout=subprocess.DEVNULL,
            # A machine that cannot reach the npm registry (CI here) must
            # not wait out npm's default retries (minutes) for an extra.
            timeout=60,
        )
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        print(f"install_pytools: buf not installed ({e}); skipping buf curl", file=sys.stderr)
        return None
    if not os.access(buf, os.X_OK):
        print("install_pytools: npm installed no buf binary; skipping buf curl", file=sys.stderr)
        return None
    with open(marker, "w") as f:
        f.write(BUF_PKG)
    return buf


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: install_pytools.py ENGRAM_HOME")
    home = os.path.abspath(sys.argv[1])
    install_python(home)
    install_buf(home)


if __name__ == "__main__":
    main()
