// What the tokenizer reference-case tests share: one load per vocabulary file (a real vocabulary
// takes a noticeable fraction of a second to load) and token ids as text for failure messages.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/model/tokenizer.h"

namespace kvlens::test {

inline const Tokenizer& loaded_tokenizer(const std::string& path) {
  static std::map<std::string, Tokenizer> loaded;
  auto it = loaded.find(path);
  if (it == loaded.end()) it = loaded.emplace(path, Tokenizer::load(path)).first;
  return it->second;
}

inline std::string ids_text(const std::vector<int32_t>& ids) {
  std::string s;
  for (const int32_t id : ids) {
    if (!s.empty()) s += ' ';
    s += std::to_string(id);
  }
  return s;
}

}  // namespace kvlens::test
