"""common.py's skip (exit 4, ctest's SKIP_RETURN_CODE) where this build made no kvlens module: no
package on the path at all, and only a folder named kvlens (a namespace package, whose __file__ is
None: on a GPU machine's build of the CLI and the CUDA tests alone, cuda:python_torch failed with a
TypeError there instead of skipping)."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

with tempfile.TemporaryDirectory() as scratch:
    empty = os.path.join(scratch, "empty")
    folder = os.path.join(scratch, "folder")
    os.makedirs(empty)
    os.makedirs(os.path.join(folder, "kvlens"))
    for name, path in (("no package", empty), ("a folder named kvlens", folder)):
        env = dict(os.environ, PYTHONPATH=path, KVLENS_CLI_PATH=os.path.join(scratch, "kvlens-cli"))
        done = subprocess.run([sys.executable, "-c", "import common"], cwd=HERE, env=env,
                              capture_output=True, text=True)
        if done.returncode != 4 or "skipped" not in done.stdout:
            raise AssertionError(f"{name}: exit {done.returncode} (want 4, skipped); stdout "
                                 f"{done.stdout!r}; stderr {done.stderr[-600:]!r}")
        print(f"{name}: {done.stdout.strip()}")
