// TEMPORARY stub so the tree links; replaced by the real tokenizer.
#include "engine/model/tokenizer.h"

#include "engine/common/error.h"

namespace kvlens {
struct Tokenizer::Impl {
  std::string source;
};
Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;
Tokenizer Tokenizer::parse(std::string_view, const std::string& source) {
  throw Error(source, "tokenizer", "an implemented tokenizer");
}
Tokenizer Tokenizer::load(const std::string& path) { return parse({}, path); }
std::vector<int32_t> Tokenizer::encode(std::string_view, bool) const { return {}; }
std::string Tokenizer::decode(const std::vector<int32_t>&, bool) const { return {}; }
std::string Tokenizer::token_text(int32_t) const { return {}; }
int64_t Tokenizer::vocab_size() const { return 0; }
std::optional<int32_t> Tokenizer::token_to_id(std::string_view) const { return {}; }
std::optional<int32_t> Tokenizer::bos_id() const { return {}; }
const std::string& Tokenizer::source() const { return impl_->source; }
std::string read_maybe_gzipped(const std::string& path) { return path; }
}  // namespace kvlens
