// Co-reference sample generation (portable splitmix64 draws) and answer-token marking.
// A sample's answer is always the last bytes of its text; tokens are [BOS] + text.
#include "engine/eval/coref_benchmark.h"

#include <algorithm>

#include "engine/common/error.h"
#include "engine/model/tokenizer.h"

namespace kvlens {
namespace {

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// splitmix64: tiny, fully specified, and the same on every compiler and standard library.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ULL;
    return mix64(state_);
  }
  // Uniform in [0, n): rejection sampling drops the top partial block, so no modulo bias.
  size_t below(size_t n) {
    const uint64_t bound = static_cast<uint64_t>(n);
    const uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const uint64_t x = next();
      if (x >= threshold) return static_cast<size_t>(x % bound);
    }
  }

 private:
  uint64_t state_;
};

// Each (seed, index) gets its own stream, so sample i does not depend on how many came before.
SplitMix64 sample_stream(uint64_t seed, int64_t index) {
  return SplitMix64(mix64(seed ^ mix64(static_cast<uint64_t>(index) + 0x632BE59BD9B4E019ULL)));
}

const std::string& pick(SplitMix64& rng, const std::vector<std::string>& pool) {
  return pool[rng.below(pool.size())];
}

void require_pool(const CorefPools& pools, size_t size, const char* key, size_t needed) {
  if (size < needed) {
    throw Error(pools.source, key,
                "at least " + std::to_string(needed) + " entries to generate this sample",
                std::to_string(size));
  }
}

// True when every content word of `question` is in `lead`: the question would fit that lead as
// well as its own, so the two must not appear in one hard sample.
// A question without content words (possible in hand-made pools) fits no lead by this test; the
// caller still keeps identical questions apart.
bool question_fits_lead(const std::string& question, const std::string& lead) {
  const std::vector<std::string> words = coref_content_words(question);
  if (words.empty()) return false;
  const std::vector<std::string> lead_words = coref_content_words(lead);
  for (const std::string& word : words) {
    if (std::find(lead_words.begin(), lead_words.end(), word) == lead_words.end()) return false;
  }
  return true;
}

std::string distractor(SplitMix64& rng, const CorefPools& pools) {
  switch (rng.below(3)) {
    case 0:
      return pick(rng, pools.philosophy_statements);
    case 1:
      return pick(rng, pools.food_descriptions);
    default:
      return pick(rng, pools.math_problems);
  }
}

void finish(CorefSample& sample, const std::string& question, const std::string& answer) {
  sample.text += question + ": ";
  sample.answer_char_begin = static_cast<int64_t>(sample.text.size());
  sample.text += answer;
  sample.answer_char_end = static_cast<int64_t>(sample.text.size());
  sample.answer = answer;
}

}  // namespace

CorefSample generate_coref_sample(const CorefPools& pools, uint64_t seed, int64_t index,
                                  bool hard) {
  if (index < 0)
    throw Error("coref sample", "index", "a non-negative index", std::to_string(index));
  const size_t needed = hard ? 3 : 1;
  require_pool(pools, pools.location_names.size(), "location_names", needed);
  require_pool(pools, pools.intros.size(), "loc_intro_tieback_list", needed);
  require_pool(pools, pools.philosophy_statements.size(), "philosophy_statements", 1);
  require_pool(pools, pools.food_descriptions.size(), "food_descriptions", 1);
  require_pool(pools, pools.math_problems.size(), "math_problems", 1);

  SplitMix64 rng = sample_stream(seed, index);
  CorefSample sample;
  sample.seed = seed;
  sample.index = index;
  sample.hard = hard;
  if (!hard) {
    // One draw per statement, in this order: the operands of `+` are unsequenced in C++, so the
    // draws must not happen inside one concatenation.
    const std::string& name = pick(rng, pools.location_names);
    const CorefIntro& intro = pools.intros[rng.below(pools.intros.size())];
    const std::string& philosophy = pick(rng, pools.philosophy_statements);
    const std::string& food = pick(rng, pools.food_descriptions);
    const std::string& math = pick(rng, pools.math_problems);
    sample.text =
        intro.location_intro + " " + name + ". " + philosophy + " " + food + " " + math + " ";
    sample.locations = {name};
    finish(sample, intro.tieback_question, name);
    return sample;
  }

  const size_t count = 2 + rng.below(2);
  const size_t target = rng.below(count);
  std::vector<size_t> names, intros;
  // Draws with rejection; the bounded loop turns pools of look-alike leads into an error rather
  // than a hang.
  for (int attempt = 0; names.size() < count || intros.size() < count; ++attempt) {
    if (attempt > 10000) {
      throw Error(pools.source, "loc_intro_tieback_list",
                  std::to_string(count) + " leads the asked question tells apart");
    }
    if (names.size() < count) {
      const size_t n = rng.below(pools.location_names.size());
      if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
      continue;
    }
    const size_t i = rng.below(pools.intros.size());
    if (std::find(intros.begin(), intros.end(), i) != intros.end()) continue;
    // The asked lead is drawn first (slot 0, moved to `target` below); companions must not be
    // an equally good answer to its question.
    if (!intros.empty() &&
        (pools.intros[i].tieback_question == pools.intros[intros[0]].tieback_question ||
         question_fits_lead(pools.intros[intros[0]].tieback_question,
                            pools.intros[i].location_intro))) {
      continue;
    }
    intros.push_back(i);
  }
  std::swap(intros[0], intros[target]);
  for (size_t k = 0; k < count; ++k) {
    const std::string& name = pools.location_names[names[k]];
    sample.text += pools.intros[intros[k]].location_intro + " " + name + ". ";
    // One or two distractors after each introduction keep the mentions apart.
    const size_t distractors = 1 + rng.below(2);
    for (size_t d = 0; d < distractors; ++d) sample.text += distractor(rng, pools) + " ";
    sample.locations.push_back(name);
  }
  finish(sample, pools.intros[intros[target]].tieback_question,
         pools.location_names[names[target]]);
  return sample;
}

CorefTokens mark_answer_tokens(const CorefSample& sample, const Tokenizer& tokenizer) {
  const std::string& text = sample.text;
  if (sample.answer_char_begin < 0 || sample.answer_char_begin >= sample.answer_char_end ||
      sample.answer_char_end > static_cast<int64_t>(text.size())) {
    throw Error(
        "coref sample " + std::to_string(sample.index), "answer_char_begin/end",
        "a non-empty span inside the text",
        std::to_string(sample.answer_char_begin) + ".." + std::to_string(sample.answer_char_end));
  }
  // BPE glues the preceding space to the word (" Name", "▁Name"), so the answer's tokens start
  // at the whitespace before it.
  auto boundary = static_cast<size_t>(sample.answer_char_begin);
  while (boundary > 0 && text[boundary - 1] == ' ') --boundary;
  const auto end = static_cast<size_t>(sample.answer_char_end);

  CorefTokens out;
  out.tokens = tokenizer.encode(text, true);
  const std::vector<int32_t> prefix = tokenizer.encode(text.substr(0, boundary), true);
  const std::vector<int32_t> through_answer =
      end == text.size() ? out.tokens : tokenizer.encode(text.substr(0, end), true);
  auto is_prefix = [](const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
  };
  if (is_prefix(prefix, through_answer) && is_prefix(through_answer, out.tokens) &&
      prefix.size() < through_answer.size()) {
    out.answer_token_begin = static_cast<int64_t>(prefix.size());
    out.answer_token_end = static_cast<int64_t>(through_answer.size());
  } else {
    // A merge crossed a boundary: encode the pieces apart so the answer owns whole tokens.
    out.canonical = false;
    out.tokens = prefix;
    out.answer_token_begin = static_cast<int64_t>(out.tokens.size());
    const std::vector<int32_t> answer =
        tokenizer.encode(text.substr(boundary, end - boundary), false);
    out.tokens.insert(out.tokens.end(), answer.begin(), answer.end());
    out.answer_token_end = static_cast<int64_t>(out.tokens.size());
    if (end < text.size()) {
      const std::vector<int32_t> rest = tokenizer.encode(text.substr(end), false);
      out.tokens.insert(out.tokens.end(), rest.begin(), rest.end());
    }
  }
  // The first answer token must be predicted from something (BOS or earlier text).
  if (out.answer_token_begin < 1 || out.answer_token_end <= out.answer_token_begin) {
    throw Error("coref sample " + std::to_string(sample.index), "answer tokens",
                "at least one token before the answer and one in it");
  }
  return out;
}

}  // namespace kvlens
