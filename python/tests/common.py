"""Shared set-up of the Python module's tests: exit 4 (ctest's SKIP_RETURN_CODE) when the module
was not built, the kvlens-cli to compare with, a scratch folder."""
import os
import subprocess
import sys
import tempfile

try:
    import kvlens  # noqa: F401  (PYTHONPATH=<build>/python, set by ctest)
except ImportError as error:
    print(f"skipped: the kvlens module was not built ({error})")
    sys.exit(4)

import kvlens  # noqa: E402

# A folder named kvlens without the module (a build that made only the CLI) imports as a namespace
# package, which has no __file__.
if getattr(kvlens, "__file__", None) is None:
    print(f"skipped: the kvlens module was not built (only a folder: {list(kvlens.__path__)})")
    sys.exit(4)

# Under ctest, only this build's module counts (not one installed earlier).
_build = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]
if _build and os.environ.get("KVLENS_CLI_PATH") and not os.path.abspath(kvlens.__file__).startswith(
        os.path.abspath(_build) + os.sep):
    print(f"skipped: this build made no kvlens module (found {kvlens.__file__} instead)")
    sys.exit(4)

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("KVLENS_CLI_PATH", os.path.join(SOURCE_DIR, "build", "app", "kvlens-cli"))
DEMO = kvlens.demo_model()
SCRATCH = tempfile.mkdtemp(prefix="kvlens-python-test-")


def cli(*args):
    """Runs kvlens-cli; returns its stdout (a failure fails the test with its stderr)."""
    done = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True)
    if done.returncode != 0:
        raise AssertionError(f"kvlens-cli {' '.join(map(str, args))}: {done.stderr}")
    return done.stdout


def check(condition, message):
    if not condition:
        raise AssertionError(message)
