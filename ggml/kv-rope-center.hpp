// KVQ_KV_FORMATS' +ropecenter keys (kv-formats.hpp): the keys' mean before the RoPE, turned to each row's
// position, subtracted on the pairs of channels where that removes the most; the position kept in the
// row's block scales; and the attention that adds the subtracted q·R_p·m back to each score.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "kv-calibration.hpp"
#include "kv-formats.hpp"

namespace kvq_ggml {

// The pairs centered by position per kv head, and the bits of a row's position.
constexpr size_t kRopePairs = 8;
constexpr int kPositionBits = 24;

// Chooses f's pairs and position bits from its layer's calibration l and its codec, and sets var (per
// channel: the variance of what is stored, for the scales) on the chosen pairs; the reason if it cannot.
std::string setup_rope_center(KvFormat& f, const LayerCalibration& l, const kvq::Codec& codec, std::vector<double>& var);

// A row's position (kPositionBits bits, position_bits in the low bits of each of the position_scales)
// in the cache row that starts at row; put_position writes it.
int64_t get_position(const KvFormat& f, const char* row);
void put_position(const KvFormat& f, char* row, int64_t p);
inline bool position_fits(int64_t p) { return p >= 0 && p < (int64_t{1} << kPositionBits); }

// y (n values from channel `first`, whole heads) += sign · R_p·m on each head's chosen pairs.
void add_rope_mean(const KvFormat& f, float* y, size_t n, size_t first, int64_t p, float sign);

// +ropecenter's angles for the attention, per kv head: for its chosen pairs c and the cells t of the cache,
// cos(p·θ_c) at e[2c][t] and sin(p·θ_c) at e[2c + 1][t] (row stride cap), for the position pos[t] that
// the cell's row held when they were computed: a decode step computes only its new cell's.
struct AngleTables {
    std::mutex mu;
    struct Head {
        std::vector<float> e;
        std::vector<int64_t> pos;
        size_t cap = 0;
    };
    std::vector<Head> heads;
};

}  // namespace kvq_ggml
