// model_type -> the family's layer math.
#include "engine/arch/architecture.h"

#include <algorithm>
#include <string>

#include "engine/arch/families.h"
#include "engine/common/error.h"

namespace kvlens {

const Architecture& architecture_for(const ModelConfig& config) {
  const Architecture* const families[] = {&llama_architecture(), &qwen2_architecture(),
                                          &qwen3_architecture(), &phi3_architecture(),
                                          &gemma3_architecture()};
  std::string known;
  for (const Architecture* family : families) {
    std::string_view types = family->model_types();
    known += (known.empty() ? "" : ", ") + std::string(types);
    // model_types() is a ", "-separated list: match whole names.
    for (size_t begin = 0; begin <= types.size();) {
      const size_t end = std::min(types.find(", ", begin), types.size());
      if (types.substr(begin, end - begin) == config.model_type) return *family;
      begin = end + 2;
    }
  }
  throw Error(config.source, "model_type", "one of " + known, "\"" + config.model_type + "\"");
}

}  // namespace kvlens
