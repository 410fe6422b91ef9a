#!/usr/bin/env bash
# The results tables of a model (issue 41 item 5), rerunnable: every policy of `kvlens-cli
# policies` at each sparsity, all of them in one lockstep `kvlens-cli eval --hit-rate` per
# (task, sparsity), for four tasks: perplexity on WikiText-2 test (its first N tokens), perplexity
# on the held-back C4 text (the part of the corpus train_predictor.py never trains on, written by
# tools/corpus_text.py), co-reference accuracy on the bundled pools and on the TokenButler paper's
# pools (mrcr_custom.json from its repository; never committed). Writes OUT/results.md (printed
# too; tools/real_model_tables.py) with a table per task, the commands, machine and timings, and
# keeps every eval's JSON and log under OUT/runs/.
#
#   tools/real_model_results.sh --cli build/app/kvlens-cli --model M.gguf|DIR [options]
#     --predictor FILE     TokenButler predictor .safetensors (without it, and without one in a
#                          model folder, the policies that need a predictor are left out)
#     --paper-pools FILE   the paper's pools JSON (without it that task is left out, and said so)
#     --backend cpu|cuda   (default cpu)     --jobs N      eval processes at once (default 1)
#     --threads N          threads per process (default: the CPU's cores / jobs)
#     --samples N          co-reference samples per pool file (default 200)
#     --paper-samples N    samples of the paper's pools (default: --samples; its samples are
#                          about four times as long as the bundled ones)
#     --resume             keep the evals of an earlier run into --out that finished with the
#                          same command line, and run only the others
#     --ppl-tokens N       tokens of each perplexity text (default 8192)
#     --window W           perplexity window (default: the model's max_position_embeddings)
#     --sparsities "S ..." (default "0.3 0.5 0.7 0.9")
#     --policies A,B,...   (default: every registered policy)
#     --shared DIR         the shared data folder (default ../shared next to the repository); it
#                          reads data/eval/wikitext2-test.txt and
#                          data/corpus/c4-realnewslike-sample.jsonl
#     --out DIR            (default out/real-model-results)
# Exit status: 0 when every eval ran; 1 when one failed (the tables show what did run); 2 for
# bad usage.
set -euo pipefail

invocation=$(printf '%q ' "$0" "$@")
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "real_model_results.sh: $*" >&2; exit 2; }

cli="" model="" predictor="" paper_pools="" backend=cpu jobs=1 threads="" samples=200
paper_samples="" resume=0
ppl_tokens=8192 window="" sparsities="0.3 0.5 0.7 0.9" policies="" shared="$root/../shared"
out=out/real-model-results
while [ $# -gt 0 ]; do
  case "$1" in --resume) resume=1; shift; continue ;; esac
  [ $# -ge 2 ] || case "$1" in -h | --help) usage ;; *) die "$1 needs a value" ;; esac
  case "$1" in
    --cli) cli=$2 ;;
    --model) model=$2 ;;
    --predictor) predictor=$2 ;;
    --paper-pools) paper_pools=$2 ;;
    --backend) backend=$2 ;;
    --jobs) jobs=$2 ;;
    --threads) threads=$2 ;;
    --samples) samples=$2 ;;
    --paper-samples) paper_samples=$2 ;;
    --ppl-tokens) ppl_tokens=$2 ;;
    --window) window=$2 ;;
    --sparsities) sparsities=$2 ;;
    --policies) policies=$2 ;;
    --shared) shared=$2 ;;
    --out) out=$2 ;;
    *) die "unknown option $1 (--help lists them)" ;;
  esac
  shift 2
done
[ -n "$cli" ] || die "--cli: expected the kvlens-cli executable"
[ -x "$cli" ] || die "--cli: $cli is not an executable file"
[ -n "$model" ] || die "--model: expected a .gguf file or a model folder"
[ -e "$model" ] || die "--model: $model does not exist"
[ -z "$predictor" ] || [ -f "$predictor" ] || die "--predictor: $predictor is not a file"
[ -z "$paper_pools" ] || [ -f "$paper_pools" ] || die "--paper-pools: $paper_pools is not a file"
case "$backend" in cpu | cuda) ;; *) die "--backend: expected cpu or cuda, got '$backend'" ;; esac
[ -n "$paper_samples" ] || paper_samples=$samples
for pair in "jobs:$jobs" "samples:$samples" "paper-samples:$paper_samples" \
  "ppl-tokens:$ppl_tokens" "threads:${threads:-1}" "window:${window:-2}"; do
  [[ ${pair#*:} =~ ^[1-9][0-9]*$ ]] ||
    die "--${pair%%:*}: expected a positive integer, got '${pair#*:}'"
done
for s in $sparsities; do
  [[ $s =~ ^0?\.[0-9]+$ ]] || die "--sparsities: expected fractions in (0, 1) such as 0.5, got '$s'"
done
shared=$(cd "$shared" 2>/dev/null && pwd) || die "--shared: expected the shared data folder"
wikitext="$shared/data/eval/wikitext2-test.txt"
c4_corpus="$shared/data/corpus/c4-realnewslike-sample.jsonl"
[ -f "$wikitext" ] || die "--shared: $wikitext is missing (WikiText-2 test)"
[ -f "$c4_corpus" ] || die "--shared: $c4_corpus is missing (the C4 corpus sample)"
[ -n "$threads" ] || threads=$(($(nproc) / jobs > 0 ? $(nproc) / jobs : 1))

mkdir -p "$out/runs"
out=$(cd "$out" && pwd)
tables=("$here/real_model_tables.py")
started=$(date +%s)

# The policies: every registered one unless listed; those that need a predictor only where one is
# given or the model folder has one.
registry="$out/runs/policies.json"
"$cli" policies --json >"$registry"
have_predictor=0
if [ -n "$predictor" ] || [ -f "$model/predictor.safetensors" ] ||
  { [ -d "$model" ] && grep -qs '"llama_butler"' "$model/config.json"; }; then
  have_predictor=1
elif [ -f "$model" ] && "$cli" info --model "$model" 2>/dev/null | grep -q '"predictor": {'; then
  have_predictor=1  # a .gguf with a predictor beside it or a bundled one for its model
fi
policies=$(python3 "${tables[@]}" policies --registry "$registry" --have-predictor $have_predictor \
  ${policies:+--only "$policies"})

# The held-back C4 text: train_predictor.py's split of the same file.
c4_text="$out/runs/c4-heldout.txt"
python3 "$here/corpus_text.py" --heldout "$c4_corpus" --out "$c4_text"

common=(--model "$model" --backend "$backend" --threads "$threads" --policies "$policies"
  --hit-rate)
[ -z "$predictor" ] || common+=(--predictor "$predictor")
window_args=()
[ -z "$window" ] || window_args=(--window "$window")
tasks=(wikitext2 c4 coref)
[ -z "$paper_pools" ] || tasks+=(coref_paper)

# One line per eval: the task, the sparsity and the command's arguments (tab-separated).
: >"$out/runs/commands.tsv"
for task in "${tasks[@]}"; do
  case $task in
    wikitext2) args=(--task ppl --text-file "$wikitext" --max-tokens "$ppl_tokens") ;;
    c4) args=(--task ppl --text-file "$c4_text" --max-tokens "$ppl_tokens") ;;
    coref) args=(--task coref --samples "$samples") ;;
    coref_paper) args=(--task coref --samples "$paper_samples" --coref-pools "$paper_pools") ;;
  esac
  [ "${args[1]}" = coref ] || args+=("${window_args[@]}")
  for s in $sparsities; do
    {
      printf '%s\t%s' "$task" "$s"
      printf '\t%s' eval "${common[@]}" "${args[@]}" --sparsity "$s" \
        --json "$out/runs/${task}_$s.json"
      printf '\n'
    } >>"$out/runs/commands.tsv"
  done
done

# Runs one line of commands.tsv; its wall time and exit status go to OUT/runs/TASK_S.time.
run_one() {
  local task sparsity start status=0
  local -a fields
  IFS=$'\t' read -r -a fields <<<"$1"
  task=${fields[0]} sparsity=${fields[1]}
  start=$(date +%s%N)
  "$cli" "${fields[@]:2}" >"$out/runs/${task}_$sparsity.log" 2>&1 || status=$?
  local ms=$(( ($(date +%s%N) - start) / 1000000 ))
  printf '%s\t%s\t%d.%03d\t%s\n' "$task" "$sparsity" $((ms / 1000)) $((ms % 1000)) "$status" \
    >"$out/runs/${task}_$sparsity.time"
  echo "real_model_results.sh: $task at $sparsity: exit $status after $((ms / 1000)) s" >&2
}
# --resume keeps an eval whose recorded command line is this one's and that exited 0.
done_before() {
  local task=$1 sparsity=$2 line=$3
  [ $resume = 1 ] && [ -f "$out/runs/${task}_$sparsity.json" ] &&
    [ -f "$out/runs/${task}_$sparsity.cmd" ] &&
    [ "$(cat "$out/runs/${task}_$sparsity.cmd")" = "$line" ] &&
    grep -qs $'\t0$' "$out/runs/${task}_$sparsity.time"
}
echo "real_model_results.sh: $(wc -l <"$out/runs/commands.tsv") evals, $jobs at a time," \
  "$threads threads each, into $out" >&2
while IFS= read -r line; do
  IFS=$'\t' read -r task sparsity _ <<<"$line"
  if done_before "$task" "$sparsity" "$line"; then
    echo "real_model_results.sh: $task at $sparsity: kept from the earlier run (--resume)" >&2
    continue
  fi
  rm -f "$out/runs/${task}_$sparsity.time"
  printf '%s\n' "$line" >"$out/runs/${task}_$sparsity.cmd"
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  run_one "$line" &
done <"$out/runs/commands.tsv"
wait

{
  echo "started=$(date -u -d "@$started" '+%Y-%m-%d %H:%M:%S UTC')"
  echo "seconds=$(($(date +%s) - started))"
  echo "host=$(hostname)"
  echo "cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')"
  echo "cores=$(nproc)"
  echo "memory_gb=$(awk '/MemTotal/ {printf "%.0f", $2 / 1048576}' /proc/meminfo 2>/dev/null)"
  if [ "$backend" = cuda ] && command -v nvidia-smi >/dev/null; then
    echo "gpu=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -n 1)"
  fi
  echo "kvlens=$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "backend=$backend"
  echo "jobs=$jobs"
  echo "threads=$threads"
  echo "model=$model"
  if [ -n "$predictor" ]; then
    echo "predictor=$predictor"
  elif [ $have_predictor = 1 ]; then
    echo "predictor=the model folder's"
  else
    echo "predictor=none (policies that need one left out)"
  fi
  echo "paper_pools=${paper_pools:-(not given)}"
  echo "samples=$samples"
  echo "paper_samples=$paper_samples"
  echo "ppl_tokens=$ppl_tokens"
  echo "window=${window:-max_position_embeddings}"
  echo "have_predictor=$have_predictor"
  echo "command=$invocation"
} >"$out/runs/run.txt"

python3 "${tables[@]}" tables --runs "$out/runs" --out "$out/results.md"
cat "$out/results.md"
! grep -qv $'\t0$' "$out"/runs/*.time
