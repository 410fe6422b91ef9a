// PyramidKV's per-layer schedule and Ada-KV's knobs (allocator.h; the selection itself is
// BudgetedPolicy's, through backend ops).
#include "engine/policy/allocator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "engine/common/error.h"

namespace kvlens {

AllocatorKind allocator_kind(const std::string& id) {
  if (id == "pyramidkv" || id == "pyramid") return AllocatorKind::Pyramid;
  if (id == "adakv") return AllocatorKind::Adaptive;
  return AllocatorKind::Uniform;
}

bool is_allocator_id(const std::string& id) {
  return allocator_kind(id) != AllocatorKind::Uniform;
}

std::string allocator_id(AllocatorKind kind) {
  switch (kind) {
    case AllocatorKind::Pyramid:
      return "pyramidkv";
    case AllocatorKind::Adaptive:
      return "adakv";
    case AllocatorKind::Uniform:
      break;
  }
  return "";
}

std::vector<ParamSpec> allocator_param_specs(AllocatorKind kind) {
  const double inf = std::numeric_limits<double>::infinity();
  if (kind == AllocatorKind::Pyramid) {
    return {{"pyramid_beta",
             ParamType::Int,
             "PyramidKV's beta: the deepest policy layer keeps 1/beta of the mean per-layer "
             "budget, the first one twice the mean less that (20, the paper's)",
             "20",
             1,
             inf,
             {}}};
  }
  if (kind == AllocatorKind::Adaptive) {
    return {{"floor_alpha",
             ParamType::Float,
             "Ada-KV's safeguard: the share of each head's mean budget it keeps whatever the "
             "other heads' scores (0.2, the authors' scripts); the rest goes to one top-k over "
             "the layer's heads",
             "0.2",
             0.0,
             1.0,
             {}}};
  }
  return {};
}

AllocatorKnobs read_allocator_knobs(AllocatorKind kind, const ParamValues& values) {
  AllocatorKnobs knobs;
  knobs.kind = kind;
  if (kind == AllocatorKind::Pyramid) knobs.pyramid_beta = values.get_int("pyramid_beta");
  if (kind == AllocatorKind::Adaptive) knobs.floor_alpha = values.get_float("floor_alpha");
  return knobs;
}

std::vector<int64_t> pyramid_schedule(int64_t extra, int64_t capacity, int64_t layers,
                                      int64_t beta) {
  if (layers <= 0) return {};
  if (extra < 0 || capacity < extra || beta < 1)
    throw Error("pyramidkv", "schedule", "0 <= extra <= capacity and beta >= 1",
                "extra " + std::to_string(extra) + ", capacity " + std::to_string(capacity) +
                    ", beta " + std::to_string(beta));
  if (layers == 1) return {extra};
  // The authors' integer ends (min = base // beta, max = 2 * base - min), lowered to the
  // candidates where max would exceed them with the mean kept.
  int64_t min = extra / beta, max = 2 * extra - min;
  if (max > capacity) {
    max = capacity;
    min = 2 * extra - capacity;
  }
  // Target of layer i: max - (max - min) * i / (n - 1), held exactly as numerator / (n - 1).
  const int64_t d = layers - 1;
  const size_t n = static_cast<size_t>(layers);
  std::vector<int64_t> out(n), remainder(n);
  int64_t assigned = 0;
  for (int64_t i = 0; i < layers; ++i) {
    const int64_t numerator = max * d - (max - min) * i;
    out[size_t(i)] = numerator / d;
    remainder[size_t(i)] = numerator % d;
    assigned += out[size_t(i)];
  }
  // The targets sum to n * extra; the units the floors lost go to the largest remainders, ties
  // to the shallower layer (which keeps the schedule non-increasing).
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return remainder[size_t(a)] > remainder[size_t(b)];
  });
  for (int64_t k = 0; assigned < layers * extra; ++k, ++assigned) ++out[size_t(order[size_t(k)])];
  return out;
}

std::vector<int64_t> pyramid_allocation(int64_t extra, int64_t capacity,
                                        const std::vector<int64_t>& room, int64_t beta) {
  std::vector<int64_t> out = pyramid_schedule(extra, capacity, int64_t(room.size()), beta);
  int64_t excess = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (room[i] >= 0 && out[i] > room[i]) {
      excess += out[i] - room[i];
      out[i] = room[i];
    }
  }
  for (size_t i = 0; i < out.size() && excess > 0; ++i) {
    const int64_t limit = room[i] >= 0 ? std::min(room[i], capacity) : capacity;
    const int64_t take = std::min(excess, limit - out[i]);
    if (take <= 0) continue;
    out[i] += take;
    excess -= take;
  }
  return out;
}

int64_t adaptive_floor(int64_t extra, double alpha) {
  return std::max<int64_t>(0, int64_t(std::floor(alpha * double(extra))));
}

}  // namespace kvlens
