// token_history and token_story (token_history.h).
#include "engine/trace/token_history.h"

#include <algorithm>

#include "engine/common/error.h"

namespace kvlens {
namespace {

void require_index(int64_t value, int64_t limit, const char* field) {
  if (value < 0 || value >= limit) {
    throw Error("trace", field, "an index in [0, " + std::to_string(limit) + ")",
                std::to_string(value));
  }
}

std::string step_range(int64_t first, int64_t last) {
  return first == last ? std::to_string(first) : std::to_string(first) + "-" + std::to_string(last);
}

}  // namespace

const char* token_state_name(TokenState state) {
  switch (state) {
    case TokenState::Pending:
      return "pending";
    case TokenState::Visible:
      return "visible";
    case TokenState::Hidden:
      return "hidden";
    case TokenState::Evicted:
      return "evicted";
    case TokenState::Returned:
      return "back";
    case TokenState::Unknown:
      return "unknown";
  }
  return "unknown";
}

TokenState TokenHistory::state(int64_t token, int64_t step) const {
  if (pending(token, step)) return TokenState::Pending;
  const TokenStepCounts& c = at(token, step);
  if (c.known() == 0) return TokenState::Unknown;
  TokenState best = TokenState::Visible;
  int32_t most = c.visible;
  for (const auto& [state, count] :
       {std::pair{TokenState::Hidden, c.hidden}, std::pair{TokenState::Evicted, c.evicted},
        std::pair{TokenState::Returned, c.returned}}) {
    if (count > most) best = state, most = count;
  }
  return best;
}

TokenHistory token_history(const Trace& trace, int64_t run, int64_t last_step, int64_t layer,
                           int64_t head) {
  require_index(run, int64_t(trace.runs.size()), "run");
  require_index(last_step, trace.step_count(), "step");
  const int64_t L = trace.model.layers, H = trace.model.heads;
  if (layer >= 0) require_index(layer, L, "layer");
  if (head >= 0) require_index(head, H, "head");
  TokenHistory history;
  history.tokens = int64_t(trace.tokens.size());
  history.steps = last_step + 1;
  history.cells.assign(size_t(history.tokens * history.steps), TokenStepCounts{});
  // Per head in scope and token: what the head did at the last step it had rows (-1: never read
  // the token yet, 0 hidden, 1 seen) and whether it ever saw the token.
  std::vector<int64_t> scope;
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < H; ++h)
      if ((layer < 0 || l == layer) && (head < 0 || h == head)) scope.push_back(l * H + h);
  history.heads_in_scope = int32_t(scope.size());
  const size_t n = size_t(history.tokens);
  std::vector<int8_t> last(scope.size() * n, -1);
  std::vector<uint8_t> ever(scope.size() * n, 0);
  for (int64_t t = 0; t <= last_step; ++t) {
    const StepRecord& record = trace.steps()[size_t(t)][size_t(run)];
    const int64_t columns = std::min<int64_t>(record.columns, history.tokens);
    for (size_t s = 0; s < scope.size(); ++s) {
      const uint8_t* shown = record.visible_row(scope[s] / H, scope[s] % H, H);
      for (int64_t j = 0; j < columns; ++j) {
        TokenStepCounts& cell = history.cells[size_t(j * history.steps + t)];
        if (!shown) {
          ++cell.unknown;
          continue;
        }
        int8_t& before = last[s * n + size_t(j)];
        uint8_t& seen_ever = ever[s * n + size_t(j)];
        if (shown[j]) {
          ++(before == 0 && seen_ever ? cell.returned : cell.visible);
          seen_ever = 1;
        } else {
          ++(before == 1 ? cell.evicted : cell.hidden);
        }
        before = shown[j] ? 1 : 0;
      }
    }
  }
  return history;
}

std::string token_story(const TokenHistory& history, int64_t token) {
  require_index(token, history.tokens, "token");
  if (token >= history.steps) return "not read yet";
  const bool one_head = history.heads_in_scope == 1;
  const std::string all = std::to_string(history.heads_in_scope);
  // A step's kind: 0 seen (by all), 1 hidden (by all), 2 seen by some, 3 no rows.
  auto kind = [&](int64_t t) {
    const TokenStepCounts& c = history.at(token, t);
    if (c.known() == 0) return 3;
    if (c.seen() == c.known()) return 0;
    return c.seen() == 0 ? 1 : 2;
  };
  std::string story;
  bool said_seen_by = false;
  for (int64_t first = token; first < history.steps;) {
    const int k = kind(first);
    int64_t last = first;
    int32_t lo = history.at(token, first).seen(), hi = lo;
    // (one head: an eviction or a return starts a new run of steps, said as an event)
    while (last + 1 < history.steps && kind(last + 1) == k &&
           !(one_head && history.state(token, last + 1) == TokenState::Returned)) {
      ++last;
      lo = std::min(lo, history.at(token, last).seen());
      hi = std::max(hi, history.at(token, last).seen());
    }
    const std::string steps = step_range(first, last);
    std::string part;
    if (k == 3) {
      part = "no rows " + steps;
    } else if (one_head) {
      const TokenState opening = history.state(token, first);
      if (opening == TokenState::Evicted) part = "evicted at " + std::to_string(first) + ", ";
      if (opening == TokenState::Returned) part = "back at " + std::to_string(first) + ", ";
      part += (k == 0 ? "visible " : "hidden ") + steps;
    } else {
      part = said_seen_by ? "by " : "seen by ";
      said_seen_by = true;
      if (k == 0) part += "all " + all + " heads " + steps;
      if (k == 1) part += "none " + steps;
      if (k == 2) {
        part += "some (" +
                (lo == hi ? std::to_string(lo) : std::to_string(lo) + "-" + std::to_string(hi)) +
                " of " + all + ") " + steps;
      }
    }
    story += (story.empty() ? "" : ", ") + part;
    first = last + 1;
  }
  return story;
}

}  // namespace kvlens
