// A token's history under one run: for every token (rows) and step (columns) up to a last step,
// how many of the heads in scope saw it, hid it, evicted it (hidden now, seen at the step before)
// or brought it back (seen now, hidden before but seen earlier), or had no rows (the memory
// budget). Shape: cells [tokens][steps], row-major; a token j is a candidate from step j on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/trace/trace.h"

namespace kvlens {

// One head's state of a token at a step. Pending: the token comes after the step (not read yet).
// Hidden: not seen now and not seen at the step before (never kept yet, or still not selected).
// Evicted: not seen now but seen at the last step the head had rows. Returned: seen now, not seen
// at that step but seen at some earlier one. Unknown: the trace kept no rows of the head here.
enum class TokenState : uint8_t { Pending, Visible, Hidden, Evicted, Returned, Unknown };

// "pending", "visible", "hidden", "evicted", "back", "unknown".
const char* token_state_name(TokenState state);

// How many heads in scope were in each state (Pending cells have every count 0).
struct TokenStepCounts {
  int32_t visible = 0, hidden = 0, evicted = 0, returned = 0, unknown = 0;
  int32_t seen() const { return visible + returned; }
  int32_t known() const { return visible + hidden + evicted + returned; }
};

struct TokenHistory {
  int64_t tokens = 0, steps = 0;  // cells [tokens][steps]: steps [0, steps), tokens of the text
  int32_t heads_in_scope = 0;
  std::vector<TokenStepCounts> cells;
  const TokenStepCounts& at(int64_t token, int64_t step) const {
    return cells[size_t(token * steps + step)];
  }
  bool pending(int64_t token, int64_t step) const { return token > step; }
  // The one state of a cell when the scope is one head (heads_in_scope == 1); with more heads,
  // the state most of the known heads share (Visible, Hidden, Evicted, Returned in that order on
  // ties), Unknown when no head is known.
  TokenState state(int64_t token, int64_t step) const;
};

// Steps [0, last_step] of run `run` over the heads in scope: layer -1 (every layer) or one
// layer, head -1 (every head of the scope) or one head, as retention_counts. A head's Evicted and
// Returned compare against the last step where it had rows. Throws kvlens::Error (file "trace")
// for a run, step, layer or head out of range.
TokenHistory token_history(const Trace& trace, int64_t run, int64_t last_step, int64_t layer,
                           int64_t head);

// One line of a token's story over the history's steps, as runs of steps:
// one head: "visible 0-12, evicted at 13, hidden 13-19, back at 20, visible 20-30";
// more heads: "seen by all 64 heads 5-12, by some (3-40 of 64) 13-20, by none 21-30";
// "not read yet" before its step; "no rows" for steps without any head's rows.
// Throws kvlens::Error (file "trace") for a token outside [0, tokens).
std::string token_story(const TokenHistory& history, int64_t token);

}  // namespace kvlens
