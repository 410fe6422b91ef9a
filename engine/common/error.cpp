// Formatting of kvlens::Error messages.
#include "engine/common/error.h"

namespace kvlens {
namespace {
std::string format_message(const std::string& file, const std::string& field,
                           const std::string& expected, const std::string& found) {
  // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on `s += "x" + t`.
  std::string message = file.empty() ? std::string("<input>") : file;
  if (!field.empty()) message.append(": ").append(field);
  message.append(": expected ").append(expected);
  if (!found.empty()) message.append(", found ").append(found);
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
