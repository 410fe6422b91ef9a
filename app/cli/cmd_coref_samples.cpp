// kvlens-cli coref-samples: co-reference benchmark samples as JSON lines, one object per sample
// ({"index","seed","hard","text","answer","answer_char_begin","answer_char_end"} plus tokens and
// the answer's token span with --tokenizer), the one format training and evaluation share.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>

#include "app/cli/cli_common.h"
#include "app/session/model_input.h"
#include "engine/common/error.h"
#include "engine/eval/coref_benchmark.h"
#include "engine/eval/coref_pools.h"
#include "engine/model/tokenizer.h"

namespace kvlens::cli {

namespace {

// The command's flags: CLI11 binds options to storage that must outlive the parse.
int64_t count = 200, first_index = 0;
uint64_t seed = 0;
bool hard = false;
std::string pools_path, tokenizer_path, out_path;

void write_samples(std::ostream& out, const CorefPools& pools, const Tokenizer* tokenizer) {
  for (int64_t i = 0; i < count; ++i) {
    const CorefSample sample = generate_coref_sample(pools, seed, first_index + i, hard);
    nlohmann::json line = {{"index", sample.index},
                           {"seed", sample.seed},
                           {"hard", sample.hard},
                           {"text", sample.text},
                           {"answer", sample.answer},
                           {"answer_char_begin", sample.answer_char_begin},
                           {"answer_char_end", sample.answer_char_end}};
    if (tokenizer) {
      const CorefTokens marked = mark_answer_tokens(sample, *tokenizer);
      line["tokens"] = marked.tokens;
      line["answer_token_begin"] = marked.answer_token_begin;
      line["answer_token_end"] = marked.answer_token_end;
    }
    out << line.dump() << '\n';
  }
}

}  // namespace

void add_coref_samples_command(CLI::App& app, CommonOptions& common, CommandFn& run) {
  auto* command =
      app.add_subcommand("coref-samples", "Write co-reference benchmark samples as JSON lines");
  command->add_option("--count", count, "Number of samples (default 200)");
  command->add_option("--seed", seed, "Generator seed (default 0)");
  command->add_option("--first-index", first_index, "Index of the first sample (default 0)");
  command->add_flag("--hard", hard, "Introduce 2-3 locations and ask about one of them");
  command->add_option("--coref-pools", pools_path,
                      "Pools JSON (default: the bundled assets/benchmarks/coref/pools.json)");
  command->add_option("--tokenizer", tokenizer_path,
                      "tokenizer.json: also write tokens and the answer's token span");
  command->add_option("--out", out_path, "Output .jsonl file")->required();
  add_common_options(*command, common);
  command->callback([&run] {
    run = [] {
      if (count < 0)
        throw Error("coref-samples", "--count", "a non-negative count", std::to_string(count));
      if (first_index < 0) {
        throw Error("coref-samples", "--first-index", "a non-negative index",
                    std::to_string(first_index));
      }
      std::optional<Tokenizer> tokenizer;
      if (!tokenizer_path.empty()) tokenizer.emplace(Tokenizer::load(tokenizer_path));
      const CorefPools pools =
          load_coref_pools_option(pools_path, tokenizer ? &*tokenizer : nullptr);
      AtomicOutputFile out(out_path, "--out");
      write_samples(out.stream(), pools, tokenizer ? &*tokenizer : nullptr);
      out.commit();
      std::fprintf(stderr, "coref-samples: wrote %lld samples to %s\n",
                   static_cast<long long>(count), out_path.c_str());
      return 0;
    };
  });
}

}  // namespace kvlens::cli
