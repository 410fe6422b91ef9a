// The table of every backend op, core and per-policy extensions (as llama.cpp's
// tests/test-backend-ops.cpp): each entry makes its inputs from a seed (the same host values on
// every backend), runs the op on one backend and returns its outputs read back to the host. A
// suite runs every entry on the backend under test and on the reference (the generic CPU backend)
// and compares the outputs within the entry's tolerance: tests/unit/test_backend_ops.cpp (the CPU
// backend's kernel sets) and tests/cuda/test_cuda_backend_ops.cpp (the CUDA backend).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/backend.h"

namespace kvlens::test {

// One named output of an op, every element widened to double (F32, U8, ids and counts all exact).
struct OpOutput {
  std::string name;
  std::vector<double> values;
};

// |got - want| <= abs + rel * |want| per element; both zero: the same bits (the same value, the
// same sign of zero, NaN where the reference has NaN), what the ops that promise equal bits on
// every backend are held to.
struct Tolerance {
  double abs = 0.0, rel = 0.0;
  bool exact() const { return abs == 0.0 && rel == 0.0; }
};
inline constexpr Tolerance kExact{};

// What an entry's run gets: the backend, seeded inputs and a place for its outputs.
class OpRun {
 public:
  OpRun(Backend& backend, uint32_t seed) : backend_(backend), rng_(seed) {}
  Backend& backend() { return backend_; }

  // Uniform values in [-scale, scale) from the seeded generator (the same on every backend).
  std::vector<float> values(int64_t count, float scale = 1.0f);
  // Whole numbers in [0, levels): ties for the selection ops.
  std::vector<float> levels(int64_t count, int levels);
  // A 0/1 mask with about `percent` ones.
  std::vector<uint8_t> bits(int64_t count, int percent);
  int64_t below(int64_t n) { return int64_t(rng_() % uint64_t(n)); }

  DeviceTensor f32(std::vector<int64_t> shape, float scale = 1.0f);
  DeviceTensor f32_of(const std::vector<float>& values, std::vector<int64_t> shape);
  DeviceTensor u8(std::vector<int64_t> shape, int percent);
  DeviceTensor u8_of(const std::vector<uint8_t>& values, std::vector<int64_t> shape);
  // A weight made by upload_weight from random values stored as `dtype` (F32, BF16 or F16); the
  // host copy lives as long as the backend's tensor needs it.
  DeviceTensor weight(std::vector<int64_t> shape, DType dtype = DType::F32, float scale = 1.0f);

  // Records an output: a tensor (F32 or U8) read back whole, or host values.
  void out(const std::string& name, const DeviceTensor& tensor);
  void out(const std::string& name, std::vector<double> values);

  std::vector<OpOutput> outputs;

 private:
  Backend& backend_;
  std::mt19937 rng_;
};

struct OpEntry {
  std::string name;  // "op shape", e.g. "matmul n5 in37 out19" (no ';', '[' or ']')
  Tolerance tolerance;
  std::function<void(OpRun&)> run;
};

// Every op of Backend and of the policies' op extensions (keydiff, quest, tokenfilter), each at
// a few shapes.
const std::vector<OpEntry>& backend_op_table();

// Runs `entry` on `reference` and on `backend` from the same seed and checks every output
// within the entry's tolerance (Catch2 CHECKs naming the entry, the output and the worst
// element).
void check_op_entry(const OpEntry& entry, Backend& reference, Backend& backend);

}  // namespace kvlens::test
