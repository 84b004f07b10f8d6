"""Installs the external gRPC clients the reflection test drives,
schemathesis for the REST routes (tests/schemathesis.rs) and selenium for
the console (tests/console.rs).

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

# schemathesis, which tests/schemathesis.rs runs against the REST routes'
# OpenAPI document, with every dependency pinned.
SCHEMATHESIS_PKGS = [
    "schemathesis==4.32.5",
    "anyio==4.16.0",
    "certifi==2026.10.19.post1",
    "charset-normalizer==3.5.3",
    "click==8.5.1",
    "graphql-core==3.3.2",
    "harfile==0.6.0",
    "hypothesis==6.170.17",
    "hypothesis-graphql==0.13.5",
    "idna==3.20",
    "iniconfig==2.3.1",
    "jsonschema-rs==0.60.3",
    "markdown-it-py==4.3.0",
    "markupsafe==3.0.4",
    "mdurl==0.1.2",
    "packaging==26.4",
    "pluggy==1.7.0",
    "pygments==2.21.0",
    "pyrate-limiter==4.5.1",
    "pytest==9.2.0",
    "pyyaml==6.0.4",
    "requests==2.34.2",
    "rich==15.0.0",
    "sortedcontainers==2.4.0",
    "typing-extensions==4.16.0",
    "urllib3==2.8.0",
    "werkzeug==3.1.9",
]
SCHEMATHESIS_MARKER = ".engram-schemathesis"

# selenium, which tests/console.rs drives Debian's Chromium with (its
# WebDriver, chromium-driver, comes from Debian too: selenium never
# fetches a driver here), with every dependency pinned.
SELENIUM_PKGS = [
    "selenium==4.51.0",
    "attrs==26.1.0",
    "certifi==2026.10.19.post1",
    "h11==0.16.0",
    "idna==3.20",
    "outcome==1.3.0.post0",
    "pysocks==1.7.1",
    "sniffio==1.3.1",
    "sortedcontainers==2.4.0",
    "trio==0.35.0",
    "trio-websocket==0.12.2",
    "typing-extensions==4.16.0",
    "urllib3==2.8.0",
    "websocket-client==1.9.2",
    "wsproto==1.3.2",
]
SELENIUM_MARKER = ".engram-selenium"


def install_python(home):
    """Into HOME/pytools, atomically: a half-finished install is never seen."""
    return install_pins(os.path.join(home, "pytools"), PY_PKGS, MARKER)


def install_schemathesis(home):
    """Into HOME/schemathesis, atomically, like the clients."""
    return install_pins(os.path.join(home, "schemathesis"), SCHEMATHESIS_PKGS,
                        SCHEMATHESIS_MARKER)


def install_selenium(home):
    """Into HOME/selenium, atomically, like the clients."""
    return install_pins(os.path.join(home, "selenium"), SELENIUM_PKGS, SELENIUM_MARKER)


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
    install_schemathesis(home)
    install_selenium(home)
    install_buf(home)


if __name__ == "__main__":
    main()
