// kvlens-cli score: teacher-forced per-position NLL, argmax and perplexity of a text or token list.
// `--json` prints {"tokens", "nll", "argmax", "ppl"} exactly as DESIGN.md specifies.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "app/cli/cli_common.h"
#include "app/session/model_input.h"
#include "engine/common/error.h"
#include "engine/common/mapped_file.h"
#include "engine/session/scoring.h"

namespace kvlens::cli {

void add_score_command(CLI::App& app, CommonOptions& common, CommandFn& run) {
  auto* command = app.add_subcommand("score", "Teacher-forced NLL and perplexity of a text");
  static std::string model_dir, text_file, tokens;
  static bool json = false;
  static int64_t chunk = 1, max_tokens = 0;
  static PolicyOptions policy;
  command->add_option("--model", model_dir, "Hugging Face checkpoint folder")->required();
  auto* file_option = command->add_option("--text-file", text_file, "Text file to score");
  auto* tokens_option = command->add_option("--tokens", tokens, "Token ids, e.g. 1,2,3");
  file_option->excludes(tokens_option);
  command->add_flag("--json", json, "Print {tokens, nll, argmax, ppl} as JSON");
  command
      ->add_option("--chunk", chunk,
                   "Tokens per forward pass (1 = decode step by step; larger = prefill chunks)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command
      ->add_option("--max-tokens", max_tokens,
                   "Score only the first N tokens (0 = all; longer than the model's positions "
                   "is an error)")
      ->check(CLI::NonNegativeNumber);
  add_policy_options(*command, policy);
  add_common_options(*command, common);
  add_predictor_option(*command, common);
  add_plugin_option(*command, common);
  command->callback([&run, &common, file_option, tokens_option] {
    run = [&common, file_option, tokens_option] {
      if (!*file_option && !*tokens_option) {
        throw Error("score", "--text-file or --tokens", "one of them");
      }
      const PolicyConfig policy_config = resolve_policy(policy);
      const auto model = load_model(common, model_dir);
      std::optional<std::string> text;
      if (*file_option) text = read_text_file(text_file);
      const std::vector<int32_t> ids = resolve_input_tokens(
          *model, text, tokens, *file_option ? "--text-file" : "--tokens", max_tokens);
      check_cpu_memory(common, *model, int64_t(ids.size()), 1, true, "the text's tokens");
      const auto backend = make_backend(common);
      const auto resident = upload_model(model, *backend, session::upload_options(common));
      ProgressBar bar(common.progress, "score");
      ScoreOptions options;
      options.chunk = chunk;
      options.policy = policy_config;
      options.progress = [&bar](int64_t done, int64_t total) { bar.update(done, total); };
      const auto start = std::chrono::steady_clock::now();
      const ScoreResult result = score_tokens(resident, ids, options);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (json) {
        nlohmann::json out = {
            {"tokens", result.tokens},
            {"nll", result.nll},
            {"argmax", result.argmax},
            {"ppl", std::isfinite(result.ppl) ? nlohmann::json(result.ppl) : nlohmann::json()}};
        std::printf("%s\n", out.dump().c_str());
        return 0;
      }
      int64_t correct = 0;
      double total_nll = 0.0;
      for (size_t i = 0; i < result.nll.size(); ++i) {
        correct += result.argmax[i] == result.tokens[i + 1];
        total_nll += result.nll[i];
      }
      const size_t scored = result.nll.size();
      std::printf("model         %s\n", model_dir.c_str());
      std::printf("backend       %s\n", backend->name().c_str());
      std::printf("tokens        %zu (%zu predictions scored)\n", result.tokens.size(), scored);
      if (scored > 0) {
        std::printf("mean NLL      %.4f nats/token\n", total_nll / double(scored));
        std::printf("perplexity    %.3f\n", result.ppl);
        std::printf("top-1 acc.    %.1f%%\n", 100.0 * double(correct) / double(scored));
      }
      std::printf("speed         %.1f tokens/s (%s, chunk %lld)\n",
                  double(result.tokens.size()) / seconds, policy.policy.c_str(), (long long)chunk);
      return 0;
    };
  });
}

}  // namespace kvlens::cli
