"""Atomic pinned installs shared by install_mcp.py, install_pytools.py and
install_client.py.

A directory is built beside its target (`<target>.tmp.<pid>`), stamped with
a marker file holding what it was built from, and renamed into place: a
half-finished install is never seen, and a concurrent installer with the
same inputs is harmless. Packages go in with pip --no-deps --target, so the
pins (dependencies included) are exactly what a fresh machine gets.
"""

import os
import shutil
import subprocess
import sys


def read(path):
    """The file's text, or None when it cannot be read."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def is_current(target, marker, wanted):
    return read(os.path.join(target, marker)) == wanted


def fresh_tmp(target):
    """An empty path beside `target` to build into (its parent created)."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = f"{target}.tmp.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    return tmp


def pip_target(target_dir, args):
    """pip install --no-deps --target; pip's output goes to stderr so the
    installers' stdout stays theirs."""
    subprocess.check_call(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--no-warn-script-location", "--root-user-action=ignore",
         "--target", target_dir] + list(args),
        stdout=sys.stderr,
    )


def swap_in(tmp, target, marker, wanted):
    """Stamps the finished `tmp` and renames it to `target`, unless an equal
    one is already there (another installer finished first)."""
    with open(os.path.join(tmp, marker), "w") as f:
        f.write(wanted)
    if is_current(target, marker, wanted):
        shutil.rmtree(tmp, ignore_errors=True)
        return
    old = f"{target}.old.{os.getpid()}"
    if os.path.exists(target):
        os.rename(target, old)
    try:
        os.rename(tmp, target)
    except OSError:
        # Lost a race to a concurrent installer with the same inputs.
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)


def install_pins(target, pins, marker):
    """The exact `pins` into `target`; a no-op while its marker matches."""
    wanted = "\n".join(pins)
    if not is_current(target, marker, wanted):
        tmp = fresh_tmp(target)
        pip_target(tmp, pins)
        swap_in(tmp, target, marker, wanted)
    return target
