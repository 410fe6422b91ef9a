"""kvlens.eval_coref / eval_ppl give the numbers kvlens-cli eval writes (exactly: the same
functions over the same engine)."""
import json
import os

from common import DEMO, SCRATCH, SOURCE_DIR, check, cli, kvlens

POLICIES, SPARSITY, SAMPLES = "dense,h2o,quest,tokenbutler,streaming", "0.5", 12
model = kvlens.Model(DEMO)

out = os.path.join(SCRATCH, "coref.json")
cli("eval", "--model", DEMO, "--task", "coref", "--policies", POLICIES, "--sparsity", SPARSITY,
    "--samples", SAMPLES, "--seed", 3, "--json", out)
expected = json.load(open(out))["results"]
rows = kvlens.eval_coref(model, POLICIES, sparsity=SPARSITY, samples=SAMPLES, seed=3)
check(len(rows) == len(expected), "one row per (policy, sparsity)")
for mine, theirs in zip(rows, expected):
    for key, value in theirs.items():
        check(mine[key] == value, f"{theirs['policy']}: {key} {mine[key]} vs kvlens-cli {value}")
kvlens.table(rows)
print(f"coref: {len(rows)} rows identical to kvlens-cli eval --json")

text = os.path.join(SCRATCH, "text.txt")
with open(text, "w") as f:
    f.write(open(os.path.join(SOURCE_DIR, "README.md")).read()[:6000])
out = os.path.join(SCRATCH, "ppl.json")
cli("eval", "--model", DEMO, "--task", "ppl", "--policies", "dense,h2o", "--sparsity", "0.5",
    "--text-file", text, "--window", 256, "--max-tokens", 600, "--json", out)
expected = json.load(open(out))["results"]
rows = kvlens.eval_ppl(model, policies="dense,h2o", sparsity=0.5, window=256, text_file=text,
                       max_tokens=600)
for mine, theirs in zip(rows, expected):
    for key, value in theirs.items():
        check(mine[key] == value, f"{theirs['policy']}: {key} {mine[key]} vs kvlens-cli {value}")
kvlens.table(rows)
print("ppl: identical to kvlens-cli eval --json")
print("ok")
