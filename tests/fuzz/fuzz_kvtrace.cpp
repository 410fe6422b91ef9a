// libFuzzer entry for parse_trace: arbitrary bytes as a whole .kvtrace file, parsed twice: as
// given (the framing: magic, version, sizes, checksum) and with the body size and CRC-32 fixed up,
// so the mutations reach the body's checks instead of dying at the checksum. kvlens::Error is the
// expected outcome for bad input; a trace that parses must re-serialize to exactly its bytes (a
// version 1 file: to version 2 bytes that read back the same).
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/common/error.h"
#include "engine/trace/trace.h"

namespace {

void parse_one(const std::vector<uint8_t>& bytes) {
  try {
    const kvlens::Trace trace = kvlens::parse_trace(bytes.data(), bytes.size(), "fuzz.kvtrace");
    // The format has one encoding per trace: anything else means the reader accepted a field the
    // writer would not produce (or lost one). An older version's file is written as the current
    // version, which must then read back to the same bytes.
    const std::vector<uint8_t> written = kvlens::serialize_trace(trace);
    uint32_t version = 0;
    std::memcpy(&version, bytes.data() + 8, 4);  // parsed, so the header is there
    if (version == kvlens::kTraceFileVersion) {
      if (written != bytes) std::abort();
    } else {
      const kvlens::Trace again =
          kvlens::parse_trace(written.data(), written.size(), "fuzz.kvtrace rewritten");
      if (kvlens::serialize_trace(again) != written) std::abort();
    }
    // Touch every kept row through the accessors: AddressSanitizer checks they stay in bounds.
    volatile float sink = 0;
    for (const auto& step : trace.steps()) {
      for (const kvlens::StepRecord& record : step) {
        for (int64_t layer = 0; layer < trace.model.layers; ++layer) {
          for (int64_t head = 0; head < trace.model.heads; ++head) {
            const float* row = record.logits_row(layer, head, trace.model.heads);
            if (row != nullptr) sink = sink + row[record.columns - 1];
          }
        }
      }
    }
  } catch (const kvlens::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  parse_one(bytes);
  // Header (24 bytes: magic, version, flags, u64 body size) + body + u32 CRC.
  if (size >= 28) {
    const uint64_t body = size - 28;
    std::memcpy(bytes.data() + 16, &body, 8);  // little-endian hosts (x86-64, arm64)
    const auto crc = uint32_t(crc32(0, bytes.data(), uInt(size - 4)));
    std::memcpy(bytes.data() + size - 4, &crc, 4);
    parse_one(bytes);
  }
  return 0;
}
