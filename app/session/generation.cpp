// generate_runs (generation.h): every run decodes freely under its own policy, all of them in one
// lockstep DecoderSession (forward_runs: one token per run), dense among them for the departures.
#include "app/session/generation.h"

#include <algorithm>

#include "app/session/policy_runs.h"
#include "engine/common/error.h"
#include "engine/policy/registry.h"

namespace kvlens::session {
namespace {

// One run's continuation as it grows: its ids, and its text decoded with the prompt before it
// (a token's leading space or a byte-fallback character depends on what precedes it).
class ContinuationText {
 public:
  ContinuationText(const Tokenizer* tokenizer, std::span<const int32_t> prompt)
      : tokenizer_(tokenizer), all_(prompt.begin(), prompt.end()) {
    if (tokenizer_) printed_ = prompt_text_ = tokenizer_->decode(all_, true);
  }

  void add(int32_t token, GeneratedText& out) {
    out.ids.push_back(token);
    all_.push_back(token);
    if (!tokenizer_) return;
    const std::string now = tokenizer_->decode(all_, true);
    // A character split across tokens is not a clean extension until its last byte arrives: the
    // token that completes it carries it.
    std::string piece;
    if (now.size() >= printed_.size() && now.compare(0, printed_.size(), printed_) == 0) {
      piece = now.substr(printed_.size());
      printed_ = now;
    }
    out.pieces.push_back(piece);
    const bool after_prompt =
        now.size() >= prompt_text_.size() && now.compare(0, prompt_text_.size(), prompt_text_) == 0;
    out.text =
        after_prompt
            ? now.substr(prompt_text_.size())
            : tokenizer_->decode(
                  std::vector<int32_t>(all_.end() - int64_t(out.ids.size()), all_.end()), true);
  }

 private:
  const Tokenizer* tokenizer_;
  std::vector<int32_t> all_;
  std::string prompt_text_, printed_;
};

}  // namespace

int64_t first_departure(std::span<const int32_t> ids, std::span<const int32_t> reference) {
  const size_t common = std::min(ids.size(), reference.size());
  for (size_t i = 0; i < common; ++i) {
    if (ids[i] != reference[i]) return int64_t(i);
  }
  return ids.size() == reference.size() ? -1 : int64_t(common);
}

std::vector<GeneratedText> generate_runs(std::shared_ptr<const BackendModel> model,
                                         std::span<const int32_t> prompt,
                                         const std::vector<PolicyConfig>& runs,
                                         const GenerationOptions& options) {
  if (prompt.empty()) throw Error("generate", "prompt", "at least one token");
  if (runs.empty()) throw Error("generate", "runs", "at least one policy run");
  if (options.max_new < 0) {
    throw Error("generate", "max_new", "a count >= 0", std::to_string(options.max_new));
  }
  const ModelConfig& config = model->config();
  Backend& backend = *model->backend;
  // The session's runs: the listed ones, then dense when none of them is (for the departures).
  std::vector<PolicyConfig> session_runs = runs;
  const auto listed_reference = std::find_if(
      runs.begin(), runs.end(), [](const PolicyConfig& c) { return is_reference_policy(c.id); });
  const size_t reference = size_t(listed_reference - runs.begin());
  if (listed_reference == runs.end()) session_runs.push_back(PolicyConfig{reference_policy().id});
  const size_t count = session_runs.size();

  DecoderSession session(model, {}, int64_t(count));
  for (size_t r = 0; r < count; ++r) {
    if (auto policy = make_run_policy(session_runs[r], session.policy_shape(), backend))
      session.set_policy(int64_t(r), std::move(policy));
  }
  const auto cancelled = [&] { return options.cancel && options.cancel->load(); };
  const int64_t total = int64_t(prompt.size()) + options.max_new;
  std::vector<int32_t> next(count);
  const auto read_next = [&](const DeviceTensor& logits) {
    backend.argmax_rows(logits, next);
    if (options.progress) options.progress(session.position(), total);
  };

  const Tokenizer* tokenizer = model->model->tokenizer.get();
  std::vector<GeneratedText> texts(count);
  std::vector<ContinuationText> growing;
  for (size_t r = 0; r < count; ++r) {
    texts[r].spec = run_spec(session_runs[r]);
    growing.emplace_back(tokenizer, prompt);
  }
  const auto listed = [&] {
    for (GeneratedText& text : texts) {
      text.first_departure = first_departure(text.ids, texts[reference].ids);
    }
    return std::vector<GeneratedText>(texts.begin(), texts.begin() + int64_t(runs.size()));
  };

  for (const int32_t token : prompt) {
    if (cancelled()) return listed();
    read_next(session.forward(std::span<const int32_t>(&token, 1)));
  }
  std::vector<bool> ended(count, false);
  for (int64_t i = 0; i < options.max_new; ++i) {
    for (size_t r = 0; r < count; ++r) {
      if (ended[r]) continue;
      growing[r].add(next[r], texts[r]);
      const bool is_eos = std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(),
                                    int64_t(next[r])) != config.eos_token_ids.end();
      ended[r] = options.stop_at_eos && is_eos;
    }
    if (options.on_step) options.on_step(listed());
    const bool all_ended = std::all_of(ended.begin(), ended.end(), [](bool e) { return e; });
    if (all_ended || i + 1 == options.max_new || cancelled() ||
        session.position() >= config.max_position_embeddings) {
      break;
    }
    // An ended run is fed its last token again: its state no longer matters, and the others
    // keep one lockstep step.
    read_next(session.forward_runs(next));
  }
  return listed();
}

}  // namespace kvlens::session
