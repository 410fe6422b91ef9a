// Policy checks, input-token resolution and the --coref-pools option (model_input.h), shared by
// kvlens-cli's commands and the app's recordings.
#include "app/session/model_input.h"

#include <cstdint>
#include <cstdio>

#include "engine/common/comma_list.h"
#include "engine/common/error.h"
#include "engine/policy/registry.h"

namespace kvlens::session {

PolicyConfig resolve_policy(const PolicyOptions& options) {
  // Dense hides nothing, so any other value would label a result with a sparsity it does not have.
  if (is_reference_policy(options.policy) && options.sparsity != 0.0) {
    throw Error("--sparsity", "sparsity",
                "0 for policy " + options.policy + " (it hides no tokens)",
                std::to_string(options.sparsity));
  }
  PolicyConfig config{options.policy, options.sparsity, options.policy_args};
  try {
    validate_policy_config(config);
  } catch (const Error& error) {
    // Name the flag the user typed: the id and sparsity come from --policy, the rest from
    // --policy-arg.
    const bool about_policy = error.field() == "id" || error.field() == "sparsity";
    throw Error(about_policy ? "--policy" : "--policy-arg", error.field(), error.expected(),
                error.found().empty() ? options.policy : error.found());
  }
  return config;
}

std::vector<int32_t> parse_token_list(const std::string& text, const std::string& flag) {
  std::vector<int32_t> ids;
  for (const std::string& item : split_comma_list(text)) {
    if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos ||
        item.size() > 10 || std::stoll(item) > INT32_MAX) {
      throw Error(flag, "token list", "comma-separated non-negative token ids like 1,2,3",
                  "'" + item + "'");
    }
    ids.push_back(int32_t(std::stoll(item)));
  }
  return ids;
}

std::vector<int32_t> resolve_input_tokens(const Model& model,
                                          const std::optional<std::string>& text,
                                          const std::string& tokens_flag_value,
                                          const std::string& tokens_flag_name, int64_t max_tokens) {
  std::vector<int32_t> ids = text ? model.require_tokenizer().encode(*text, true)
                                  : parse_token_list(tokens_flag_value, tokens_flag_name);
  // Cut before the length check, so a long file can be scored in part.
  if (max_tokens > 0 && int64_t(ids.size()) > max_tokens) ids.resize(size_t(max_tokens));
  check_input_tokens(model, ids, tokens_flag_name);
  return ids;
}

void check_input_tokens(const Model& model, const std::vector<int32_t>& ids,
                        const std::string& flag_name) {
  if (ids.empty()) throw Error("input", "tokens", "at least one token");
  for (const int32_t id : ids) {
    if (id >= model.config.vocab_size) {
      throw Error(flag_name, "token id",
                  "an id below the vocabulary size " + std::to_string(model.config.vocab_size),
                  std::to_string(id));
    }
  }
  if (int64_t(ids.size()) > model.config.max_position_embeddings) {
    throw Error(
        model.config.source, "max_position_embeddings",
        "an input of at most " + std::to_string(model.config.max_position_embeddings) + " tokens",
        std::to_string(ids.size()) + " tokens");
  }
}

CorefPools load_coref_pools_option(const std::string& pools_path, const Tokenizer* tokenizer) {
  if (pools_path.empty()) {
    CorefPools pools = load_bundled_coref_pools();
    validate_pool_integrity(pools, tokenizer);
    return pools;
  }
  CorefPools pools = load_coref_pools(pools_path);
  validate_pool_integrity(pools, tokenizer, true);
  const std::string warning = repeated_entries_warning(pools);
  if (!warning.empty()) std::fprintf(stderr, "kvlens: warning: %s\n", warning.c_str());
  return pools;
}

}  // namespace kvlens::session
