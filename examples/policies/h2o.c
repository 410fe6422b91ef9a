/* h2o as a C plug-in: the rule of kvlens's built-in h2o (engine/policy/h2o_policy.cpp) with its
 * default score, written only against include/kvlens/policy_plugin.h. Each head accumulates,
 * per cached token, the attention it received at every step it was selected (under that step's
 * visible set); a token left out of a step's set is evicted for good (the sinks excepted) and
 * its accumulated score forgotten. Each step the budget splits into the most recent tokens and
 * heavy_frac of it for the heavy hitters: kvlens picks the highest accumulated scores among the
 * tokens not evicted (KVLENS_SCORES with `eligible` and `recent`).
 * State per layer: accumulated [H, stride] F32, kept [R, stride] U8 (R = selection rows). */
#include <math.h>

#include "plugin_util.h"

typedef struct {
  int64_t layers, heads, rows, stride, group;
  double heavy_frac;
  int64_t sinks; /* the sinks knob of the last select (observe applies the eviction) */
  int kv_heads_select;
  float** accumulated;
  uint8_t** kept;
} h2o_state;

static void destroy(void* opaque) {
  h2o_state* s = (h2o_state*)opaque;
  for (int64_t l = 0; s->accumulated && l < s->layers; ++l) free(s->accumulated[l]);
  for (int64_t l = 0; s->kept && l < s->layers; ++l) free(s->kept[l]);
  free(s->accumulated);
  free(s->kept);
  free(s);
}

static void* create(const kvlens_model_shape* shape, const double* values, char* error,
                    size_t error_size) {
  h2o_state* s = (h2o_state*)calloc(1, sizeof *s);
  if (!s) return NULL;
  s->layers = shape->layers;
  s->heads = shape->heads;
  s->group = shape->heads / shape->kv_heads;
  s->heavy_frac = values[0];
  s->rows = -1; /* known at the first select (granularity) */
  s->accumulated = (float**)calloc((size_t)s->layers, sizeof(float*));
  s->kept = (uint8_t**)calloc((size_t)s->layers, sizeof(uint8_t*));
  if (!s->accumulated || !s->kept) {
    set_error(error, error_size, "out of memory");
    destroy(s);
    return NULL;
  }
  return s;
}

/* Every layer's buffers at `stride` columns (new columns: 0 accumulated, kept). */
static int ensure_stride(h2o_state* s, const kvlens_step* step) {
  if (s->rows < 0) {
    s->rows = step->selection_rows;
    s->kv_heads_select = step->kv_head_granularity;
  }
  if (step->stride <= s->stride) return 1;
  for (int64_t l = 0; l < s->layers; ++l) {
    s->accumulated[l] =
        (float*)widen_rows(s->accumulated[l], s->heads, s->stride, step->stride, sizeof(float), 0);
    s->kept[l] = (uint8_t*)widen_rows(s->kept[l], s->rows, s->stride, step->stride, 1, 1);
    if (!s->accumulated[l] || !s->kept[l]) return 0;
  }
  s->stride = step->stride;
  return 1;
}

static int32_t select_step(void* opaque, const kvlens_step* step, kvlens_answer* answer,
                           char* error, size_t error_size) {
  h2o_state* s = (h2o_state*)opaque;
  if (!ensure_stride(s, step)) {
    set_error(error, error_size, "out of memory at stride %lld", (long long)step->stride);
    return KVLENS_FAILED;
  }
  const int64_t l = step->layer, cols = step->cols, stride = step->stride;
  s->sinks = step->sinks;
  for (int64_t h = 0; h < s->heads; ++h)
    memcpy(answer->scores + h * stride, s->accumulated[l] + h * s->stride,
           (size_t)cols * sizeof(float));
  for (int64_t r = 0; r < s->rows; ++r)
    memcpy(answer->eligible + r * stride, s->kept[l] + r * s->stride, (size_t)cols);
  const int64_t heavy = (int64_t)floor(s->heavy_frac * (double)step->budget);
  answer->recent = step->budget - heavy;
  return KVLENS_SCORES;
}

static int32_t observe(void* opaque, const kvlens_observation* seen, char* error,
                       size_t error_size) {
  (void)error;
  (void)error_size;
  h2o_state* s = (h2o_state*)opaque;
  const int64_t l = seen->layer, cols = seen->cols;
  uint8_t* kept = s->kept[l];
  /* What this step's set left out is evicted (a KV head's selection is the row of its first
   * query head: the group shares it); the sinks stay. */
  for (int64_t r = 0; r < s->rows; ++r) {
    const uint8_t* visible = seen->visible + (s->kv_heads_select ? r * s->group : r) * seen->stride;
    uint8_t* row = kept + r * s->stride;
    for (int64_t j = 0; j < cols; ++j) row[j] = (uint8_t)(row[j] & (visible[j] != 0));
    for (int64_t j = 0; j < s->sinks && j < cols; ++j) row[j] = 1;
  }
  /* Evicted tokens' scores are forgotten (per query head; one KV head's tokens once evicted are
   * never chosen again, so its heads need not forget them). */
  for (int64_t h = 0; h < s->heads; ++h) {
    float* sums = s->accumulated[l] + h * s->stride;
    const float* probabilities = seen->probabilities + h * seen->stride;
    const uint8_t* keep = s->kv_heads_select ? NULL : kept + h * s->stride;
    /* sums * keep is the sum or +0 exactly (sums >= 0, keep 0 or 1): the built-in's bits, in a
     * loop the compiler vectorises. */
    if (keep) {
      for (int64_t j = 0; j < cols; ++j) sums[j] = sums[j] * (float)keep[j] + probabilities[j];
    } else {
      for (int64_t j = 0; j < cols; ++j) sums[j] = sums[j] + probabilities[j];
    }
  }
  return 0;
}

static const kvlens_param params[] = {
    {"heavy_frac", KVLENS_PARAM_FLOAT, "Fraction of the budget for heavy hitters", 0.5, 0.0, 1.0,
     NULL, 0},
};

static const kvlens_policy_plugin plugin = {
    KVLENS_POLICY_ABI_VERSION,
    sizeof(kvlens_policy_plugin),
    "h2o_c",
    "eviction (H2O), C plug-in",
    "Keeps the most recent tokens and the heavy hitters by accumulated attention; evicted "
    "tokens never return (kvlens's h2o rule, as a C plug-in).",
    params,
    1,
    KVLENS_NEEDS_PROBABILITIES | KVLENS_NEEDS_ELIGIBLE,
    KVLENS_ACCEPTS_HOST,
    0,
    create,
    destroy,
    select_step,
    observe,
    {NULL, NULL, NULL, NULL},
};

KVLENS_PLUGIN_EXPORT const kvlens_policy_plugin* kvlens_policy_plugin_v1(void) {
  return &plugin;
}
