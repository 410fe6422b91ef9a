// kvlens-kernel-bench: the CUDA backend's decode ops one by one at the shapes of a
// Llama-3.2-1B-like model (or --hidden/--intermediate/...), each called many times in a row. Per
// op: the host's enqueue time per call (the queue does not fill: the calls are timed without a
// synchronization) and the time per call of the whole batch once the GPU has finished it, which
// is the GPU's time where the GPU is the slower side. Products also print their weight-read
// rate against the device copy bandwidth measured in the same process.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda_backend.h"

namespace {

using kvlens::Backend;
using kvlens::DeviceTensor;
using kvlens::DType;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Timing {
  double enqueue_us = 0.0, per_call_us = 0.0;
};

// Median over `repeats` batches of `calls` calls each.
Timing time_op(Backend& backend, int calls, int repeats, const std::function<void()>& op) {
  op();
  backend.synchronize();
  std::vector<double> enqueue, total;
  for (int r = 0; r < repeats; ++r) {
    const double start = now_seconds();
    for (int i = 0; i < calls; ++i) op();
    const double queued = now_seconds();
    backend.synchronize();
    const double done = now_seconds();
    enqueue.push_back((queued - start) / calls * 1e6);
    total.push_back((done - start) / calls * 1e6);
  }
  std::sort(enqueue.begin(), enqueue.end());
  std::sort(total.begin(), total.end());
  return {enqueue[enqueue.size() / 2], total[total.size() / 2]};
}

int64_t arg(int argc, char** argv, const char* name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoll(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  if (!kvlens::cuda_device_available()) {
    std::printf("kvlens-kernel-bench: no CUDA device\n");
    return 0;
  }
  const int64_t E = arg(argc, argv, "--hidden", 2048);
  const int64_t F = arg(argc, argv, "--intermediate", 8192);
  const int64_t H = arg(argc, argv, "--heads", 32);
  const int64_t G = arg(argc, argv, "--kv-heads", 8);
  const int64_t V = arg(argc, argv, "--vocab", 128256);
  const int64_t D = E / H;
  const int calls = int(arg(argc, argv, "--calls", 200));
  const int repeats = 5;
  auto backend = kvlens::make_cuda_backend(0);
  Backend& b = *backend;
  const double copy_gbps = b.copy_bandwidth_gbps(size_t(1) << 30, 5);
  const double memory_gbps = 2.0 * copy_gbps;
  std::printf("device copy %.0f GB/s (read + written %.0f GB/s)\n", copy_gbps, memory_gbps);
  std::printf("%-40s %12s %12s %10s\n", "op", "enqueue us", "per call us", "of bound");

  auto report = [&](const std::string& name, const Timing& t, double bytes) {
    if (bytes > 0) {
      const double bound_us = bytes / (memory_gbps * 1e9) * 1e6;
      std::printf("%-40s %12.2f %12.2f %9.2fx\n", name.c_str(), t.enqueue_us, t.per_call_us,
                  t.per_call_us / bound_us);
    } else {
      std::printf("%-40s %12.2f %12.2f\n", name.c_str(), t.enqueue_us, t.per_call_us);
    }
  };

  struct Product {
    const char* name;
    int64_t in, out;
  };
  for (const int64_t rows : {1, 8}) {
    for (const Product& p :
         {Product{"wq", E, H * D}, Product{"wk", E, G * D}, Product{"w_gate", E, F},
          Product{"w_down", F, E}, Product{"lm_head", E, V}}) {
      const DeviceTensor w = b.alloc(DType::BF16, {p.out, p.in});
      const DeviceTensor x = b.alloc(DType::F32, {rows, p.in});
      DeviceTensor y = b.alloc(DType::F32, {rows, p.out});
      const Timing t = time_op(b, calls, repeats, [&] { b.matmul(x, w, y); });
      report(std::string("matmul ") + p.name + " bf16 rows " + std::to_string(rows), t,
             double(w.bytes()));
    }
  }
  for (const int64_t rows : {1, 8}) {
    // The fused decode calls of one layer, as the session makes them.
    const DeviceTensor norm = b.alloc(DType::BF16, {E});
    const DeviceTensor wq = b.alloc(DType::BF16, {H * D, E}), wk = b.alloc(DType::BF16, {G * D, E});
    const DeviceTensor wv = b.alloc(DType::BF16, {G * D, E}), wo = b.alloc(DType::BF16, {E, H * D});
    const DeviceTensor w_gate = b.alloc(DType::BF16, {F, E}), w_up = b.alloc(DType::BF16, {F, E});
    DeviceTensor x = b.alloc(DType::F32, {rows, E}), normed = b.alloc(DType::F32, {rows, E});
    DeviceTensor q = b.alloc(DType::F32, {rows, H * D}), k = b.alloc(DType::F32, {rows, G * D});
    DeviceTensor v = b.alloc(DType::F32, {rows, G * D}), proj = b.alloc(DType::F32, {rows, E});
    DeviceTensor gate = b.alloc(DType::F32, {rows, F}), up = b.alloc(DType::F32, {rows, F});
    DeviceTensor act = b.alloc(DType::F32, {rows, F});
    const DeviceTensor* const qkv_w[] = {&wq, &wk, &wv};
    DeviceTensor* const qkv[] = {&q, &k, &v};
    const std::string at = " rows " + std::to_string(rows);
    report("rmsnorm + q/k/v" + at,
           time_op(b, calls, repeats,
                   [&] { b.rmsnorm_matmul_many(x, norm, 1e-5f, normed, qkv_w, qkv); }),
           double(wq.bytes() + wk.bytes() + wv.bytes()));
    report("o_proj + residual" + at,
           time_op(b, calls, repeats, [&] { b.matmul_add(q, wo, proj, x); }), double(wo.bytes()));
    report("rmsnorm + gate/up + silu" + at,
           time_op(b, calls, repeats,
                   [&] { b.rmsnorm_gate_up(x, norm, 1e-5f, normed, w_gate, w_up, gate, up, act); }),
           double(w_gate.bytes() + w_up.bytes()));
  }
  {
    DeviceTensor x = b.alloc(DType::F32, {1, E});
    const DeviceTensor w = b.alloc(DType::BF16, {E});
    DeviceTensor y = b.alloc(DType::F32, {1, E});
    report("rmsnorm", time_op(b, calls, repeats, [&] { b.rmsnorm(x, w, 1e-5f, y); }), 0);
    report("add_inplace", time_op(b, calls, repeats, [&] { b.add_inplace(x, y); }), 0);
    DeviceTensor gate = b.alloc(DType::F32, {1, F}), up = b.alloc(DType::F32, {1, F});
    DeviceTensor act = b.alloc(DType::F32, {1, F});
    report("silu_mul", time_op(b, calls, repeats, [&] { b.silu_mul(gate, up, act); }), 0);
    DeviceTensor q = b.alloc(DType::F32, {1, H, D});
    const DeviceTensor inv_freq = b.alloc(DType::F32, {D / 2});
    const std::vector<int64_t> position = {1000};
    report("rope (q)", time_op(b, calls, repeats, [&] { b.rope(q, position, inv_freq); }), 0);
  }
  for (const DType cache_dtype : {DType::BF16, DType::F32}) {
    for (const int64_t context : {512, 4096, 16384, 32768}) {
      const int64_t stride = 32768;
      DeviceTensor k_cache = b.alloc(cache_dtype, {G, stride, D});
      DeviceTensor v_cache = b.alloc(cache_dtype, {G, stride, D});
      const DeviceTensor q = b.alloc(DType::F32, {1, H, D});
      const DeviceTensor k = b.alloc(DType::F32, {1, G, D});
      DeviceTensor logits = b.alloc(DType::F32, {H, stride});
      DeviceTensor probs = b.alloc(DType::F32, {H, stride});
      DeviceTensor out = b.alloc(DType::F32, {1, H, D});
      DeviceTensor step_logits = b.alloc(DType::F32, {1, H, context});
      const std::string at = std::string(cache_dtype == DType::BF16 ? " bf16" : " f32") +
                             " cache, ctx " + std::to_string(context);
      report("kv_append" + at,
             time_op(b, calls, repeats, [&] { b.kv_append(k, k, k_cache, v_cache, context - 1); }),
             0);
      const double cache_bytes = double(G * context * D * dtype_size(cache_dtype));
      report("attention_logits" + at,
             time_op(b, calls, repeats,
                     [&] { b.attention_logits(q, k_cache, context - 1, 0, logits); }),
             cache_bytes);
      report("attention_visible" + at,
             time_op(b, calls, repeats,
                     [&] { b.attention_visible(logits, context, nullptr, v_cache, out, nullptr); }),
             cache_bytes);
      report("attention (decode op)" + at,
             time_op(b, calls, repeats,
                     [&] {
                       b.attention(q, k_cache, v_cache, context - 1, 0, kvlens::Visibility{}, out,
                                   nullptr);
                     }),
             2 * cache_bytes);
      report("attention +logits (decode op)" + at,
             time_op(b, calls, repeats,
                     [&] {
                       b.attention(q, k_cache, v_cache, context - 1, 0, kvlens::Visibility{}, out,
                                   &step_logits);
                     }),
             2 * cache_bytes);
    }
  }
  return 0;
}
