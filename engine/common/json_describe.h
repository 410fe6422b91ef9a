// describe_json: a short, single-line description of a JSON value for error messages
// ("an object", "null", "\"F64\"", "12"...), shared by every parser of JSON input.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace kvlens {

std::string describe_json(const nlohmann::json& value);

}  // namespace kvlens
