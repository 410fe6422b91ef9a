// Comparison of a kvlens run with tests/fixtures/demo_bf16_reference.json (see the header).
#include "tests/support/bf16_reference.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/common/mapped_file.h"
#include "engine/session/scoring.h"
#include "tests/support/test_paths.h"

namespace kvlens::test {

namespace {

int first_difference(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (a[i] != b[i]) return int(i);
  return a.size() == b.size() ? -1 : int(std::min(a.size(), b.size()));
}

}  // namespace

std::vector<Bf16PromptComparison> compare_with_bf16_reference(
    const std::shared_ptr<const BackendModel>& model) {
  const auto reference =
      nlohmann::json::parse(read_text_file(source_path("tests/fixtures/demo_bf16_reference.json")));
  const int64_t max_new = reference["max_new"].get<int64_t>();
  std::vector<Bf16PromptComparison> results;
  for (const auto& entry : reference["prompts"]) {
    Bf16PromptComparison c;
    c.prompt = entry["prompt"].get<std::string>();
    const auto prompt = entry["prompt_tokens"].get<std::vector<int32_t>>();
    c.prompt_ids_match = model->model->require_tokenizer().encode(c.prompt, true) == prompt;
    const auto greedy_bf16 = entry["greedy_bf16"].get<std::vector<int32_t>>();
    const auto greedy_f32 = entry["greedy_f32"].get<std::vector<int32_t>>();

    GenerateOptions options;
    options.max_new = max_new;
    options.stop_at_eos = false;
    const std::vector<int32_t> greedy = generate_greedy(model, prompt, options);
    c.first_difference_bf16 = first_difference(greedy, greedy_bf16);
    c.first_difference_f32 = first_difference(greedy, greedy_f32);
    const auto& steps = entry["steps"];
    if (c.first_difference_bf16 >= 0)
      c.bf16_margin_there = steps[size_t(c.first_difference_bf16)]["margin_bf16"].get<double>();

    // Teacher-forced: the logits row after the prompt, then after each reference token.
    DecoderSession session(model);
    std::vector<float> logits;
    for (const int32_t t : prompt) logits = session.step(t);
    for (size_t s = 0; s < steps.size(); ++s) {
      const auto ids = steps[s]["top_ids"].get<std::vector<int64_t>>();
      const auto bf16 = steps[s]["bf16"].get<std::vector<double>>();
      const auto f32 = steps[s]["f32"].get<std::vector<double>>();
      for (size_t i = 0; i < ids.size(); ++i) {
        const double ours = logits[size_t(ids[i])];
        c.gap_to_bf16 = std::max(c.gap_to_bf16, std::fabs(ours - bf16[i]));
        c.gap_to_f32 = std::max(c.gap_to_f32, std::fabs(ours - f32[i]));
        c.reference_bf16_f32_gap = std::max(c.reference_bf16_f32_gap, std::fabs(bf16[i] - f32[i]));
      }
      if (s + 1 < steps.size()) logits = session.step(greedy_bf16[s]);
    }
    results.push_back(c);
  }
  return results;
}

}  // namespace kvlens::test
