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

# match="effective" is --match effective: the same nominal sparsity found, the same rows; the
# tokenfilter nominal budget (capped at 0.6 on the demo model's 8 layers) warns.
import warnings  # noqa: E402

MATCHED = "dense,h2o,quest,tokenfilter"
cli("eval", "--model", DEMO, "--task", "coref", "--policies", MATCHED, "--sparsity", 0.6,
    "--samples", 3, "--match", "effective", "--json", out)
expected = json.load(open(out))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    rows = kvlens.eval_coref(model, MATCHED, sparsity=0.6, samples=3, match="effective")
for mine, theirs in zip(rows, expected["results"]):
    for key, value in theirs.items():
        check(mine[key] == value, f"{theirs['policy']}: {key} {mine[key]} vs kvlens-cli {value}")
check(abs(rows[1]["effective_sparsity"] - 0.6) <= 0.005 and rows[1]["sparsity"] > 0.6,
      f"h2o matched: {rows[1]}")
check([str(w.message) for w in caught] == expected["warnings"],
      f"warnings {[str(w.message) for w in caught]} vs kvlens-cli {expected['warnings']}")
try:
    kvlens.eval_coref(model, "h2o", sparsity=0.5, samples=1, match="exact")
    check(False, "match='exact' must fail")
except Exception as error:  # kvlens.Error
    check("effective or none" in str(error), str(error))
print("coref match='effective': identical to kvlens-cli eval --match effective")
print("ok")
