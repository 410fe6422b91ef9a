// Typed tokenizer.json accessors: turn every shape mismatch into one kvlens::Error with the
// field path, instead of letting nlohmann's type errors surface with no file or field named.
#include "engine/model/tokenizer_json.h"

#include "engine/common/error.h"
#include "engine/model/tokenizer_unicode.h"

namespace kvlens::tok {

JsonPath JsonPath::child(std::string_view key) const {
  std::string f = field;
  if (!f.empty()) f += '.';
  f += key;
  return {source, std::move(f)};
}

JsonPath JsonPath::index(size_t i) const {
  return {source, field + "[" + std::to_string(i) + "]"};
}

void JsonPath::fail(const std::string& expected, const Json* found) const {
  throw Error(*source, field.empty() ? std::string("(root)") : field, expected,
              found ? describe_json(*found) : std::string());
}

const Json& expect_object(const Json& value, const JsonPath& path) {
  if (!value.is_object()) path.fail("an object", &value);
  return value;
}

const Json& expect_array(const Json& value, const JsonPath& path) {
  if (!value.is_array()) path.fail("an array", &value);
  return value;
}

const std::string& expect_string(const Json& value, const JsonPath& path) {
  if (!value.is_string()) path.fail("a string", &value);
  return value.get_ref<const std::string&>();
}

bool expect_bool(const Json& value, const JsonPath& path) {
  if (!value.is_boolean()) path.fail("true or false", &value);
  return value.get<bool>();
}

int64_t expect_int(const Json& value, const JsonPath& path, int64_t lo, int64_t hi) {
  const std::string expected =
      "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) path.fail(expected, &value);
    const auto v = static_cast<int64_t>(u);
    if (v < lo) path.fail(expected, &value);
    return v;
  }
  if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v < lo || v > hi) path.fail(expected, &value);
    return v;
  }
  path.fail(expected, &value);
}

const Json* optional_member(const Json& object, std::string_view key, const JsonPath& path) {
  expect_object(object, path);
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

const Json& required_member(const Json& object, std::string_view key, const JsonPath& path) {
  const Json* member = optional_member(object, key, path);
  if (!member) path.child(key).fail("a value (the field is missing or null)");
  return *member;
}

const std::string& type_field(const Json& object, const JsonPath& path) {
  expect_object(object, path);
  return expect_string(required_member(object, "type", path), path.child("type"));
}

bool bool_or(const Json& object, std::string_view key, bool fallback, const JsonPath& path) {
  const Json* member = optional_member(object, key, path);
  return member ? expect_bool(*member, path.child(key)) : fallback;
}

std::string string_or(const Json& object, std::string_view key, std::string fallback,
                      const JsonPath& path) {
  const Json* member = optional_member(object, key, path);
  return member ? expect_string(*member, path.child(key)) : std::move(fallback);
}

std::string char_or(const Json& object, std::string_view key, std::string fallback,
                    const JsonPath& path) {
  std::string s = string_or(object, key, std::move(fallback), path);
  if (s.empty() || utf8_step(s, 0).len != s.size() || !utf8_step(s, 0).valid) {
    path.child(key).fail("a single character", optional_member(object, key, path));
  }
  return s;
}

int64_t int_or(const Json& object, std::string_view key, int64_t fallback, const JsonPath& path,
               int64_t lo, int64_t hi) {
  const Json* member = optional_member(object, key, path);
  return member ? expect_int(*member, path.child(key), lo, hi) : fallback;
}

}  // namespace kvlens::tok
