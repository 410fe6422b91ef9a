/* keynorm: a method kvlens has no built-in for, as the worked example of
 * docs/writing_a_policy.md. Devoto et al. (2024, "A Simple and Effective L2 Norm-Based Strategy
 * for KV Cache Compression") observe that keys with a small L2 norm draw high attention, so
 * each step every head keeps the cached tokens whose keys (after RoPE, of its KV head) have the
 * smallest norm: score = -||k_j||. kvlens adds the forced tokens (the current one, the sinks,
 * the window) and fills the rest of the budget by score. Nothing is evicted: the choice is made
 * afresh every step. Reads the keys, so on a CUDA session it gets host copies of the cache. */
#include <math.h>

#include "plugin_util.h"

typedef struct {
  int64_t heads, group, head_dim;
} keynorm_state;

static void* create(const kvlens_model_shape* shape, const double* values, char* error,
                    size_t error_size) {
  (void)values;
  (void)error;
  (void)error_size;
  keynorm_state* s = (keynorm_state*)malloc(sizeof *s);
  if (!s) return NULL;
  s->heads = shape->heads;
  s->group = shape->heads / shape->kv_heads;
  s->head_dim = shape->head_dim;
  return s;
}

static void destroy(void* state) {
  free(state);
}

static int32_t select_step(void* opaque, const kvlens_step* step, kvlens_answer* answer,
                           char* error, size_t error_size) {
  const keynorm_state* s = (const keynorm_state*)opaque;
  if (!step->keys) {
    set_error(error, error_size, "no keys given");
    return KVLENS_FAILED;
  }
  const int64_t D = s->head_dim;
  for (int64_t h = 0; h < s->heads; ++h) {
    const int64_t g = h / s->group;
    float* scores = answer->scores + h * step->stride;
    for (int64_t j = 0; j < step->cols; ++j) {
      const int64_t row = (g * step->stride + j) * D;
      double norm = 0.0;
      for (int64_t c = 0; c < D; ++c) {
        const double x = cache_value(step->keys, step->cache_dtype, row + c);
        norm += x * x;
      }
      scores[j] = (float)-sqrt(norm);
    }
  }
  return KVLENS_SCORES;
}

static const kvlens_policy_plugin plugin = {
    KVLENS_POLICY_ABI_VERSION,
    sizeof(kvlens_policy_plugin),
    "keynorm",
    "key-norm selection (Devoto et al. 2024), C plug-in",
    "Each step every head sees the forced tokens and, for the rest of its budget, the cached "
    "tokens whose keys have the smallest L2 norm (score -||k_j||, keys after RoPE); chosen "
    "afresh every step.",
    NULL,
    0,
    KVLENS_NEEDS_CACHE,
    KVLENS_ACCEPTS_HOST,
    0,
    create,
    destroy,
    select_step,
    NULL,
    {NULL, NULL, NULL, NULL},
};

KVLENS_PLUGIN_EXPORT const kvlens_policy_plugin* kvlens_policy_plugin_v1(void) {
  return &plugin;
}
