// A read-only memory map of a whole file (weights are used in place, never copied).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kvlens {

class MappedFile {
 public:
  // Throws kvlens::Error naming the path when the file cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  std::string_view bytes() const { return {reinterpret_cast<const char*>(data_), size_}; }

 private:
  std::string path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// Whole file into a string (for JSON files); throws kvlens::Error naming the path.
std::string read_text_file(const std::string& path);

}  // namespace kvlens
