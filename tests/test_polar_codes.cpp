// Polar's codes by compares (polar_level1_code, polar_node_code: lib/ref/rotated_quantize.hpp) are the
// cells of the exact angles except within a float rounding of a threshold, and the codes of the
// specification before them (kvq's own atan2, one division and the Cephes polynomial, ranked among the
// float thresholds; copied here) except at a rare few such points; points exactly on a threshold take
// the cell the specification says; and the row's codes and radius follow from them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <random>
#include <vector>

#include "ref/bit_codes.hpp"
#include "ref/lloyd_max.hpp"
#include "ref/rotated_quantize.hpp"
#include "ref/stored_norm.hpp"
#include "rotation/hadamard.hpp"

namespace {

using kvq::detail::polar_angle_codebook;
using kvq::detail::polar_level1_code;
using kvq::detail::polar_node_code;
using kvq::detail::polar_tangents;

// The specification's angle before this change (rotated_quantize_scalar.cpp at bcc9e1e).
float old_angle_q1(float y, float x, bool& big) {
    const float ax = std::fabs(x), ay = std::fabs(y);
    big = ay > ax;
    const float mx = big ? ay : ax, mn = big ? ax : ay;
    const bool red = mn > 0.414213562f * mx;
    const float num = red ? mn - mx : mn, den = red ? mn + mx : mx;
    float t = num / den;
    if (!(den > 0.0f)) t = 0.0f;
    const float z = t * t;
    float p = ((8.05374449538e-2f * z + -1.38776856032e-1f) * z + 1.99777106478e-1f) * z + -3.33329491539e-1f;
    p = p * z;
    p = p * t;
    p = p + t;
    if (red) p = p + 0.785398163f;
    return big ? 1.57079633f - p : p;
}
float old_angle(float y, float x) {
    bool big;
    float a = old_angle_q1(y, x, big);
    if (x < 0.0f) a = 3.14159265f - a;
    if (y < 0.0f) a = 6.28318531f - a;
    return a;
}
uint32_t old_rank(const std::vector<float>& bounds, float v) {
    return static_cast<uint32_t>(std::upper_bound(bounds.begin(), bounds.end(), v) - bounds.begin());
}

// The cell of the exact angle θ among thresholds t (ascending), and θ's distance to the nearest one.
uint32_t exact_cell(const std::vector<double>& t, double theta, double& dist) {
    dist = INFINITY;
    for (double v : t) dist = std::min(dist, std::fabs(theta - v));
    return static_cast<uint32_t>(std::upper_bound(t.begin(), t.end(), theta) - t.begin());
}
std::vector<double> level1_thresholds(int bits) {
    std::vector<double> t;
    for (int k = 1; k < 1 << bits; ++k) t.push_back(k * 2 * std::numbers::pi / (1 << bits));
    return t;
}
double exact_angle(float b, float a) {
    double th = std::atan2(double(b), double(a));
    return th < 0 ? th + 2 * std::numbers::pi : th;
}

}  // namespace

TEST_CASE("polar's level-1 codes are the cells of the exact angle but within a rounding of a threshold") {
    std::mt19937_64 rng(5);
    std::normal_distribution<float> normal;
    for (int bits = 1; bits <= 8; ++bits) {
        CAPTURE(bits);
        const auto tan = polar_tangents(1, bits, nullptr);
        const auto t = level1_thresholds(bits);
        size_t differ = 0, n = 400000;
        for (size_t i = 0; i < n; ++i) {
            float a = normal(rng), b = normal(rng);
            if (i % 5 == 1) b *= 1e-3f;   // near the axes
            if (i % 5 == 2) a *= 1e20f, b *= 1e20f;
            if (i % 5 == 3) a *= 1e-20f, b *= 1e-20f;
            double dist;
            const uint32_t want = exact_cell(t, exact_angle(b, a), dist);
            const uint32_t got = polar_level1_code(a, b, bits, tan.data());
            if (got != want) {
                ++differ;
                CHECK(dist < 1e-6);
            }
        }
        MESSAGE(bits << "-bit level 1: " << differ << " of " << n << " codes differ from the exact angle's cell");
        CHECK(differ < n / 100000 + 2);
    }
}

TEST_CASE("polar's codes above level 1 are the ranks of the exact angle but within a rounding of a threshold") {
    std::mt19937_64 rng(6);
    std::normal_distribution<float> normal;
    for (int level = 2; level <= 4; ++level) {
        for (int bits = 1; bits <= 8; ++bits) {
            CAPTURE(level);
            CAPTURE(bits);
            const auto& cb = polar_angle_codebook(level, bits);
            const auto tan = polar_tangents(level, bits, cb.boundaries.data());
            const std::vector<double> t(cb.boundaries.begin(), cb.boundaries.end());
            size_t differ = 0, n = 100000;
            for (size_t i = 0; i < n; ++i) {
                const float r1 = std::fabs(normal(rng)) + 0.1f, r2 = std::fabs(normal(rng)) + 0.1f;
                const float s1 = r1 * r1, s2 = r2 * r2;
                double dist;
                const uint32_t want = exact_cell(t, std::atan2(std::sqrt(double(s2)), std::sqrt(double(s1))), dist);
                if (polar_node_code(s1, s2, bits, tan.data()) != want) {
                    ++differ;
                    CHECK(dist < 1e-6);
                }
            }
            if (differ) MESSAGE("level " << level << ", " << bits << " bits: " << differ << " of " << n << " differ");
            CHECK(differ < n / 10000 + 2);
        }
    }
}

// Whole rows, rotated, against the old specification's codes (its atan2 and its radii by square roots):
// the rate of codes that differ is of the order of the angles' rounding, not of the cells.
TEST_CASE("polar rows get the old specification's codes but for a few within a rounding of a threshold") {
    const int d = 128;
    const kvq::detail::Rotation rot(d, 42);
    std::mt19937_64 rng(8);
    std::normal_distribution<float> normal;
    for (const std::vector<int>& bits : {std::vector<int>{4, 2, 2, 2}, {4, 3, 4, 4, 5, 4, 4}, {5, 4, 3}}) {
        const int levels = static_cast<int>(bits.size());
        CAPTURE(levels);
        std::vector<std::vector<float>> bounds, tan;
        for (int l = 1; l <= levels; ++l) {
            const auto& cb = polar_angle_codebook(l, bits[l - 1]);
            bounds.push_back(cb.boundaries);
            tan.push_back(polar_tangents(l, bits[l - 1], cb.boundaries.data()));
        }
        size_t codes = 0, differ = 0;
        std::vector<float> x(d), y(d), r(d), s(d);
        for (int row = 0; row < 2000; ++row) {
            for (auto& v : x) v = normal(rng);
            rot.apply(x.data(), y.data());
            for (int j = 0; j < d / 2; ++j) {
                const float a = y[2 * j], b = y[2 * j + 1];
                differ += old_rank(bounds[0], old_angle(b, a)) != polar_level1_code(a, b, bits[0], tan[0].data());
                r[j] = std::sqrt(a * a + b * b);
                s[j] = a * a + b * b;
                ++codes;
            }
            for (int l = 2, nodes = d / 4; l <= levels; ++l, nodes /= 2) {
                for (int i = 0; i < nodes; ++i) {
                    bool big;
                    const uint32_t old = old_rank(bounds[l - 1], old_angle_q1(r[2 * i + 1], r[2 * i], big));
                    differ += old != polar_node_code(s[2 * i], s[2 * i + 1], bits[l - 1], tan[l - 1].data());
                    r[i] = std::sqrt(r[2 * i] * r[2 * i] + r[2 * i + 1] * r[2 * i + 1]);
                    s[i] = s[2 * i] + s[2 * i + 1];
                    ++codes;
                }
            }
        }
        MESSAGE("bits " << bits[0] << "… : " << differ << " of " << codes << " codes differ from the old specification's");
        CHECK(differ * 100000 < codes);  // below 1e-5
    }
}

// The points that can lie exactly on a threshold, and products that tie: the specification's cells.
TEST_CASE("polar's codes on the axes, the diagonals, at zero and at tied products are the specification's") {
    const auto t4 = polar_tangents(1, 4, nullptr);
    REQUIRE(t4.size() == 1);
    CHECK(t4[0] == static_cast<float>(std::tan(std::numbers::pi / 8)));
    // 4 bits: cells of π/8. Axes and diagonals take the cell on the side the compares give.
    CHECK(polar_level1_code(1.0f, 0.0f, 4, t4.data()) == 0);     // 0: cell 0
    CHECK(polar_level1_code(1.0f, -0.0f, 4, t4.data()) == 0);    // −0 counts as positive
    CHECK(polar_level1_code(0.0f, 1.0f, 4, t4.data()) == 3);     // π/2, between cells 3 and 4
    CHECK(polar_level1_code(-0.0f, 1.0f, 4, t4.data()) == 3);
    CHECK(polar_level1_code(-1.0f, 0.0f, 4, t4.data()) == 7);    // π, between 7 and 8
    CHECK(polar_level1_code(0.0f, -1.0f, 4, t4.data()) == 12);   // 3π/2: cell 12
    CHECK(polar_level1_code(1.0f, 1.0f, 4, t4.data()) == 1);     // π/4, between 1 and 2
    CHECK(polar_level1_code(-1.0f, 1.0f, 4, t4.data()) == 6);    // 3π/4, between 5 and 6
    CHECK(polar_level1_code(-1.0f, -1.0f, 4, t4.data()) == 9);   // 5π/4, between 9 and 10
    CHECK(polar_level1_code(1.0f, -1.0f, 4, t4.data()) == 14);   // 7π/4, between 13 and 14
    for (float a : {0.0f, -0.0f}) {
        for (float b : {0.0f, -0.0f}) {
            for (int bits = 1; bits <= 8; ++bits) CHECK(polar_level1_code(a, b, bits, polar_tangents(1, bits, nullptr).data()) == 0);
        }
    }
    // Just off every threshold of the first octant, and exactly at the product: min > max·T is strict.
    for (int bits = 4; bits <= 8; ++bits) {
        const auto t = polar_tangents(1, bits, nullptr);
        for (size_t k = 0; k < t.size(); ++k) {
            const float mx = 3.0f, at = mx * t[k];
            CHECK(polar_level1_code(mx, at, bits, t.data()) == k);  // on the threshold: below it
            CHECK(polar_level1_code(mx, std::nextafter(at, INFINITY), bits, t.data()) == k + 1);
            CHECK(polar_level1_code(mx, std::nextafter(at, 0.0f), bits, t.data()) == k);
            // mirrored into octant 1 (past the diagonal): the cells count down
            const uint32_t h = 1u << (bits - 3);
            CHECK(polar_level1_code(at, mx, bits, t.data()) == 2 * h - 1 - k);
            CHECK(polar_level1_code(std::nextafter(at, INFINITY), mx, bits, t.data()) == 2 * h - 2 - k);
        }
    }
    // Above level 1: squared radii; equal radii sit on the middle threshold π/4 (the densities are
    // symmetric about it), whose squared tangent rounds above 1.
    for (int bits = 1; bits <= 8; ++bits) {
        CAPTURE(bits);
        const auto& cb = polar_angle_codebook(2, bits);
        const auto u = polar_tangents(2, bits, cb.boundaries.data());
        const uint32_t mid = (1u << (bits - 1)) - 1;
        CHECK(cb.boundaries[mid] == static_cast<float>(std::numbers::pi / 4));
        CHECK(u[mid] > 1.0f);
        CHECK(polar_node_code(2.0f, 2.0f, bits, u.data()) == mid);
        CHECK(polar_node_code(0.0f, 0.0f, bits, u.data()) == 0);
        CHECK(polar_node_code(1.0f, 0.0f, bits, u.data()) == 0);
        CHECK(polar_node_code(0.0f, 1.0f, bits, u.data()) == u.size());
        // Subnormal products round coarsely: 1e-45·U is 0 for U ≤ 0.5 (the smallest subnormal is 1e-45).
        CHECK(polar_node_code(1e-45f, 1e-45f, bits, u.data()) == std::count_if(u.begin(), u.end(), [](float v) { return v <= 0.5f; }));
        CHECK(polar_node_code(3e38f, 3e38f, bits, u.data()) == mid);    // 3e38·U overflows past 1
        for (size_t k = 0; k < u.size(); ++k) {
            const float s1 = 5.0f, at = s1 * u[k];
            CHECK(polar_node_code(s1, at, bits, u.data()) == k);
            CHECK(polar_node_code(s1, std::nextafter(at, INFINITY), bits, u.data()) == k + 1);
        }
    }
}

// The row function: codes from the squared radii, the last radius √s in fp16; a zero row is all zero bytes.
TEST_CASE("a polar row's codes and radius come from its squared radii") {
    const int d = 16;
    const kvq::detail::Rotation rot(d, 3);
    kvq::detail::PolarQuantizeLayout l;
    l.rot = kvq::detail::rotation_layout(rot);
    l.levels = 2;
    const int bits[2] = {4, 3};
    std::vector<float> tan[2];
    size_t bit = 0;
    for (int i = 0; i < 2; ++i) {
        tan[i] = polar_tangents(i + 1, bits[i], polar_angle_codebook(i + 1, bits[i]).boundaries.data());
        tan[i].resize(32, 0.0f);
        l.bits[i] = bits[i];
        l.bit_off[i] = bit;
        l.tangents[i] = tan[i].data();
        bit += size_t(d >> (i + 1)) * bits[i];
    }
    l.radius_off = kvq::detail::bytes_for_bits(bit);
    l.row_bytes = l.radius_off + 2 * (d / 4);
    std::mt19937_64 rng(9);
    std::normal_distribution<float> normal;
    std::vector<float> x(d), y(d);
    std::vector<uint8_t> row(l.row_bytes);
    for (int trial = 0; trial < 50; ++trial) {
        for (auto& v : x) v = trial == 0 ? 0.0f : normal(rng);
        kvq::detail::polar_quantize_row_spec(l, x.data(), row.data());
        if (trial == 0) CHECK(std::all_of(row.begin(), row.end(), [](uint8_t b) { return b == 0; }));
        rot.apply(x.data(), y.data());
        for (int g = 0; g < d / 4; ++g) {
            const float* v = y.data() + 4 * g;
            float s[2];
            for (int j = 0; j < 2; ++j) {
                CHECK(kvq::detail::get_code(row.data(), size_t(2 * g + j) * 4, 4) == polar_level1_code(v[2 * j], v[2 * j + 1], 4, tan[0].data()));
                s[j] = v[2 * j] * v[2 * j] + v[2 * j + 1] * v[2 * j + 1];
            }
            CHECK(kvq::detail::get_code(row.data(), l.bit_off[1] + size_t(g) * 3, 3) == polar_node_code(s[0], s[1], 3, tan[1].data()));
            uint8_t half[2];
            kvq::detail::store_half(half, std::sqrt(s[0] + s[1]));
            CHECK(std::memcmp(half, row.data() + l.radius_off + 2 * g, 2) == 0);
        }
    }
}
