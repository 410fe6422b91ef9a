// kvlens-cli generate: greedy continuation of a prompt, streamed as it is produced.
#include <cstdio>

#include "app/cli/cli_common.h"
#include "app/session/model_input.h"
#include "engine/common/error.h"
#include "engine/policy/registry.h"
#include "engine/session/scoring.h"

namespace kvlens::cli {

void add_generate_command(CLI::App& app, CommonOptions& common, CommandFn& run) {
  auto* command = app.add_subcommand(
      "generate",
      "Greedy generation. Prints the prompt and its continuation (with --ids: the new token ids)");
  static std::string model_dir, prompt, tokens;
  static int64_t max_new = 32;
  static bool print_ids = false;
  static PolicyOptions policy;
  command->add_option("--model", model_dir, "Hugging Face checkpoint folder")->required();
  auto* prompt_option = command->add_option("--prompt", prompt, "Prompt text (BOS is added)");
  auto* tokens_option = command->add_option("--tokens", tokens, "Prompt token ids, e.g. 1,2,3");
  prompt_option->excludes(tokens_option);
  command->add_option("--max-new", max_new, "Tokens to generate")
      ->required()
      ->check(CLI::NonNegativeNumber);
  command->add_flag("--ids", print_ids, "Print the generated token ids instead of text");
  add_policy_options(*command, policy);
  add_common_options(*command, common);
  add_predictor_option(*command, common);
  add_plugin_option(*command, common);
  command->callback([&run, &common, prompt_option, tokens_option] {
    run = [&common, prompt_option, tokens_option] {
      if (!*prompt_option && !*tokens_option) {
        throw Error("generate", "--prompt or --tokens", "one of them");
      }
      const PolicyConfig policy_config = resolve_policy(policy);
      const auto model = load_model(common, model_dir);
      const std::optional<std::string> text =
          *prompt_option ? std::optional<std::string>(prompt) : std::nullopt;
      const std::vector<int32_t> prompt_ids =
          resolve_input_tokens(*model, text, tokens, "--tokens");
      check_cpu_memory(common, *model, int64_t(prompt_ids.size()) + max_new, 1,
                       !policy_config.id.empty() && !is_reference_policy(policy_config.id),
                       "prompt + --max-new");
      const auto backend = make_backend(common);
      const auto resident = upload_model(model, *backend, session::upload_options(common));

      const Tokenizer* tokenizer =
          (!print_ids && model->tokenizer) ? model->tokenizer.get() : nullptr;
      if (!print_ids && !tokenizer) {
        throw Error(model_dir, "tokenizer.json", "a tokenizer to print text (or pass --ids)");
      }
      ProgressBar bar(common.progress, "generate");
      GenerateOptions options;
      options.max_new = max_new;
      options.policy = policy_config;
      options.progress = [&bar](int64_t done, int64_t total) { bar.update(done, total); };
      std::vector<int32_t> all_ids = prompt_ids;
      std::string printed;
      if (tokenizer) {
        printed = tokenizer->decode(all_ids, true);
        std::fputs(printed.c_str(), stdout);
        std::fflush(stdout);
      }
      // Text is streamed by decoding the whole sequence and printing what is new, so multi-byte
      // characters split across tokens appear once complete.
      options.on_token = [&](int32_t token) {
        all_ids.push_back(token);
        if (!tokenizer) return;
        const std::string text_now = tokenizer->decode(all_ids, true);
        if (text_now.size() > printed.size() && text_now.compare(0, printed.size(), printed) == 0) {
          std::fputs(text_now.c_str() + printed.size(), stdout);
          std::fflush(stdout);
          printed = text_now;
        }
      };
      const std::vector<int32_t> generated = generate_greedy(resident, prompt_ids, options);
      if (print_ids) {
        std::string line;
        for (size_t i = 0; i < generated.size(); ++i) {
          if (i) line += ' ';
          line += std::to_string(generated[i]);
        }
        std::printf("%s\n", line.c_str());
      } else {
        const std::string final_text = tokenizer->decode(all_ids, true);
        if (final_text.size() > printed.size())
          std::fputs(final_text.c_str() + printed.size(), stdout);
        std::fputc('\n', stdout);
      }
      return 0;
    };
  });
}

}  // namespace kvlens::cli
