/* kvlens policy plug-in contract, version 1: the C ABI a token-selection policy compiled as a
 * shared library implements (a Python class implements the same contract through the kvlens
 * module). kvlens calls the policy at every decode step t and layer l with what a built-in policy
 * sees, and the policy answers with a visible set or with scores that kvlens turns into a set
 * under the budget and the common knobs. Row buffers are [rows, stride], row-major; columns
 * [0, cols) are in use, cols = t + 1, and column j holds the token at position j.
 *
 * A plug-in exports one function, kvlens_policy_plugin_v1, returning its description. kvlens
 * checks every answer (sizes, finiteness) and turns a failure into an error naming the plug-in;
 * a plug-in never makes kvlens unsafe. No C++ types cross this boundary. */
#ifndef KVLENS_POLICY_PLUGIN_H
#define KVLENS_POLICY_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI version this header describes. kvlens loads a plug-in whose abi_version equals it
 * and refuses any other with an error naming both versions. */
#define KVLENS_POLICY_ABI_VERSION 1

/* The symbol kvlens looks up in the shared library. */
#define KVLENS_POLICY_ENTRY "kvlens_policy_plugin_v1"

/* ---- What a policy declares ----------------------------------------------------------------- */

/* A knob's type. Values reach create() as doubles: INT and BOOL as exact integers (BOOL 0 or 1),
 * CHOICE as the index of the chosen string in `choices`. */
typedef enum kvlens_param_type {
  KVLENS_PARAM_INT = 0,
  KVLENS_PARAM_FLOAT = 1,
  KVLENS_PARAM_BOOL = 2,
  KVLENS_PARAM_CHOICE = 3
} kvlens_param_type;

/* A knob named like one of the common knobs (sinks, window, dense_layers, granularity,
 * budget_tokens, min_keep, budget_excludes_sinks; `kvlens-cli policies` lists them) sets that
 * knob's default, range and description for this policy instead (Quest's dense_layers = 2); it
 * must have the knob's type, and create() does not receive it: kvlens applies it. */
typedef struct kvlens_param {
  const char* name;        /* [a-z0-9_]+, unique */
  int32_t type;            /* kvlens_param_type */
  const char* description; /* one line */
  double default_value;    /* CHOICE: an index into choices */
  double min_value;        /* INT, FLOAT: inclusive bounds (use -HUGE_VAL / HUGE_VAL for none) */
  double max_value;
  const char* const* choices; /* CHOICE: choice_count strings; NULL otherwise */
  int32_t choice_count;
} kvlens_param;

/* What select() reads, so kvlens computes it only when asked (a bit set in `needs`). */
enum {
  /* step->logits: the true pre-softmax logits of this step (else NULL, and kvlens may compute
   * them at the chosen columns only, after select). */
  KVLENS_NEEDS_LOGITS = 1u << 0,
  /* observe(): the attention probabilities actually computed under the chosen set. */
  KVLENS_NEEDS_PROBABILITIES = 1u << 1,
  /* step->predictor_scores: the model's learned predictor (TokenButler) logits for this step.
   * A model without a predictor cannot run the policy (a clear error when it is made). */
  KVLENS_NEEDS_PREDICTOR = 1u << 2,
  /* step->keys / step->values on the host for a plug-in that reads host memory only (on a CUDA
   * session they are copied for it; with device memory they are always given). */
  KVLENS_NEEDS_CACHE = 1u << 3,
  /* step->previous_visible: this layer's visible set at the previous step. */
  KVLENS_NEEDS_PREVIOUS_VISIBLE = 1u << 4,
  /* answer->eligible is given for the policy to mark evicted columns; without this bit it is
   * NULL and every column is eligible. */
  KVLENS_NEEDS_ELIGIBLE = 1u << 5,
  /* answer->visible is given, zeroed, and select() may return KVLENS_VISIBLE; without this bit
   * it is NULL and KVLENS_VISIBLE is an error (a policy that only ranks costs no zeroing). */
  KVLENS_ANSWERS_VISIBLE = 1u << 6
};

/* Where the pointers of a step live. */
typedef enum kvlens_memory {
  KVLENS_MEMORY_HOST = 0, /* CPU memory: the CPU backend, or copies made for a host plug-in */
  KVLENS_MEMORY_CUDA = 1  /* device memory of the current CUDA device; `stream` orders the work */
} kvlens_memory;

/* Which memories a plug-in can work in (bits of `memories`). A plug-in without the CUDA bit
 * still runs on a CUDA session: kvlens copies its inputs to the host and its answer back, and
 * `kvlens-cli bench` reports the copies' time. */
enum { KVLENS_ACCEPTS_HOST = 1u << 0, KVLENS_ACCEPTS_CUDA = 1u << 1 };

typedef enum kvlens_dtype { KVLENS_F32 = 0, KVLENS_BF16 = 1, KVLENS_F16 = 2 } kvlens_dtype;

/* The model a policy instance is made for. */
typedef struct kvlens_model_shape {
  uint32_t struct_size; /* sizeof(kvlens_model_shape) of the kvlens that filled it */
  int64_t layers, heads, kv_heads, head_dim, hidden_size;
  int64_t max_positions; /* max_position_embeddings: no step reaches it */
  int32_t has_predictor;
  int32_t memory; /* kvlens_memory of every step's pointers for this instance */
} kvlens_model_shape;

/* ---- One step ------------------------------------------------------------------------------ */

/* What select() is given for one (step, layer). Query heads h = 0..H-1 read KV head
 * g = h / (H / G). Pointers are in `memory`; NULL where not asked for. */
typedef struct kvlens_step {
  uint32_t struct_size;
  int32_t memory; /* kvlens_memory */
  void* stream;   /* cudaStream_t of the session on CUDA, NULL on the host */
  int64_t step;   /* t: the token just appended (its key is column t) */
  int64_t layer;  /* l, at least the dense_layers knob (earlier layers are dense) */
  int64_t cols;   /* t + 1 candidates */
  int64_t stride; /* columns of every row buffer below (it grows with the context) */
  int64_t budget; /* B(t): the most tokens a head may see, everything forced included (on a
                     sliding-window layer B of the window's keys: see first_candidate) */
  int64_t sinks;  /* the common knobs, resolved */
  int64_t window;
  int32_t kv_head_granularity; /* 1: one selection per KV head (selection_rows = G) */
  int64_t selection_rows;      /* rows of `eligible` and of a shared selection: H or G */
  const float* layer_input;    /* [E]: this layer's attention input (after its input RMSNorm) */
  const float* query;          /* [H, D] after RoPE */
  const void* keys;     /* [G, stride, D] in cache_dtype (needs KVLENS_NEEDS_CACHE on host) */
  const void* values;   /* [G, stride, D] in cache_dtype */
  int32_t cache_dtype;  /* kvlens_dtype */
  int32_t keys_rotated; /* 1: cached keys are after RoPE (always, in version 1) */
  const float* logits;  /* [H, stride] true logits (KVLENS_NEEDS_LOGITS), else NULL */
  const float* predictor_scores;   /* [H, stride] (KVLENS_NEEDS_PREDICTOR), else NULL */
  const uint8_t* previous_visible; /* [H, stride]: what each head saw at this layer's previous
                                      step (columns < t; KVLENS_NEEDS_PREVIOUS_VISIBLE), NULL
                                      at its first step or where that step was dense */
  /* A sliding-window layer's first visible column (gemma3's local layers, mistral's window):
   * columns before it are no candidates (never chosen, never visible) and `budget` is B of the
   * cols - first_candidate keys in the window; 0 elsewhere. */
  int64_t first_candidate;
} kvlens_step;

/* What select() answers into. Write every candidate column [0, cols) of every row of what you
 * answer with: the buffers are not cleared between steps (that would cost a pass each), except
 * `visible`, which arrives zeroed. */
typedef struct kvlens_answer {
  uint32_t struct_size;
  float* scores;     /* [H, stride]: the importance of each candidate (higher is kept), written
                        for every candidate whatever the decision: with KVLENS_SCORES they rank,
                        with KVLENS_VISIBLE the views show them. Finite numbers only. */
  uint8_t* eligible; /* [selection_rows, stride] (KVLENS_NEEDS_ELIGIBLE, else NULL): 1 where a
                        column may be chosen, 0 where it may never be (an evicted token), even
                        where it would be forced. KVLENS_SCORES only. */
  uint8_t* visible;  /* [H, stride], zeroed (KVLENS_ANSWERS_VISIBLE, else NULL): 1 where a head
                        sees the column (KVLENS_VISIBLE). */
  int64_t recent;    /* in: the window knob; the most recent tokens forced visible (current one
                        included), as the window knob is. KVLENS_SCORES only. */
  int64_t page_size; /* in: 0. > 0: the budget left after the forced tokens buys whole pages of
                        this many columns, ranked by their best score (Quest). */
  int32_t shared;    /* in: 0. 1: one set for every head of the layer, ranked by the scores
                        summed over the heads (eligible: its first row). KVLENS_SCORES only. */
} kvlens_answer;

/* select()'s return values. */
typedef enum kvlens_decision {
  KVLENS_DENSE = 0,   /* every candidate visible this layer; nothing written is read */
  KVLENS_SCORES = 1,  /* kvlens selects: the forced columns (the current token, `sinks`, then
                         `recent`) and the best remaining scores among eligible columns, up to
                         `budget`, per head or per KV head (scores summed over the group) */
  KVLENS_VISIBLE = 2, /* `visible` is the set; kvlens checks each row: the current token must be
                         in it, at most `budget` columns, none before first_candidate (a row
                         that breaks either is an error) */
  KVLENS_FAILED = -1  /* the step failed: `error` holds why (kvlens stops the run with it) */
} kvlens_decision;

/* What observe() is given after the attention of a (step, layer) ran under the chosen set. */
typedef struct kvlens_observation {
  uint32_t struct_size;
  int32_t memory;
  void* stream;
  int64_t step, layer, cols, stride;
  const float* probabilities; /* [H, stride]: softmax over the visible set, 0 elsewhere */
  const uint8_t* visible;     /* [H, stride]: the set the probabilities were computed under */
} kvlens_observation;

/* ---- The plug-in --------------------------------------------------------------------------- */

/* What a plug-in declares and the functions kvlens calls: one static instance per library,
 * returned by its entry point. Calls for one instance never overlap; different instances (runs)
 * may be called from different threads at once, so keep state in the instance. */
typedef struct kvlens_policy_plugin {
  uint32_t abi_version;       /* KVLENS_POLICY_ABI_VERSION */
  uint32_t struct_size;       /* sizeof(kvlens_policy_plugin) */
  const char* name;           /* the policy id: [a-z0-9_.-]+, not a built-in's */
  const char* family;         /* a few words: "eviction", "page selection", "learned predictor" */
  const char* rule;           /* one paragraph: the exact rule it runs */
  const kvlens_param* params; /* its own knobs (the common ones come from kvlens) */
  int32_t param_count;
  uint32_t needs;          /* KVLENS_NEEDS_* bits */
  uint32_t memories;       /* KVLENS_ACCEPTS_* bits (0 means host only) */
  int32_t predicts_logits; /* 1: its scores estimate the true logits (predicted-vs-true view) */

  /* Makes a policy instance for one run. `values` holds one value per param, in order (defaults
   * filled in, ranges checked). Returns the instance's state (any non-NULL pointer) or NULL with
   * a message in error[0 .. error_size). */
  void* (*create)(const kvlens_model_shape* shape, const double* values, char* error,
                  size_t error_size);
  /* Frees an instance. */
  void (*destroy)(void* state);
  /* Decides one (step, layer); see kvlens_decision. */
  int32_t (*select)(void* state, const kvlens_step* step, kvlens_answer* answer, char* error,
                    size_t error_size);
  /* Optional (NULL: none): the probabilities of a selected (step, layer), called before the
   * layer's next select. Returns 0, or nonzero with a message in error. */
  int32_t (*observe)(void* state, const kvlens_observation* observation, char* error,
                     size_t error_size);
  /* Reserved for later versions: NULL. */
  void* reserved[4];
} kvlens_policy_plugin;

/* The entry point: `const kvlens_policy_plugin* kvlens_policy_plugin_v1(void);` */
typedef const kvlens_policy_plugin* (*kvlens_policy_plugin_entry)(void);

#if defined(_WIN32)
#define KVLENS_PLUGIN_EXPORT __declspec(dllexport)
#else
#define KVLENS_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
}
#endif

#endif /* KVLENS_POLICY_PLUGIN_H */
