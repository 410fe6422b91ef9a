/* tokenbutler's selection as a C plug-in: per (layer, head), the top B(t) candidates by the
 * model's learned predictor (TokenButler) logits for this step, chosen afresh every step,
 * nothing evicted; the current token is the one forced recent token (the window knob may widen
 * it). kvlens runs the predictor and hands its scores over (KVLENS_NEEDS_PREDICTOR); the scores
 * are predicted logits, so the predicted-vs-true view compares them with the true ones. */
#include "plugin_util.h"

typedef struct {
  int64_t heads;
} butler_state;

static void* create(const kvlens_model_shape* shape, const double* values, char* error,
                    size_t error_size) {
  (void)values;
  if (!shape->has_predictor) {
    set_error(error, error_size, "the model has no TokenButler predictor");
    return NULL;
  }
  butler_state* s = (butler_state*)malloc(sizeof *s);
  if (s) s->heads = shape->heads;
  return s;
}

static void destroy(void* state) {
  free(state);
}

static int32_t select_step(void* opaque, const kvlens_step* step, kvlens_answer* answer,
                           char* error, size_t error_size) {
  const butler_state* s = (const butler_state*)opaque;
  if (!step->predictor_scores) {
    set_error(error, error_size, "no predictor scores given");
    return KVLENS_FAILED;
  }
  for (int64_t h = 0; h < s->heads; ++h) {
    memcpy(answer->scores + h * step->stride, step->predictor_scores + h * step->stride,
           (size_t)step->cols * sizeof(float));
  }
  answer->recent = 1;
  return KVLENS_SCORES;
}

static const kvlens_policy_plugin plugin = {
    KVLENS_POLICY_ABI_VERSION,
    sizeof(kvlens_policy_plugin),
    "tokenbutler_c",
    "learned predictor (TokenButler), C plug-in",
    "Top-B(t) tokens per (layer, head) by the TokenButler predictor's logits for this step, "
    "chosen afresh every step; nothing evicted (kvlens's tokenbutler rule, as a C plug-in).",
    NULL,
    0,
    KVLENS_NEEDS_PREDICTOR,
    KVLENS_ACCEPTS_HOST,
    1,
    create,
    destroy,
    select_step,
    NULL,
    {NULL, NULL, NULL, NULL},
};

KVLENS_PLUGIN_EXPORT const kvlens_policy_plugin* kvlens_policy_plugin_v1(void) {
  return &plugin;
}
