#!/usr/bin/env python3
"""Hugging Face transformers decode-step timing, the reference kvlens' `bench` is compared with.

For a Llama checkpoint folder (config.json + safetensors, e.g. one made by make_random_model.py; no
tokenizer is needed: the context is random token ids) and each context length, it fills a KV cache
with `context` tokens (prefill in chunks of --prefill-chunk, which bounds eager attention's
[heads, q, k] scores at long contexts), then times greedy decode steps: one new token given the
cache, its argmax the next step's input, torch.cuda.synchronize() before and after each step.
--warmup steps are untimed, then --steps are timed; it reports their median and minimum.

Modes:
  eager            attn_implementation="eager", DynamicCache
  sdpa             attn_implementation="sdpa", DynamicCache
  static-compiled  sdpa, StaticCache(config=..., max_cache_len=context + every step) and
                   torch.compile(model.forward, mode="reduce-overhead", fullgraph=True) as the
                   transformers docs on static caches and torch.compile show; the prefill runs
                   uncompiled. Compilation (dynamo reset per context, so every context compiles
                   afresh) and CUDA-graph recording happen in the first --compile-calls steps,
                   whose total time is reported as compile_seconds; --compile-timeout bounds it.
A (mode, context) that runs out of memory or fails is reported as {"skipped": reason}; the run
goes on. Prints one JSON object on stdout (progress on stderr).

  bench_transformers.py --model DIR [--contexts 512,4096,16384] [--modes eager,sdpa,static-compiled]
      [--steps 64] [--warmup 4] [--device cuda] [--dtype bf16]
CPU toy run: --device cpu --dtype f32 --contexts 16,32 --modes eager,sdpa
"""

import argparse
import gc
import json
import os
import platform
import signal
import statistics
import sys
import time

MODES = ("eager", "sdpa", "static-compiled")
DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}


def log(text):
    print(f"bench_transformers: {text}", file=sys.stderr, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="checkpoint folder (config.json + safetensors)")
    p.add_argument("--contexts", default="512,4096,16384",
                   help="comma-separated tokens in the cache before the timed steps")
    p.add_argument("--modes", default=",".join(MODES),
                   help="comma-separated, of " + ", ".join(MODES))
    p.add_argument("--steps", type=int, default=64, help="timed decode steps (default 64)")
    p.add_argument("--warmup", type=int, default=4, help="untimed decode steps first (default 4)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--prefill-chunk", type=int, default=1024,
                   help="tokens per prefill forward (bounds eager's score matrix; default 1024)")
    p.add_argument("--compile-calls", type=int, default=3,
                   help="static-compiled: steps that compile and record the graph (default 3)")
    p.add_argument("--compile-timeout", type=float, default=300.0,
                   help="static-compiled: give up on a context whose compile steps take longer "
                        "(seconds, default 300; 0 = no limit)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="also write the JSON object to this file")
    args = p.parse_args(argv)
    try:
        args.contexts = [int(c) for c in args.contexts.split(",") if c.strip()]
    except ValueError:
        p.error(f"--contexts: expected integers, got {args.contexts!r}")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in args.modes:
        if m not in MODES:
            p.error(f"--modes: unknown mode {m!r} (known: {', '.join(MODES)})")
    if args.steps < 1 or args.warmup < 0 or args.prefill_chunk < 1 or args.compile_calls < 1:
        p.error("--steps, --prefill-chunk and --compile-calls must be positive, --warmup >= 0")
    if any(c < 1 for c in args.contexts):
        p.error("--contexts must be positive")
    return args


class CompileTimeout(Exception):
    pass


class Deadline:
    """SIGALRM-based time limit for the compile steps (main thread, POSIX); a no-op elsewhere."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.armed = seconds > 0 and hasattr(signal, "SIGALRM")

    def _fire(self, signum, frame):
        raise CompileTimeout(f"compile steps took longer than --compile-timeout {self.seconds:g} s")

    def __enter__(self):
        if self.armed:
            self.previous = signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc):
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)
        return False


class Bench:
    def __init__(self, args):
        import torch
        import transformers
        self.torch, self.transformers, self.args = torch, transformers, args
        self.device = torch.device(args.device)
        self.dtype = getattr(torch, DTYPES[args.dtype])
        self.cuda = self.device.type == "cuda"
        self.model = None
        self.attn = None

    # ------------------------------------------------------------------ model and caches
    def load(self, attn):
        """The model with attention implementation `attn`: switched in place where the
        transformers version can, else loaded again."""
        if self.model is not None and self.attn == attn:
            return self.model
        if self.model is not None and hasattr(self.model, "set_attn_implementation"):
            try:
                self.model.set_attn_implementation(attn)
                if getattr(self.model.config, "_attn_implementation", attn) == attn:
                    self.attn = attn
                    return self.model
            except Exception as error:  # noqa: BLE001 - fall back to a fresh load
                log(f"set_attn_implementation({attn}) failed ({error}); loading again")
        self.model = None
        self.free()
        start = time.perf_counter()
        cls = self.transformers.AutoModelForCausalLM
        try:
            model = cls.from_pretrained(self.args.model, dtype=self.dtype, attn_implementation=attn)
        except TypeError:  # transformers 4.x: torch_dtype
            model = cls.from_pretrained(self.args.model, torch_dtype=self.dtype,
                                        attn_implementation=attn)
        self.model = model.to(self.device).eval()
        self.attn = attn
        self.load_seconds = time.perf_counter() - start
        log(f"loaded {self.args.model} ({attn}, {self.args.dtype}, {self.args.device}) in "
            f"{self.load_seconds:.1f} s")
        return self.model

    def dynamic_cache(self):
        DynamicCache = self.transformers.DynamicCache
        try:
            return DynamicCache(config=self.model.config)
        except TypeError:  # transformers 4.x
            return DynamicCache()

    def static_cache(self, max_len):
        StaticCache = self.transformers.StaticCache
        # transformers 5.x: StaticCache(config=..., max_cache_len=...); the layers allocate
        # lazily on the first update with the keys' dtype and device.
        return StaticCache(config=self.model.config, max_cache_len=max_len)

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def free(self):
        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()

    # ------------------------------------------------------------------ steps
    def prefill(self, cache, ids):
        """Fills `cache` with `ids` in chunks; returns the last position's argmax and seconds."""
        torch = self.torch
        start = time.perf_counter()
        token = None
        with torch.no_grad():
            for s in range(0, ids.shape[1], self.args.prefill_chunk):
                out = self.model(input_ids=ids[:, s:s + self.args.prefill_chunk],
                                 past_key_values=cache, use_cache=True, logits_to_keep=1)
                token = out.logits[:, -1:].argmax(-1)
                del out
        self.sync()
        return token, time.perf_counter() - start

    def timed_steps(self, forward, cache, token, count):
        """`count` greedy steps through `forward`; the seconds of each and the last token."""
        torch = self.torch
        seconds = []
        with torch.no_grad():
            for _ in range(count):
                self.sync()
                start = time.perf_counter()
                out = forward(input_ids=token, past_key_values=cache, use_cache=True)
                token = out.logits[:, -1:].argmax(-1)
                self.sync()
                seconds.append(time.perf_counter() - start)
                del out
        return seconds, token

    def compile_steps(self, entry, ids, total):
        """static-compiled: a StaticCache of `total` positions filled with `ids` (uncompiled), then
        the first --compile-calls steps through torch.compile(model.forward, ...), which compile
        and record the CUDA graph. fullgraph=True as documented; should this torch/transformers
        pair fail to trace the forward as one graph, it falls back to fullgraph=False (graph
        breaks allowed, as generate()'s own CompileConfig default) and says so."""
        torch, args = self.torch, self.args
        entry["cache"] = "StaticCache"
        entry["max_cache_len"] = total
        for fullgraph in (True, False):
            cache = self.static_cache(total)
            token, entry["prefill_seconds"] = self.prefill(cache, ids)
            torch._dynamo.reset()  # every context compiles afresh, as a user's first run would
            forward = torch.compile(self.model.forward, mode="reduce-overhead", fullgraph=fullgraph)
            entry["compile"] = ('torch.compile(model.forward, mode="reduce-overhead", '
                                f'fullgraph={fullgraph})')
            entry["fullgraph"] = fullgraph
            start = time.perf_counter()
            try:
                with Deadline(args.compile_timeout):
                    first, token = self.timed_steps(forward, cache, token, args.compile_calls)
            except Exception as error:  # noqa: BLE001 - the fallback, or the caller's skip
                oom = (isinstance(error, torch.cuda.OutOfMemoryError)
                       or "out of memory" in str(error))
                if not fullgraph or oom or isinstance(error, CompileTimeout):
                    raise
                text = " ".join(str(error).split())[:300]
                log(f"fullgraph=True failed ({type(error).__name__}: {text}); "
                    "trying fullgraph=False")
                entry["fullgraph_error"] = f"{type(error).__name__}: {text}"
                del cache, forward
                self.free()
                continue
            entry["compile_seconds"] = time.perf_counter() - start
            entry["compile_call_seconds"] = first
            return token, cache, forward
        raise AssertionError("unreachable")

    def run(self, mode, context, entry):
        torch, args = self.torch, self.args
        model = self.load("eager" if mode == "eager" else "sdpa")
        vocab = model.config.vocab_size
        generator = torch.Generator().manual_seed(args.seed + context)
        ids = torch.randint(0, vocab, (1, context), generator=generator).to(self.device)
        entry["attn_implementation"] = self.attn
        compiled_calls = args.compile_calls if mode == "static-compiled" else 0
        total = context + compiled_calls + args.warmup + args.steps
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit is not None and total > limit:
            raise ValueError(f"context + steps = {total} > max_position_embeddings {limit}")
        if mode == "static-compiled":
            token, cache, forward = self.compile_steps(entry, ids, total)
        else:
            cache = self.dynamic_cache()
            entry["cache"] = "DynamicCache"
            token, entry["prefill_seconds"] = self.prefill(cache, ids)
            forward = model
        _, token = self.timed_steps(forward, cache, token, args.warmup)
        seconds, token = self.timed_steps(forward, cache, token, args.steps)
        entry.update(median_ms=statistics.median(seconds) * 1e3, min_ms=min(seconds) * 1e3,
                     max_ms=max(seconds) * 1e3, steps=len(seconds), warmup=args.warmup)
        if self.cuda:
            entry["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(self.device)
        del cache, ids, token, forward
        return entry

    def safe_run(self, mode, context):
        torch = self.torch
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        entry = {}
        try:
            self.run(mode, context, entry)
        except Exception as error:  # noqa: BLE001 - one failed (mode, context) never aborts
            oom = isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error)
            reason = "out of memory" if oom else f"{type(error).__name__}"
            text = " ".join(str(error).split())
            entry = {"skipped": f"{reason}: {text[:400]}" if text else reason,
                     **{k: v for k, v in entry.items() if k in ("fullgraph_error", "compile")}}
            if mode == "static-compiled":
                try:
                    torch._dynamo.reset()
                except Exception:  # noqa: BLE001
                    pass
        self.free()
        return entry

    def machine(self):
        torch = self.torch
        info = {"device": self.args.device, "torch": torch.__version__,
                "transformers": self.transformers.__version__, "python": platform.python_version(),
                "host": platform.node()}
        if self.cuda:
            info["gpu"] = torch.cuda.get_device_name(self.device)
            info["cuda"] = torch.version.cuda
            info["gpu_memory_bytes"] = torch.cuda.get_device_properties(self.device).total_memory
        else:
            info["cpu"] = platform.processor() or platform.machine()
            info["threads"] = torch.get_num_threads()
        return info


def main(argv=None):
    args = parse_args(argv)
    import torch
    bench = Bench(args)
    if bench.cuda and not torch.cuda.is_available():
        raise SystemExit("bench_transformers.py: --device cuda but torch sees no CUDA device")
    with open(os.path.join(args.model, "config.json")) as f:
        config = json.load(f)
    result = {"tool": "bench_transformers.py", "machine": bench.machine(),
              "model": os.path.abspath(args.model), "dtype": args.dtype,
              "config": {k: config.get(k) for k in ("hidden_size", "num_hidden_layers",
                                                    "num_attention_heads", "num_key_value_heads",
                                                    "intermediate_size", "vocab_size",
                                                    "tie_word_embeddings",
                                                    "max_position_embeddings")},
              "steps": args.steps, "warmup": args.warmup, "prefill_chunk": args.prefill_chunk,
              "step": "one greedy token: model(input_ids=[[t]], past_key_values=cache, "
                      "use_cache=True), argmax on the device, synchronized before and after",
              "modes": {}}
    start = time.perf_counter()
    # eager, sdpa, static-compiled in this order: one loaded model, its attention implementation
    # switched in place; the compiled mode last (compile workers no longer compete with them).
    for mode in sorted(args.modes, key=MODES.index):
        per_context = result["modes"].setdefault(mode, {})
        for context in args.contexts:
            log(f"{mode} at context {context} ...")
            entry = bench.safe_run(mode, context)
            per_context[str(context)] = entry
            if "skipped" in entry:
                log(f"{mode} at context {context}: skipped: {entry['skipped']}")
            else:
                extra = (f", compile {entry['compile_seconds']:.1f} s"
                         if "compile_seconds" in entry else "")
                log(f"{mode} at context {context}: median {entry['median_ms']:.3f} ms, "
                    f"min {entry['min_ms']:.3f} ms{extra}")
        if bench.model is not None:
            result["parameters"] = sum(p.numel() for p in bench.model.parameters())
            result["load_seconds"] = getattr(bench, "load_seconds", None)
    result["seconds"] = time.perf_counter() - start
    text = json.dumps(result, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    main()
