// kvlens-cli generate: greedy continuation of a prompt, streamed as it is produced; with
// --policies, each run's own greedy continuation (app/session/generation.h), one line per run
// with where it first departs from dense's.
#include <charconv>
#include <cstdio>

#include "app/cli/cli_common.h"
#include "app/session/generation.h"
#include "app/session/model_input.h"
#include "app/session/policy_runs.h"
#include "engine/common/error.h"
#include "engine/policy/registry.h"
#include "engine/session/scoring.h"
#include "engine/session/tensor_parallel_session.h"

namespace kvlens::cli {
namespace {

// One line per run: "SPEC<TAB>DEPARTURE<TAB>CONTINUATION" (DEPARTURE: the index of the first new
// token that differs from dense's, "-" where none does). The text marks the departure with "▶"
// and escapes backslashes, tabs and newlines, so every run stays on one line; with --ids the
// continuation is the new token ids.
void print_run_texts(const std::vector<session::GeneratedText>& texts, bool print_ids) {
  for (const session::GeneratedText& text : texts) {
    std::string line;
    for (size_t i = 0; i < text.ids.size(); ++i) {
      const bool departs = int64_t(i) == text.first_departure;
      if (print_ids) {
        line += (i ? " " : "") + std::string(departs ? "▶" : "") + std::to_string(text.ids[i]);
        continue;
      }
      if (departs) line += "▶";
      for (const char c : text.pieces[i]) {
        line += c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\t' ? "\\t" : std::string(1, c);
      }
    }
    const std::string departure =
        text.first_departure < 0 ? "-" : std::to_string(text.first_departure);
    std::printf("%s\t%s\t%s\n", text.spec.c_str(), departure.c_str(), line.c_str());
  }
}

std::string number_text(double value) {
  char text[32];
  return std::string(text, std::to_chars(text, text + sizeof text, value).ptr);
}

}  // namespace

void add_generate_command(CLI::App& app, CommonOptions& common, CommandFn& run) {
  auto* command = app.add_subcommand(
      "generate",
      "Greedy generation. Prints the prompt and its continuation (with --ids: the new token ids)");
  static std::string model_dir, prompt, tokens, policies;
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
  auto* policies_option = command->add_option(
      "--policies", policies,
      "Generate under several runs at once, one line per run (SPEC, the first token that "
      "departs from dense's or -, the text with ▶ there): ids or run specs "
      "ID[@SPARSITY][:KEY=VALUE...], "
      "e.g. dense,h2o@0.3,h2o@0.7:window=16 (a plain id takes --sparsity)");
  policies_option->excludes(command->get_option("--policy"));
  add_tensor_parallel_options(*command, common);
  add_common_options(*command, common);
  add_predictor_option(*command, common);
  add_plugin_option(*command, common);
  command->callback([&run, &common, prompt_option, tokens_option, policies_option] {
    run = [&common, prompt_option, tokens_option, policies_option] {
      if (!*prompt_option && !*tokens_option) {
        throw Error("generate", "--prompt or --tokens", "one of them");
      }
      if (*policies_option && common.tensor_parallel()) {
        throw Error("generate", "--policies", "one --policy with --gpus or --devices",
                    "--policies " + policies);
      }
      if (*policies_option) {
        const std::vector<PolicyConfig> runs = session::resolve_policy_runs(
            policies, number_text(policy.sparsity), policy.policy_args);
        const auto model = load_model(common, model_dir);
        const std::optional<std::string> text =
            *prompt_option ? std::optional<std::string>(prompt) : std::nullopt;
        const std::vector<int32_t> prompt_ids =
            resolve_input_tokens(*model, text, tokens, "--tokens");
        if (!print_ids && !model->tokenizer) {
          throw Error(model_dir, "tokenizer.json", "a tokenizer to print text (or pass --ids)");
        }
        check_cpu_memory(common, *model, int64_t(prompt_ids.size()) + max_new,
                         int64_t(runs.size()) + 1, true, "prompt + --max-new");
        const auto backend = make_backend(common);
        const auto resident = upload_model(model, *backend, session::upload_options(common));
        ProgressBar bar(common.progress, "generate");
        session::GenerationOptions options;
        options.max_new = max_new;
        options.progress = [&bar](int64_t done, int64_t total) { bar.update(done, total); };
        print_run_texts(session::generate_runs(resident, prompt_ids, runs, options), print_ids);
        return 0;
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
      const std::vector<int> devices =
          session::chosen_devices("generate", common.gpus, common.devices);
      session::require_gpus_hold(common, *model, devices, int64_t(prompt_ids.size()) + max_new, 1);
      std::vector<std::unique_ptr<Backend>> group = session::make_backend_group(common, devices);
      std::vector<Backend*> backends;
      for (const auto& b : group) backends.push_back(b.get());
      std::shared_ptr<const BackendModel> resident;
      std::vector<std::shared_ptr<const BackendModel>> shards;
      if (backends.size() == 1) {
        resident = upload_model(model, *backends.front(), session::upload_options(common));
      } else {
        check_tensor_parallel_policy(policy_config, model->config, int64_t(backends.size()));
        shards = upload_tensor_parallel(model, backends, session::upload_options(common));
      }

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
      const std::vector<int32_t> generated =
          resident ? generate_greedy(resident, prompt_ids, options)
                   : generate_greedy_tensor_parallel(model, shards, prompt_ids, options);
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
