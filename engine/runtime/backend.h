// Backend: the small set of operations the decoder needs, implemented by the CPU reference
// backend (engine/runtime/cpu_backend) and the CUDA backend (kernels/). All activations are F32;
// weights may stay F32, BF16 or F16 in backend memory. Shapes below are row-major.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/common/dtype.h"
#include "engine/model/safetensors.h"

namespace kvlens {

class Backend;

// A tensor in a backend's memory (host memory for the CPU backend, device memory for CUDA).
// Copies share storage; storage is released when the last copy goes.
struct DeviceTensor {
  std::shared_ptr<void> storage;  // owner (may be empty when aliasing mapped host memory)
  void* data = nullptr;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;

  int64_t numel() const;
  size_t bytes() const { return size_t(numel()) * dtype_size(dtype); }
  int64_t dim(size_t i) const { return shape.at(i); }
  bool empty() const { return data == nullptr; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// Which cached positions each head may attend to at one decode step. Empty = all of
// [window_begin, position]. Otherwise mask[h * context + j] != 0 means head h sees key j.
struct Visibility {
  const DeviceTensor* mask = nullptr;  // U8 [heads, context] in backend memory
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // --- memory ---
  // Makes weights usable by the backend. The CPU backend aliases the mapped file (F32/BF16) and
  // converts F16 to F32; device backends copy. `keep_alive` owns the host memory behind `view`.
  virtual DeviceTensor upload_weight(const TensorView& view, std::shared_ptr<void> keep_alive) = 0;
  virtual DeviceTensor alloc(DType dtype, std::vector<int64_t> shape) = 0;  // zero-filled
  virtual void to_host(const DeviceTensor& src, void* host, size_t bytes) = 0;
  virtual void from_host(DeviceTensor& dst, const void* host, size_t bytes) = 0;
  // Copies `rows` rows of `row_elems` F32 each from src[src_row..] to dst[dst_row..].
  virtual void copy_rows(const DeviceTensor& src, int64_t src_row, DeviceTensor& dst,
                         int64_t dst_row, int64_t rows, int64_t row_elems) = 0;

  // --- ops (F32 activations) ---
  // out[n, E] = table[ids[n], :] (table F32/BF16/F16 [vocab, E]). ids are host values, checked.
  virtual void embed(const DeviceTensor& table, std::span<const int32_t> ids,
                     DeviceTensor& out) = 0;
  // y[n, out] = x[n, in] * w[out, in]^T  (w in any weight dtype).
  virtual void matmul(const DeviceTensor& x, const DeviceTensor& w, DeviceTensor& y) = 0;
  // y[n, E] = x * rsqrt(mean(x^2) + eps) * weight, per row (weight [E] any weight dtype).
  virtual void rmsnorm(const DeviceTensor& x, const DeviceTensor& weight, float eps,
                       DeviceTensor& y) = 0;
  // In place on x[n, heads, D]: rotate-half RoPE at positions[n] (host values), with the
  // model's inverse frequencies inv_freq[D/2] (F32, backend memory).
  virtual void rope(DeviceTensor& x, std::span<const int64_t> positions,
                    const DeviceTensor& inv_freq) = 0;
  // out[n, F] = silu(gate) * up
  virtual void silu_mul(const DeviceTensor& gate, const DeviceTensor& up, DeviceTensor& out) = 0;
  // x += y (same shape)
  virtual void add_inplace(DeviceTensor& x, const DeviceTensor& y) = 0;
  // Writes k[n, G, D] and v[n, G, D] into cache rows [G, capacity, D] at positions
  // first_position .. first_position + n - 1.
  virtual void kv_append(const DeviceTensor& k, const DeviceTensor& v, DeviceTensor& k_cache,
                         DeviceTensor& v_cache, int64_t first_position) = 0;
  // Causal attention of q[n, H, D] (positions first_position..+n-1) over the cache
  // [G, capacity, D] (GQA: query head h reads KV head h / (H/G)). Query row i sees keys
  // j in [max(0, p_i - window + 1), p_i] when window > 0, else [0, p_i], intersected with
  // `visible` (only for n == 1). out[n, H, D]. When logits_out is non-empty it receives the
  // pre-softmax scaled logits [n, H, context] (-inf where not visible), context = last p + 1.
  virtual void attention(const DeviceTensor& q, const DeviceTensor& k_cache,
                         const DeviceTensor& v_cache, int64_t first_position, int64_t window,
                         Visibility visible, DeviceTensor& out, DeviceTensor* logits_out) = 0;
  // Row-wise argmax of x[n, V] into host memory (ties toward the lower index, like torch).
  virtual void argmax_rows(const DeviceTensor& x, std::span<int32_t> out) = 0;
  // Row-wise log-softmax value of targets: out[i] = log softmax(x[i])[target[i]] (host spans).
  virtual void log_prob_rows(const DeviceTensor& x, std::span<const int32_t> targets,
                             std::span<double> out) = 0;
  // Blocks until queued work is done (no-op on the CPU).
  virtual void synchronize() {}
};

// The CPU reference backend with `threads` worker threads (0 = hardware concurrency).
std::unique_ptr<Backend> make_cpu_backend(int threads = 0);

}  // namespace kvlens
