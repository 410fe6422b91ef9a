// FieldReader: typed, range-checked fields of one JSON object, for the loaders of config.json and
// predictor.json; every error names the file, the field (with its enclosing object's prefix) and
// what was expected.
#pragma once

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "engine/common/error.h"
#include "engine/common/json_describe.h"

namespace kvlens {

// Reads typed fields of one JSON object; `prefix` names the enclosing object in messages
// (e.g. "rope_scaling.").
class FieldReader {
 public:
  FieldReader(const nlohmann::json& object, std::string source, std::string prefix = {})
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  // The value of `key`, or nullptr when the key is absent or null (transformers treats an
  // explicit null like "not given" for every optional field read here).
  const nlohmann::json* find(const std::string& key) const {
    const auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  int64_t integer(const std::string& key, int64_t min_value, int64_t max_value) const {
    const nlohmann::json* value = find(key);
    if (value == nullptr) {
      throw Error(source_, prefix_ + key, "an integer field", "missing or null");
    }
    return integer_value(key, *value, min_value, max_value);
  }
  int64_t integer_or(const std::string& key, int64_t fallback, int64_t min_value,
                     int64_t max_value) const {
    const nlohmann::json* value = find(key);
    return value == nullptr ? fallback : integer_value(key, *value, min_value, max_value);
  }
  std::optional<int64_t> optional_integer(const std::string& key, int64_t min_value,
                                          int64_t max_value) const {
    const nlohmann::json* value = find(key);
    if (value == nullptr) return std::nullopt;
    return integer_value(key, *value, min_value, max_value);
  }

  // A finite number strictly above `exclusive_min` (integers are accepted: rope_theta is often
  // written as 10000).
  double number_or(const std::string& key, double fallback, double exclusive_min) const {
    const nlohmann::json* value = find(key);
    if (value == nullptr) return fallback;
    if (!value->is_number()) throw Error(source_, prefix_ + key, "a number", describe_json(*value));
    const double number = value->get<double>();
    if (!std::isfinite(number) || !(number > exclusive_min)) {
      throw Error(source_, prefix_ + key,
                  "a finite number greater than " + nlohmann::json(exclusive_min).dump(),
                  value->dump());
    }
    return number;
  }

  bool boolean_or(const std::string& key, bool fallback) const {
    const nlohmann::json* value = find(key);
    if (value == nullptr) return fallback;
    if (!value->is_boolean())
      throw Error(source_, prefix_ + key, "true or false", describe_json(*value));
    return value->get<bool>();
  }

  std::optional<std::string> optional_string(const std::string& key) const {
    const nlohmann::json* value = find(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_string()) throw Error(source_, prefix_ + key, "a string", describe_json(*value));
    return value->get<std::string>();
  }

  int64_t integer_value(const std::string& key, const nlohmann::json& value, int64_t min_value,
                        int64_t max_value) const {
    const std::string range =
        "an integer in [" + std::to_string(min_value) + ", " + std::to_string(max_value) + "]";
    if (value.is_number_unsigned()) {
      const uint64_t number = value.get<uint64_t>();
      // nlohmann stores every non-negative literal as unsigned, so the lower bound applies too.
      if (number > uint64_t(max_value) || (min_value > 0 && number < uint64_t(min_value))) {
        throw Error(source_, prefix_ + key, range, value.dump());
      }
      return int64_t(number);
    }
    if (value.is_number_integer()) {
      const int64_t number = value.get<int64_t>();
      if (number < min_value || number > max_value) {
        throw Error(source_, prefix_ + key, range, value.dump());
      }
      return number;
    }
    throw Error(source_, prefix_ + key, range, describe_json(value));
  }

  const std::string& source() const { return source_; }
  const std::string& prefix() const { return prefix_; }

 private:
  const nlohmann::json& object_;
  std::string source_;
  std::string prefix_;
};

}  // namespace kvlens
