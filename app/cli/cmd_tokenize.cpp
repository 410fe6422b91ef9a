// kvlens-cli tokenize: token ids of a text under a tokenizer.json or a GGUF file's tokenizer,
// space separated.
#include <cstdio>

#include "app/cli/cli_common.h"
#include "engine/common/error.h"
#include "engine/common/mapped_file.h"
#include "engine/model/gguf_tokenizer_data.h"
#include "engine/model/tokenizer.h"

namespace kvlens::cli {

void add_tokenize_command(CLI::App& app, CommonOptions& common, CommandFn& run) {
  auto* command = app.add_subcommand("tokenize", "Print the token ids of a text, space separated");
  static std::string tokenizer_path, text, text_file;
  static bool special = false, decode = false;
  command
      ->add_option(
          "--tokenizer", tokenizer_path,
          "tokenizer.json (or .json.gz), or a .gguf model file (its tokenizer, as llama.cpp's)")
      ->required();
  auto* text_option = command->add_option("--text", text, "Text to encode");
  auto* file_option = command->add_option("--file", text_file, "File whose text to encode");
  text_option->excludes(file_option);
  command->add_flag("--special", special,
                    "Add special tokens (e.g. BOS) as the model expects (a GGUF tokenizer also "
                    "matches special-token text in the input always, as llama.cpp does)");
  command->add_flag("--decode", decode, "Also print the decoded text on a second line");
  add_common_options(*command, common);
  command->callback([&run, text_option, file_option] {
    run = [text_option, file_option] {
      if (!*text_option && !*file_option) {
        throw Error("tokenize", "--text or --file", "one of them");
      }
      const std::unique_ptr<Tokenizer> loaded = load_tokenizer_file(tokenizer_path);
      const Tokenizer& tokenizer = *loaded;
      const std::string input = *file_option ? read_text_file(text_file) : text;
      const std::vector<int32_t> ids = tokenizer.encode(input, special);
      std::string line;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i) line += ' ';
        line += std::to_string(ids[i]);
      }
      std::printf("%s\n", line.c_str());
      if (decode) std::printf("%s\n", tokenizer.decode(ids).c_str());
      return 0;
    };
  });
}

}  // namespace kvlens::cli
