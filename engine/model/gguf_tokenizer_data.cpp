// gguf_tokenizer_data: tokenizer.ggml.* keys -> GgufTokenizerData.
#include "engine/model/gguf_tokenizer_data.h"

#include <fstream>

#include "engine/common/error.h"

namespace kvlens {
namespace {

int32_t token_id(const GgufFile& file, const std::string& key) {
  return file.has(key) ? int32_t(file.u32(key)) : -1;
}

// The first of the keys present (newer files name the FIM tokens fim_*, older ones prefix/...).
int32_t token_id(const GgufFile& file, const std::string& key, const std::string& older) {
  return file.has(key) ? token_id(file, key) : token_id(file, older);
}

std::optional<bool> flag(const GgufFile& file, const std::string& key) {
  if (!file.has(key)) return std::nullopt;
  return file.boolean(key);
}

}  // namespace

bool has_gguf_tokenizer(const GgufFile& file) {
  return file.has("tokenizer.ggml.model");
}

GgufTokenizerData gguf_tokenizer_data(const GgufFile& file) {
  GgufTokenizerData d;
  d.model = file.string("tokenizer.ggml.model");
  if (auto pre = file.optional_string("tokenizer.ggml.pre")) d.pre = *pre;
  if (auto name = file.optional_string("general.name")) d.general_name = *name;
  d.tokens = file.string_array("tokenizer.ggml.tokens");
  if (file.has("tokenizer.ggml.scores")) d.scores = file.float_array("tokenizer.ggml.scores");
  if (file.has("tokenizer.ggml.token_type"))
    d.token_types = file.int_array("tokenizer.ggml.token_type");
  if (file.has("tokenizer.ggml.merges")) d.merges = file.string_array("tokenizer.ggml.merges");
  d.bos = token_id(file, "tokenizer.ggml.bos_token_id");
  d.eos = token_id(file, "tokenizer.ggml.eos_token_id");
  d.unk = token_id(file, "tokenizer.ggml.unknown_token_id");
  d.pad = token_id(file, "tokenizer.ggml.padding_token_id");
  d.fim_pre = token_id(file, "tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id");
  d.fim_suf = token_id(file, "tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id");
  d.fim_mid = token_id(file, "tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id");
  d.fim_pad = token_id(file, "tokenizer.ggml.fim_pad_token_id");
  d.fim_rep = token_id(file, "tokenizer.ggml.fim_rep_token_id");
  d.fim_sep = token_id(file, "tokenizer.ggml.fim_sep_token_id");
  d.add_bos = flag(file, "tokenizer.ggml.add_bos_token");
  d.add_eos = flag(file, "tokenizer.ggml.add_eos_token");
  d.add_space_prefix = flag(file, "tokenizer.ggml.add_space_prefix");
  return d;
}

std::unique_ptr<Tokenizer> load_tokenizer_file(const std::string& path) {
  char magic[4] = {};
  std::ifstream in(path, std::ios::binary);
  const bool gguf = (path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0) ||
                    (in.read(magic, 4) && std::string_view(magic, 4) == "GGUF");
  if (!gguf) return std::make_unique<Tokenizer>(Tokenizer::load(path));
  const std::shared_ptr<const GgufFile> file = GgufFile::open(path);
  if (!has_gguf_tokenizer(*file))
    throw Error(path, "tokenizer.ggml.model", "a GGUF file with a tokenizer", "none");
  return tokenizer_from_gguf(gguf_tokenizer_data(*file), path);
}

}  // namespace kvlens
