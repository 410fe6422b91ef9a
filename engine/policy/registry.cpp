// The table of registered policies and config validation.
#include "engine/policy/registry.h"

#include <deque>
#include <functional>
#include <mutex>
#include <utility>

#include "engine/common/error.h"
#include "engine/policy/policy_factories.h"

namespace kvlens {
namespace {

struct Entry {
  PolicyInfo info;
  PolicyFactory make;
  std::string source;  // "" for a built-in; the plug-in's file or class otherwise
};

// Built-ins first, in POLICIES.md's order, then the registered plug-ins in the order they came.
// Registration happens while nothing steps (start-up, a plug-in loaded from a command or the
// app's File menu between sessions); the mutex keeps two registrations apart.
std::mutex& registry_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::vector<Entry>& entries() {
  static std::vector<Entry> table = {
      {dense_policy_info(), make_dense_policy},
      {oracle_policy_info(), make_oracle_policy},
      {random_policy_info(), make_random_policy},
      {streaming_policy_info(), make_streaming_policy},
      {h2o_policy_info(), make_h2o_policy},
      {snapkv_policy_info(), make_snapkv_policy},
      {quest_policy_info(), make_quest_policy},
      {keydiff_policy_info(), make_keydiff_policy},
      {tokenfilter_policy_info(), make_tokenfilter_policy},
      {lazyllm_policy_info(), make_lazyllm_policy},
      {tokenbutler_policy_info(), make_tokenbutler_policy},
      {tova_policy_info(), make_tova_policy},
      {pyramidkv_policy_info(), make_pyramidkv_policy},
      {adakv_policy_info(), make_adakv_policy},
      {sparq_policy_info(), make_sparq_policy},
      {loki_policy_info(), make_loki_policy},
      {doublesparsity_policy_info(), make_doublesparsity_policy},
      {duoattention_policy_info(), make_duoattention_policy},
      {seerattention_policy_info(), make_seerattention_policy},
      {rocketkv_policy_info(), make_rocketkv_policy},
      {twilight_policy_info(), make_twilight_policy},
      {magicpig_policy_info(), make_magicpig_policy},
  };
  return table;
}

std::vector<PolicyInfo>& infos_table() {
  static std::vector<PolicyInfo> infos = [] {
    std::vector<PolicyInfo> out;
    for (const Entry& e : entries()) out.push_back(e.info);
    return out;
  }();
  return infos;
}

// SCORER+ALLOCATOR ids, made on first use (stable addresses: a deque only grows at its end).
const Entry* composed_entry(const std::string& id) {
  if (id.find('+') == std::string::npos) return nullptr;
  static std::mutex mutex;
  static std::deque<Entry> made;
  std::lock_guard<std::mutex> lock(mutex);
  for (const Entry& e : made)
    if (e.info.id == id) return &e;
  PolicyInfo info = composed_policy_info(id);  // throws naming what composes
  made.push_back(
      {std::move(info),
       [id](const PolicyShape& shape, Backend& backend, const ParamValues& params,
            double sparsity) { return make_composed_policy(id, shape, backend, params, sparsity); },
       ""});
  return &made.back();
}

const Entry& entry(const std::string& id) {
  for (const Entry& e : entries()) {
    if (e.info.id == id) return e;
  }
  if (const Entry* composed = composed_entry(id)) return *composed;
  std::string known;
  for (const Entry& e : entries()) known += (known.empty() ? "" : ", ") + e.info.id;
  throw Error("policy", "id", "one of " + known, "'" + id + "'");
}

ParamValues resolve(const PolicyConfig& config) {
  const Entry& e = entry(config.id);
  if (!(config.sparsity >= 0.0 && config.sparsity < 1.0)) {
    throw Error("policy " + config.id, "sparsity", "a number in [0, 1)",
                std::to_string(config.sparsity));
  }
  return resolve_params(e.info.params, config.args, "policy " + config.id);
}

}  // namespace

std::vector<ParamSpec> with_common_specs(std::vector<ParamSpec> own) {
  std::vector<ParamSpec> specs = common_param_specs();
  specs.insert(specs.end(), own.begin(), own.end());
  return specs;
}

const std::vector<PolicyInfo>& policy_infos() {
  return infos_table();
}

const PolicyInfo& register_policy(PolicyInfo info, PolicyFactory make, const std::string& source) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<PolicyInfo>& infos = infos_table();  // made from the entries before this one
  for (const Entry& e : entries()) {
    if (e.info.id != info.id) continue;
    if (!source.empty() && e.source == source) return e.info;  // the same plug-in again
    throw Error(
        source, "name", "a policy id no other policy has",
        "'" + info.id + "', already " +
            (e.source.empty() ? std::string("a built-in policy") : "registered by " + e.source));
  }
  if (info.reference)
    throw Error(source, "reference", "a policy that is not the reference", "true");
  entries().push_back({std::move(info), std::move(make), source});
  infos.push_back(entries().back().info);
  return infos.back();
}

std::string policy_source(const std::string& id) {
  return entry(id).source;
}

const PolicyInfo& policy_info(const std::string& id) {
  return entry(id).info;
}

void validate_policy_config(const PolicyConfig& config) {
  resolve(config);
}

std::unique_ptr<Policy> make_policy(const PolicyConfig& config, const PolicyShape& shape,
                                    Backend& backend) {
  const ParamValues values = resolve(config);
  return entry(config.id).make(shape, backend, values, config.sparsity);
}

std::unique_ptr<Policy> make_run_policy(const PolicyConfig& config, const PolicyShape& shape,
                                        Backend& backend) {
  if (is_reference_policy(config.id)) {
    validate_policy_config(config);
    return nullptr;
  }
  return make_policy(config, shape, backend);
}

const PolicyInfo& reference_policy() {
  for (const Entry& e : entries()) {
    if (e.info.reference) return e.info;
  }
  throw Error("policy registry", "reference", "one policy marked as the reference", "none");
}

bool is_reference_policy(const std::string& id) {
  return id == reference_policy().id;
}

const PolicyInfo* find_policy_info(const std::string& id) {
  for (const PolicyInfo& info : policy_infos()) {
    if (info.id == id) return &info;
  }
  try {
    if (const Entry* composed = composed_entry(id)) return &composed->info;
  } catch (const Error&) {
  }
  return nullptr;
}

std::vector<std::string> composed_policy_ids() {
  return composed_policy_examples();
}

std::string policy_composition_rule() {
  return "SCORER+ALLOCATOR composes a budget allocator with a scorer: SCORER one of " +
         composable_scorers() +
         ", ALLOCATOR pyramidkv (per-layer budgets; alias pyramid) or adakv (per-head budgets); "
         "the total kept is the scorer's own at the same sparsity";
}

std::string default_comparison_policies() {
  return reference_policy().id + ",tokenbutler,h2o,quest";
}

}  // namespace kvlens
