#!/usr/bin/env bash
# GPU benchmark users can rerun (issue 26 item 6): kvlens against Hugging Face transformers on the
# same random checkpoints, on one GPU, with the issue's targets marked met or missed.
#
# usage: tools/bench_gpu.sh BUILD_DIR [--part NAME ...] [--work DIR] [--tiny]
#   BUILD_DIR   a kvlens build with the CUDA backend (BUILD_DIR/app/kvlens-cli)
#   --part      one or more of the parts below (repeatable, or comma-separated);
#               default: 1b lockstep trace coref
#   --work      where checkpoints and results go (default /tmp/kvlens-bench); a part's checkpoint
#               is made once there and reused by later parts and later runs
#   --tiny      toy sizes (tiny random models, short contexts): the whole flow in a minute, on
#               the CPU with KVLENS_BENCH_BACKEND=cpu; its numbers mean nothing
# environment: PYTHON (python3 with torch + transformers, for bench_transformers.py; default
#   python3), KVLENS_BENCH_BACKEND (cuda; cpu for a toy run), KVLENS_BENCH_REPEATS (lockstep,
#   trace and coref runs per figure, default 3), KVLENS_BENCH_1B_CONTEXTS (part 1b's contexts,
#   default 512,4096,16384; static-compiled runs at those up to 4096),
#   KVLENS_BENCH_COMPILE_TIMEOUT (seconds one context's torch.compile may take, default 150)
#
# Parts (each sized to take well under 10 minutes on an H100, so each can be its own job):
#   1b        the Llama-3.2-1B shape (random BF16): kvlens-cli bench at 512, 4096 and 16384 tokens
#             of context, then tools/bench_transformers.py (eager and sdpa at the same contexts,
#             static-compiled at 512 and 4096); step time against the weight-read time (targets
#             1.5x, 2x, 3x) and the speedups over transformers eager (>= 10x) and static-compiled
#             (>= 2x). It is 1b-kvlens then 1b-hf, which can also be run separately (each prints
#             the table from whatever results WORK holds).
#   lockstep  the same checkpoint, 8 policies in lockstep at 512 against dense (target <= 2x),
#             the same with KVLENS_GEMV_MMA=1 (tensor-core products; no target), and each
#             policy's run alone: its own work (target <= 15% of the dense step)
#   trace     a vocab-8192 variant with the demo model's tokenizer: `trace` of 512 decode steps,
#             its own stepping time against `bench`'s summed steps over the same 512 steps from an
#             empty cache (target <= 1.3x); also the processes' wall times against `generate`,
#             each less a load-only run (the trace's includes saving its file; no target)
#   coref     wall time of a 50-sample, 10-policy coref eval of the demo model (target < 5 s)
#   8b        the Llama-3.1-8B shape (about 16 GB): step time at 8192 against the weight-read
#             time (target <= 1.5x)
#   tokenbutler  a tokenbutler run on the 1B shape with the 1B butler predictor's dimensions (a
#             random predictor from make_butler_checkpoint.py, about 1% of the model) at 512 and
#             4096 tokens: its step against a dense step of the same process (target <= 1.15x)
#             and the predictor's own share of a dense step (target <= 3%), with how much each
#             grows from 512 to 4096 tokens
#   sparse    whether a sparse run pays only for what it keeps (issue 43 item 4): on the 1B shape
#             (with the butler predictor's files) at 16384 tokens, streaming, quest, h2o,
#             tokenbutler and oracle at sparsity 0.5 and 0.9, `bench --attention-cost`: each
#             run's attention over the keys it kept at its last step against the dense attention
#             over the same caches (target: at most the share of keys some head of a KV group
#             kept, what a grouped-query kernel reads), and its step against dense
#   policies  each policy's own cost per step (issue 42): the vocab-8192 1B checkpoint given the
#             files its learned and calibrated policies read (a random predictor, loki and
#             doublesparsity calibration, duo gates after a few steps, an untrained seer gate),
#             then per policy `bench --policies P --sparsity 0.5` at 4096 tokens of context: the
#             lockstep step of that one run against the dense step measured in the same process
#             (no target). Random weights attend nearly uniformly, which makes top-p methods
#             (twilight) keep more than a trained model would.
#   multi     more than one GPU (issue 44 items 2 and 3), on the GPUs this host has
#             (KVLENS_BENCH_GPUS: how many to use; on the CPU, that many CPU ranks): the 8B shape
#             at 4096 tokens on one GPU and split over all of them (target: faster split); the
#             Llama-3.1-70B shape (about 141 GB of disk; KVLENS_BENCH_70B_LAYERS=N makes a proxy
#             of its first N layers, said so in the report) split over them against each GPU's
#             read of its own shard (target <= 1.5x), skipped with the reason when WORK's disk
#             or the GPUs' memory cannot hold it; and a coref sweep (KVLENS_BENCH_SWEEP_SAMPLES
#             samples x 10 policies x 4 budgets, default 24) on one GPU and on all of them, one
#             engine each (target: speedup >= 0.875 x GPUs, the 3.5x of 4 GPUs)
# Every part writes its raw results to WORK/raw/, its summary to WORK/<part>.json, and prints
# each number with the command that measured it. The exit status is non-zero only when a command
# fails, never for a missed target.
#
# On the GPU machine, from the repository root (a CUDA build in build-cuda):
#   cmake -B build-cuda -DKVLENS_CUDA=ON -DCMAKE_BUILD_TYPE=Release && cmake --build build-cuda -j
#   tools/bench_gpu.sh build-cuda --part 1b        # and --part lockstep, trace, coref, 8b
# Toy run on a CPU:
#   KVLENS_BENCH_BACKEND=cpu PYTHON=/path/to/venv/bin/python tools/bench_gpu.sh build --tiny
set -euo pipefail

usage() {
  sed -n '4,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  exit 2
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ $# -ge 1 ] || usage
case $1 in -h | --help) usage ;; esac
build=$(cd "$1" && pwd)
shift
work=/tmp/kvlens-bench
tiny=0
parts=()
while [ $# -gt 0 ]; do
  case $1 in
    --part)
      [ $# -ge 2 ] || usage
      IFS=, read -r -a more <<<"$2"
      parts+=("${more[@]}")
      shift 2
      ;;
    --work)
      [ $# -ge 2 ] || usage
      work=$2
      shift 2
      ;;
    --tiny)
      tiny=1
      shift
      ;;
    -h | --help) usage ;;
    *)
      echo "bench_gpu.sh: unknown argument $1" >&2
      usage
      ;;
  esac
done
[ ${#parts[@]} -gt 0 ] || parts=(1b lockstep trace coref)
for part in "${parts[@]}"; do
  case $part in
    1b | 1b-kvlens | 1b-hf | lockstep | trace | coref | 8b | policies | tokenbutler | sparse | multi) ;;
    *)
      echo "bench_gpu.sh: unknown part '$part'" \
        "(parts: 1b 1b-kvlens 1b-hf lockstep trace coref 8b policies tokenbutler sparse multi)" >&2
      exit 2
      ;;
  esac
done

cli=$build/app/kvlens-cli
[ -x "$cli" ] || {
  echo "bench_gpu.sh: no $cli (build kvlens first)" >&2
  exit 1
}
backend=${KVLENS_BENCH_BACKEND:-cuda}
python=${PYTHON:-python3}
repeats=${KVLENS_BENCH_REPEATS:-3}
mkdir -p "$work/raw"
work=$(cd "$work" && pwd)
raw=$work/raw
demo=$root/assets/models/demo
policies10=dense,oracle,tokenbutler,h2o,snapkv,streaming,quest,keydiff,tokenfilter,lazyllm
policies8=dense,h2o,quest,snapkv,streaming,keydiff,tokenfilter,lazyllm
# Every built-in policy as tools/policy_tables.sh lists them (dense's run: what a lockstep run
# itself adds to the plain step).
policies_all=dense,oracle,random,streaming,h2o,snapkv,quest,keydiff,tokenfilter,lazyllm,tokenbutler,tova
policies_all+=,pyramidkv,adakv,h2o+adakv,tova+adakv,sparq,loki,doublesparsity,twilight,rocketkv
policies_all+=,duoattention,seerattention,magicpig
policies_sparse=streaming,quest,h2o,tokenbutler,oracle
policies_sweep=dense,oracle,random,h2o,snapkv,streaming,quest,keydiff,tokenfilter,tova

# Sizes. The 1B shape: Llama-3.2-1B (hidden 2048, 16 layers, 32/8 heads, MLP 8192, vocab 128256,
# tied embeddings); the 8B shape: Llama-3.1-8B (hidden 4096, 32 layers, 32/8 heads, MLP 14336,
# untied). Positions: enough for the longest context plus the timed steps.
if [ "$tiny" = 1 ]; then
  shape_1b=(--hidden 256 --layers 2 --heads 4 --kv-heads 2 --intermediate 512 --vocab 1024
    --tie-embeddings --dtype BF16 --max-positions 1024)
  shape_trace=(--hidden 256 --layers 2 --heads 4 --kv-heads 2 --intermediate 512 --vocab 8192
    --tie-embeddings --dtype BF16 --max-positions 1024)
  shape_8b=(--hidden 256 --layers 4 --heads 4 --kv-heads 2 --intermediate 640 --vocab 8192
    --dtype BF16 --max-positions 1024)
  contexts_1b=(32 64 128)
  hf_contexts=32,64
  hf_compiled_contexts=32,64
  steps_1b=8 warmup=2 lockstep_context=64 trace_tokens=64 coref_samples=2 context_8b=128 steps_8b=8
  policies_context=64 butler_contexts=(32 64) sparse_context=128
  name_1b=tiny-1b name_trace=tiny-1b-v8k name_8b=tiny-8b
  shape_70b=(--hidden 256 --heads 8 --kv-heads 4 --intermediate 768 --vocab 2048 --dtype BF16
    --max-positions 1024)
  layers_70b=${KVLENS_BENCH_70B_LAYERS:-4} multi_context=64 multi_steps=8 sweep_samples=2
  name_70b=tiny-70b
else
  shape_1b=(--hidden 2048 --layers 16 --heads 32 --kv-heads 8 --intermediate 8192 --vocab 128256
    --tie-embeddings --dtype BF16 --max-positions 32768)
  shape_trace=(--hidden 2048 --layers 16 --heads 32 --kv-heads 8 --intermediate 8192 --vocab 8192
    --tie-embeddings --dtype BF16 --max-positions 32768)
  shape_8b=(--hidden 4096 --layers 32 --heads 32 --kv-heads 8 --intermediate 14336 --vocab 128256
    --dtype BF16 --max-positions 16384)
  contexts_1b=(512 4096 16384)
  hf_contexts=512,4096,16384
  hf_compiled_contexts=512,4096
  # KVLENS_BENCH_1B_CONTEXTS=512,4096 (say) narrows part 1b to fewer contexts.
  if [ -n "${KVLENS_BENCH_1B_CONTEXTS:-}" ]; then
    IFS=, read -r -a contexts_1b <<<"$KVLENS_BENCH_1B_CONTEXTS"
    hf_contexts=$KVLENS_BENCH_1B_CONTEXTS
    hf_compiled_contexts=$(printf '%s\n' "${contexts_1b[@]}" | awk '$1 <= 4096' | paste -sd, -)
  fi
  steps_1b=64 warmup=4 lockstep_context=512 trace_tokens=512 coref_samples=50 context_8b=8192
  steps_8b=32 policies_context=4096 butler_contexts=(512 4096) sparse_context=16384
  name_1b=llama-1b name_trace=llama-1b-v8k name_8b=llama-8b
  # Llama-3.1-70B: hidden 8192, 80 layers, 64/8 heads, MLP 28672, vocab 128256, untied.
  shape_70b=(--hidden 8192 --heads 64 --kv-heads 8 --intermediate 28672 --vocab 128256
    --dtype BF16 --max-positions 8192)
  layers_70b=${KVLENS_BENCH_70B_LAYERS:-80} multi_context=4096 multi_steps=32
  sweep_samples=${KVLENS_BENCH_SWEEP_SAMPLES:-24}
  name_70b=llama-70b
fi
# transformers' modes: static-compiled needs a GPU (torch.compile with CUDA graphs); on the CPU
# only the toy flow is checked.
if [ "$backend" = cuda ]; then
  hf_device=(--device cuda --dtype bf16)
  hf_compiled=1
else
  hf_device=(--device cpu --dtype f32)
  hf_compiled=${KVLENS_BENCH_CPU_COMPILE:-0}
fi

# ------------------------------------------------------------------------------------------ helpers

# The command line as printed: shell-quoted, a long --prompt shown as the file it came from.
show() {
  local out="" arg
  for arg in "$@"; do
    if [ -n "${prompt_text:-}" ] && [ "$arg" = "$prompt_text" ]; then
      out+="\"\$(cat $prompt_file)\" "
    else
      out+="$(printf '%q' "$arg") "
    fi
  done
  printf '%s' "${out% }"
}

# run NAME CMD...: runs CMD with stdout in $raw/NAME.out and stderr in $raw/NAME.err; writes its
# command line to $raw/NAME.cmd and its wall seconds to $raw/NAME.seconds. A failing CMD fails the
# part, with the end of its stderr.
run() {
  local name=$1
  shift
  local cmd start end rc=0
  cmd=$(show "$@")
  printf '%s\n' "$cmd" >"$raw/$name.cmd"
  printf '  $ %s\n' "$cmd"
  rm -f "$raw/$name.seconds"
  start=$(date +%s.%N)
  "$@" >"$raw/$name.out" 2>"$raw/$name.err" || rc=$?
  end=$(date +%s.%N)
  if [ "$rc" != 0 ]; then
    echo "bench_gpu.sh: FAILED (exit $rc): $cmd" >&2
    tail -n 20 "$raw/$name.err" >&2
    return "$rc"
  fi
  awk -v a="$start" -v b="$end" 'BEGIN { printf "%.6f\n", b - a }' >"$raw/$name.seconds"
  awk '{ printf "    (%.2f s)\n", $1 }' "$raw/$name.seconds"
}

# make_model DIR ARGS...: a make_random_model.py checkpoint in DIR, made once: reused when DIR
# holds one made with the same ARGS.
make_model() {
  local dir=$1
  shift
  local stamp="$*"
  if { [ -f "$dir/model.safetensors" ] || [ -f "$dir/model.safetensors.index.json" ]; } &&
    [ -f "$dir/.bench-args" ] &&
    [ "$(cat "$dir/.bench-args")" = "$stamp" ]; then
    echo "  checkpoint $dir (made earlier with: make_random_model.py $stamp)"
    return 0
  fi
  rm -rf "$dir" "$dir.partial"
  run "make-$(basename "$dir")" python3 "$root/tools/make_random_model.py" --out "$dir.partial" "$@"
  cat "$raw/make-$(basename "$dir").out"
  mv "$dir.partial" "$dir"
  printf '%s\n' "$stamp" >"$dir/.bench-args"
}

# The report: reads $raw and prints one part's numbers, each with its command, and the targets;
# writes WORK/<part>.json. Standard library only.
report() {
  python3 - "$work" "$backend" "$@" <<'PY'
import json, os, re, statistics, sys

work, backend, part = sys.argv[1], sys.argv[2], sys.argv[3]
args = sys.argv[4:]
raw = os.path.join(work, "raw")


def text(name, ext):
    path = os.path.join(raw, f"{name}.{ext}")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return f.read()


def result(name):
    """(parsed JSON stdout, command) of a run, or (None, None) if it has not run."""
    out, cmd = text(name, "out"), text(name, "cmd")
    if out is None or text(name, "seconds") is None:
        return None, None
    # The JSON object, should anything else have been printed around it.
    return json.loads(out[out.index("{"):out.rindex("}") + 1]), cmd.strip()


def seconds(name):
    s = text(name, "seconds")
    return float(s) if s is not None else None


targets, summary = [], {"part": part, "backend": backend}


def target(what, value, op, bar, unit="x"):
    if value is None:
        state = "not measured"
    else:
        state = "met" if (value <= bar if op == "<=" else value >= bar if op == ">=" else
                          value > bar if op == ">" else value < bar) else "MISSED"
    targets.append({"what": what, "value": value, "target": f"{op} {bar:g}{unit}", "state": state})
    shown = "n/a" if value is None else f"{value:.2f}{unit}"
    return f"{shown:>10}   target {op} {bar:g}{unit}: {state}"


def line(label, value, cmd=None):
    print(f"  {label:<34} {value}")
    if cmd:
        print(f"      $ {cmd}")


def own_work(prefix, count):
    """A policy's run alone beside the dense step of the same process, over the repeats
    `prefix`-0 .. `prefix`-(count-1): medians of the dense step, the run's step, the run's own
    work (its step less the dense one) and that as a share of the dense step; None if none ran."""
    pairs = [result(f"{prefix}-{i}") for i in range(count)]
    pairs = [(d, c) for d, c in pairs if d is not None]
    if not pairs:
        return None
    extra = [d["lockstep"]["step_seconds_median"] - d["step_seconds_median"] for d, _ in pairs]
    return {"dense_step_seconds": statistics.median(d["step_seconds_median"] for d, _ in pairs),
            "run_step_seconds": statistics.median(d["lockstep"]["step_seconds_median"]
                                                  for d, _ in pairs),
            "own_seconds": statistics.median(extra),
            "share_of_dense_step": statistics.median(
                e / d["step_seconds_median"] for e, (d, _) in zip(extra, pairs)),
            "command": pairs[0][1]}


def weight_read(r):
    """Seconds to read one step's weights at the device's bandwidth, and where that came from.
    Fields, first found wins: weight_read_seconds; device_bandwidth_gbps (bytes read + written
    per second, 1e9 B/s); device_copy_gbps or memcpy_gbps (bytes copied per second: a copy reads
    and writes each byte, so the traffic is twice that)."""
    b = r.get("weight_bytes_per_step")
    if r.get("weight_read_seconds"):
        return r["weight_read_seconds"], "the JSON's weight_read_seconds"
    if b and r.get("device_bandwidth_gbps"):
        gbps = r["device_bandwidth_gbps"]
        return b / (gbps * 1e9), (f"weight_bytes_per_step {b / 1e9:.3f} GB / "
                                  f"device_bandwidth_gbps {gbps:.0f} GB/s (read + written)")
    for field in ("device_copy_gbps", "memcpy_gbps"):
        if b and r.get(field):
            gbps = 2 * r[field]
            note = ""
            if r.get("backend") == "cuda" and gbps < 400:
                note = " -- NB: too slow for GPU memory, likely a host memcpy: not a GPU figure"
            return b / (gbps * 1e9), (f"weight_bytes_per_step {b / 1e9:.3f} GB / (2 x {field} "
                                      f"{r[field]:.1f}) {gbps:.1f} GB/s{note}")
    return None, "no bandwidth figure in the JSON"


def ms(value):
    return "n/a" if value is None else f"{value * 1e3:.3f} ms"


def hf_entry(hf, mode, context):
    for doc, cmd in hf:
        e = doc.get("modes", {}).get(mode, {}).get(str(context))
        if e is not None:
            return e, cmd, doc
    return None, None, None


def hf_text(e):
    if e is None:
        return "not run"
    if "skipped" in e:
        return "skipped: " + e["skipped"][:200]
    extra = f", compile {e['compile_seconds']:.1f} s" if "compile_seconds" in e else ""
    if e.get("fullgraph") is False:
        extra += ", fullgraph=False fallback"
    return f"{e['median_ms']:.3f} ms median (min {e['min_ms']:.3f}, {e['steps']} steps{extra})"


def kvlens_text(r):
    return (f"{r['step_seconds_median'] * 1e3:.3f} ms median "
            f"(min {r['step_seconds_min'] * 1e3:.3f}, {r['steps']} steps)")


if part == "1b":
    contexts = [int(c) for c in args[0].split(",")]
    step_targets = [1.5, 2.0, 3.0]
    hf = [result(n) for n in ("1b-hf", "1b-hf-compiled")]
    hf = [(d, c) for d, c in hf if d is not None]
    if hf:
        m = hf[0][0]["machine"]
        print(f"  transformers {m['transformers']}, torch {m['torch']}"
              f"{', ' + m['gpu'] if 'gpu' in m else ''}")
    rows = []
    for i, context in enumerate(contexts):
        # The issue's contexts (toy runs: by position): 512 and 4096 have every target, 16384
        # only the step / weight-read one.
        tier = {512: 0, 4096: 1, 16384: 2}.get(context, min(i, 2))
        print(f"-- context {context}")
        r, cmd = result(f"1b-kvlens-{context}")
        row = {"context": context}
        if r is None:
            line("kvlens step", "not run (part 1b-kvlens)")
            step = None
        else:
            step = r["step_seconds_median"]
            line("kvlens step", kvlens_text(r), cmd)
            read, source = weight_read(r)
            line("weight-read time", f"{ms(read)}  ({source})")
            ratio = step / read if read else None
            line("kvlens step / weight read",
                 target(f"1b context {context}: step / weight read", ratio, "<=",
                        step_targets[tier]))
            row.update(kvlens_ms=step * 1e3, weight_read_ms=read * 1e3 if read else None,
                       weight_read_source=source, step_over_read=ratio, kvlens_command=cmd,
                       kvlens=r)
        for mode in ("eager", "sdpa", "static-compiled"):
            e, hcmd, _ = hf_entry(hf, mode, context)
            if e is None and mode == "static-compiled" and tier >= 2:
                continue
            line(f"transformers {mode}", hf_text(e), hcmd)
            speedup = (e["median_ms"] / 1e3 / step) if (e and "median_ms" in e and step) else None
            row[f"hf_{mode}_ms"] = e.get("median_ms") if e else None
            row[f"speedup_vs_{mode}"] = speedup
            if mode == "eager" and tier < 2:
                shown = target(f"1b context {context}: speedup vs transformers eager", speedup,
                               ">=", 10)
            elif mode == "static-compiled" and tier < 2:
                shown = target(f"1b context {context}: speedup vs transformers static-compiled",
                               speedup, ">=", 2)
            else:
                shown = f"{'n/a':>10}" if speedup is None else f"{speedup:>9.2f}x   (no target)"
            line(f"kvlens speedup vs {mode}", shown)
        rows.append(row)
    print("-- summary (ms; speedup = transformers median / kvlens median)")
    print(f"  {'context':>7} {'kvlens':>9} {'wt-read':>9} {'ratio':>6} {'eager':>9} {'x':>6}"
          f" {'sdpa':>9} {'x':>6} {'compiled':>9} {'x':>6}")
    f = lambda v, w=9, p=3: f"{v:>{w}.{p}f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"
    for row in rows:
        print(f"  {row['context']:>7} {f(row.get('kvlens_ms'))} {f(row.get('weight_read_ms'))}"
              f" {f(row.get('step_over_read'), 6, 2)} {f(row.get('hf_eager_ms'))}"
              f" {f(row.get('speedup_vs_eager'), 6, 1)} {f(row.get('hf_sdpa_ms'))}"
              f" {f(row.get('speedup_vs_sdpa'), 6, 1)} {f(row.get('hf_static-compiled_ms'))}"
              f" {f(row.get('speedup_vs_static-compiled'), 6, 1)}")
    summary["rows"] = rows
    summary["transformers"] = [dict(d, command=c) for d, c in hf]

elif part == "lockstep":
    def lockstep_runs(prefix, label):
        """The repeats prefix-0 .. that ran, each shown as its dense and lockstep steps."""
        found = [result(f"{prefix}-{i}") for i in range(int(args[0]))]
        found = [(d, c) for d, c in found if d is not None]
        for d, c in found:
            lk = d["lockstep"]
            line(label, f"{d['step_seconds_median'] * 1e3:.3f} ms / "
                 f"{lk['step_seconds_median'] * 1e3:.3f} ms ({lk['runs']} runs), ratio "
                 f"{lk['ratio_to_dense']:.2f}", c)
        return found

    runs = lockstep_runs("lockstep", "dense / lockstep step")
    ratios = [d["lockstep"]["ratio_to_dense"] for d, _ in runs]
    med = statistics.median(ratios) if ratios else None
    line(f"lockstep ratio_to_dense (median of {len(ratios)})",
         target(f"lockstep: 8 policies / dense at context {args[1]}", med, "<=", 2))
    # The tensor cores' figures (not the default, so no target of their own).
    mma = lockstep_runs("lockstep-mma", "tensor cores: dense / lockstep")
    if mma:
        mma_ratio = statistics.median(d["lockstep"]["ratio_to_dense"] for d, _ in mma)
        mma_step = statistics.median(d["lockstep"]["step_seconds_median"] for d, _ in mma)
        default_step = (statistics.median(d["lockstep"]["step_seconds_median"] for d, _ in runs)
                        if runs else None)
        line(f"tensor cores: ratio (median of {len(mma)})",
             f"{mma_ratio:.2f}x; its lockstep step / the default's: " +
             (f"{mma_step / default_step:.2f}" if default_step else "n/a"))
    summary["tensor_core_runs"] = [dict(d, command=c) for d, c in mma]
    if runs and runs[0][0]["lockstep"].get("run_tasks"):
        print("  per-run work (attention + policy select/observe, median over the runs, ms):")
        for j, task in enumerate(runs[0][0]["lockstep"]["run_tasks"]):
            value = statistics.median(d["lockstep"]["run_tasks"][j]["task_seconds_median"]
                                      for d, _ in runs)
            print(f"    {task['policy']:<12} {task['sparsity']:.2f}  {value * 1e3:.3f}")
    summary["runs"] = [dict(d, command=c) for d, c in runs]
    # Each policy's own work: its run alone less the dense step of the same process, as a share
    # of that dense step (medians over the repeats).
    own_rows = []
    names = [n for n in args[2].split(",") if n != "dense"]
    if names:
        print("  each policy's own work (its run alone - the dense step, share of the dense step):")
    for name in names:
        own = own_work(f"lockstep-own-{name}", int(args[0]))
        if own is None:
            print(f"    {name:<12} not run")
            continue
        print(f"    {name:<12} {own['own_seconds'] * 1e3:+8.3f} ms  " +
              target(f"{name}'s own work / dense step at context {args[1]}",
                     own["share_of_dense_step"] * 100, "<=", 15, "%"))
        own_rows.append({"policy": name, **own})
    summary["own_work"] = own_rows

elif part == "trace":
    n, count = int(args[0]), int(args[1])

    def med(name):
        values = [seconds(f"{name}-{i}") for i in range(count)]
        values = [v for v in values if v is not None]
        return (statistics.median(values) if values else None), values

    load, load_all = med("trace-load")
    gen, gen_all = med("trace-generate")
    rec, rec_all = med("trace-record")
    for label, name, value, values in (("load only", "trace-load", load, load_all),
                                       ("generate", "trace-generate", gen, gen_all),
                                       ("trace (record)", "trace-record", rec, rec_all)):
        cmd = text(f"{name}-0", "cmd")
        shown = "n/a" if value is None else (f"{value:.3f} s wall (median of "
                                             f"{', '.join(f'{v:.3f}' for v in values)})")
        line(label, shown, cmd.strip() if cmd else None)
    per_gen = (gen - load) / n if gen is not None and load is not None else None
    per_rec = (rec - load) / n if rec is not None and load is not None else None
    line("generate: per step", "n/a" if per_gen is None else f"{per_gen * 1e3:.3f} ms "
         f"((generate - load only) / {n})")
    line("trace: per step", "n/a" if per_rec is None else f"{per_rec * 1e3:.3f} ms "
         f"((trace - load only) / {n}, saving the file included)")
    ratio = per_rec / per_gen if per_rec and per_gen and per_gen > 0 else None
    line("trace / generate per step (wall)", "n/a" if ratio is None else
         f"{ratio:>9.2f}x   (processes' wall time: the trace's includes saving the file)")
    # The target: stepping alone, in process. trace's own stepping seconds (stdout, the file's
    # saving apart) against bench's summed step times over the same N steps from an empty cache
    # (each bench step waits for its logits; the trace's steps overlap their read-back).
    own, saves = [], []
    for i in range(count):
        out = text(f"trace-record-{i}", "out") or ""
        found = re.search(r"steps x \d+ runs in ([0-9.]+) s, rows ([0-9.]+) MiB saved in ([0-9.]+) s",
                          out)
        if found:
            own.append(float(found.group(1)) / n)
            saves.append((float(found.group(3)), float(found.group(2))))
    benches = [result(f"trace-bench-{i}") for i in range(count)]
    benches = [(d, c) for d, c in benches if d is not None]
    step = statistics.median(d.get("step_seconds_total", d["step_seconds_median"] * n) / n
                             for d, _ in benches) if benches else None
    line("bench: mean step over the same N", ms(step), benches[0][1] if benches else None)
    rec_step = statistics.median(own) if own else None
    line("trace: stepping only, per step", "n/a" if rec_step is None else
         f"{rec_step * 1e3:.3f} ms (its printed stepping seconds / {n})")
    if saves:
        save_s, mib = statistics.median(s for s, _ in saves), saves[0][1]
        line("trace: saving the file", f"{save_s:.3f} s for {mib:.1f} MiB of rows "
             f"({save_s / n * 1e3:.3f} ms per step)")
    inproc = rec_step / step if rec_step and step else None
    line("trace / bench per step (in process)",
         target("trace: recording every head, per step (in process)", inproc, "<=", 1.3))
    summary["commands"] = {k: (text(f"{k}-0", "cmd") or "").strip()
                           for k in ("trace-load", "trace-generate", "trace-record", "trace-bench")}
    summary.update(steps=n, load_seconds=load_all, generate_seconds=gen_all,
                   trace_seconds=rec_all, ratio=ratio, trace_step_seconds=own,
                   bench_step_seconds=step, ratio_in_process=inproc)

elif part == "coref":
    count = int(args[0])
    values = [seconds(f"coref-{i}") for i in range(count)]
    values = [v for v in values if v is not None]
    for i in range(count):
        out = text(f"coref-{i}", "out") or ""
        found = re.search(r"([0-9.]+) s for \d+ runs", out)
        own = f" (its own figure {found.group(1)} s)" if found else ""
        line(f"eval wall time, run {i + 1}", "n/a" if seconds(f"coref-{i}") is None else
             f"{seconds(f'coref-{i}'):.3f} s{own}", (text(f"coref-{i}", "cmd") or "").strip())
    med = statistics.median(values) if values else None
    line(f"median of {len(values)}",
         target(f"coref: {args[1]} samples x 10 policies, wall time", med, "<", 5, " s"))
    summary["seconds"] = values
    summary["command"] = (text("coref-0", "cmd") or "").strip()

elif part == "8b":
    r, cmd = result("8b-kvlens")
    if r is None:
        line("kvlens step", "not run")
        ratio = None
    else:
        line("kvlens step", kvlens_text(r), cmd)
        read, source = weight_read(r)
        line("weight-read time", f"{ms(read)}  ({source})")
        ratio = r["step_seconds_median"] / read if read else None
        summary["kvlens"] = dict(r, command=cmd)
    line("kvlens step / weight read",
         target(f"8b context {args[0]}: step / weight read", ratio, "<=", 1.5))

elif part == "multi":
    count, context, samples, layers_70b = int(args[0]), int(args[1]), int(args[2]), int(args[3])
    gpus_text = text("multi-gpus", "txt")
    gpus = int(gpus_text) if gpus_text else 1
    summary["gpus"] = gpus
    one = [result(f"multi-8b-1-{i}") for i in range(count)]
    split = [result(f"multi-8b-{gpus}-{i}") for i in range(count)]
    one = [(d, c) for d, c in one if d is not None]
    split = [(d, c) for d, c in split if d is not None]
    speedup = None
    if one and split:
        t1 = statistics.median(d["step_seconds_median"] for d, _ in one)
        tn = statistics.median(d["step_seconds_median"] for d, _ in split)
        line("8b step, one GPU", f"{ms(t1)} (median of {len(one)})", one[0][1])
        line(f"8b step, {gpus} GPUs", f"{ms(tn)} (median of {len(split)}; "
             f"/ a GPU's read of its shard {statistics.median(d['step_over_shard_weight_read'] for d, _ in split):.2f}x)",
             split[0][1])
        speedup = t1 / tn
        summary["8b"] = {"one_gpu_step_seconds": t1, "split_step_seconds": tn}
        peer = [result(f"multi-8b-{gpus}-peer-{i}") for i in range(count)]
        peer = [(d, c) for d, c in peer if d is not None]
        if peer:
            tp = statistics.median(d["step_seconds_median"] for d, _ in peer)
            line(f"8b step, {gpus} GPUs, peer all-reduce", f"{ms(tp)} (median of {len(peer)}; "
                 f"/ shard read {statistics.median(d['step_over_shard_weight_read'] for d, _ in peer):.2f}x)",
                 peer[0][1])
            summary["8b"]["split_peer_step_seconds"] = tp
    else:
        line("8b one GPU / split", "not run")
    line(f"8b at {context}: one GPU / {gpus} GPUs", target(f"8b split over {gpus} GPUs: speedup",
                                                         speedup, ">", 1.0))
    r, cmd = result(f"multi-70b-{gpus}")
    ratio = None
    skipped = text("multi-70b-skipped", "txt")
    proxy = "" if layers_70b == 80 else f" (a proxy: its first {layers_70b} of 80 layers)"
    if r is not None:
        ratio = r["step_over_shard_weight_read"]
        line(f"70b shape{proxy} step, {gpus} GPUs", f"{ms(r['step_seconds_median'])}, "
             f"shard {r['shard_weight_bytes_per_step'] / 1e9:.2f} GB a GPU", cmd)
        summary["70b"] = dict(r, command=cmd, layers=layers_70b)
        rp, cmd_peer = result(f"multi-70b-{gpus}-peer")
        if rp is not None:
            line(f"70b shape{proxy} step, {gpus} GPUs, peer all-reduce",
                 f"{ms(rp['step_seconds_median'])} (/ shard read {rp['step_over_shard_weight_read']:.2f}x)",
                 cmd_peer)
            summary["70b"]["peer_step_seconds"] = rp["step_seconds_median"]
    else:
        line(f"70b shape{proxy}", skipped.strip() if skipped else "not run (see the log)")
    line("70b step / a GPU's read of its shard",
         target(f"70b{proxy} on {gpus} GPUs at {context}: step / shard weight read", ratio, "<=", 1.5))
    s1, sn = seconds("multi-sweep-1"), seconds(f"multi-sweep-{gpus}")
    sweep = s1 / sn if s1 and sn else None
    line(f"coref sweep {samples} x 10 x 4, one GPU / {gpus} GPUs",
         "not run" if sweep is None else f"{s1:.1f} s / {sn:.1f} s",
         (text(f"multi-sweep-{gpus}", "cmd") or "").strip())
    line("sweep speedup", target(f"coref sweep on {gpus} GPUs: speedup", sweep, ">=",
                                 round(0.875 * gpus, 3)))
    summary["sweep"] = {"one_gpu_seconds": s1, "split_seconds": sn, "samples": samples}

elif part == "tokenbutler":
    count, contexts = int(args[0]), [int(c) for c in args[1].split(",")]
    rows = []
    for context in contexts:
        runs = [result(f"tokenbutler-{context}-{i}") for i in range(count)]
        runs = [(d, c) for d, c in runs if d is not None]
        if not runs:
            line(f"context {context}", "not run")
            continue
        ratio = statistics.median(d["lockstep"]["ratio_to_dense"] for d, _ in runs)
        share = statistics.median(d["predictor"]["share_of_dense_step"] for d, _ in runs)
        dense = statistics.median(d["step_seconds_median"] for d, _ in runs)
        own = statistics.median(d["predictor"]["step_seconds_median"] for d, _ in runs)
        fraction = runs[0][0]["predictor"]["parameter_fraction"]
        line(f"context {context}: dense / predictor", f"{dense * 1e3:.3f} ms / {own * 1e3:.3f} ms"
             f" (predictor {fraction:.2%} of the parameters)", runs[0][1])
        line(f"context {context}: tokenbutler / dense",
             target(f"tokenbutler run / dense step at {context}", ratio, "<=", 1.15))
        line(f"context {context}: predictor / dense",
             target(f"predictor share of a dense step at {context}", share * 100, "<=", 3, "%"))
        rows.append({"context": context, "dense_step_seconds": dense, "predictor_seconds": own,
                     "ratio": ratio, "predictor_share": share, "parameter_fraction": fraction})
    if len(rows) >= 2:
        first, last = rows[0], rows[-1]
        line(f"growth {first['context']} -> {last['context']}",
             f"predictor x{last['predictor_seconds'] / first['predictor_seconds']:.2f}, "
             f"dense step x{last['dense_step_seconds'] / first['dense_step_seconds']:.2f}")
    summary["rows"] = rows

elif part == "sparse":
    names, context = args[0].split(","), int(args[1])
    rows = []
    print(f"  at {context} tokens; attention: one step's attention calls over the run's kept keys "
          "against the dense attention op over the same caches (medians)")
    print("  kept: the (head, key) pairs the run kept; read: the keys some head of a KV group kept,"
          " the cache a grouped-query\n  kernel must read (the target: at most that share)")
    print("  policy       sparsity  kept    read    attention / dense (ms)    ratio   step / dense"
          " step        layers fused")
    for name in names:
        for sparsity in ("0.5", "0.9"):
            d, cmd = result(f"sparse-{name}-{sparsity}")
            if d is None or not d.get("attention_cost"):
                print(f"  {name:<12} {sparsity:<8}  not run")
                continue
            cost = d["attention_cost"][0]
            step = d["lockstep"]["step_seconds_median"]
            dense = d["step_seconds_median"]
            read = cost["read_share"]
            print(f"  {name:<12} {sparsity:<8}  {cost['kept_share']:.3f}   {read:.3f}  "
                  f"{cost['attention_seconds'] * 1e3:8.3f} / {cost['dense_attention_seconds'] * 1e3:8.3f}"
                  f"   {cost['ratio_to_dense']:6.2f}   {step * 1e3:.3f} / {dense * 1e3:.3f} ms"
                  f"   {cost.get('fused_layers', 0)} ({cost['masked_layers']} masked)")
            print("    " + target(f"{name}@{sparsity} at {context}: attention / dense "
                                  f"attention, kept {cost['kept_share']:.3f}, read {read:.3f}",
                                  cost["ratio_to_dense"], "<=", round(read, 3)))
            rows.append({"policy": name, "sparsity": float(sparsity), "command": cmd,
                         "kept_share": cost["kept_share"], "read_share": read,
                         "attention_seconds": cost["attention_seconds"],
                         "dense_attention_seconds": cost["dense_attention_seconds"],
                         "fused_layers": cost.get("fused_layers", 0),
                         "masked_layers": cost["masked_layers"],
                         "run_step_seconds": step, "dense_step_seconds": dense})
    summary["context"] = context
    summary["rows"] = rows

elif part == "policies":
    count, names = int(args[0]), args[1].split(",")
    rows = []
    print("  policy            dense step   policy's run   own work (run - dense), ms; medians of"
          f" {count}")
    for name in names:
        own = own_work(f"policies-{name.replace('+', '_')}", count)
        if own is None:
            print(f"  {name:<16} not run")
            continue
        print(f"  {name:<16} {own['dense_step_seconds'] * 1e3:10.3f}   "
              f"{own['run_step_seconds'] * 1e3:12.3f}   {own['own_seconds'] * 1e3:+9.3f}")
        rows.append({"policy": name, **own})
    summary["context"] = int(args[2])
    summary["rows"] = rows

summary["targets"] = targets
with open(os.path.join(work, f"{part}.json"), "w") as f:
    json.dump(summary, f, indent=2)
    f.write("\n")
PY
}

# ------------------------------------------------------------------------------------------ parts

part_1b_kvlens() {
  make_model "$work/$name_1b" "${shape_1b[@]}"
  local context
  for context in "${contexts_1b[@]}"; do
    run "1b-kvlens-$context" "$cli" bench --model "$work/$name_1b" --backend "$backend" \
      --context "$context" --steps "$steps_1b" --warmup "$warmup" --json
  done
}

part_1b_hf() {
  make_model "$work/$name_1b" "${shape_1b[@]}"
  # eager and sdpa at every context (eager at the longest one if it fits: else it says skipped),
  # then static-compiled at the first two (each context compiles afresh).
  run 1b-hf "$python" "$root/tools/bench_transformers.py" --model "$work/$name_1b" \
    "${hf_device[@]}" --contexts "$hf_contexts" --modes eager,sdpa --steps "$steps_1b" \
    --warmup "$warmup"
  if [ "$hf_compiled" = 1 ]; then
    # Each context compiles afresh; a compile past the timeout is reported as skipped, which
    # keeps the part inside a 10-minute job.
    run 1b-hf-compiled "$python" "$root/tools/bench_transformers.py" --model "$work/$name_1b" \
      "${hf_device[@]}" --contexts "$hf_compiled_contexts" --modes static-compiled \
      --steps "$steps_1b" --warmup "$warmup" \
      --compile-timeout "${KVLENS_BENCH_COMPILE_TIMEOUT:-150}"
  else
    rm -f "$raw"/1b-hf-compiled.*
    echo "  (transformers static-compiled: not run on backend $backend)"
  fi
}

part_1b() {
  part_1b_kvlens
  part_1b_hf
}

part_lockstep() {
  make_model "$work/$name_1b" "${shape_1b[@]}"
  local i name
  rm -f "$raw"/lockstep-*
  for i in $(seq 0 $((repeats - 1))); do
    run "lockstep-$i" "$cli" bench --model "$work/$name_1b" --backend "$backend" \
      --context "$lockstep_context" --steps "$steps_1b" --warmup "$warmup" \
      --policies "$policies8" --sparsity 0.5 --json
    # The same with the weight products on the tensor cores (KVLENS_GEMV_MMA=1, off by default:
    # lockstep much faster, a lone step slower; docs/performance.md round 21).
    run "lockstep-mma-$i" env KVLENS_GEMV_MMA=1 "$cli" bench --model "$work/$name_1b" \
      --backend "$backend" --context "$lockstep_context" --steps "$steps_1b" --warmup "$warmup" \
      --policies "$policies8" --sparsity 0.5 --json
    # Each policy's own work (item 2 of issue 43): its run alone beside the dense step of the
    # same process, the run's step less the dense one.
    for name in ${policies8//,/ }; do
      [ "$name" = dense ] && continue
      run "lockstep-own-$name-$i" "$cli" bench --model "$work/$name_1b" --backend "$backend" \
        --context "$lockstep_context" --steps "$steps_1b" --warmup "$warmup" \
        --policies "$name" --sparsity 0.5 --json
    done
  done
}

part_trace() {
  make_model "$work/$name_trace" "${shape_trace[@]}"
  # The demo model's tokenizer (8192 ids) turns the prompt into ids of this vocabulary.
  cp "$demo/tokenizer.json" "$work/$name_trace/tokenizer.json"
  prompt_file=$work/trace-prompt.txt
  # Text of many tokens (this repository's README, repeated); --max-tokens keeps the first N.
  # (head closes the pipe early once the README is long enough: cat's SIGPIPE is expected)
  { for _ in 1 2 3; do cat "$root/README.md"; done | head -c 60000 >"$prompt_file"; } || true
  prompt_text=$(cat "$prompt_file")
  local i model=$work/$name_trace
  rm -f "$raw"/trace-*
  for i in $(seq 0 $((repeats - 1))); do
    # load + upload + one token; generate's N forwards (one prompt token, N-1 new); trace's N
    # recorded decode steps (--prefill 0: every token a decode step) and saving the file.
    run "trace-load-$i" "$cli" generate --model "$model" --backend "$backend" --tokens 1 \
      --max-new 0 --ids
    run "trace-generate-$i" "$cli" generate --model "$model" --backend "$backend" --tokens 1 \
      --max-new $((trace_tokens - 1)) --ids
    run "trace-record-$i" "$cli" trace --model "$model" --backend "$backend" \
      --prompt "$prompt_text" --max-tokens "$trace_tokens" --prefill 0 --policies dense \
      --out "$work/t.kvtrace"
    # In-process figure of plain decoding: the same N steps from an empty cache, each timed.
    run "trace-bench-$i" "$cli" bench --model "$model" --backend "$backend" --context 0 \
      --steps "$trace_tokens" --warmup 0 --json
  done
  # Both sides stepped the same number of tokens.
  if ! grep -q "^trace .*: $trace_tokens steps" "$raw/trace-record-0.out"; then
    echo "bench_gpu.sh: the trace did not record $trace_tokens steps:" >&2
    head -n 1 "$raw/trace-record-0.out" >&2
    return 1
  fi
  if [ "$(wc -w <"$raw/trace-generate-0.out")" != $((trace_tokens - 1)) ]; then
    echo "bench_gpu.sh: generate did not print $((trace_tokens - 1)) ids" >&2
    return 1
  fi
  unset prompt_text
}

part_coref() {
  local i
  rm -f "$raw"/coref-*
  for i in $(seq 0 $((repeats - 1))); do
    run "coref-$i" "$cli" eval --backend "$backend" --model "$demo" --task coref \
      --samples "$coref_samples" --policies "$policies10" --sparsity 0.5 \
      --json "$work/coref-eval.json"
  done
}

part_policies() {
  make_model "$work/$name_trace" "${shape_trace[@]}"
  local model=$work/$name_trace corpus=$work/policies-corpus.txt name i
  cp "$demo/tokenizer.json" "$model/tokenizer.json"
  # Calibration text: this repository's documentation (the weights are random: what the files
  # hold does not change what the policies cost, only their shapes do).
  cat "$root"/README.md "$root"/docs/*.md >"$corpus"
  [ -f "$model/predictor.safetensors" ] ||
    run policies-predictor "$python" "$root/tools/make_butler_checkpoint.py" \
      --random-predictor "$model" --out "$model"
  [ -f "$model/loki_pca.safetensors" ] ||
    run policies-calibrate "$python" "$root/tools/calibrate_channels.py" --model "$model" \
      --corpus "$corpus" --tokens 4096 --device "$([ "$backend" = cuda ] && echo cuda || echo cpu)"
  [ -f "$model/duo_gates.safetensors" ] ||
    run policies-duo "$python" "$root/tools/train_duo_gates.py" --model "$model" \
      --data "$corpus" --steps 2 --haystack-tokens 20000 \
      --device "$([ "$backend" = cuda ] && echo cuda || echo cpu)"
  [ -f "$model/seer_gate.safetensors" ] ||
    run policies-seer "$python" "$root/tools/train_seer_gate.py" --model "$model" --init-only
  rm -f "$raw"/policies-*-[0-9].*
  for name in ${policies_all//,/ }; do
    for i in $(seq 0 $((repeats - 1))); do
      run "policies-${name//+/_}-$i" "$cli" bench --model "$model" --backend "$backend" \
        --context "$policies_context" --steps "$steps_1b" --warmup "$warmup" \
        --policies "$name" --sparsity 0.5 --json
    done
  done
}

# The 1B checkpoint with a random predictor of the 1B butler's dimensions, in a folder of its own
# (links to the checkpoint's files: its folder stays predictor-free for the other parts).
make_butler_model() {
  make_model "$work/$name_1b" "${shape_1b[@]}"
  local model=$work/$name_1b-butler
  mkdir -p "$model"
  ln -sf "$work/$name_1b/config.json" "$work/$name_1b/model.safetensors" "$model/"
  [ -f "$model/predictor.safetensors" ] ||
    run tokenbutler-predictor "$python" "$root/tools/make_butler_checkpoint.py" \
      --random-predictor "$model" --out "$model"
}

part_tokenbutler() {
  make_butler_model
  local model=$work/$name_1b-butler context i
  rm -f "$raw"/tokenbutler-[0-9]*
  for context in "${butler_contexts[@]}"; do
    for i in $(seq 0 $((repeats - 1))); do
      run "tokenbutler-$context-$i" "$cli" bench --model "$model" --backend "$backend" \
        --context "$context" --steps "$steps_1b" --warmup "$warmup" --policies tokenbutler \
        --sparsity 0.5 --json
    done
  done
}

part_sparse() {
  make_butler_model
  local model=$work/$name_1b-butler name sparsity
  rm -f "$raw"/sparse-*
  for name in ${policies_sparse//,/ }; do
    for sparsity in 0.5 0.9; do
      run "sparse-$name-$sparsity" "$cli" bench --model "$model" --backend "$backend" \
        --context "$sparse_context" --steps 16 --warmup 2 --policies "$name" \
        --sparsity "$sparsity" --attention-cost "$repeats" --json
    done
  done
}

part_8b() {
  make_model "$work/$name_8b" "${shape_8b[@]}"
  run 8b-kvlens "$cli" bench --model "$work/$name_8b" --backend "$backend" \
    --context "$context_8b" --steps "$steps_8b" --warmup "$warmup" --json
}

# The GPUs the multi part splits over: KVLENS_BENCH_GPUS, else every GPU nvidia-smi lists (on the
# CPU backend, 2 CPU ranks).
multi_gpus() {
  if [ -n "${KVLENS_BENCH_GPUS:-}" ]; then
    echo "$KVLENS_BENCH_GPUS"
  elif [ "$backend" = cuda ]; then
    nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l
  else
    echo 2
  fi
}

part_multi() {
  local gpus context i free need layer_bytes shm_free
  gpus=$(multi_gpus)
  rm -f "$raw"/multi-gpus.txt
  echo "  $gpus GPUs (ranks)"
  printf '%s\n' "$gpus" >"$raw/multi-gpus.txt"
  [ "$gpus" -ge 2 ] || {
    echo "  not run: one GPU (the multi part needs 2 or more)"
    return 0
  }
  # KVLENS_BENCH_MULTI=8b,70b,sweep (the default: all) runs some of them, e.g. the 70B shape in
  # a job of its own (its checkpoint alone takes minutes to write).
  local steps=",${KVLENS_BENCH_MULTI:-8b,70b,sweep},"
  [[ $steps == *,8b,* ]] && rm -f "$raw"/multi-8b-*
  [[ $steps == *,70b,* ]] && rm -f "$raw"/multi-70b-*
  [[ $steps == *,sweep,* ]] && rm -f "$raw"/multi-sweep-*
  if [[ $steps == *,8b,* || $steps == *,sweep,* ]]; then
    make_model "$work/$name_8b" "${shape_8b[@]}"
  fi
  for i in $(seq 0 $((repeats - 1))); do
    [[ $steps == *,8b,* ]] || break
    run "multi-8b-1-$i" "$cli" bench --model "$work/$name_8b" --backend "$backend" \
      --context "$multi_context" --steps "$multi_steps" --warmup "$warmup" --json
    run "multi-8b-$gpus-$i" "$cli" bench --model "$work/$name_8b" --backend "$backend" \
      --gpus "$gpus" --context "$multi_context" --steps "$multi_steps" --warmup "$warmup" --json
    # The small sums over peer memory instead of NCCL (opt-in: kernels/peer_all_reduce.h).
    if [ "$backend" = cuda ]; then
      run "multi-8b-$gpus-peer-$i" env KVLENS_PEER_ALL_REDUCE=1 "$cli" bench \
        --model "$work/$name_8b" --backend "$backend" --gpus "$gpus" --context "$multi_context" \
        --steps "$multi_steps" --warmup "$warmup" --json
    fi
  done
  # The 70B shape needs its checkpoint on disk (BF16: 2 bytes a parameter) and its shards in the
  # GPUs' memory; a run that cannot is skipped with the reason rather than failing midway.
  layer_bytes=$(python3 -c "h, f = 8192, 28672; print(2 * (2 * h * h + 2 * h * 1024 + 3 * h * f))")
  [ "$tiny" = 1 ] && layer_bytes=0
  need=$(((layer_bytes * layers_70b + 2 * 2 * 128256 * 8192) / 1000000000 + 2))
  [ "$tiny" = 1 ] && need=1
  free=$(df -P --block-size=1G "$work" | awk 'NR == 2 { print $4 }')
  # Where the disk is short, half the checkpoint goes to memory (/dev/shm, linked from $work):
  # the 80-layer shape is 141 GB, the 2 x H200 machine has 128 GB of disk and 256 GB of memory.
  shm_free=$(df -P --block-size=1G /dev/shm 2>/dev/null | awk 'NR == 2 { print $4 }')
  local spread=()
  if [ "$free" -lt "$need" ] && [ "$tiny" != 1 ] && [ -n "$shm_free" ] &&
    [ $((free + shm_free)) -ge "$need" ] && [ $((2 * shm_free)) -ge "$need" ]; then
    spread=(--shards 2 --shard-dirs "$work/$name_70b-$layers_70b.partial,/dev/shm/kvlens-$name_70b-$layers_70b")
    free=$need
    echo "  70B shape: half of its $need GB in /dev/shm ($shm_free GB free there, $work has less)"
  fi
  if [[ $steps != *,70b,* ]]; then
    echo "  70B shape not run (KVLENS_BENCH_MULTI)"
  elif [ -f "$work/$name_70b-$layers_70b/.bench-args" ] || [ "$free" -ge "$need" ]; then
    make_model "$work/$name_70b-$layers_70b" "${shape_70b[@]}" --layers "$layers_70b" "${spread[@]}"
    run "multi-70b-$gpus" "$cli" bench --model "$work/$name_70b-$layers_70b" \
      --backend "$backend" --gpus "$gpus" --context "$multi_context" --steps "$multi_steps" \
      --warmup "$warmup" --json || true
    if [ "$backend" = cuda ]; then
      run "multi-70b-$gpus-peer" env KVLENS_PEER_ALL_REDUCE=1 "$cli" bench \
        --model "$work/$name_70b-$layers_70b" --backend "$backend" --gpus "$gpus" \
        --context "$multi_context" --steps "$multi_steps" --warmup "$warmup" --json || true
    fi
  else
    echo "  70B shape ($layers_70b layers) not run: its checkpoint needs about $need GB of disk," \
      "$work has $free GB and /dev/shm ${shm_free:-0} GB (set KVLENS_BENCH_70B_LAYERS for a" \
      "proxy of fewer layers)" |
      tee "$raw/multi-70b-skipped.txt"
  fi
  # The sweep: every sample x policy x budget once on one GPU, then one engine per GPU (on the
  # CPU: --workers, the cores shared out). The demo model's tokenizer (8192 ids, within this
  # vocabulary) makes the samples' ids; ten policies that need no files of the model.
  [[ $steps == *,sweep,* ]] || return 0
  cp "$demo/tokenizer.json" "$work/$name_8b/tokenizer.json"
  local spread=(--gpus "$gpus")
  [ "$backend" = cuda ] || spread=(--workers "$gpus")
  run multi-sweep-1 "$cli" eval --backend "$backend" --model "$work/$name_8b" --task coref \
    --samples "$sweep_samples" --policies "$policies_sweep" --sparsity 0.3,0.5,0.7,0.9 \
    --json "$work/multi-sweep-1.json"
  run "multi-sweep-$gpus" "$cli" eval --backend "$backend" --model "$work/$name_8b" --task coref \
    --samples "$sweep_samples" --policies "$policies_sweep" --sparsity 0.3,0.5,0.7,0.9 \
    "${spread[@]}" --json "$work/multi-sweep-$gpus.json"
}

report_part() {
  case $1 in
    1b | 1b-kvlens | 1b-hf) report 1b "$(
      IFS=,
      echo "${contexts_1b[*]}"
    )" ;;
    lockstep) report lockstep "$repeats" "$lockstep_context" "$policies8" ;;
    trace) report trace "$trace_tokens" "$repeats" ;;
    coref) report coref "$repeats" "$coref_samples" ;;
    8b) report 8b "$context_8b" ;;
    multi) report multi "$repeats" "$multi_context" "$sweep_samples" "$layers_70b" ;;
    policies) report policies "$repeats" "$policies_all" "$policies_context" ;;
    sparse) report sparse "$policies_sparse" "$sparse_context" ;;
    tokenbutler) report tokenbutler "$repeats" "$(
      IFS=,
      echo "${butler_contexts[*]}"
    )" ;;
  esac
}

# ------------------------------------------------------------------------------------------ main

if command -v nvidia-smi >/dev/null 2>&1; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)
fi
echo "GPU: ${gpu:-none found (no nvidia-smi)}"
echo "backend: $backend$([ "$tiny" = 1 ] && echo ', --tiny: toy sizes, the numbers mean nothing')"
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
commit=unknown
if git -C "$root" rev-parse --short HEAD >/dev/null 2>&1; then
  commit=$(git -C "$root" rev-parse --short HEAD)
  git -C "$root" diff --quiet HEAD 2>/dev/null || commit+=" + local changes"
fi
echo "kvlens: $("$cli" --version 2>&1) ($cli), commit $commit"
echo "work: $work; parts: ${parts[*]}; $(date -u '+%Y-%m-%d %H:%M UTC')"

failed=()
for part in "${parts[@]}"; do
  echo
  echo "== part $part"
  start=$(date +%s)
  set +e
  (
    set -e
    "part_${part//-/_}"
  )
  rc=$?
  set -e
  state="done"
  [ $rc = 0 ] || state="FAILED (exit $rc)"
  echo "-- part $part: $state in $(($(date +%s) - start)) s"
  [ $rc = 0 ] || failed+=("$part")
  # The table, from whatever results WORK holds (a failed part reports what it measured).
  report_part "$part" || failed+=("$part (report)")
done

echo
echo "== targets"
python3 - "$work" "${parts[@]}" <<'PY'
import json, os, sys
work, parts = sys.argv[1], sys.argv[2:]
seen = set()
for part in parts:
    name = "1b" if part.startswith("1b") else part
    path = os.path.join(work, f"{name}.json")
    if name in seen or not os.path.exists(path):
        continue
    seen.add(name)
    with open(path) as f:
        for t in json.load(f)["targets"]:
            value = "n/a" if t["value"] is None else f"{t['value']:.2f}"
            print(f"  {t['state']:<12} {t['what']}: {value} (target {t['target']})")
PY
if [ ${#failed[@]} -gt 0 ]; then
  echo "bench_gpu.sh: failed: ${failed[*]}" >&2
  exit 1
fi
