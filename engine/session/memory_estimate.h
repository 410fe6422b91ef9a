// What a model will need in memory before it is opened for work (issue 27 item 3): its weights on
// each backend, and per 1k tokens its KV cache, policy rows and trace rows; and the check that a
// request fits the memory the machine has (MemAvailable in /proc/meminfo), made before any work so
// that asking for too much is one clear error instead of an out-of-memory kill.
#pragma once

#include <cstdint>
#include <string>

#include "engine/model/model.h"

namespace kvlens {

struct MemoryEstimate {
  // The checkpoint's tensors as stored (mapped from the files: page cache the kernel may drop
  // and read again, not private memory).
  int64_t mapped_bytes = 0;
  // CPU backend, private memory: every matrix repacked once into matmul panels (BF16 stays
  // BF16; F32 and F16 as F32) and F16 tensors widened to F32; F32/BF16 tensors are used where
  // they are mapped.
  int64_t cpu_weight_bytes = 0;
  // CUDA backend: every tensor in its checkpoint dtype (GPU memory).
  int64_t cuda_weight_bytes = 0;
  // Per 1024 tokens of context, per run (one policy): the KV cache (F32 keys and values of every
  // layer, both backends), the session's policy rows ([H, tokens] scores of every layer, logits
  // and probabilities F32, masks U8; a policy's own state comes on top, about as much again),
  // and one recorded step's trace rows at 1024 columns (a logit, a score and a visibility byte per
  // layer and head; a recording keeps each step's rows within its memory budget).
  int64_t kv_cache_per_1k = 0;
  // The CUDA backend's KV cache per 1024 tokens: in the layers' weight dtype by default.
  int64_t cuda_kv_cache_per_1k = 0;
  int64_t policy_rows_per_1k = 0;
  int64_t trace_step_rows_at_1k = 0;
  // Of cuda_weight_bytes, what a tensor-parallel split divides (engine/arch/tensor_parallel.h):
  // the layers' q, o, gate, up and down products (with q's bias) over the ranks, and their k and
  // v products (with biases) over min(ranks, KV heads); embeddings, lm_head and norms are whole
  // on every GPU.
  int64_t cuda_split_bytes = 0;
  int64_t cuda_kv_proj_bytes = 0;
  int64_t kv_heads = 1;

  // GPU memory on each GPU of a split over `ranks` (1: the whole model on one): its weights, and
  // `runs` runs' KV caches of `tokens` positions (each GPU holds its KV heads' caches), the
  // weights scaled by `weight_scale` (2 for a BF16 checkpoint run in F32, 0.5 the other way).
  int64_t cuda_bytes_per_gpu(int64_t ranks, int64_t tokens, int64_t runs = 1,
                             double weight_scale = 1.0) const;

  // Private CPU memory of `runs` runs over `tokens` positions (weights, caches, and policy rows
  // where `policies`), rounded up to the caches' doubling.
  int64_t cpu_session_bytes(int64_t tokens, int64_t runs, bool policies) const;
};

MemoryEstimate estimate_memory(const Model& model);

// The fewest GPUs of `device_bytes` each that hold `model` split as check_tensor_parallel allows,
// with `runs` runs' caches of `tokens` positions, a tenth of each GPU kept for the CUDA runtime
// and scratch; 0 when no split up to 64 GPUs fits.
int64_t gpus_needed_split(const Model& model, const MemoryEstimate& estimate, int64_t tokens,
                          int64_t device_bytes, double weight_scale = 1.0, int64_t runs = 1);

// MemAvailable of a /proc/meminfo-style file in bytes, or -1 where it cannot be read.
int64_t available_memory_bytes(const std::string& meminfo = "/proc/meminfo");

// Throws kvlens::Error ("memory", `what`) naming both figures in MiB when `needed` bytes exceed
// `available` (a negative `available`, unknown, passes).
void require_memory(int64_t needed, int64_t available, const std::string& what);

}  // namespace kvlens
