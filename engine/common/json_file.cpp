// read_json_file (json_file.h).
#include "engine/common/json_file.h"

#include "engine/common/error.h"
#include "engine/common/mapped_file.h"

namespace kvlens {

nlohmann::json read_json_file(const std::string& path) {
  try {
    return nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& error) {
    throw Error(path, "JSON", "a valid JSON document", error.what());
  }
}

}  // namespace kvlens
