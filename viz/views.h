// The views of the app as figures built from a Trace (through engine/eval/trace_queries):
// heads (per-(layer, head) attention maps, or one head in detail), predicted vs true, retention,
// consensus, logits and a token's history. One to four runs: more than one is compare mode
// (panels side by side, the retention view's diff of the first two). Each view also returns the
// data it shows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/trace/trace.h"
#include "engine/trace/trace_queries.h"
#include "viz/figure.h"

namespace kvlens::viz {

enum class ViewKind { Heads, Predicted, Retention, Consensus, Logits, History };

// "heads", "predicted", "retention", "consensus", "logits", "history"; throws kvlens::Error
// otherwise.
ViewKind parse_view(const std::string& name);
const char* view_name(ViewKind kind);
// "logits", "probabilities", "scores" / "pearson", "jaccard"; throws kvlens::Error naming `flag`.
HeadQuantity parse_quantity(const std::string& text, const std::string& flag);
ConsensusMetric parse_consensus(const std::string& text, const std::string& flag);
// "0,2" or "dense,h2o" (a policy id names its first run) -> run indices of the trace; throws
// kvlens::Error naming `flag` and listing the trace's runs for an item that is neither.
std::vector<int64_t> parse_runs(const Trace& trace, const std::string& list,
                                const std::string& flag);

struct ViewOptions {
  std::vector<int64_t> runs{0};  // 1 to 4 run indices (compare mode with more than one)
  int64_t step = -1;             // -1: the last recorded step
  int64_t layer = 0, head = 0;   // the selected head (heads detail, predicted)
  bool head_detail = false;      // heads view: the selected head alone, with token labels
  HeadQuantity quantity = HeadQuantity::Probabilities;
  bool log_scale = true;  // probabilities on a log10 scale
  ConsensusMetric consensus = ConsensusMetric::Pearson;
  int64_t retention_layer = -1, retention_head = -1;  // retention scope (-1: all)
  bool dark = false;
  float width = 1280;  // canvas width
  // The canvas height the figure may fill (the app's view area); 0: the content decides. Views
  // whose maps can grow (the heads grid) use it to fill both directions.
  float height = 0;
  // Token positions to highlight in every view that has a column per token (a token search).
  std::vector<int64_t> highlight_tokens;
  // History view: the selected head (layer, head) alone, each cell in its state's colour; false:
  // the retention scope (retention_layer / retention_head), shaded by the fraction of its heads
  // that see the token.
  bool history_per_head = false;
  // History view: a token whose row is outlined and whose story is told in a line per run (-1:
  // none). A click on a retention or history cell gives it (see their hover ids).
  int64_t focus_token = -1;
  // The data behind the figure (View::data). Its tables grow with heads x tokens, so the app
  // builds the figure it redraws without them and asks again with them to export.
  bool with_data = true;
  // Level of detail of the heads grid: at most max_map_pixels pixels a map side; where the figure
  // is shown on a screen (pixel_scale > 0: device pixels per canvas unit, zoom included), no more
  // than about the pixels a map covers there (exports, pixel_scale 0, keep max_map_pixels).
  int64_t max_map_pixels = 128;
  float pixel_scale = 0.0f;
  // The app's maps kept between frames (null: computed afresh).
  HeadMapCache* head_maps = nullptr;
};

struct View {
  Figure figure;
  DataTable data;  // empty unless ViewOptions::with_data
};

// Throws kvlens::Error (file "view") for options the trace cannot satisfy: no steps, a run,
// step, layer or head out of range, more than 4 runs.
View build_view(const Trace& trace, ViewKind kind, const ViewOptions& options);

// The step the options select (the last one for -1), checked against the trace.
int64_t resolved_step(const Trace& trace, const ViewOptions& options);

// Per view (views_*.cpp); build_view checks the options first.
View heads_view(const Trace& trace, const ViewOptions& options, int64_t step);
View predicted_view(const Trace& trace, const ViewOptions& options, int64_t step);
// Its token chips' hover grids have the id "token R:T" (R: the run's index in the trace, run A's in
// the two-run difference; T: the token), for a click to open T's history under R.
View retention_view(const Trace& trace, const ViewOptions& options, int64_t step);
View consensus_view(const Trace& trace, const ViewOptions& options, int64_t step);
View logits_view(const Trace& trace, const ViewOptions& options, int64_t step);
// Tokens (rows) x steps [0, step] (columns) per run, side by side. Its hover grids have the id
// "history R" (R: the run's index in the trace), one cell per (row = token, column = step): a
// click there may focus the token and go to the step.
View history_view(const Trace& trace, const ViewOptions& options, int64_t step);

// The runs a dashboard shows side by side when a trace opens: the first three (fewer when the
// trace has fewer).
std::vector<int64_t> default_runs(const Trace& trace);

// A run's colour: its policy's (the same policy keeps one colour in every view and comparison,
// whatever its position), legible as text and lines on the theme's background.
Color run_color(const Trace& trace, int64_t run, const Theme& theme);
// The same colour by policy id (the app's run list, before anything is recorded).
Color policy_color(const std::string& policy, const Theme& theme);

// "policy s=0.5" for a run, as the panels title it.
std::string run_title(const Trace& trace, int64_t run);
// True when the run's policy scores are a learned predictor's predicted attention logits (the
// registry's family "learned predictor ...", as tokenbutler; a trace's policy this build does not
// know counts by its id): the views then call them so.
bool run_predicts_logits(const Trace& trace, int64_t run);
const Theme& theme_of(const ViewOptions& options);
// A view with an empty figure of the options' width and theme background (each view's start).
View empty_view(const ViewOptions& options);

}  // namespace kvlens::viz
