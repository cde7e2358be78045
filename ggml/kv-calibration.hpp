// What KVQ_KV_FORMATS' calibrated key formats need from llama.cpp's graph and from a calibration run:
// llama.cpp's own Hadamard rotation of the cache rows, the rotary embedding (RoPE) that made a key row and
// its positions, and the calibration file (calibrate=PATH writes it, calib=PATH reads it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ggml.h"

namespace kvq_ggml {

// llama.cpp's rotation (llama_mul_mat_hadamard): each run of n values of x[0..len) times H, Sylvester's
// Hadamard matrix over √n (ggml_gen_hadamard), symmetric, so that H·H = I.
void hadamard(float* x, int64_t len, int64_t n);

// The size of llama.cpp's Hadamard rotation applied to t's rows (a SET_ROWS source, a flash attention's Q):
// t is, through views and reshapes, a MUL_MAT by llama.cpp's rotation input (attn_inp_k_rot /
// attn_inp_v_rot, a square f32 matrix); 0 if not.
int64_t llama_rotation_of(const ggml_tensor* t);

// The ROPE op whose rows t holds (through views, reshapes, copies and llama.cpp's rotation), or null.
const ggml_tensor* rope_of(const ggml_tensor* t);

// A rotary embedding as +ropecenter models it: channel pairs (a, b) of one head turned by the angle
// p·theta[i] at position p, as ggml's ROPE (normal or NeoX order, freq_base, freq_scale, freq_factors,
// the first n_dims channels). YaRN's corrections and attn_factor are not modeled: the model only has to be
// the same function wherever the plugin applies it (the stored rows, the attention's correction, the
// calibration), not ggml's bit for bit; a difference costs accuracy, never correctness.
struct Rope {
    int64_t head_dim = 0;
    bool neox = false;
    int mode() const { return neox ? GGML_ROPE_TYPE_NEOX : 0; }
    std::vector<double> theta;  // per pair (n_dims / 2)

    bool operator==(const Rope&) const = default;
    int64_t pairs() const { return static_cast<int64_t>(theta.size()); }
    // The channels of pair i.
    int64_t a(int64_t i) const { return neox ? i : 2 * i; }
    int64_t b(int64_t i) const { return neox ? i + pairs() : 2 * i + 1; }
    // Turns one head's row x by position p (inverse: by −p), every pair.
    void rotate(float* x, int64_t p, bool inverse) const;
};

// The rope of a ROPE op on rows of head_dim values, or the reason it cannot be modeled.
std::optional<Rope> rope_from_op(const ggml_tensor* rope, int64_t head_dim, std::string& error);

// One layer's calibration: per kv head and channel (width = heads × head_dim values), in the model's
// channels (llama.cpp's rotation undone): the keys' mean and variance as stored (after the RoPE), the
// queries' second moment, and (version 2, when the run could see the positions) the keys' mean and
// variance before the RoPE, in each head's own frame (what +ropecenter subtracts, turned to the row's
// position).
struct LayerCalibration {
    int64_t width = 0, head_dim = 0;
    std::vector<float> mean, kvar, qsq;
    std::vector<float> rmean, rvar;  // empty: not measured
    int rope_mode = -1;              // with rmean: the RoPE's mode (0 or GGML_ROPE_TYPE_NEOX) and rotated channels
    int64_t rope_dims = 0;
};

// calib=PATH, read once (a bad file: the reason, and no layers).
std::optional<std::map<int, LayerCalibration>> read_calibration(const std::string& path, std::string& error);

// calibrate=PATH: one layer's key rows as written (model channels), with the rope and positions that
// made them when known (rope null: no pre-RoPE moments), and its queries (model channels, g query heads
// per kv head, first_head the view's first kv head).
void record_key_rows(int layer, int64_t head_dim, const float* rows, int64_t width, const Rope* rope, int64_t position);
void record_queries(int layer, int64_t head_dim, int64_t width, const float* q, int64_t n_rows, int64_t n_heads, int64_t g,
                    int64_t first_head);

// Writes what was recorded to path (atomically: a temporary file renamed); no-op with nothing recorded.
void write_calibration(const std::string& path);

}  // namespace kvq_ggml
