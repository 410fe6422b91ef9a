// Safetensors parsing: [u64 little-endian header length][JSON header][data section]. Every
// offset and size is checked with overflow-safe arithmetic before a byte of data is touched.
#include "engine/model/safetensors.h"

#include <algorithm>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "engine/common/error.h"
#include "engine/common/json_describe.h"
#include "engine/common/json_file.h"

namespace kvlens {
namespace {

using Json = nlohmann::json;

// The reference implementation refuses headers above 100 MB; so do we, so that a corrupt
// length prefix cannot make us parse (or allocate for) gigabytes of "JSON".
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Every dtype the safetensors format defines, with its element size. Only the float types a
// Llama checkpoint uses can be loaded, but knowing the sizes of the others lets a file that
// also holds e.g. an I64 buffer be validated and still opened.
struct KnownDType {
  const char* name;
  size_t size;
};
constexpr KnownDType kKnownDTypes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2},    {"I64", 8},     {"I32", 4},
    {"I16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1},    {"F8_E4M3", 1}, {"F8_E5M2", 1},
    {"U16", 2}, {"U32", 4}, {"U64", 8}, {"F8_E8M0", 1},
};

std::optional<DType> loadable_dtype(const std::string& name) {
  if (name == "F32") return DType::F32;
  if (name == "F16") return DType::F16;
  if (name == "BF16") return DType::BF16;
  return std::nullopt;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// Short rendering of a tensor name or dtype taken from untrusted bytes; the cut never splits a
// UTF-8 sequence, so the message stays valid UTF-8 for the UI and JSON output.
std::string display_name(const std::string& text) {
  size_t cut = text.size();
  if (cut > 80) {
    cut = 80;
    while (cut > 0 && (uint8_t(text[cut]) & 0xc0u) == 0x80u) --cut;
  }
  // Appended piecewise: GCC 12 reports a false -Wrestrict on "lit" + string + "lit" here.
  std::string shown(1, '"');
  shown.append(text, 0, cut);
  if (cut < text.size()) shown.append("...");
  shown.push_back('"');
  return shown;
}

// A non-negative integer that fits in uint64 (JSON may hold negatives, floats, huge values).
bool read_u64(const Json& value, uint64_t& out) {
  if (value.is_number_unsigned()) {
    out = value.get<uint64_t>();
    return true;
  }
  if (value.is_number_integer()) {
    const int64_t number = value.get<int64_t>();
    if (number < 0) return false;
    out = uint64_t(number);
    return true;
  }
  return false;
}

TensorEntry parse_entry(const std::string& name, const Json& value, uint64_t data_size,
                        const std::string& source) {
  const std::string field = "tensor " + display_name(name);
  if (!value.is_object()) {
    throw Error(source, field, "an object with dtype, shape and data_offsets",
                describe_json(value));
  }
  TensorEntry entry;

  const auto dtype_it = value.find("dtype");
  if (dtype_it == value.end() || !dtype_it->is_string()) {
    throw Error(source, field + " dtype", "a dtype string such as \"BF16\"",
                dtype_it == value.end() ? "missing" : describe_json(*dtype_it));
  }
  entry.stored_dtype = dtype_it->get<std::string>();
  size_t element_size = 0;
  for (const KnownDType& known : kKnownDTypes) {
    if (entry.stored_dtype == known.name) element_size = known.size;
  }
  if (element_size == 0) {
    throw Error(source, field + " dtype", "a safetensors dtype (F32, F16, BF16, ...)",
                display_name(entry.stored_dtype));
  }
  if (const auto loadable = loadable_dtype(entry.stored_dtype)) entry.dtype = *loadable;

  const auto shape_it = value.find("shape");
  if (shape_it == value.end() || !shape_it->is_array()) {
    throw Error(source, field + " shape", "an array of non-negative integers",
                shape_it == value.end() ? "missing" : describe_json(*shape_it));
  }
  uint64_t numel = 1;
  bool numel_overflow = false;
  for (const Json& dim : *shape_it) {
    uint64_t extent = 0;
    if (!read_u64(dim, extent) || extent > uint64_t(std::numeric_limits<int64_t>::max())) {
      throw Error(source, field + " shape", "an array of non-negative integers", dim.dump());
    }
    entry.shape.push_back(int64_t(extent));
    // Keep multiplying after an overflow only to detect a later zero extent.
    if (__builtin_mul_overflow(numel, extent, &numel)) numel_overflow = true;
  }
  const bool has_zero = std::find(entry.shape.begin(), entry.shape.end(), 0) != entry.shape.end();
  if (has_zero) numel = 0, numel_overflow = false;
  uint64_t byte_size = 0;
  if (numel_overflow || numel > uint64_t(std::numeric_limits<int64_t>::max()) ||
      __builtin_mul_overflow(numel, uint64_t(element_size), &byte_size)) {
    throw Error(source, field + " shape", "a shape whose byte size fits in 64 bits",
                shape_text(entry.shape));
  }

  const auto offsets_it = value.find("data_offsets");
  if (offsets_it == value.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !read_u64((*offsets_it)[0], entry.begin) || !read_u64((*offsets_it)[1], entry.end)) {
    throw Error(source, field + " data_offsets", "[begin, end] as two non-negative integers",
                offsets_it == value.end() ? "missing" : offsets_it->dump());
  }
  if (entry.begin > entry.end) {
    throw Error(source, field + " data_offsets", "begin <= end", offsets_it->dump());
  }
  if (entry.end > data_size) {
    throw Error(source, field + " data_offsets",
                "offsets inside the data section of " + std::to_string(data_size) +
                    " bytes (the file is truncated or the header is corrupt)",
                offsets_it->dump());
  }
  if (entry.end - entry.begin != byte_size) {
    throw Error(source, field + " data_offsets",
                "end - begin == " + std::to_string(byte_size) + " bytes for " + entry.stored_dtype +
                    " " + shape_text(entry.shape),
                std::to_string(entry.end - entry.begin) + " bytes");
  }
  return entry;
}

}  // namespace

SafetensorsHeader parse_safetensors_header(std::string_view file_bytes, const std::string& source) {
  SafetensorsHeader header;
  if (file_bytes.size() < 8) {
    throw Error(source, "header length", "an 8-byte header length prefix",
                "a file of " + std::to_string(file_bytes.size()) + " bytes");
  }
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | uint8_t(file_bytes[size_t(i)]);
  const uint64_t available = uint64_t(file_bytes.size()) - 8;
  if (length > available) {
    throw Error(source, "header length",
                "at most the " + std::to_string(available) + " bytes after the 8-byte prefix",
                std::to_string(length) + " (header length past the end of the file)");
  }
  if (length > kMaxHeaderBytes) {
    throw Error(source, "header length",
                "a header of at most " + std::to_string(kMaxHeaderBytes) + " bytes",
                std::to_string(length));
  }
  header.header_size = length;
  const uint64_t data_size = available - length;
  const std::string_view text = file_bytes.substr(8, size_t(length));

  Json root;
  try {
    root = Json::parse(text.begin(), text.end());
  } catch (const Json::exception& error) {
    throw Error(source, "header", "a JSON object", std::string("invalid JSON: ") + error.what());
  }
  if (!root.is_object()) throw Error(source, "header", "a JSON object", describe_json(root));

  for (const auto& [name, value] : root.items()) {
    if (name == "__metadata__") {
      if (value.is_null()) continue;
      if (!value.is_object()) {
        throw Error(source, "__metadata__", "an object of strings", describe_json(value));
      }
      for (const auto& [key, item] : value.items()) {
        if (!item.is_string()) {
          throw Error(source, "__metadata__." + key, "a string", describe_json(item));
        }
        header.metadata[key] = item.get<std::string>();
      }
      continue;
    }
    header.tensors.emplace(name, parse_entry(name, value, data_size, source));
  }

  // Overlap check: sorted by begin, each non-empty tensor must start at or after the end of
  // every earlier one. Empty tensors occupy no bytes and cannot overlap anything.
  std::vector<std::pair<const std::string*, const TensorEntry*>> order;
  for (const auto& [name, entry] : header.tensors) {
    if (entry.end > entry.begin) order.emplace_back(&name, &entry);
  }
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.second->begin != b.second->begin ? a.second->begin < b.second->begin
                                              : *a.first < *b.first;
  });
  for (size_t i = 1; i < order.size(); ++i) {
    const auto& previous = order[i - 1];
    const auto& current = order[i];
    if (current.second->begin < previous.second->end) {
      throw Error(source, "tensor " + display_name(*current.first) + " data_offsets",
                  "bytes not shared with tensor " + display_name(*previous.first) +
                      " (which ends at " + std::to_string(previous.second->end) + ")",
                  "begin " + std::to_string(current.second->begin));
    }
  }
  return header;
}

SafetensorsFile::SafetensorsFile(const std::string& path)
    : file_(path), header_(parse_safetensors_header(file_.bytes(), path)) {}

TensorView SafetensorsFile::tensor(const std::string& name) const {
  const auto it = header_.tensors.find(name);
  if (it == header_.tensors.end()) {
    throw Error(path(), "tensor " + display_name(name), "a tensor of that name",
                "none in this file");
  }
  const TensorEntry& entry = it->second;
  if (!loadable_dtype(entry.stored_dtype)) {
    throw Error(path(), "tensor " + display_name(name), "dtype F32, F16 or BF16",
                "dtype " + entry.stored_dtype);
  }
  TensorView view;
  view.name = name;
  view.dtype = entry.dtype;
  view.shape = entry.shape;
  // In bounds: parse_safetensors_header checked end <= data size of this very mapping.
  view.data = file_.data() + 8 + header_.header_size + entry.begin;
  view.bytes = size_t(entry.end - entry.begin);
  view.file = path();
  return view;
}

namespace {

const char* const kIndexName = "model.safetensors.index.json";

// A shard name from the index must stay inside the folder: no absolute paths, no "..".
bool is_safe_relative(const std::string& name) {
  if (name.empty()) return false;
  const std::filesystem::path path(name);
  if (path.is_absolute() || path.has_root_name()) return false;
  for (const auto& part : path) {
    if (part == "..") return false;
  }
  return true;
}

}  // namespace

SafetensorsSet SafetensorsSet::open_folder(const std::string& model_dir) {
  namespace fs = std::filesystem;
  SafetensorsSet set;
  set.folder_ = model_dir;
  const fs::path dir(model_dir);
  std::error_code ec;
  const fs::path index_path = dir / kIndexName;
  const fs::path single_path = dir / "model.safetensors";

  if (fs::exists(index_path, ec)) {
    const std::string index_file = index_path.string();
    const Json index = read_json_file(index_file);
    if (!index.is_object()) throw Error(index_file, "JSON", "an object", describe_json(index));
    const auto map_it = index.find("weight_map");
    if (map_it == index.end() || !map_it->is_object() || map_it->empty()) {
      throw Error(index_file, "weight_map", "a non-empty object of tensor name -> shard file",
                  map_it == index.end() ? "missing" : describe_json(*map_it));
    }
    std::map<std::string, size_t> file_of_shard;
    for (const auto& [name, shard] : map_it->items()) {
      const std::string field = "weight_map[" + display_name(name) + "]";
      if (!shard.is_string())
        throw Error(index_file, field, "a shard file name", describe_json(shard));
      const std::string shard_name = shard.get<std::string>();
      if (!is_safe_relative(shard_name)) {
        throw Error(index_file, field, "a file name inside the model folder",
                    display_name(shard_name));
      }
      auto found = file_of_shard.find(shard_name);
      if (found == file_of_shard.end()) {
        const fs::path shard_path = dir / shard_name;
        if (!fs::is_regular_file(shard_path, ec)) {
          throw Error(index_file, field, "an existing shard file",
                      "no file " + shard_path.string());
        }
        set.files_.push_back(std::make_unique<SafetensorsFile>(shard_path.string()));
        found = file_of_shard.emplace(shard_name, set.files_.size() - 1).first;
      }
      const SafetensorsFile& file = *set.files_[found->second];
      if (!file.contains(name)) {
        throw Error(file.path(), "tensor " + display_name(name),
                    std::string("the tensor that ") + kIndexName + " places in this shard",
                    "none in this file");
      }
      set.file_of_tensor_[name] = found->second;
    }
    return set;
  }

  if (fs::exists(single_path, ec)) {
    set.files_.push_back(std::make_unique<SafetensorsFile>(single_path.string()));
    for (const auto& [name, entry] : set.files_.front()->header().tensors) {
      set.file_of_tensor_[name] = 0;
    }
    return set;
  }
  throw Error(model_dir, "weights", std::string("model.safetensors or ") + kIndexName,
              "neither in this folder");
}

SafetensorsSet SafetensorsSet::from_views(std::string source, std::vector<TensorView> views,
                                          std::shared_ptr<const void> owner) {
  SafetensorsSet set;
  set.folder_ = std::move(source);
  for (TensorView& view : views) {
    const std::string name = view.name;
    set.views_[name] = std::move(view);
  }
  set.views_owner_ = std::move(owner);
  return set;
}

bool SafetensorsSet::contains(const std::string& name) const {
  return file_of_tensor_.count(name) != 0 || views_.count(name) != 0;
}

TensorView SafetensorsSet::tensor(const std::string& name) const {
  if (const auto view = views_.find(name); view != views_.end()) return view->second;
  const auto it = file_of_tensor_.find(name);
  if (it == file_of_tensor_.end()) {
    throw Error(folder_, "tensor " + display_name(name), "a tensor of that name in the checkpoint",
                "none");
  }
  return files_[it->second]->tensor(name);
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> result;
  result.reserve(file_of_tensor_.size());
  for (const auto& [name, index] : file_of_tensor_) result.push_back(name);
  for (const auto& [name, view] : views_) result.push_back(name);
  return result;
}

}  // namespace kvlens
