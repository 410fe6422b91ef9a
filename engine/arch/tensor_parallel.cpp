// shard_model: a shard's weights as row views (q/k/v, gate/up) and column copies (o_proj,
// down_proj) of the model's. Shapes as in engine/model/weights.h: wq [H * D, E],
// wk and wv [G * D, E], wo [E, H * D], w_gate and w_up [F, E], w_down [E, F].
#include "engine/arch/tensor_parallel.h"

#include <cstring>
#include <string>
#include <vector>

#include "engine/common/error.h"

namespace kvlens {
namespace {

// Rows [first, first + count) of a row-major [rows, cols] view: a view into the same bytes.
TensorView row_slice(const TensorView& view, int64_t first, int64_t count) {
  if (view.data == nullptr) return view;
  TensorView slice = view;
  int64_t row_elements = 1;
  for (size_t i = 1; i < view.shape.size(); ++i) row_elements *= view.shape[i];
  const size_t row_bytes = size_t(row_elements) * dtype_size(view.dtype);
  slice.shape[0] = count;
  slice.data = view.data + size_t(first) * row_bytes;
  slice.bytes = size_t(count) * row_bytes;
  return slice;
}

// Columns [first, first + count) of a row-major [rows, cols] view, copied into a host buffer
// that `keep` holds.
TensorView column_slice(const TensorView& view, int64_t first, int64_t count,
                        std::vector<std::shared_ptr<void>>& keep) {
  const int64_t rows = view.shape.at(0), cols = view.shape.at(1);
  const size_t element = dtype_size(view.dtype);
  auto buffer = std::shared_ptr<void>(::operator new(size_t(rows * count) * element),
                                      [](void* p) { ::operator delete(p); });
  auto* out = static_cast<std::byte*>(buffer.get());
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(out + size_t(r * count) * element, view.data + size_t(r * cols + first) * element,
                size_t(count) * element);
  }
  keep.push_back(buffer);
  TensorView slice = view;
  slice.shape = {rows, count};
  slice.data = out;
  slice.bytes = size_t(rows * count) * element;
  return slice;
}

// What a shard's views need alive: the model's files and the column copies.
struct ShardStorage {
  std::shared_ptr<SafetensorsSet> files;
  std::vector<std::shared_ptr<void>> columns;
};

}  // namespace

void check_tensor_parallel(const Model& model, int64_t ranks) {
  const ModelConfig& c = model.config;
  const std::string source = model.dir + "/config.json";
  if (ranks < 1) throw Error("tensor parallel", "ranks", "at least 1", std::to_string(ranks));
  auto require = [&](bool ok, const std::string& field, int64_t value, const std::string& why) {
    if (!ok) {
      throw Error(source, field, why + " to split over " + std::to_string(ranks) + " GPUs",
                  std::to_string(value));
    }
  };
  require(c.num_heads % ranks == 0, "num_attention_heads", c.num_heads, "a multiple of the ranks");
  require(c.num_kv_heads % ranks == 0 || ranks % c.num_kv_heads == 0, "num_key_value_heads",
          c.num_kv_heads, "a multiple or a divisor of the ranks");
  require(c.intermediate_size % ranks == 0, "intermediate_size", c.intermediate_size,
          "a multiple of the ranks");
}

ShardHeads shard_heads(const ModelConfig& config, int64_t rank, int64_t ranks) {
  ShardHeads s;
  s.heads = config.num_heads / ranks;
  s.first_head = rank * s.heads;
  if (config.num_kv_heads >= ranks) {
    s.kv_heads = config.num_kv_heads / ranks;
    s.first_kv_head = rank * s.kv_heads;
  } else {
    // R / G ranks share each KV head: rank r's query heads all belong to KV head r * G / R.
    s.kv_heads = 1;
    s.first_kv_head = rank * config.num_kv_heads / ranks;
  }
  return s;
}

std::shared_ptr<const Model> shard_model(std::shared_ptr<const Model> model, int64_t rank,
                                         int64_t ranks) {
  check_tensor_parallel(*model, ranks);
  if (rank < 0 || rank >= ranks) {
    throw Error("tensor parallel", "rank", "0 .. " + std::to_string(ranks - 1),
                std::to_string(rank));
  }
  const ModelConfig& c = model->config;
  const ShardHeads heads = shard_heads(c, rank, ranks);
  const int64_t D = c.head_dim;
  const int64_t columns = c.intermediate_size / ranks;
  auto storage = std::make_shared<ShardStorage>();
  storage->files = model->weights.files;

  auto shard = std::make_shared<Model>(*model);
  shard->config.num_heads = heads.heads;
  shard->config.num_kv_heads = heads.kv_heads;
  shard->config.intermediate_size = columns;
  // Policies read the rows of the whole model's per-head files that belong to these heads.
  shard->shard = {heads.first_head, heads.first_kv_head, c.num_heads, c.num_kv_heads};
  for (LayerWeights& layer : shard->weights.layers) {
    layer.wq = row_slice(layer.wq, heads.first_head * D, heads.heads * D);
    layer.bq = row_slice(layer.bq, heads.first_head * D, heads.heads * D);
    layer.wk = row_slice(layer.wk, heads.first_kv_head * D, heads.kv_heads * D);
    layer.bk = row_slice(layer.bk, heads.first_kv_head * D, heads.kv_heads * D);
    layer.wv = row_slice(layer.wv, heads.first_kv_head * D, heads.kv_heads * D);
    layer.bv = row_slice(layer.bv, heads.first_kv_head * D, heads.kv_heads * D);
    layer.wo = column_slice(layer.wo, heads.first_head * D, heads.heads * D, storage->columns);
    layer.w_gate = row_slice(layer.w_gate, rank * columns, columns);
    layer.w_up = row_slice(layer.w_up, rank * columns, columns);
    layer.w_down = column_slice(layer.w_down, rank * columns, columns, storage->columns);
  }
  // The aliasing constructor: the set's pointer, owned with the column copies.
  shard->weights.files = std::shared_ptr<SafetensorsSet>(storage, storage->files.get());
  return shard;
}

}  // namespace kvlens
