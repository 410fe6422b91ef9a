// A JSON file read and parsed in one step, for the loaders (predictor.json, the safetensors
// index): a malformed file is an Error naming the file.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace kvlens {

// Throws kvlens::Error naming `path` when it cannot be read or is not valid JSON.
nlohmann::json read_json_file(const std::string& path);

}  // namespace kvlens
