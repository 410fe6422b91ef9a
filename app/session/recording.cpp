// open_recording (recording.h).
#include "app/session/recording.h"

#include <cstdio>
#include <optional>

#include "app/session/model_input.h"
#include "engine/common/error.h"
#include "engine/eval/coref_benchmark.h"
#include "engine/eval/coref_pools.h"
#include "engine/session/tensor_parallel_session.h"

namespace kvlens::session {

Recording open_recording(const CommonOptions& common, std::shared_ptr<const Model> model_ptr,
                         const RecordingSource& source, const std::vector<PolicyConfig>& runs,
                         const TraceOptions& options, const std::string& prompt_flag) {
  Recording recording;
  recording.model = std::move(model_ptr);
  const Model& model = *recording.model;
  const Tokenizer& tokenizer = model.require_tokenizer();
  std::vector<int32_t> tokens;
  std::optional<CorefSample> sample;
  std::optional<CorefTokens> marked;
  if (source.coref_index < 0) {
    tokens = resolve_input_tokens(model, source.prompt, "", prompt_flag, source.max_tokens);
  } else {
    const CorefPools pools = load_coref_pools_option(source.pools_path);
    sample = generate_coref_sample(pools, source.seed, source.coref_index, source.hard);
    marked = mark_answer_tokens(*sample, tokenizer);
    tokens = marked->tokens;
    check_input_tokens(model, tokens, "--coref-sample");
  }
  if (tokenizer.vocab_size() < model.config.vocab_size) {
    // Said once per recording; every label of an id the tokenizer lacks reads "<id N>".
    std::fprintf(stderr,
                 "kvlens: note: the tokenizer has %lld ids, the model %lld: tokens the tokenizer "
                 "lacks are shown as <id N>\n",
                 static_cast<long long>(tokenizer.vocab_size()),
                 static_cast<long long>(model.config.vocab_size));
  }
  recording.devices = chosen_devices("trace", common.gpus, common.devices);
  require_gpus_hold(common, model, recording.devices, int64_t(tokens.size()),
                    int64_t(runs.size()) + 1);
  recording.backends = make_backend_group(common, recording.devices);
  if (recording.backends.size() == 1) {
    recording.resident =
        upload_model(recording.model, *recording.backends.front(), upload_options(common));
    recording.recorder =
        std::make_unique<TraceRecorder>(recording.resident, &tokenizer, tokens, runs, options);
  } else {
    std::vector<Backend*> group;
    for (const auto& b : recording.backends) group.push_back(b.get());
    recording.shards = upload_tensor_parallel(recording.model, group, upload_options(common));
    recording.recorder = std::make_unique<TraceRecorder>(recording.model, recording.shards,
                                                         &tokenizer, tokens, runs, options);
  }
  if (sample) {
    recording.recorder->trace().coref = {true,
                                         sample->index,
                                         sample->seed,
                                         sample->answer,
                                         marked->answer_token_begin,
                                         marked->answer_token_end};
  }
  return recording;
}

std::string placement_text(const Recording& recording) {
  const std::string name = recording.backends.front()->name();
  std::string devices;
  for (const int device : recording.devices) {
    if (!devices.empty()) devices += ",";
    devices += std::to_string(device);
  }
  if (recording.shards.size() <= 1) return name == "cpu" ? name : name + " " + devices;
  const ModelConfig& whole = recording.model->config;
  const ModelConfig& shard = recording.shards.front()->config();
  return name + (name == "cpu" ? " ranks " : " ") + devices + ": " +
         std::to_string(shard.num_heads) + " of " + std::to_string(whole.num_heads) + " heads, " +
         std::to_string(shard.num_kv_heads) + " of " + std::to_string(whole.num_kv_heads) +
         " KV heads each";
}

}  // namespace kvlens::session
