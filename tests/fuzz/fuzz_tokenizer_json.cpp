// libFuzzer target: arbitrary bytes as tokenizer.json. Parsing may reject the input only with
// kvlens::Error (or a nlohmann exception); a tokenizer that parses must encode and decode without
// crashing, and must decode every id its own encode produced.
#include "engine/common/error.h"
#include "engine/model/tokenizer.h"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  std::optional<kvlens::Tokenizer> tok;
  try {
    tok.emplace(kvlens::Tokenizer::parse(json, "fuzz.json"));
  } catch (const kvlens::Error&) {
    return 0;
  } catch (const nlohmann::json::exception&) {
    return 0;
  }

  static const char* const kTexts[] = {
      "",
      "Hello world",
      " a  b\n\tc 1234567 it's 'LL",
      "\xC3\xA9\xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\xA6\x99\xE2\x80\x8D!",
      "<s>x</s><unk> <|endoftext|>",
      "bad \xFF\xC3 utf8 \xE2\x96\x81\xE2\x96\x81",
      // NFC input (e + combining acute, the Angstrom sign) and o200k's case runs and slashes.
      "Cafe\xCC\x81 \xE2\x84\xAB HTTPServer iPhone DON'T !\n/ <|im_start|>x<|im_end|>",
  };
  for (const char* text : kTexts) {
    for (const bool special : {false, true}) {
      const std::vector<int32_t> ids = tok->encode(text, special);
      try {
        (void)tok->decode(ids, false);
        (void)tok->decode(ids, true);
      } catch (const kvlens::Error&) {
        std::abort();  // encode produced an id that decode does not know
      }
    }
  }
  // Every label (gaps and ids outside the vocabulary read "<id N>"), plus those outside.
  const int64_t limit = std::min<int64_t>(tok->vocab_size(), 512);
  for (int64_t id = -1; id <= limit; ++id) {
    try {
      (void)tok->token_text(static_cast<int32_t>(id));
    } catch (const kvlens::Error&) {
    }
  }
  (void)tok->bos_id();
  (void)tok->token_to_id("a");
  return 0;
}
