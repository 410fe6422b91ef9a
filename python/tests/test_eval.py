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

# hit_rate=True is --hit-rate: the same means (null where the policy scores nothing).
cli("eval", "--model", DEMO, "--task", "coref", "--policies", POLICIES, "--sparsity", SPARSITY,
    "--samples", 4, "--seed", 3, "--hit-rate", "--json", out)
expected = json.load(open(out))["results"]
rows = kvlens.eval_coref(model, POLICIES, sparsity=SPARSITY, samples=4, seed=3, hit_rate=True)
for mine, theirs in zip(rows, expected):
    check(mine["hit_rate"] == theirs["hit_rate"],
          f"{theirs['policy']}: hit_rate {mine['hit_rate']} vs kvlens-cli {theirs['hit_rate']}")
check(rows[0]["hit_rate"] is None and 0.5 < rows[3]["hit_rate"] < 1, "dense none, tokenbutler's")
print("coref --hit-rate: identical")

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
