// Hostile data-set files and metric inputs (issue 36, items 7, 8 and 11): npy:DIR never hangs, never reads
// more than its header promises, and says what is wrong; metrics on non-finite or overflowing input are
// refused with the reason or computed in double, never a clean-looking table.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "kvq/research/datasets.hpp"
#include "kvq/research/eval.hpp"
#include "kvq/research/npy.hpp"
#include "kvq/research/planner.hpp"
#include "kvq/research/sweep.hpp"
#include "npy_bytes.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;

namespace {

using kvq::test::npy_bytes;

struct Dump {
    fs::path path;
    static constexpr size_t L = 1, T = 24, H = 1, D = 32;
    Dump() {
        path = fs::temp_directory_path() / ("kvq_hostile_" + std::to_string(::getpid()) + "_" + std::to_string(reinterpret_cast<uintptr_t>(this)));
        fs::create_directories(path);
        const auto k = kvq::test::gaussian(L * T * H * D, 2), v = kvq::test::gaussian(L * T * H * D, 3);
        kvq::write_npy(file("k.npy"), k.data(), k.size(), {L, T, H, D});
        kvq::write_npy(file("v.npy"), v.data(), v.size(), {L, T, H, D});
    }
    ~Dump() { fs::remove_all(path); }
    std::string file(const char* name) const { return (path / name).string(); }
    std::string spec() const { return "npy:" + path.string() + ",query_positions=2"; }
    void write(const char* name, const std::string& bytes) const { std::ofstream(file(name), std::ios::binary) << bytes; }
    // q.npy of GQA 2 with one value (or every value of the first query head) at the last token replaced.
    void write_queries(float value, bool whole_head = false) const {
        auto q = kvq::test::gaussian(L * T * 2 * H * D, 4);
        for (size_t j = whole_head ? 0 : 5; j < (whole_head ? D : 6); ++j) q[((T - 1) * 2 * H) * D + j] = value;
        kvq::write_npy(file("q.npy"), q.data(), q.size(), {L, T, 2 * H, D});
    }
};

long peak_rss_kib() {
    struct rusage u;
    ::getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss;
}

std::string load_error(const std::string& spec) {
    try {
        kvq::make_dataset(spec);
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return "no error";
}

}  // namespace

TEST_CASE("npy data: a FIFO, a device, a directory where a file should be are refused at once, nothing read") {
    Dump dump;
    fs::remove(dump.file("k.npy"));
    REQUIRE(::mkfifo(dump.file("k.npy").c_str(), 0600) == 0);  // no writer: reading it would block forever
    CHECK(load_error(dump.spec()).find("k.npy: is a FIFO, not a regular file") != std::string::npos);
    CHECK_THROWS_WITH_AS(kvq::read_npy("/dev/zero"), doctest::Contains("is a device, not a regular file"), std::invalid_argument);
    fs::remove(dump.file("k.npy"));
    fs::create_directory(dump.file("k.npy"));
    CHECK(load_error(dump.spec()).find("k.npy: is a directory, not a regular file") != std::string::npos);
    fs::remove(dump.file("k.npy"));
    fs::create_symlink(dump.file("nowhere.npy"), dump.file("k.npy"));  // dangling: named, not "missing"
    CHECK(load_error(dump.spec()).find("k.npy: cannot open") != std::string::npos);
    fs::remove(dump.file("k.npy"));
    const auto k = kvq::test::gaussian(Dump::L * Dump::T * Dump::H * Dump::D, 2);
    kvq::write_npy(dump.file("k.npy"), k.data(), k.size(), {Dump::L, Dump::T, Dump::H, Dump::D});
    REQUIRE(load_error(dump.spec()) == "no error");
    for (const char* name : {"q.npy", "meta.json"}) {
        REQUIRE(::mkfifo(dump.file(name).c_str(), 0600) == 0);
        CHECK(load_error(dump.spec()).find(std::string(name) + ": is a FIFO") != std::string::npos);
        fs::remove(dump.file(name));
        fs::create_directory(dump.file(name));
        CHECK(load_error(dump.spec()).find(std::string(name) + ": is a directory") != std::string::npos);
        fs::remove(dump.file(name));
    }
}

TEST_CASE("npy data: a file larger than its header promises is refused before its data is read") {
    Dump dump;
    // A sparse k.npy of 2 GiB whose header says 32 KiB: refused from its size, without reading 2 GiB.
    {
        std::ofstream(dump.file("k.npy"), std::ios::binary) << npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 256, 1, 32), }");
        fs::resize_file(dump.file("k.npy"), uint64_t(2) << 30);
    }
    const long peak_before = peak_rss_kib();
    CHECK_THROWS_WITH_AS(kvq::read_npy(dump.file("k.npy")), doctest::Contains("does not match shape (1, 256, 1, 32) of float32 (32768 bytes)"),
                         std::invalid_argument);
    CHECK(peak_rss_kib() - peak_before < 256 * 1024);  // the 2 GiB were not read into memory
    // A header length beyond what the file holds, and a format 2.0 header of 4 GiB.
    dump.write("k.npy", npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }").substr(0, 30));
    CHECK_THROWS_WITH_AS(kvq::read_npy(dump.file("k.npy")), doctest::Contains("truncated .npy header"), std::invalid_argument);
    dump.write("k.npy", std::string("\x93NUMPY\x02\x00\xff\xff\xff\xff", 12) + "{}");
    CHECK_THROWS_WITH_AS(kvq::read_npy(dump.file("k.npy")), doctest::Contains("beyond the 65536 read here"), std::invalid_argument);
    dump.write("k.npy", "");
    CHECK_THROWS_WITH_AS(kvq::read_npy(dump.file("k.npy")), doctest::Contains("bad magic"), std::invalid_argument);
}

TEST_CASE("npy: shape numbers and element counts that do not fit 64 bits are refused with the reason") {
    const auto error = [](const std::string& shape) {
        const std::string bytes = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }") + std::string(16, '\0');
        try {
            kvq::parse_npy(bytes.data(), bytes.size(), "x.npy");
        } catch (const std::invalid_argument& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    CHECK(error("(12345678901234567890123,)").find("shape number 12345678901234567890123 is beyond") != std::string::npos);
    CHECK(error("(18446744073709551616,)").find("is beyond") != std::string::npos);                     // 2^64
    CHECK(error("(4294967296, 4294967296, 1)").find("more elements than fit in 64 bits") != std::string::npos);  // 2^64: wraps to 0
    CHECK(error("(4294967296, 4294967297)").find("more elements than fit in 64 bits") != std::string::npos);
    CHECK(error("(4611686018427387904,)").find("more bytes than fit in 64 bits") != std::string::npos);  // 2^62 floats
    CHECK(error("(4,)") == "no error");
    const std::string empty = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4), }");  // no data (UBSan: no memcpy)
    CHECK(kvq::parse_npy(empty.data(), empty.size()).shape == std::vector<size_t>{0, 4});
    // A dump whose dimension does not fit the data set's int is refused by name, not truncated.
    const std::vector<float> one(1);
    CHECK_THROWS_WITH_AS(kvq::write_npy("/nonexistent/x.npy", one.data(), 0, {size_t(1) << 32, size_t(1) << 32}),
                         doctest::Contains("more values than fit in 64 bits"), std::invalid_argument);
}

TEST_CASE("npy data: meta.json values a float cannot hold, or not a number, are refused") {
    Dump dump;
    for (const char* scale : {"1e300", "1e-300", "Infinity", "NaN", "-0.5", "0", "\"0.1\""}) {
        CAPTURE(scale);
        dump.write("meta.json", std::string(R"({"scale": )") + scale + "}");
        CHECK(load_error(dump.spec()).find("'scale' must be a positive number within float's range") != std::string::npos);
    }
    dump.write("meta.json", R"({"scale": 3e38})");
    CHECK(kvq::make_dataset(dump.spec()).softmax_scale() == 3e38f);
    std::string padded(2 << 20, ' ');
    dump.write("meta.json", padded += "{}");
    CHECK(load_error(dump.spec()).find("more than the 1048576 this file may have") != std::string::npos);
    dump.write("meta.json", std::string(100000, '[') + std::string(100000, ']'));
    CHECK(load_error(dump.spec()).find("nesting too deep") != std::string::npos);
}

TEST_CASE("data sets: NaN or Inf in the keys, values or queries is refused with where it is") {
    Dump dump;
    dump.write_queries(NAN);
    CHECK(load_error(dump.spec()).find("the queries holds nan at layer 0, token 23, head 0") != std::string::npos);
    dump.write_queries(INFINITY);
    CHECK(load_error(dump.spec()).find("the queries holds inf") != std::string::npos);
    fs::remove(dump.file("q.npy"));
    auto k = kvq::test::gaussian(Dump::L * Dump::T * Dump::H * Dump::D, 2);
    k[7 * Dump::D + 1] = -INFINITY;
    kvq::write_npy(dump.file("k.npy"), k.data(), k.size(), {Dump::L, Dump::T, Dump::H, Dump::D});
    CHECK(load_error(dump.spec()).find("the keys holds -inf at layer 0, token 7, head 0") != std::string::npos);
}

TEST_CASE("sweep: a query whose scores overflow float is refused with the reason, not a table of KL 0") {
    Dump dump;
    for (float big : {1e38f, 3e38f}) {
        dump.write_queries(big, true);
        const kvq::KVData d = kvq::make_dataset(dump.spec());
        kvq::SweepOptions o;
        o.formats = {kvq::KVFormat::parse("q8_0/q4_0")};
        o.timing = false;
        CHECK_THROWS_WITH_AS(kvq::run_sweep({d}, o), doctest::Contains("layer 0, kv head 0: the queries at token 23 have scores (q · k · scale) beyond float's range"),
                             std::invalid_argument);
    }
    // The same through a meta.json scale: 3e38 is a float, and every score overflows.
    dump.write_queries(1.0f);
    dump.write("meta.json", R"({"scale": 3e38})");
    kvq::SweepOptions o;
    o.formats = {kvq::KVFormat::parse("q8_0/q4_0")};
    o.timing = false;
    CHECK_THROWS_WITH_AS(kvq::run_sweep({kvq::make_dataset(dump.spec())}, o), doctest::Contains("beyond float's range"), std::invalid_argument);
}

TEST_CASE("reference_attention: a query of 3e38 is computed in double, NaN input and a NaN scale are refused") {
    const int d = 32, n_q = 2;
    const size_t n = 20;
    auto q = kvq::test::gaussian(n_q * d, 1);
    const auto k = kvq::test::gaussian(n * d, 2), v = kvq::test::gaussian(n * d, 3);
    q[d + 3] = 3e38f;  // query 1's scores are ±1e38 and beyond
    std::vector<float> out(n_q * d), w(n_q * n);
    kvq::reference_attention(q.data(), n_q, k.data(), v.data(), n, d, 0, out.data(), w.data());
    REQUIRE(kvq::all_finite(out.data(), out.size()));
    REQUIRE(kvq::all_finite(w.data(), w.size()));
    // The score is dominated by channel 3: the weight goes to the row with the largest k[r][3].
    size_t best = 0;
    for (size_t r = 1; r < n; ++r) best = k[r * d + 3] > k[best * d + 3] ? r : best;
    CHECK(w[n + best] == 1.0f);
    for (int j = 0; j < d; ++j) CHECK(out[d + j] == v[best * d + j]);
    std::vector<float> out0(d), w0(n);  // query 0 alone: as in the pair (to float rounding: GEMV, not GEMM)
    kvq::reference_attention(q.data(), 1, k.data(), v.data(), n, d, 0, out0.data(), w0.data());
    for (int j = 0; j < d; ++j) CHECK(out[j] == doctest::Approx(out0[j]).epsilon(1e-6));

    q[5] = NAN;
    CHECK_THROWS_WITH_AS(kvq::reference_attention(q.data(), n_q, k.data(), v.data(), n, d, 0, out.data()), doctest::Contains("must be finite"),
                         std::invalid_argument);
    q[5] = 0;
    CHECK_THROWS_WITH_AS(kvq::reference_attention(q.data(), n_q, k.data(), v.data(), n, d, NAN, out.data()), doctest::Contains("scale must be finite"),
                         std::invalid_argument);
    CHECK_THROWS_AS(kvq::reference_attention(q.data(), n_q, k.data(), v.data(), n, d, INFINITY, out.data()), std::invalid_argument);
}

TEST_CASE("attention_error: a query whose scores overflow float is refused, not a NaN mean beside a finite worst") {
    const int d = 32, n_q = 3;
    const size_t n = 64;
    auto q = kvq::test::gaussian(n_q * d, 1);
    const auto k = kvq::test::gaussian(n * d, 2), v = kvq::test::gaussian(n * d, 3);
    const kvq::Codec keys = kvq::Codec::make("q8_0", d), values = kvq::Codec::make("q4_0", d);
    const auto ok = kvq::attention_error(q.data(), n_q, k.data(), v.data(), n, keys, values);
    CHECK(std::isfinite(ok.kl.mean));
    q[d + 3] = 3e38f;
    CHECK_THROWS_WITH_AS(kvq::attention_error(q.data(), n_q, k.data(), v.data(), n, keys, values),
                         doctest::Contains("query 1's scores (q · k · scale) are beyond float's range"), std::invalid_argument);
    q[d + 3] = 1;
    CHECK_THROWS_AS(kvq::attention_error(q.data(), n_q, k.data(), v.data(), n, keys, values, NAN), std::invalid_argument);
}

TEST_CASE("compare_attention: non-finite results are refused by query and array") {
    const int d = 4, n_q = 2;
    const size_t n = 3;
    std::vector<float> s = {1, 2, 3, 1, 2, 3}, w = {0.1f, 0.2f, 0.7f, 0.1f, 0.2f, 0.7f}, o(n_q * d, 0.5f);
    CHECK(kvq::compare_attention(s.data(), w.data(), o.data(), s.data(), w.data(), o.data(), n_q, n, d).kl.worst == 0);
    // Finite scores and outputs whose float difference overflows: the errors are taken in double.
    std::vector<float> ref_s = {3e38f, 0, 0, 1, 2, 3}, far_s = {-3e38f, 0, 0, 1, 2, 3}, ref_o = o, far_o = o;
    ref_o[2] = 3e38f;
    far_o[2] = -3e38f;
    const auto far = kvq::compare_attention(ref_s.data(), w.data(), ref_o.data(), far_s.data(), w.data(), far_o.data(), n_q, n, d);
    CHECK(far.score_rmse.worst == doctest::Approx(std::sqrt(6.0)));  // an error of 6e38 over a spread of sqrt(2)·1e38
    CHECK(far.output_l2.worst == doctest::Approx(2.0));
    auto bad_w = w;
    bad_w[4] = NAN;  // a NaN weight is never > 0: it read as KL 0, top-k 1
    CHECK_THROWS_WITH_AS(kvq::compare_attention(s.data(), bad_w.data(), o.data(), s.data(), w.data(), o.data(), n_q, n, d),
                         doctest::Contains("query 1's reference weights are not finite"), std::invalid_argument);
    auto bad_o = o;
    bad_o[1] = INFINITY;
    CHECK_THROWS_WITH_AS(kvq::compare_attention(s.data(), w.data(), o.data(), s.data(), w.data(), bad_o.data(), n_q, n, d),
                         doctest::Contains("query 0's output"), std::invalid_argument);
}

TEST_CASE("load_model: a config.json that is a FIFO, huge, or a path fs cannot look at is a clear error") {
    Dump dump;  // a directory to hold the configs
    REQUIRE(::mkfifo(dump.file("config.json").c_str(), 0600) == 0);
    CHECK_THROWS_WITH_AS(kvq::load_model(dump.path.string()), doctest::Contains("config.json: is a FIFO"), std::invalid_argument);
    fs::remove(dump.file("config.json"));
    { std::ofstream(dump.file("config.json")) << "{}"; }
    fs::resize_file(dump.file("config.json"), uint64_t(1) << 30);  // sparse
    const long peak_before = peak_rss_kib();
    CHECK_THROWS_WITH_AS(kvq::load_model(dump.file("config.json")), doctest::Contains("more than the 16777216 this file may have"),
                         std::invalid_argument);
    CHECK(peak_rss_kib() - peak_before < 256 * 1024);
    CHECK_THROWS_AS(kvq::load_model(std::string(5000, 'a') + ".json"), std::invalid_argument);  // ENAMETOOLONG
}
