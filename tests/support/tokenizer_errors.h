// expect_tokenizer_parse_error: Tokenizer::parse of a bad tokenizer.json must throw a
// kvlens::Error naming the file, a field containing `field_part` and an expectation containing
// `expected_part` (shared by the tokenizer unit tests).
#pragma once

#include <catch2/catch.hpp>
#include <string>

#include "engine/common/error.h"
#include "engine/model/tokenizer.h"

namespace kvlens::test {

inline void expect_tokenizer_parse_error(const std::string& json, const std::string& field_part,
                                         const std::string& expected_part) {
  INFO("tokenizer.json: " << json);
  try {
    Tokenizer::parse(json, "bad.json");
    FAIL("no kvlens::Error thrown");
  } catch (const kvlens::Error& e) {
    INFO("message: " << e.what());
    CHECK(e.file() == "bad.json");
    CHECK_THAT(e.field(), Catch::Matchers::Contains(field_part));
    CHECK_THAT(e.expected(), Catch::Matchers::Contains(expected_part));
  }
}

}  // namespace kvlens::test
