"""The app with Python policies: File > Load policy plug-in takes a .py file (the script's
load-plugin) and --policy-file loads one at start; the policy runs beside h2o and exports."""
import os
import shutil
import subprocess
import sys

from common import SCRATCH, SOURCE_DIR, check, kvlens

app = os.environ.get("KVLENS_APP_PATH", "")
if not (app and os.path.exists(app) and shutil.which("xvfb-run")):
    print("skipped: no app (KVLENS_APP_PATH) or no xvfb-run")
    sys.exit(4)
if not kvlens._core.has_plugin_adapter:
    print("skipped: no plug-in adapter")
    sys.exit(4)
tova = os.path.join(SOURCE_DIR, "examples", "policies", "tova.py")
h2o = os.path.join(SOURCE_DIR, "examples", "policies", "h2o.py")
broken = os.path.join(SCRATCH, "broken.py")
open(broken, "w").write("raise RuntimeError('this file is broken')\n")
script = os.path.join(SCRATCH, "script.txt")
open(script, "w").write("\n".join([
    f"load-plugin {broken}", "expect-error this file is broken", "close-dialogs",
    f"load-plugin {tova}", "expect-note tova_py", "policies dense,h2o,tova_py,h2o_py", "restart",
    "wait-idle", "step 12", "wait-idle", "compare h2o,tova_py,h2o_py", "view retention",
    f"export {SCRATCH}/retention.json", "quit", ""]))
done = subprocess.run(["xvfb-run", "-a", app, "--policy-file", h2o, "--script", script],
                      capture_output=True, text=True, timeout=300)
print(done.stdout[-2000:], done.stderr[-2000:])
check(done.returncode == 0, "the app ran the script")
exported = open(os.path.join(SCRATCH, "retention.json")).read()
check("tova_py" in exported and "h2o_py" in exported, "both Python policies in the export")
print("ok")
