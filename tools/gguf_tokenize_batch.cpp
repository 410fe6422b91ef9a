// Reference driver for tools/gguf_reference_ids.py, built against llama.cpp's libllama (never part
// of kvlens): tokenizes many texts with llama.cpp's own tokenizer in one process. Input: a file of
// texts separated by NUL bytes. Output, four lines per text: the ids without and with special
// tokens (special-token text parsed, as llama-tokenize does), then as hex the detokenized text of
// the first ids (remove_special false, unparse_special true) and of the second (true, false).
#include "llama.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::vector<llama_token> tokenize(const llama_vocab* vocab, const std::string& text, bool add) {
  std::vector<llama_token> ids(text.size() + 8);
  int32_t n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                             static_cast<int32_t>(ids.size()), add, true);
  if (n < 0) {
    ids.resize(static_cast<size_t>(-n));
    n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                       static_cast<int32_t>(ids.size()), add, true);
  }
  ids.resize(static_cast<size_t>(n));
  return ids;
}

std::string detokenize(const llama_vocab* vocab, const std::vector<llama_token>& ids,
                       bool remove_special, bool unparse_special) {
  std::string text(ids.size() * 16 + 16, '\0');
  int32_t n = llama_detokenize(vocab, ids.data(), static_cast<int32_t>(ids.size()), text.data(),
                               static_cast<int32_t>(text.size()), remove_special, unparse_special);
  if (n < 0) {
    text.resize(static_cast<size_t>(-n));
    n = llama_detokenize(vocab, ids.data(), static_cast<int32_t>(ids.size()), text.data(),
                         static_cast<int32_t>(text.size()), remove_special, unparse_special);
  }
  text.resize(static_cast<size_t>(n));
  return text;
}

void print_ids(const std::vector<llama_token>& ids) {
  for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %d" : "%d", ids[i]);
  std::printf("\n");
}

void print_hex(const std::string& text) {
  for (const char c : text) std::printf("%02x", static_cast<unsigned char>(c));
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s MODEL.gguf TEXTS (NUL-separated)\n", argv[0]);
    return 2;
  }
  llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
  llama_backend_init();
  llama_model_params params = llama_model_default_params();
  params.vocab_only = true;
  llama_model* model = llama_model_load_from_file(argv[1], params);
  if (!model) {
    std::fprintf(stderr, "cannot load %s\n", argv[1]);
    return 1;
  }
  const llama_vocab* vocab = llama_model_get_vocab(model);
  std::ifstream in(argv[2], std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str();
  size_t begin = 0;
  while (begin <= all.size()) {
    size_t end = all.find('\0', begin);
    if (end == std::string::npos) end = all.size();
    const std::string text = all.substr(begin, end - begin);
    const auto plain = tokenize(vocab, text, false);
    const auto special = tokenize(vocab, text, true);
    print_ids(plain);
    print_ids(special);
    print_hex(detokenize(vocab, plain, false, true));
    print_hex(detokenize(vocab, special, true, false));
    begin = end + 1;
  }
  llama_model_free(model);
  return 0;
}
