// Input handling of both front ends: a single policy checked against the registry (generate,
// score), text or --tokens into token ids (generate, score, trace and the app's recordings), and
// the co-reference pools of --coref-pools. Errors name the kvlens-cli flag at fault.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/eval/coref_pools.h"
#include "engine/model/model.h"
#include "engine/policy/policy.h"
#include "engine/policy/registry.h"

namespace kvlens::session {

// --policy, --sparsity and --policy-arg (kvlens-cli's add_policy_options registers them).
struct PolicyOptions {
  std::string policy = reference_policy().id;
  double sparsity = 0.0;
  std::vector<std::string> policy_args;
};

// The policy config the flags describe, checked against the registry (id, sparsity, every
// --policy-arg). Throws kvlens::Error naming the flag.
PolicyConfig resolve_policy(const PolicyOptions& options);

// "1,2,3" -> ids; throws kvlens::Error naming `flag` for anything that is not a comma-separated
// list of non-negative integers.
std::vector<int32_t> parse_token_list(const std::string& text, const std::string& flag);

// Ids from --tokens when given, else the text encoded with the model's tokenizer (special tokens
// added, e.g. BOS), cut to max_tokens when that is > 0, then checked by check_input_tokens.
std::vector<int32_t> resolve_input_tokens(const Model& model,
                                          const std::optional<std::string>& text,
                                          const std::string& tokens_flag_value,
                                          const std::string& tokens_flag_name,
                                          int64_t max_tokens = 0);

// Every id inside the vocabulary, at least one, at most max_position_embeddings of them.
void check_input_tokens(const Model& model, const std::vector<int32_t>& ids,
                        const std::string& flag_name);

// The co-reference pools of --coref-pools (empty: the bundled ones). The bundled pools must pass
// validate_pool_integrity as they are; a user's file may repeat entries (the TokenButler
// repository's does): they are kept, and one warning on stderr names them.
CorefPools load_coref_pools_option(const std::string& pools_path,
                                   const Tokenizer* tokenizer = nullptr);

}  // namespace kvlens::session
