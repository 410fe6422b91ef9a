"""examples/notebook_compare.py runs headless at a small sample count and saves its figure."""
import os
import subprocess
import sys

from common import SCRATCH, SOURCE_DIR, check, kvlens

if not kvlens._core.has_plugin_adapter:
    print("skipped: this build has no plug-in adapter (engine/policy/plugin_policy.cpp)")
    sys.exit(4)
env = dict(os.environ, KVLENS_NOTEBOOK_SAMPLES="4", KVLENS_NOTEBOOK_OUT=SCRATCH)
done = subprocess.run([sys.executable, os.path.join(SOURCE_DIR, "examples", "notebook_compare.py")],
                      env=env, capture_output=True, text=True, timeout=500)
print(done.stdout)
check(done.returncode == 0, done.stderr)
check("group_mean" in done.stdout and "tokenbutler" in done.stdout, "the comparison table")
if kvlens.has_figures:
    check(os.path.getsize(os.path.join(SCRATCH, "retention.png")) > 1000, "the figure")
print("ok")
