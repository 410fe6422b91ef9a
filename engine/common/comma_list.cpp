// split_comma_list (comma_list.h).
#include "engine/common/comma_list.h"

namespace kvlens {

std::vector<std::string> split_comma_list(const std::string& text) {
  std::vector<std::string> items;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(begin, end - begin);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    items.push_back(std::move(item));
    begin = end + 1;
  }
  return items;
}

}  // namespace kvlens
