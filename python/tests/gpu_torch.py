"""On a GPU (ctest cuda:python_torch; exit 4, skipped, without torch, CUDA or the module):
Python policies on a CUDA session. examples/policies/h2o_torch.py gets CUDA tensors through DLPack and runs on the
session's stream; h2o.py (NumPy) gets the adapter's host copies; both give the built-in h2o's
visible sets in lockstep with it. Prints the Python time per step."""
import json
import os
import subprocess
import sys
import time

import numpy as np

from common import CLI, DEMO, SCRATCH, SOURCE_DIR, check, cli, kvlens

try:
    import torch  # noqa: E402
except ImportError:
    print("skipped: no torch")
    sys.exit(4)
if not torch.cuda.is_available() or not kvlens.has_cuda:
    print("skipped: no CUDA device, or a module built without the CUDA backend")
    sys.exit(4)
EXAMPLES = os.path.join(SOURCE_DIR, "examples", "policies")
kvlens.load_policy_file(os.path.join(EXAMPLES, "h2o_torch.py"))
kvlens.load_policy_file(os.path.join(EXAMPLES, "h2o.py"))


class Probe(kvlens.Policy):
    """Records what a torch policy is given on CUDA, and ranks by the true logits."""
    name = "probe_torch"
    needs = {"logits", "eligible"}
    tensors = "torch"
    seen = []

    def select(self, step):
        if not Probe.seen:
            Probe.seen.append((type(step.logits).__name__, str(step.logits.device),
                               str(step.logits.dtype), tuple(step.logits.shape),
                               str(step.eligible.dtype), step.memory,
                               torch.cuda.current_stream().cuda_stream))
        return step.logits


kvlens.register_policy(Probe)
model = kvlens.Model(DEMO, backend="cuda")
print(model)


def run(policies, sample, sparsity=0.5):
    session = kvlens.Session(model, policies=policies, sparsity=sparsity, coref_sample=sample)
    seconds = []
    while True:
        start = time.perf_counter()
        if not session.step():
            break
        seconds.append(time.perf_counter() - start)
    return session, seconds


session, _ = run("oracle,probe_torch", 0)
print("a torch policy on CUDA sees:", Probe.seen[0])
check(Probe.seen[0][0] == "Tensor" and Probe.seen[0][1].startswith("cuda"), "CUDA tensors")
same = all(np.array_equal(session.rows(run=0, step=t).visible, session.rows(run=1, step=t).visible)
           for t in range(session.step_count))
print("probe_torch (true logits through torch on CUDA) = oracle's sets:", same)

for sample, sparsity in ((0, 0.5), (1, 0.7), (2, 0.5)):
    session, _ = run("h2o,h2o_torch,h2o_py", sample, sparsity)
    differ = {1: 0, 2: 0}
    for t in range(session.step_count):
        ref = session.rows(run=0, step=t).visible
        for r in (1, 2):
            differ[r] += int(np.count_nonzero(ref != session.rows(run=r, step=t).visible))
    total = session.step_count * model.config["layers"] * model.config["heads"]
    print(f"sample {sample} s={sparsity}: choices differing from the built-in h2o: "
          f"h2o_torch {differ[1]}, h2o_py {differ[2]} (of the sets of {total} (step, layer, "
          "head)s)")

for python_id in ("h2o_torch", "h2o_py", "probe_torch"):
    times = {}
    for policies in ("dense,h2o", f"dense,{python_id}"):
        kvlens._core._python_policy_stats(reset=True)
        medians, steps = [], 0
        for sample in range(3):
            s, seconds = run(policies, sample)
            medians.append(np.median(seconds))
            steps += s.step_count
        times[policies] = (float(np.median(medians)), kvlens._core._python_policy_stats(True),
                           steps)
    base = times["dense,h2o"][0]
    mine, stats, steps = times[f"dense,{python_id}"]
    calls = stats["selects"] + stats["observes"]
    print(f"CUDA overhead: {python_id}: {1e3 * stats['seconds'] / steps:.3f} ms a step in Python "
          f"({calls / steps:.0f} calls, {1e6 * stats['seconds'] / max(calls, 1):.1f} us each); "
          f"step {1e3 * mine:.3f} ms against {1e3 * base:.3f} ms for dense,h2o")

rows = kvlens.eval_coref(model, "h2o,h2o_torch,h2o_py", sparsity=0.5, samples=20)
kvlens.table(rows)
out = os.path.join(SCRATCH, "eval.json")
cli("eval", "--backend", "cuda", "--model", DEMO, "--task", "coref", "--policy-file",
    os.path.join(EXAMPLES, "h2o_torch.py"), "--policies", "h2o,h2o_torch", "--sparsity", "0.5",
    "--samples", 20, "--json", out)
print("kvlens-cli --backend cuda --policy-file h2o_torch.py:",
      [(r["policy"], r["accuracy"]) for r in json.load(open(out))["results"]])
print("ok")
