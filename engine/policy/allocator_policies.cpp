// The allocators as policies: the built-ins pyramidkv and adakv (SnapKV's scoring, as both papers
// use by default) and the composition SCORER+ALLOCATOR of a budgeted scorer (snapkv, h2o, tova)
// with PyramidKV's per-layer or Ada-KV's per-head budgets (allocator.h; docs/policies/).
#include <utility>

#include "engine/common/error.h"
#include "engine/policy/budgeted_policy.h"
#include "engine/policy/policy_factories.h"

namespace kvlens {
namespace {

struct Scorer {
  const char* id;
  PolicyInfo (*info)();
  std::unique_ptr<Policy> (*make)(const PolicyShape&, Backend&, const ParamValues&, double);
};

// The scorers whose selection is BudgetedPolicy's token top-k with a budget to share out.
const Scorer kScorers[] = {
    {"snapkv", snapkv_policy_info, make_snapkv_policy},
    {"h2o", h2o_policy_info, make_h2o_policy},
    {"tova", tova_policy_info, make_tova_policy},
};

const Scorer* find_scorer(const std::string& id) {
  for (const Scorer& s : kScorers)
    if (id == s.id) return &s;
  return nullptr;
}

std::string allocator_family(AllocatorKind kind) {
  return kind == AllocatorKind::Pyramid ? "PyramidKV per-layer budgets" : "Ada-KV per-head budgets";
}

PolicyInfo allocated_info(const std::string& id, const Scorer& scorer, AllocatorKind kind,
                          const std::string& description) {
  PolicyInfo info = scorer.info();
  info.id = id;
  info.family = info.family + " + " + allocator_family(kind);
  info.description = description;
  // PyramidKV's layer budgets follow from the step's counts alone (the same on every
  // tensor-parallel rank): the scorer's rule decides. Ada-KV's one top-k reads every head's
  // scores of a layer, which a shard gathers with all-reduces (BudgetedPolicy::select_adaptive).
  if (kind == AllocatorKind::Adaptive) {
    info.per_head_rule = false;
    info.reduces_heads = true;
  }
  const std::vector<ParamSpec> own = allocator_param_specs(kind);
  info.params.insert(info.params.end(), own.begin(), own.end());
  return info;
}

std::unique_ptr<Policy> make_allocated(const Scorer& scorer, AllocatorKind kind,
                                       const PolicyShape& shape, Backend& backend,
                                       const ParamValues& params, double sparsity) {
  std::unique_ptr<Policy> policy = scorer.make(shape, backend, params, sparsity);
  auto* budgeted = dynamic_cast<BudgetedPolicy*>(policy.get());
  if (budgeted == nullptr)
    throw Error("policy " + std::string(scorer.id), "allocator", "a budgeted scorer", scorer.id);
  budgeted->set_allocator(read_allocator_knobs(kind, params));
  return policy;
}

std::string allocator_rule(AllocatorKind kind) {
  return kind == AllocatorKind::Pyramid
             ? "per-layer budgets shrinking linearly with depth (PyramidKV), their mean the "
               "uniform budget"
             : "per-head budgets from one top-k over all heads' scores of a layer (Ada-KV), "
               "each head keeping floor_alpha of its mean";
}

}  // namespace

std::string composable_scorers() {
  std::string out;
  for (const Scorer& s : kScorers) out += (out.empty() ? "" : ", ") + std::string(s.id);
  return out;
}

std::vector<std::string> composed_policy_examples() {
  std::vector<std::string> out;
  for (const Scorer& s : kScorers)
    for (const char* allocator : {"pyramidkv", "adakv"})
      out.push_back(std::string(s.id) + "+" + allocator);
  return out;
}

PolicyInfo composed_policy_info(const std::string& id) {
  const size_t plus = id.find('+');
  const std::string scorer_id = id.substr(0, plus);
  const std::string allocator = plus == std::string::npos ? "" : id.substr(plus + 1);
  const Scorer* scorer = find_scorer(scorer_id);
  if (plus == std::string::npos || scorer == nullptr || !is_allocator_id(allocator))
    throw Error("policy", "id",
                "SCORER+ALLOCATOR with SCORER one of " + composable_scorers() +
                    " and ALLOCATOR one of pyramidkv (or pyramid), adakv",
                "'" + id + "'");
  const AllocatorKind kind = allocator_kind(allocator);
  return allocated_info(
      id, *scorer, kind,
      std::string(scorer->info().description) + " Budgets: " + allocator_rule(kind) + ".");
}

std::unique_ptr<Policy> make_composed_policy(const std::string& id, const PolicyShape& shape,
                                             Backend& backend, const ParamValues& params,
                                             double sparsity) {
  composed_policy_info(id);  // the id's checks
  const size_t plus = id.find('+');
  return make_allocated(*find_scorer(id.substr(0, plus)), allocator_kind(id.substr(plus + 1)),
                        shape, backend, params, sparsity);
}

PolicyInfo pyramidkv_policy_info() {
  return allocated_info(
      "pyramidkv", *find_scorer("snapkv"), AllocatorKind::Pyramid,
      "SnapKV's eviction with per-layer budgets shrinking linearly with depth (PyramidKV), the "
      "same total as snapkv's; compose with another scorer as h2o+pyramidkv.");
}

std::unique_ptr<Policy> make_pyramidkv_policy(const PolicyShape& shape, Backend& backend,
                                              const ParamValues& params, double sparsity) {
  return make_allocated(*find_scorer("snapkv"), AllocatorKind::Pyramid, shape, backend, params,
                        sparsity);
}

PolicyInfo adakv_policy_info() {
  return allocated_info(
      "adakv", *find_scorer("snapkv"), AllocatorKind::Adaptive,
      "SnapKV's eviction with per-head budgets from one top-k over the layer's heads (Ada-KV), "
      "the same total as snapkv's; compose with another scorer as tova+adakv.");
}

std::unique_ptr<Policy> make_adakv_policy(const PolicyShape& shape, Backend& backend,
                                          const ParamValues& params, double sparsity) {
  return make_allocated(*find_scorer("snapkv"), AllocatorKind::Adaptive, shape, backend, params,
                        sparsity);
}

}  // namespace kvlens
