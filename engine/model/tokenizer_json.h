// Typed access to tokenizer.json values. Every accessor either returns a value of the expected
// type or throws kvlens::Error naming the source, the JSON field path and what was expected, so
// the tokenizer parser never lets a nlohmann type_error (or a crash) escape on malformed input.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

#include "engine/common/json_describe.h"

namespace kvlens::tok {

using Json = nlohmann::json;

// Token ids above this are rejected: no real vocabulary comes close, and id tables are dense.
inline constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

// Where a value sits: the file it came from and its dotted path ("model.merges[3]").
struct JsonPath {
  const std::string* source;
  std::string field;

  JsonPath child(std::string_view key) const;
  JsonPath index(size_t i) const;
  [[noreturn]] void fail(const std::string& expected, const Json* found = nullptr) const;
};

using kvlens::describe_json;

// The member `key` of `object`, or nullptr when it is absent or null. `object` must be an object.
const Json* optional_member(const Json& object, std::string_view key, const JsonPath& path);
// The member `key`; absent or null is an error.
const Json& required_member(const Json& object, std::string_view key, const JsonPath& path);

const Json& expect_object(const Json& value, const JsonPath& path);
const Json& expect_array(const Json& value, const JsonPath& path);
const std::string& expect_string(const Json& value, const JsonPath& path);
bool expect_bool(const Json& value, const JsonPath& path);
// An integer in [lo, hi].
int64_t expect_int(const Json& value, const JsonPath& path, int64_t lo, int64_t hi);

// The "type" string of a pipeline component object.
const std::string& type_field(const Json& object, const JsonPath& path);
// How deeply "Sequence" components may nest before the input is rejected (keeps recursion bounded).
inline constexpr int kMaxNesting = 32;

// Optional members with defaults (null counts as absent, as serde's Option does).
bool bool_or(const Json& object, std::string_view key, bool fallback, const JsonPath& path);
std::string string_or(const Json& object, std::string_view key, std::string fallback,
                      const JsonPath& path);
// A member holding exactly one character (Metaspace replacement, Strip content), as UTF-8.
std::string char_or(const Json& object, std::string_view key, std::string fallback,
                    const JsonPath& path);
int64_t int_or(const Json& object, std::string_view key, int64_t fallback, const JsonPath& path,
               int64_t lo, int64_t hi);

}  // namespace kvlens::tok
