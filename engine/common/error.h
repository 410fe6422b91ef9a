// kvlens::Error: the one exception type for bad input. Its message always names the file, the
// field and what was expected, so the CLI and the app can show it as-is.
#pragma once

#include <stdexcept>
#include <string>

namespace kvlens {

class Error : public std::runtime_error {
 public:
  // what() reads "<file>: <field>: expected <expected>" plus ", found <found>" when given.
  Error(std::string file, std::string field, std::string expected, std::string found = {});

  const std::string& file() const { return file_; }
  const std::string& field() const { return field_; }
  const std::string& expected() const { return expected_; }
  const std::string& found() const { return found_; }

 private:
  std::string file_, field_, expected_, found_;
};

}  // namespace kvlens
