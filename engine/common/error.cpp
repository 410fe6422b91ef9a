// Formatting of kvlens::Error messages.
#include "engine/common/error.h"

namespace kvlens {
namespace {
std::string format_message(const std::string& file, const std::string& field,
                           const std::string& expected, const std::string& found) {
  std::string message = file.empty() ? std::string("<input>") : file;
  if (!field.empty()) message += ": " + field;
  message += ": expected " + expected;
  if (!found.empty()) message += ", found " + found;
  return message;
}
}  // namespace

Error::Error(std::string file, std::string field, std::string expected, std::string found)
    : std::runtime_error(format_message(file, field, expected, found)),
      file_(std::move(file)),
      field_(std::move(field)),
      expected_(std::move(expected)),
      found_(std::move(found)) {}

}  // namespace kvlens
