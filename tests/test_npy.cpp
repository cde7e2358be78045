// .npy files: float32 and float16 arrays load; wrong shapes, dtypes and damaged files are clear errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "ref/half.hpp"
#include "kvq/research/datasets.hpp"
#include "kvq/research/npy.hpp"
#include "npy_bytes.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;

namespace {

using kvq::test::npy_bytes;

std::string float_data(const std::vector<float>& x) { return {reinterpret_cast<const char*>(x.data()), x.size() * 4}; }

struct TempDir {
    fs::path path;
    TempDir() {
        path = fs::temp_directory_path() / ("kvq_npy_test_" + std::to_string(reinterpret_cast<uintptr_t>(this)));
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
    std::string file(const char* name) const { return (path / name).string(); }
    void write(const char* name, const std::string& bytes) const { std::ofstream(file(name), std::ios::binary) << bytes; }
};

kvq::NpyArray parse(const std::string& bytes) { return kvq::parse_npy(bytes.data(), bytes.size(), "test.npy"); }

}  // namespace

TEST_CASE("npy: write_npy and read_npy round-trip a float32 array") {
    TempDir dir;
    const auto x = kvq::test::gaussian(2 * 3 * 4, 1);
    kvq::write_npy(dir.file("x.npy"), x.data(), x.size(), {2, 3, 4});
    const auto a = kvq::read_npy(dir.file("x.npy"));
    CHECK(a.shape == std::vector<size_t>{2, 3, 4});
    CHECK(a.dtype == "float32");
    CHECK(a.data == x);
    CHECK_THROWS_AS(kvq::write_npy(dir.file("y.npy"), x.data(), x.size(), {5, 5}), std::invalid_argument);
}

TEST_CASE("npy: float16 data is converted to float32") {
    const float values[] = {1.0f, -2.5f, 0.099975586f, 65504.0f};
    std::string data;
    for (float v : values) {
        const uint16_t h = kvq::detail::f32_to_f16(v);
        data += static_cast<char>(h & 0xff);
        data += static_cast<char>(h >> 8);
    }
    const auto a = parse(npy_bytes("{'descr': '<f2', 'fortran_order': False, 'shape': (4,), }", data));
    CHECK(a.dtype == "float16");
    CHECK(a.data == std::vector<float>(std::begin(values), std::end(values)));
}

TEST_CASE("npy: unsupported or damaged files are rejected with the reason") {
    const std::string four = float_data({1, 2, 3, 4});
    auto error = [](const std::string& bytes) {
        try {
            parse(bytes);
        } catch (const std::invalid_argument& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    CHECK(error("not an npy file at all") .find("bad magic") != std::string::npos);
    CHECK(error(npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }", four)).find("'>f4' is not supported") != std::string::npos);
    CHECK(error(npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", four)).find("'<f8' is not supported") != std::string::npos);
    CHECK(error(npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (4,), }", four)).find("'<i4' is not supported") != std::string::npos);
    CHECK(error(npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", four)).find("Fortran-order") != std::string::npos);
    CHECK(error(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", four)).find("does not match shape (5,)") != std::string::npos);
    CHECK(error(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'extra': 1}", four)).find("unknown key") != std::string::npos);
    CHECK(error(npy_bytes("{'descr': '<f4', 'shape': (4,)}", four)).find("needs descr, fortran_order and shape") != std::string::npos);
    CHECK(error(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4,", four)).find("corrupt .npy header") != std::string::npos);
    CHECK(error(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", four).substr(0, 40)).find("truncated") != std::string::npos);
    CHECK_THROWS_WITH_AS(kvq::read_npy("/nonexistent/k.npy"), doctest::Contains("cannot open"), std::invalid_argument);
}

TEST_CASE("npy data sets: (layers, tokens, kv_heads, head_dim) dumps load, anything else is refused") {
    TempDir dir;
    const size_t L = 2, T = 40, H = 2, D = 32;
    const auto k = kvq::test::gaussian(L * T * H * D, 2), v = kvq::test::gaussian(L * T * H * D, 3);
    kvq::write_npy(dir.file("k.npy"), k.data(), k.size(), {L, T, H, D});
    kvq::write_npy(dir.file("v.npy"), v.data(), v.size(), {L, T, H, D});

    SUBCASE("without q.npy the queries are synthetic, one per kv head") {
        const auto d = kvq::make_dataset("npy:" + dir.path.string() + ",query_positions=3");
        CHECK(d.layers == 2);
        CHECK(d.tokens == 40);
        CHECK(d.kv_heads == 2);
        CHECK(d.q_heads == 2);
        CHECK(d.query_positions == std::vector<int>{37, 38, 39});
        CHECK(d.keys(1, 1, 1)[5] == k[((1 * T + 0) * H + 1) * D + 5]);
    }
    SUBCASE("q.npy with GQA heads supplies the queries of the last tokens") {
        const auto q = kvq::test::gaussian(L * T * 2 * H * D, 4);
        kvq::write_npy(dir.file("q.npy"), q.data(), q.size(), {L, T, 2 * H, D});
        const auto d = kvq::make_dataset("npy:" + dir.path.string());
        CHECK(d.q_heads == 4);
        CHECK(d.group() == 2);
        const int i = d.n_queries() - 1;  // token T-1
        CHECK(d.queries(1, 1, i)[3] == q[((1 * T + (T - 1)) * 2 * H + 2) * D + 3]);
    }
    SUBCASE("meta.json sets the softmax scale") {
        CHECK(kvq::make_dataset("npy:" + dir.path.string()).softmax_scale() == doctest::Approx(1 / std::sqrt(32.0)));
        dir.write("meta.json", R"({"model": "tiny", "scale": 0.0625})");
        CHECK(kvq::make_dataset("npy:" + dir.path.string()).softmax_scale() == 0.0625f);
        dir.write("meta.json", R"({"scale": -1})");
        CHECK_THROWS_WITH_AS(kvq::make_dataset("npy:" + dir.path.string()), doctest::Contains("positive number"), std::invalid_argument);
    }
    SUBCASE("meta.json gives the sliding windows per layer") {
        CHECK(kvq::make_dataset("npy:" + dir.path.string()).windows.empty());
        dir.write("meta.json", R"({"scale": 0.0625, "windows": [0, 16]})");
        auto d = kvq::make_dataset("npy:" + dir.path.string());
        CHECK(d.windows == std::vector<int>{0, 16});
        CHECK(d.first_token(0, 39) == 0);
        CHECK(d.first_token(1, 39) == 24);  // the last 16 tokens: 24..39
        CHECK(d.first_token(1, 10) == 0);
        dir.write("meta.json", R"({"sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"]})");
        CHECK(kvq::make_dataset("npy:" + dir.path.string()).windows == std::vector<int>{16, 0});
        dir.write("meta.json", R"({"windows": [0, 16, 0]})");
        CHECK_THROWS_WITH_AS(kvq::make_dataset("npy:" + dir.path.string()), doctest::Contains("'windows' has 3 entries but k.npy has 2 layers"),
                             std::invalid_argument);
        dir.write("meta.json", R"({"windows": [0, -4]})");
        CHECK_THROWS_WITH_AS(kvq::make_dataset("npy:" + dir.path.string()), doctest::Contains("windows[1] must be a non-negative integer"),
                             std::invalid_argument);
        dir.write("meta.json", R"({"windows": [0, 1.5]})");
        CHECK_THROWS_AS(kvq::make_dataset("npy:" + dir.path.string()), std::invalid_argument);
        dir.write("meta.json", R"({"windows": 16})");
        CHECK_THROWS_WITH_AS(kvq::make_dataset("npy:" + dir.path.string()), doctest::Contains("must be a list"), std::invalid_argument);
        dir.write("meta.json", R"({"sliding_window": 16})");
        CHECK_THROWS_WITH_AS(kvq::make_dataset("npy:" + dir.path.string()), doctest::Contains("go together"), std::invalid_argument);
        dir.write("meta.json", R"({"sliding_window": 16, "layer_types": ["sliding_attention", "chunked"]})");
        CHECK_THROWS_WITH_AS(kvq::make_dataset("npy:" + dir.path.string()), doctest::Contains("layer_types[1]"), std::invalid_argument);
    }
    SUBCASE("q.npy must match k.npy") {
        const auto q = kvq::test::gaussian(L * T * 3 * D, 4);
        kvq::write_npy(dir.file("q.npy"), q.data(), q.size(), {L, T, 3, D});
        CHECK_THROWS_WITH_AS(kvq::make_dataset("npy:" + dir.path.string()), doctest::Contains("a multiple of 2"), std::invalid_argument);
    }
    SUBCASE("three-dimensional dumps are refused") {
        kvq::write_npy(dir.file("k.npy"), k.data(), k.size(), {L * T, H, D});
        CHECK_THROWS_WITH_AS(kvq::make_dataset("npy:" + dir.path.string()),
                             doctest::Contains("expected shape (layers, tokens, kv_heads, head_dim), got (80, 2, 32)"), std::invalid_argument);
    }
    SUBCASE("k and v must agree") {
        kvq::write_npy(dir.file("v.npy"), v.data(), v.size(), {L, T, H * 2, D / 2});
        CHECK_THROWS_WITH_AS(kvq::make_dataset("npy:" + dir.path.string()), doctest::Contains("but v.npy has"), std::invalid_argument);
    }
    SUBCASE("float64 dumps are refused with the dtype named") {
        dir.write("v.npy", npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 40, 2, 16), }", std::string(L * T * H * 16 * 8, '\0')));
        CHECK_THROWS_WITH_AS(kvq::make_dataset("npy:" + dir.path.string()), doctest::Contains("'<f8' is not supported"), std::invalid_argument);
    }
    SUBCASE("a missing directory or file is named") {
        CHECK_THROWS_WITH_AS(kvq::make_dataset("npy:/nonexistent/dump"), doctest::Contains("is not a directory"), std::invalid_argument);
        fs::remove(dir.file("v.npy"));
        CHECK_THROWS_WITH_AS(kvq::make_dataset("npy:" + dir.path.string()), doctest::Contains("missing"), std::invalid_argument);
    }
}
