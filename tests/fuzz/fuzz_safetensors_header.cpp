// libFuzzer entry for parse_safetensors_header: arbitrary bytes as a whole .safetensors file.
// kvlens::Error is the expected outcome for bad input; anything else (crash, sanitizer report,
// another exception type) is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/common/error.h"
#include "engine/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    const kvlens::SafetensorsHeader header = kvlens::parse_safetensors_header(bytes, "fuzz");
    // Every accepted entry must lie inside the input; touching its first and last byte lets
    // AddressSanitizer confirm that.
    const uint64_t data_start = 8 + header.header_size;
    volatile char sink = 0;
    for (const auto& [name, entry] : header.tensors) {
      if (entry.end > entry.begin) {
        sink = sink ^ bytes[data_start + entry.begin] ^ bytes[data_start + entry.end - 1];
      }
    }
  } catch (const kvlens::Error&) {
  }
  return 0;
}
