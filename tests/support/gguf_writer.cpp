// GGUF writing for tests, and the tiny Llama in llama.cpp's layout (see gguf_writer.h).
#include "tests/support/gguf_writer.h"

#include <cmath>
#include <cstring>

#include "engine/common/dtype.h"

namespace kvlens::test {
namespace {

void append_u32(std::string& out, uint32_t value) {
  out += gguf_scalar(value);
}
void append_u64(std::string& out, uint64_t value) {
  out += gguf_scalar(value);
}

std::string f16_bits_text(float value) {
  return gguf_scalar(f32_to_f16_bits(value));
}

// Q8_0 blocks of 32: [d f16][32 x int8], d = max|x| / 127, q = round(x / d).
std::string quantize_q8_0(const std::vector<float>& values) {
  std::string out;
  for (size_t start = 0; start < values.size(); start += 32) {
    float amax = 0.0f;
    for (size_t i = start; i < start + 32; ++i) amax = std::max(amax, std::fabs(values[i]));
    const float d = amax / 127.0f;
    out += f16_bits_text(d);
    for (size_t i = start; i < start + 32; ++i) {
      out.push_back(char(int8_t(d == 0.0f ? 0 : std::lround(values[i] / d))));
    }
  }
  return out;
}

// llama.cpp's converter order for rows of one of `heads` heads: HF row h*D + j*D/2 + i goes to
// h*D + 2i + j.
std::vector<float> permute_rows(const std::vector<float>& values, int64_t rows, int64_t cols,
                                int64_t heads) {
  std::vector<float> out(values.size());
  const int64_t head_rows = rows / heads, half = head_rows / 2;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < 2; ++j) {
      for (int64_t i = 0; i < half; ++i) {
        const float* from = values.data() + (h * head_rows + j * half + i) * cols;
        std::copy(from, from + cols, out.data() + (h * head_rows + 2 * i + j) * cols);
      }
    }
  }
  return out;
}

}  // namespace

std::string gguf_string(const std::string& text) {
  return gguf_scalar(uint64_t(text.size())) + text;
}

void GgufWriter::u32(const std::string& key, uint32_t value) {
  raw(key, uint32_t(GgufTag::kU32), gguf_scalar(value));
}
void GgufWriter::u64(const std::string& key, uint64_t value) {
  raw(key, uint32_t(GgufTag::kU64), gguf_scalar(value));
}
void GgufWriter::i32(const std::string& key, int32_t value) {
  raw(key, uint32_t(GgufTag::kI32), gguf_scalar(value));
}
void GgufWriter::f32(const std::string& key, float value) {
  raw(key, uint32_t(GgufTag::kF32), gguf_scalar(value));
}
void GgufWriter::boolean(const std::string& key, bool value) {
  raw(key, uint32_t(GgufTag::kBool), std::string(1, value ? '\1' : '\0'));
}
void GgufWriter::string(const std::string& key, const std::string& value) {
  raw(key, uint32_t(GgufTag::kString), gguf_string(value));
}
void GgufWriter::string_array(const std::string& key, const std::vector<std::string>& values) {
  std::string encoded =
      gguf_scalar(uint32_t(GgufTag::kString)) + gguf_scalar(uint64_t(values.size()));
  for (const std::string& value : values) encoded += gguf_string(value);
  raw(key, uint32_t(GgufTag::kArray), encoded);
}
void GgufWriter::f32_array(const std::string& key, const std::vector<float>& values) {
  std::string encoded = gguf_scalar(uint32_t(GgufTag::kF32)) + gguf_scalar(uint64_t(values.size()));
  for (float value : values) encoded += gguf_scalar(value);
  raw(key, uint32_t(GgufTag::kArray), encoded);
}
void GgufWriter::i32_array(const std::string& key, const std::vector<int32_t>& values) {
  std::string encoded = gguf_scalar(uint32_t(GgufTag::kI32)) + gguf_scalar(uint64_t(values.size()));
  for (int32_t value : values) encoded += gguf_scalar(value);
  raw(key, uint32_t(GgufTag::kArray), encoded);
}
void GgufWriter::raw(const std::string& key, uint32_t tag, const std::string& encoded) {
  metadata_.push_back({key, tag, encoded});
}

void GgufWriter::tensor(const std::string& name, const std::vector<uint64_t>& dims, uint32_t type,
                        const std::string& data) {
  tensors_.push_back({name, dims, type, data});
}

void GgufWriter::tensor_f32(const std::string& name, const std::vector<uint64_t>& dims,
                            uint32_t type, const std::vector<float>& values) {
  std::string data;
  if (type == kGgmlQ8_0) {
    data = quantize_q8_0(values);
  } else {
    for (float value : values) {
      if (type == kGgmlF32) data += gguf_scalar(value);
      if (type == kGgmlF16) data += f16_bits_text(value);
      if (type == kGgmlBF16) data += gguf_scalar(f32_to_bf16(value));
    }
  }
  tensor(name, dims, type, data);
}

size_t GgufWriter::tensor_table_offset() const {
  size_t offset = 4 + 4 + 8 + 8;
  for (const Entry& entry : metadata_) offset += 8 + entry.key.size() + 4 + entry.encoded.size();
  return offset;
}

std::string GgufWriter::bytes(uint32_t version, uint32_t alignment) const {
  std::string out = "GGUF";
  append_u32(out, version);
  append_u64(out, tensors_.size());
  append_u64(out, metadata_.size());
  for (const Entry& entry : metadata_) {
    out += gguf_string(entry.key);
    append_u32(out, entry.tag);
    out += entry.encoded;
  }
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const Tensor& tensor : tensors_) {
    out += gguf_string(tensor.name);
    append_u32(out, uint32_t(tensor.dims.size()));
    for (uint64_t dim : tensor.dims) append_u64(out, dim);
    append_u32(out, tensor.type);
    append_u64(out, offset);
    offsets.push_back(offset);
    offset = (offset + tensor.data.size() + alignment - 1) / alignment * alignment;
  }
  out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
  const size_t data_start = out.size();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    out.resize(data_start + offsets[i], '\0');
    out += tensors_[i].data;
  }
  return out;
}

std::string tiny_llama_gguf(const TinyLlamaSpec& spec, uint32_t matrix_type) {
  const int64_t head_dim = spec.head_dim > 0 ? spec.head_dim : spec.hidden / spec.heads;
  GgufWriter writer;
  writer.string("general.architecture", "llama");
  writer.u32("llama.context_length", uint32_t(spec.max_positions));
  writer.u32("llama.embedding_length", uint32_t(spec.hidden));
  writer.u32("llama.block_count", uint32_t(spec.layers));
  writer.u32("llama.feed_forward_length", uint32_t(spec.intermediate));
  writer.u32("llama.attention.head_count", uint32_t(spec.heads));
  writer.u32("llama.attention.head_count_kv", uint32_t(spec.kv_heads));
  writer.u32("llama.rope.dimension_count", uint32_t(head_dim));
  if (spec.head_dim > 0) writer.u32("llama.attention.key_length", uint32_t(head_dim));
  writer.f32("llama.rope.freq_base", float(spec.rope_theta));
  writer.f32("llama.attention.layer_norm_rms_epsilon", float(spec.rms_norm_eps));
  writer.u32("llama.vocab_size", uint32_t(spec.vocab));
  writer.u32("tokenizer.ggml.bos_token_id", 1);
  writer.u32("tokenizer.ggml.eos_token_id", 2);
  for (const TestTensor& tensor : tiny_llama_tensors(spec)) {
    std::vector<float> values = tensor_values(tensor);
    std::string name = tensor.name;
    const auto replace = [&](const std::string& from, const std::string& to) {
      if (const size_t at = name.find(from); at != std::string::npos)
        name.replace(at, from.size(), to);
    };
    replace("model.embed_tokens.weight", "token_embd.weight");
    replace("model.norm.weight", "output_norm.weight");
    replace("lm_head.weight", "output.weight");
    replace("model.layers.", "blk.");
    replace("input_layernorm", "attn_norm");
    replace("post_attention_layernorm", "ffn_norm");
    replace("self_attn.q_proj", "attn_q");
    replace("self_attn.k_proj", "attn_k");
    replace("self_attn.v_proj", "attn_v");
    replace("self_attn.o_proj", "attn_output");
    replace("mlp.gate_proj", "ffn_gate");
    replace("mlp.up_proj", "ffn_up");
    replace("mlp.down_proj", "ffn_down");
    if (name.ends_with("attn_q.weight")) {
      values = permute_rows(values, tensor.shape[0], tensor.shape[1], spec.heads);
    }
    if (name.ends_with("attn_k.weight")) {
      values = permute_rows(values, tensor.shape[0], tensor.shape[1], spec.kv_heads);
    }
    const std::vector<uint64_t> dims(tensor.shape.rbegin(), tensor.shape.rend());
    writer.tensor_f32(name, dims, tensor.shape.size() == 2 ? matrix_type : kGgmlF32, values);
  }
  return writer.bytes();
}

}  // namespace kvlens::test
