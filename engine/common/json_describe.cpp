// Error-message descriptions of JSON values.
#include "engine/common/json_describe.h"

namespace kvlens {

using Json = nlohmann::json;

std::string describe_json(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::object:
      return "an object";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::boolean:
      return value.get<bool>() ? "true" : "false";
    case Json::value_t::discarded:
      return "nothing";
    default:
      break;
  }
  // Strings and numbers: their JSON text, shortened so a huge value cannot flood a dialog.
  // error_handler::replace keeps dump() from throwing on strings holding bytes nlohmann rejects.
  std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  constexpr size_t kMax = 60;
  if (text.size() > kMax) {
    size_t cut = kMax;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    text = text.substr(0, cut) + "...";
  }
  return (value.is_string() ? "the string " : "the number ") + text;
}

}  // namespace kvlens
