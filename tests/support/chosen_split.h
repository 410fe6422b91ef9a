// Whether a recorded head row's visible set is a top set of its own scores: the policies that
// take an exact top-B(t) by an estimate (sparq, loki, doublesparsity) are checked with it.
// row: one head's scores and visible flags over columns 0..t (trace_queries.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "engine/trace/trace_queries.h"

namespace kvlens::test {

// Over the columns before the current token t: the lowest score chosen and the highest left out
// (-inf when nothing is left out). A top set has highest_left <= lowest_chosen.
struct ChosenSplit {
  float lowest_chosen = INFINITY, highest_left = -INFINITY;
};

inline ChosenSplit chosen_split(const HeadRow& row, int64_t t) {
  ChosenSplit split;
  for (int64_t j = 0; j < t; ++j) {
    const float s = row.values[size_t(j)];
    if (row.visible[size_t(j)])
      split.lowest_chosen = std::min(split.lowest_chosen, s);
    else
      split.highest_left = std::max(split.highest_left, s);
  }
  return split;
}

}  // namespace kvlens::test
