/* quest as a C plug-in: the rule of kvlens's built-in quest (engine/policy/quest_policy.cpp),
 * written only against include/kvlens/policy_plugin.h. The cache is cut into pages of page_size
 * tokens; per page and KV head the channel-wise min and max of the keys bound every logit in
 * the page, U = sum_c max(q_c * min_c, q_c * max_c) / sqrt(D) (every product rounded, summed
 * in channel order), and kvlens fills the budget with the best whole pages (KVLENS_SCORES with
 * page_size), the current page always visible. A budget that holds every candidate leaves the
 * layer dense. State per layer: page_min, page_max [G, P, D] F32, updated for the pages the
 * cache gained columns in. Compile with -ffp-contract=off: the bound's products and sums are
 * rounded one by one, as the built-in's. */
#include <math.h>

#include "plugin_util.h"

typedef struct {
  int64_t layers, kv_heads, head_dim, group, page_size, pages;
  int max_only;
  float scale;
  float **page_min, **page_max;
  int64_t* filled; /* per layer: the columns the summaries cover */
} quest_state;

static void destroy(void* opaque) {
  quest_state* s = (quest_state*)opaque;
  for (int64_t l = 0; l < s->layers; ++l) {
    if (s->page_min) free(s->page_min[l]);
    if (s->page_max) free(s->page_max[l]);
  }
  free(s->page_min);
  free(s->page_max);
  free(s->filled);
  free(s);
}

static void* create(const kvlens_model_shape* shape, const double* values, char* error,
                    size_t error_size) {
  quest_state* s = (quest_state*)calloc(1, sizeof *s);
  if (!s) return NULL;
  s->layers = shape->layers;
  s->kv_heads = shape->kv_heads;
  s->head_dim = shape->head_dim;
  s->group = shape->heads / shape->kv_heads;
  s->page_size = (int64_t)values[0];
  s->max_only = values[1] != 0.0;
  s->scale = (float)(1.0 / sqrt((double)shape->head_dim)); /* the attention's F32 scale */
  s->page_min = (float**)calloc((size_t)s->layers, sizeof(float*));
  s->page_max = (float**)calloc((size_t)s->layers, sizeof(float*));
  s->filled = (int64_t*)calloc((size_t)s->layers, sizeof(int64_t));
  if (!s->page_min || !s->page_max || !s->filled) {
    set_error(error, error_size, "out of memory");
    destroy(s);
    return NULL;
  }
  return s;
}

/* Room for the pages of `cols` columns in every layer's summaries ([G, pages, D]). */
static int ensure_pages(quest_state* s, int64_t cols) {
  const int64_t needed = (cols + s->page_size - 1) / s->page_size;
  if (needed <= s->pages) return 1;
  int64_t pages = s->pages > 0 ? s->pages : 1;
  while (pages < needed) pages *= 2;
  for (int64_t l = 0; l < s->layers; ++l) {
    s->page_min[l] = (float*)widen_rows(s->page_min[l], s->kv_heads, s->pages * s->head_dim,
                                        pages * s->head_dim, sizeof(float), 0);
    s->page_max[l] = (float*)widen_rows(s->page_max[l], s->kv_heads, s->pages * s->head_dim,
                                        pages * s->head_dim, sizeof(float), 0);
    if (!s->page_min[l] || !s->page_max[l]) return 0;
  }
  s->pages = pages;
  return 1;
}

static int32_t select_step(void* opaque, const kvlens_step* step, kvlens_answer* answer,
                           char* error, size_t error_size) {
  quest_state* s = (quest_state*)opaque;
  const int64_t l = step->layer, t = step->step, cols = step->cols, D = s->head_dim;
  const int64_t P = s->page_size;
  if (!step->keys) {
    set_error(error, error_size, "no keys given (KVLENS_NEEDS_CACHE)");
    return KVLENS_FAILED;
  }
  if (!ensure_pages(s, cols)) {
    set_error(error, error_size, "out of memory for %lld columns", (long long)cols);
    return KVLENS_FAILED;
  }
  /* Fold in the pages the cache gained columns in (the current page always recomputed). */
  const int64_t begin = s->filled[l] <= cols ? (s->filled[l] < t ? s->filled[l] : t) : 0;
  for (int64_t g = 0; g < s->kv_heads; ++g) {
    for (int64_t page = begin / P; page * P < cols; ++page) {
      float* lo = s->page_min[l] + (g * s->pages + page) * D;
      float* hi = s->page_max[l] + (g * s->pages + page) * D;
      const int64_t end = (page + 1) * P < cols ? (page + 1) * P : cols;
      for (int64_t j = page * P; j < end; ++j) {
        const int64_t row = (g * step->stride + j) * D;
        for (int64_t c = 0; c < D; ++c) {
          const float x = cache_value(step->keys, step->cache_dtype, row + c);
          if (j == page * P || x < lo[c]) lo[c] = x;
          if (j == page * P || hi[c] < x) hi[c] = x;
        }
      }
    }
  }
  s->filled[l] = cols;
  /* Every column gets its page's bound, for every query head. */
  for (int64_t h = 0; h < s->group * s->kv_heads; ++h) {
    const float* q = step->query + h * D;
    const int64_t g = h / s->group;
    for (int64_t page = 0; page * P < cols; ++page) {
      const float* lo = s->page_min[l] + (g * s->pages + page) * D;
      const float* hi = s->page_max[l] + (g * s->pages + page) * D;
      float sum = 0.0f;
      for (int64_t c = 0; c < D; ++c) {
        float term;
        if (s->max_only) {
          term = fabsf(q[c]) * hi[c];
        } else {
          const float low = q[c] * lo[c], high = q[c] * hi[c];
          term = low < high ? high : low;
        }
        sum = sum + term;
      }
      const float bound = sum * s->scale;
      const int64_t end = (page + 1) * P < cols ? (page + 1) * P : cols;
      for (int64_t j = page * P; j < end; ++j) answer->scores[h * step->stride + j] = bound;
    }
  }
  if (step->budget >= cols) return KVLENS_DENSE;
  answer->recent = t % P + 1; /* the page holding t */
  answer->page_size = P;
  return KVLENS_SCORES;
}

static const kvlens_param params[] = {
    {"page_size", KVLENS_PARAM_INT, "Tokens per page", 16, 1, 1 << 20, NULL, 0},
    {"max_only", KVLENS_PARAM_BOOL,
     "Rank pages by sum_c |q_c| * max_c (the TokenButler code's simplified bound)", 0, 0, 1, NULL,
     0},
    /* A common knob named here sets its default: Quest leaves its first two layers dense. */
    {"dense_layers", KVLENS_PARAM_INT, "The first layers are left dense (Quest uses 2)", 2, 0,
     HUGE_VAL, NULL, 0},
};

static const kvlens_policy_plugin plugin = {
    KVLENS_POLICY_ABI_VERSION,
    sizeof(kvlens_policy_plugin),
    "quest_c",
    "page selection (Quest), C plug-in",
    "Pages of page_size tokens ranked by the upper bound of q.k from the per-page key min/max; "
    "the best pages fill the budget, the current page always visible (kvlens's quest rule, as "
    "a C plug-in).",
    params,
    3,
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
