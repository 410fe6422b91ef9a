// Budget allocators (docs/policies/pyramidkv.md, adakv.md): how a budgeted scorer's total budget
// is shared out over layers (PyramidKV: a linear schedule shrinking with depth) or over a layer's
// heads (Ada-KV: one top-k over every head's scores), the total kept staying the scorer's own.
// Shapes: a pyramid schedule is one count per policy layer; Ada-KV works on [R, stride] rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/policy/policy_params.h"

namespace kvlens {

enum class AllocatorKind {
  Uniform,   // every layer and head gets the scorer's own B(t) (no allocator)
  Pyramid,   // PyramidKV: per-layer budgets, linear in depth, mean B(t)
  Adaptive,  // Ada-KV: per-head budgets from one top-k over a layer's heads
};

struct AllocatorKnobs {
  AllocatorKind kind = AllocatorKind::Uniform;
  int64_t pyramid_beta = 20;  // PyramidKV's beta: the last layer gets 1/beta of the mean
  double floor_alpha = 0.2;   // Ada-KV's safeguard: each head's own share of its mean budget
};

// The allocator ids ("pyramidkv", "adakv") and the alias "pyramid"; Uniform for anything else.
AllocatorKind allocator_kind(const std::string& id);
bool is_allocator_id(const std::string& id);
// The canonical id of an allocator kind ("pyramidkv", "adakv").
std::string allocator_id(AllocatorKind kind);
// The allocator's own parameters (appended to its scorer's) and their values.
std::vector<ParamSpec> allocator_param_specs(AllocatorKind kind);
AllocatorKnobs read_allocator_knobs(AllocatorKind kind, const ParamValues& values);

// PyramidKV's schedule over n policy layers: the non-forced budgets x_0 >= x_1 >= ... >= x_{n-1}
// of a step whose uniform non-forced budget is `extra` per layer and whose layers have at most
// `capacity` non-forced candidates each. The linear ramp runs from max = 2 * extra - extra / beta
// down to min = extra / beta (the mean is extra); a max above capacity is lowered to capacity and
// min raised to 2 * extra - capacity, keeping the mean. Rounded by largest remainders (ties to
// the shallower layer), so sum x_i == n * extra exactly and the order by depth holds.
std::vector<int64_t> pyramid_schedule(int64_t extra, int64_t capacity, int64_t layers,
                                      int64_t beta);

// pyramid_schedule, then each layer held to its own room `room[i]` (< 0: none): an eviction
// layer whose budget was b at the previous step has b + 1 candidates now (its kept tokens and the
// new one), so a share rising faster than one token a step (the schedule's steep first layers
// when B(t) grows) cannot be met there. What a layer cannot take goes to the shallowest layers
// with room left, one token at a time, so the total stays n * extra wherever the room allows and
// a schedule that was non-increasing stays so.
std::vector<int64_t> pyramid_allocation(int64_t extra, int64_t capacity,
                                        const std::vector<int64_t>& room, int64_t beta);

// Ada-KV's safeguard: of a head's mean non-forced budget `extra`, floor(alpha * extra) is its
// own; the rest of every head's goes to one top-k over the layer.
int64_t adaptive_floor(int64_t extra, double alpha);

}  // namespace kvlens
