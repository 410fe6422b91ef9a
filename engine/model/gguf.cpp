// GGUF parsing: "GGUF", u32 version (2 or 3), u64 tensor count, u64 metadata count, the metadata
// (u64-length strings, u32 type tags, arrays of one element type), the tensor table, padding to
// general.alignment, then the data section. A cursor refuses every read past the end; counts are
// bounded by the bytes left before anything is allocated for them.
#include "engine/model/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "engine/common/error.h"
#include "engine/model/dequantize.h"

namespace kvlens {
namespace {

constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS

// Keys and tensor names from untrusted bytes, cut short and with control bytes replaced, so a
// message stays one printable line.
std::string shown(std::string_view text) {
  std::string out = "\"";
  size_t cut = std::min<size_t>(text.size(), 80);
  while (cut > 0 && cut < text.size() && (uint8_t(text[cut]) & 0xc0u) == 0x80u) --cut;
  for (size_t i = 0; i < cut; ++i) out.push_back(uint8_t(text[i]) < 0x20 ? '?' : text[i]);
  if (cut < text.size()) out += "...";
  return out + "\"";
}

size_t scalar_size(GgufType type) {
  switch (type) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    case GgufType::kString:
    case GgufType::kArray:
      return 0;
  }
  return 0;
}

bool is_integer(GgufType type) {
  return type == GgufType::kU8 || type == GgufType::kI8 || type == GgufType::kU16 ||
         type == GgufType::kI16 || type == GgufType::kU32 || type == GgufType::kI32 ||
         type == GgufType::kU64 || type == GgufType::kI64;
}

template <class T>
T load_le(const char* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));  // GGUF is little-endian, as are the hosts we build for
  return value;
}

// An integer element as int64 (u64 above INT64_MAX is reported through `fits`).
int64_t integer_at(GgufType type, const char* p, bool& fits) {
  fits = true;
  switch (type) {
    case GgufType::kU8:
      return load_le<uint8_t>(p);
    case GgufType::kI8:
      return load_le<int8_t>(p);
    case GgufType::kU16:
      return load_le<uint16_t>(p);
    case GgufType::kI16:
      return load_le<int16_t>(p);
    case GgufType::kU32:
      return load_le<uint32_t>(p);
    case GgufType::kI32:
      return load_le<int32_t>(p);
    case GgufType::kU64: {
      const uint64_t value = load_le<uint64_t>(p);
      fits = value <= uint64_t(std::numeric_limits<int64_t>::max());
      return int64_t(value);
    }
    case GgufType::kI64:
      return load_le<int64_t>(p);
    default:
      fits = false;
      return 0;
  }
}

class Cursor {
 public:
  Cursor(std::string_view bytes, const std::string& source) : bytes_(bytes), source_(source) {}

  size_t position() const { return pos_; }
  size_t left() const { return bytes_.size() - pos_; }

  std::string_view take(uint64_t count, const std::string& field) {
    if (count > left()) {
      throw Error(source_, field,
                  std::to_string(count) + " bytes at offset " + std::to_string(pos_),
                  "the file ends after " + std::to_string(left()));
    }
    const std::string_view out = bytes_.substr(pos_, size_t(count));
    pos_ += size_t(count);
    return out;
  }
  template <class T>
  T read(const std::string& field) {
    return load_le<T>(take(sizeof(T), field).data());
  }
  std::string_view string(const std::string& field) {
    const uint64_t length = read<uint64_t>(field + " length");
    if (length > left()) {
      throw Error(source_, field + " length",
                  "at most the " + std::to_string(left()) + " bytes left in the file",
                  std::to_string(length));
    }
    return take(length, field);
  }

 private:
  std::string_view bytes_;
  const std::string& source_;
  size_t pos_ = 0;
};

GgufType read_type(Cursor& cursor, const std::string& field, const std::string& source) {
  const uint32_t tag = cursor.read<uint32_t>(field);
  if (tag > uint32_t(GgufType::kF64)) {
    throw Error(source, field, "a GGUF value type (0 to 12)", std::to_string(tag));
  }
  return GgufType(tag);
}

GgufValue read_value(Cursor& cursor, GgufType type, const std::string& field,
                     const std::string& source) {
  GgufValue value;
  value.type = type;
  if (type == GgufType::kString) {
    value.raw = cursor.string(field);
    return value;
  }
  if (type != GgufType::kArray) {
    value.raw = cursor.take(scalar_size(type), field);
    if (type == GgufType::kBool && uint8_t(value.raw[0]) > 1) {
      throw Error(source, field, "a bool (0 or 1)", std::to_string(uint8_t(value.raw[0])));
    }
    return value;
  }
  value.element_type = read_type(cursor, field + " element type", source);
  if (value.element_type == GgufType::kArray) {
    throw Error(source, field + " element type", "an array of scalars or strings",
                "an array of arrays");
  }
  value.count = cursor.read<uint64_t>(field + " count");
  // Each element takes at least its scalar size (strings: their 8-byte length), so a count
  // beyond the bytes left is refused before anything is reserved for it.
  const size_t element =
      value.element_type == GgufType::kString ? 8 : scalar_size(value.element_type);
  if (value.count > cursor.left() / element) {
    throw Error(source, field + " count",
                "at most " + std::to_string(cursor.left() / element) + " elements (the bytes left)",
                std::to_string(value.count));
  }
  if (value.element_type == GgufType::kString) {
    value.strings.reserve(size_t(value.count));
    for (uint64_t i = 0; i < value.count; ++i) {
      value.strings.push_back(cursor.string(field + "[" + std::to_string(i) + "]"));
    }
  } else {
    value.raw = cursor.take(value.count * element, field);
    if (value.element_type == GgufType::kBool) {
      for (char byte : value.raw) {
        if (uint8_t(byte) > 1) {
          throw Error(source, field, "bools (0 or 1)", std::to_string(uint8_t(byte)));
        }
      }
    }
  }
  return value;
}

}  // namespace

std::string_view gguf_type_name(GgufType type) {
  static constexpr std::string_view kNames[] = {"u8",  "i8",  "u16",  "i16",    "u32",
                                                "i32", "f32", "bool", "string", "array",
                                                "u64", "i64", "f64"};
  const auto index = size_t(type);
  return index < std::size(kNames) ? kNames[index] : std::string_view("unknown");
}

std::vector<int64_t> GgufTensorInfo::shape() const {
  return std::vector<int64_t>(dims.rbegin(), dims.rend());
}

std::shared_ptr<const GgufFile> GgufFile::open(const std::string& path) {
  auto map = std::make_unique<MappedFile>(path);
  std::shared_ptr<GgufFile> file(new GgufFile());
  file->bytes_ = map->bytes();
  file->source_ = path;
  file->map_ = std::move(map);
  file->parse();
  return file;
}

GgufFile::GgufFile(std::string_view bytes, std::string source)
    : bytes_(bytes), source_(std::move(source)) {
  parse();
}

void GgufFile::parse() {
  Cursor cursor(bytes_, source_);
  if (bytes_.size() < 4 || bytes_.substr(0, 4) != "GGUF") {
    throw Error(source_, "magic", "a GGUF file (starting with \"GGUF\")",
                bytes_.size() < 4 ? "a file of " + std::to_string(bytes_.size()) + " bytes"
                                  : shown(bytes_.substr(0, 4)));
  }
  cursor.take(4, "magic");
  version_ = cursor.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3) {
    // A big-endian file reads as 0x02000000 or 0x03000000 here.
    throw Error(source_, "version", "GGUF version 2 or 3 (little-endian)",
                std::to_string(version_));
  }
  const uint64_t tensor_count = cursor.read<uint64_t>("tensor count");
  const uint64_t kv_count = cursor.read<uint64_t>("metadata count");
  // Smallest possible entries: a key of length 0 (8 bytes) + a type (4) + a u8 (1); a tensor
  // with an empty name (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
  if (kv_count > cursor.left() / 13) {
    throw Error(source_, "metadata count",
                "at most " + std::to_string(cursor.left() / 13) + " entries (the bytes left)",
                std::to_string(kv_count));
  }
  for (uint64_t i = 0; i < kv_count; ++i) {
    const std::string key_field = "metadata entry " + std::to_string(i) + " key";
    const std::string_view key = cursor.string(key_field);
    const std::string field = "metadata " + shown(key);
    const GgufType type = read_type(cursor, field + " type", source_);
    GgufValue value = read_value(cursor, type, field, source_);
    if (!metadata_.emplace(std::string(key), std::move(value)).second) {
      throw Error(source_, field, "each metadata key once", "a second entry");
    }
  }
  if (const GgufValue* align = find("general.alignment")) {
    if (align->type != GgufType::kU32) {
      throw Error(source_, "metadata \"general.alignment\"", "a u32",
                  std::string(gguf_type_name(align->type)));
    }
    alignment_ = load_le<uint32_t>(align->raw.data());
    if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0) {
      throw Error(source_, "metadata \"general.alignment\"", "a power of two",
                  std::to_string(alignment_));
    }
  }
  if (tensor_count > cursor.left() / 32) {
    throw Error(source_, "tensor count",
                "at most " + std::to_string(cursor.left() / 32) + " tensors (the bytes left)",
                std::to_string(tensor_count));
  }
  tensors_.reserve(size_t(tensor_count));
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo info;
    info.name = std::string(cursor.string("tensor " + std::to_string(i) + " name"));
    const std::string field = "tensor " + shown(info.name);
    const uint32_t n_dims = cursor.read<uint32_t>(field + " n_dims");
    if (n_dims == 0 || n_dims > kMaxDims) {
      throw Error(source_, field + " n_dims", "1 to " + std::to_string(kMaxDims),
                  std::to_string(n_dims));
    }
    info.elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t extent = cursor.read<uint64_t>(field + " dims");
      if (extent == 0 || extent > uint64_t(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(info.elements, extent, &info.elements) ||
          info.elements > uint64_t(std::numeric_limits<int64_t>::max())) {
        throw Error(source_, field + " dims", "extents of at least 1 whose product fits in int64",
                    "an extent of " + std::to_string(extent));
      }
      info.dims.push_back(extent);
    }
    info.type = cursor.read<uint32_t>(field + " type");
    const GgmlTypeInfo* type = ggml_type_info(info.type);
    if (type == nullptr) {
      throw Error(source_, field + " type", "a ggml type id", std::to_string(info.type));
    }
    if (info.dims[0] % uint64_t(type->block_elements) != 0) {
      throw Error(source_, field + " dims",
                  "a first extent that is a multiple of " + std::to_string(type->block_elements) +
                      " (the " + type->name + " block)",
                  std::to_string(info.dims[0]));
    }
    // elements <= INT64_MAX and block_bytes <= 292: no overflow in uint64.
    info.bytes = info.elements / uint64_t(type->block_elements) * uint64_t(type->block_bytes);
    info.offset = cursor.read<uint64_t>(field + " offset");
    if (info.offset % alignment_ != 0) {
      throw Error(source_, field + " offset",
                  "a multiple of the alignment " + std::to_string(alignment_),
                  std::to_string(info.offset));
    }
    if (!tensor_index_.emplace(info.name, tensors_.size()).second) {
      throw Error(source_, field, "each tensor name once", "a second tensor of that name");
    }
    tensors_.push_back(std::move(info));
  }
  // The data section starts at the next multiple of the alignment (the file may end right
  // there when it holds no tensors).
  const uint64_t end_of_tables = cursor.position();
  data_offset_ = (end_of_tables + alignment_ - 1) / alignment_ * alignment_;
  if (data_offset_ < end_of_tables || (!tensors_.empty() && data_offset_ > bytes_.size())) {
    throw Error(source_, "data section",
                "to start at offset " + std::to_string(data_offset_) + " inside the file",
                "a file of " + std::to_string(bytes_.size()) + " bytes");
  }
  const uint64_t data_size = bytes_.size() - std::min<uint64_t>(data_offset_, bytes_.size());
  std::vector<const GgufTensorInfo*> by_offset;
  for (GgufTensorInfo& info : tensors_) {
    if (info.offset > data_size || info.bytes > data_size - info.offset) {
      throw Error(source_, "tensor " + shown(info.name) + " data",
                  std::to_string(info.bytes) + " bytes at data offset " +
                      std::to_string(info.offset) + " inside the data section",
                  "a data section of " + std::to_string(data_size) + " bytes");
    }
    info.data = reinterpret_cast<const std::byte*>(bytes_.data()) + data_offset_ + info.offset;
    by_offset.push_back(&info);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensorInfo& before = *by_offset[i - 1];
    if (before.bytes > 0 && before.offset + before.bytes > by_offset[i]->offset) {
      throw Error(source_, "tensor " + shown(by_offset[i]->name) + " offset",
                  "data that does not overlap tensor " + shown(before.name) + " (which ends at " +
                      std::to_string(before.offset + before.bytes) + ")",
                  std::to_string(by_offset[i]->offset));
    }
  }
}

const GgufValue* GgufFile::find(std::string_view key) const {
  const auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufValue& GgufFile::require(std::string_view key, std::string_view expected) const {
  const GgufValue* value = find(key);
  if (value == nullptr) {
    throw Error(source_, "metadata " + shown(key), std::string(expected), "missing");
  }
  return *value;
}

namespace {
[[noreturn]] void wrong_type(const std::string& source, std::string_view key,
                             std::string_view expected, const GgufValue& value) {
  std::string found(gguf_type_name(value.type));
  if (value.type == GgufType::kArray) {
    found = "an array of " + std::string(gguf_type_name(value.element_type));
  }
  throw Error(source, "metadata " + shown(key), std::string(expected), found);
}
}  // namespace

uint64_t GgufFile::u64(std::string_view key) const {
  const char* expected = "a non-negative integer";
  const GgufValue& value = require(key, expected);
  bool fits = false;
  const int64_t number =
      is_integer(value.type) ? integer_at(value.type, value.raw.data(), fits) : 0;
  if (value.type == GgufType::kU64) return load_le<uint64_t>(value.raw.data());
  if (!fits) wrong_type(source_, key, expected, value);
  if (number < 0) throw Error(source_, "metadata " + shown(key), expected, std::to_string(number));
  return uint64_t(number);
}

uint64_t GgufFile::u64(std::string_view key, uint64_t fallback) const {
  return has(key) ? u64(key) : fallback;
}

uint32_t GgufFile::u32(std::string_view key) const {
  const uint64_t value = u64(key);
  if (value > std::numeric_limits<uint32_t>::max()) {
    throw Error(source_, "metadata " + shown(key), "an integer below 2^32", std::to_string(value));
  }
  return uint32_t(value);
}

uint32_t GgufFile::u32(std::string_view key, uint32_t fallback) const {
  return has(key) ? u32(key) : fallback;
}

int64_t GgufFile::i64(std::string_view key) const {
  const char* expected = "an integer";
  const GgufValue& value = require(key, expected);
  bool fits = false;
  const int64_t number =
      is_integer(value.type) ? integer_at(value.type, value.raw.data(), fits) : 0;
  if (!fits) wrong_type(source_, key, expected, value);
  return number;
}

double GgufFile::number(std::string_view key) const {
  const char* expected = "a number";
  const GgufValue& value = require(key, expected);
  if (value.type == GgufType::kF32) return load_le<float>(value.raw.data());
  if (value.type == GgufType::kF64) return load_le<double>(value.raw.data());
  if (value.type == GgufType::kU64) return double(load_le<uint64_t>(value.raw.data()));
  bool fits = false;
  const int64_t number =
      is_integer(value.type) ? integer_at(value.type, value.raw.data(), fits) : 0;
  if (!fits) wrong_type(source_, key, expected, value);
  return double(number);
}

double GgufFile::number(std::string_view key, double fallback) const {
  return has(key) ? number(key) : fallback;
}

bool GgufFile::boolean(std::string_view key) const {
  const GgufValue& value = require(key, "a bool");
  if (value.type != GgufType::kBool) wrong_type(source_, key, "a bool", value);
  return value.raw[0] != 0;
}

bool GgufFile::boolean(std::string_view key, bool fallback) const {
  return has(key) ? boolean(key) : fallback;
}

std::string GgufFile::string(std::string_view key) const {
  const GgufValue& value = require(key, "a string");
  if (value.type != GgufType::kString) wrong_type(source_, key, "a string", value);
  return std::string(value.raw);
}

std::optional<std::string> GgufFile::optional_string(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return string(key);
}

uint64_t GgufFile::array_size(std::string_view key) const {
  const GgufValue& value = require(key, "an array");
  if (value.type != GgufType::kArray) wrong_type(source_, key, "an array", value);
  return value.count;
}

std::vector<std::string> GgufFile::string_array(std::string_view key) const {
  const char* expected = "an array of strings";
  const GgufValue& value = require(key, expected);
  if (value.type != GgufType::kArray || value.element_type != GgufType::kString) {
    wrong_type(source_, key, expected, value);
  }
  return std::vector<std::string>(value.strings.begin(), value.strings.end());
}

std::vector<float> GgufFile::float_array(std::string_view key) const {
  const char* expected = "an array of f32 or f64";
  const GgufValue& value = require(key, expected);
  if (value.type != GgufType::kArray ||
      (value.element_type != GgufType::kF32 && value.element_type != GgufType::kF64)) {
    wrong_type(source_, key, expected, value);
  }
  std::vector<float> out(static_cast<size_t>(value.count));
  const size_t step = scalar_size(value.element_type);
  for (size_t i = 0; i < out.size(); ++i) {
    const char* p = value.raw.data() + i * step;
    out[i] = value.element_type == GgufType::kF32 ? load_le<float>(p) : float(load_le<double>(p));
  }
  return out;
}

std::vector<int32_t> GgufFile::int_array(std::string_view key) const {
  const char* expected = "an array of integers that fit int32";
  const GgufValue& value = require(key, expected);
  if (value.type != GgufType::kArray || !is_integer(value.element_type)) {
    wrong_type(source_, key, expected, value);
  }
  std::vector<int32_t> out(static_cast<size_t>(value.count));
  const size_t step = scalar_size(value.element_type);
  for (size_t i = 0; i < out.size(); ++i) {
    bool fits = false;
    const int64_t number = integer_at(value.element_type, value.raw.data() + i * step, fits);
    if (!fits || number < std::numeric_limits<int32_t>::min() ||
        number > std::numeric_limits<int32_t>::max()) {
      throw Error(source_, "metadata " + shown(key) + "[" + std::to_string(i) + "]", expected,
                  fits ? std::to_string(number) : "a value above 2^63");
    }
    out[i] = int32_t(number);
  }
  return out;
}

}  // namespace kvlens
