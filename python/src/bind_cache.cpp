// kvq.KVCache: the block-wise quantized KV cache (include/kvq/cache.hpp) with numpy in and out.
// Every call that touches K/V data releases the GIL (WithoutGil: safe at interpreter exit); the cache's
// own per-sequence locks make any call from any thread safe (include/kvq/cache.hpp), so calls on different
// sequences run in parallel and a sequence removed under another thread's call is a ValueError there.
#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "kvq/cache.hpp"

namespace kvq::python {
namespace {

using namespace pybind11::literals;

size_t non_negative(int64_t value, const char* name) {
    if (value < 0) raise_value_error(std::string(name) + " must be >= 0, got " + std::to_string(value));
    return static_cast<size_t>(value);
}

// exact_tail_tokens as validate_config's BadParams says it, whatever Python passes: an integer in
// 0..kMaxExactTailTokens (a float, a bool, or an int beyond C's int is not turned into a TypeError).
int parse_exact_tail_tokens(const py::object& x) {
    const std::string range = "exact_tail_tokens must be an integer in 0.." + std::to_string(kMaxExactTailTokens);
    if (py::isinstance<py::bool_>(x) || !PyIndex_Check(x.ptr())) {
        throw BadParams(range + ", got " + std::string(py::repr(x)));
    }
    const py::int_ n(py::reinterpret_steal<py::object>(PyNumber_Index(x.ptr())));
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(n.ptr(), &overflow);
    if (overflow != 0 || v < 0 || v > kMaxExactTailTokens) throw BadParams(range + ", got " + std::string(py::str(n)));
    return static_cast<int>(v);
}

SealPolicy parse_seal(const std::string& s) {
    if (s == "on_block_full") return SealPolicy::on_block_full;
    if (s == "on_append") return SealPolicy::on_append;
    raise_value_error("seal must be 'on_block_full' or 'on_append', got '" + s + "'");
}

StagingType parse_staging(const std::string& s) {
    if (s == "f32") return StagingType::f32;
    if (s == "f16") return StagingType::f16;
    raise_value_error("staging must be 'f32' or 'f16', got '" + s + "'");
}

NanPolicy parse_nan_policy(const std::string& s) {
    if (s == "reject") return NanPolicy::reject;
    if (s == "propagate") return NanPolicy::propagate;
    raise_value_error("nan_policy must be 'reject' or 'propagate', got '" + s + "'");
}

// None: full attention everywhere; an int: that window on every layer; a list: one window per layer.
std::vector<int> parse_sliding_window(const py::object& w, int n_layers) {
    if (w.is_none()) return {};
    if (py::isinstance<py::int_>(w)) return std::vector<int>(n_layers > 0 ? n_layers : 0, w.cast<int>());
    try {
        return w.cast<std::vector<int>>();
    } catch (const py::cast_error&) {
        raise_value_error("sliding_window must be None, an int or a list of ints (one per layer)");
    }
}

// None, or an array of shape (n_layers, n_kv_heads, head_dim) (CacheConfig::key_scales; validate_config
// checks the values).
std::vector<float> parse_key_scales(const py::object& o, int n_layers, int n_kv_heads, int head_dim) {
    if (o.is_none()) return {};
    const CheckedArray a = float_array(o, "KVCache: key_scales",
                                       {{"n_layers", n_layers}, {"n_kv_heads", n_kv_heads}, {"head_dim", head_dim}});
    return std::vector<float>(a.floats(), a.floats() + a.size);
}

// A path as Python gives it (str, bytes or os.PathLike) in the file system's encoding. A NUL byte would
// end the C path early (a file other than the one named): ValueError, as open() raises.
std::string fs_path(const py::object& path) {
    std::string p = py::module_::import("os").attr("fsencode")(path).cast<std::string>();
    if (p.find('\0') != std::string::npos) raise_value_error("path holds a NUL byte: " + py::repr(path).cast<std::string>());
    return p;
}

// None, or one entry per layer: None (the default codecs) or a (key, value) pair whose items may be None.
std::vector<LayerCodecs> parse_layer_codecs(const py::object& o) {
    std::vector<LayerCodecs> out;
    if (o.is_none()) return out;
    const auto name = [](const py::handle& x) { return x.is_none() ? std::string() : py::cast<std::string>(x); };
    for (const py::handle& entry : o) {
        if (entry.is_none()) {
            out.emplace_back();
            continue;
        }
        if (py::isinstance<py::str>(entry) || !py::isinstance<py::sequence>(entry) || py::len(entry) != 2) {
            raise_value_error("layer_codecs: each entry must be None or a (key codec, value codec) pair");
        }
        const py::sequence pair = py::reinterpret_borrow<py::sequence>(entry);
        out.push_back({name(pair[0]), name(pair[1])});
    }
    return out;
}

class PyKVCache {
public:
    explicit PyKVCache(const CacheConfig& config) : cache_(config) {}
    explicit PyKVCache(KVCache&& loaded) : cache_(std::move(loaded)) {}

    static std::unique_ptr<PyKVCache> load(const py::object& path, int64_t max_blocks, int64_t max_bytes, int64_t grow_blocks,
                                           int threads, bool int8_value_weights) {
        const std::string p = fs_path(path);
        LoadOptions options;
        options.max_blocks = non_negative(max_blocks, "load: max_blocks");
        options.max_bytes = non_negative(max_bytes, "load: max_bytes");
        options.grow_blocks = non_negative(grow_blocks, "load: grow_blocks");
        options.threads = threads;
        options.int8_value_weights = int8_value_weights;
        WithoutGil unlocked;
        return std::make_unique<PyKVCache>(KVCache::load(p, options));
    }

    // seq=None: every sequence.
    void save(const py::object& path, std::optional<SequenceId> seq) const {
        const std::string p = fs_path(path);
        WithoutGil unlocked;
        if (seq) {
            cache_.save(p, *seq);
        } else {
            cache_.save(p);
        }
    }

    std::vector<SequenceId> load_into(const py::object& path) {
        const std::string p = fs_path(path);
        WithoutGil unlocked;
        return cache_.load_into(p);
    }

    const KVCache& cache() const { return cache_; }
    const CacheConfig& config() const { return cache_.config(); }
    int n_heads() const { return config().n_heads > 0 ? config().n_heads : config().n_kv_heads; }

    SequenceId add_sequence() {
        WithoutGil unlocked;
        return cache_.add_sequence();
    }

    SequenceId fork(std::optional<SequenceId> parent) {
        const SequenceId p = resolve(parent);
        WithoutGil unlocked;
        return cache_.fork(p);
    }

    void remove(SequenceId seq) {
        WithoutGil unlocked;
        cache_.remove(seq);
    }

    void truncate(int64_t n_tokens, std::optional<SequenceId> seq) {
        const SequenceId s = resolve(seq);
        const size_t n = non_negative(n_tokens, "truncate: n_tokens");
        WithoutGil unlocked;
        cache_.truncate(s, n);
    }

    void append(int layer, py::handle k_obj, py::handle v_obj, std::optional<SequenceId> seq) {
        const SequenceId s = resolve(seq);
        const py::ssize_t kv_heads = config().n_kv_heads, d = config().head_dim, dv = config().head_dim_v;
        const CheckedArray k = float_array(k_obj, "append: k", {{"T"}, {"n_kv_heads", kv_heads}, {"head_dim", d}});
        // A latent cache's values are its keys' leading values: v is None there, and only there.
        if (config().latent_values != v_obj.is_none()) {
            raise_value_error(config().latent_values ? "append: a latent cache (latent_values=True) takes v=None: its values are "
                                                       "the keys' leading head_dim_v values"
                                                     : "append: v is None, but only a latent cache (latent_values=True) takes none");
        }
        std::optional<CheckedArray> v;
        if (!v_obj.is_none()) v.emplace(float_array(v_obj, "append: v", {{"T", k.dim(0)}, {"n_kv_heads", kv_heads}, {"head_dim_v", dv}}));
        WithoutGil unlocked;
        cache_.append(layer, s, k.floats(), v ? v->floats() : nullptr, static_cast<size_t>(k.dim(0)));
    }

    py::array attend(int layer, py::handle q_obj, std::optional<SequenceId> seq) const {
        const SequenceId s = resolve(seq);
        const py::ssize_t heads = n_heads(), d = config().head_dim;
        const CheckedArray q = float_array(q_obj, "attend: q", {{"n_heads", heads}, {"head_dim", d}});
        auto out = new_float_array({heads, static_cast<py::ssize_t>(config().head_dim_v)});
        float* o = out.mutable_data();
        {
            WithoutGil unlocked;
            cache_.attend(layer, s, q.floats(), o);
        }
        return out;
    }

    py::array attend_prefill(int layer, py::handle q_obj, std::optional<SequenceId> seq) const {
        const SequenceId s = resolve(seq);
        const py::ssize_t heads = n_heads(), d = config().head_dim;
        const CheckedArray q =
            float_array(q_obj, "attend_prefill: q", {{"n_queries"}, {"n_heads", heads}, {"head_dim", d}});
        auto out = new_float_array({q.dim(0), heads, static_cast<py::ssize_t>(config().head_dim_v)});
        float* o = out.mutable_data();
        {
            WithoutGil unlocked;
            cache_.attend_prefill(layer, s, q.floats(), static_cast<size_t>(q.dim(0)), o);
        }
        return out;
    }

    // Many sequences of one layer in one call; q (n_seqs, n_heads, head_dim), seqs in the same order.
    py::array attend_batch(int layer, py::handle q_obj, const std::vector<SequenceId>& seqs) const {
        const py::ssize_t heads = n_heads(), d = config().head_dim;
        const CheckedArray q = float_array(q_obj, "attend_batch: q",
                                           {{"len(seqs)", static_cast<py::ssize_t>(seqs.size())}, {"n_heads", heads}, {"head_dim", d}});
        auto out = new_float_array({static_cast<py::ssize_t>(seqs.size()), heads, static_cast<py::ssize_t>(config().head_dim_v)});
        float* o = out.mutable_data();
        {
            WithoutGil unlocked;
            cache_.attend_batch(layer, seqs, q.floats(), o);
        }
        return out;
    }

    // Seconds per call of `calls` attends made by a C++ loop on this same cache: the in-process baseline
    // against which bench/python_attend.py measures what the Python call adds.
    double time_attend(int layer, py::handle q_obj, std::optional<SequenceId> seq, int calls) const {
        const SequenceId s = resolve(seq);
        if (calls < 1) raise_value_error("_time_attend: calls must be at least 1");
        const py::ssize_t heads = n_heads(), d = config().head_dim;
        const CheckedArray q = float_array(q_obj, "_time_attend: q", {{"n_heads", heads}, {"head_dim", d}});
        std::vector<float> out(static_cast<size_t>(heads) * config().head_dim_v);
        WithoutGil unlocked;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < calls; ++i) cache_.attend(layer, s, q.floats(), out.data());
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls;
    }

    size_t n_tokens(std::optional<SequenceId> seq, int layer) const {
        const SequenceId s = resolve(seq);
        WithoutGil unlocked;
        return cache_.n_tokens(s, layer);
    }

    // seq=None means the cache's only sequence, so single-sequence scripts need not carry an id around.
    SequenceId resolve(std::optional<SequenceId> seq) const {
        if (seq) return *seq;
        const auto all = cache_.sequences();
        if (all.size() != 1) {
            raise_value_error("seq=None needs exactly one sequence in the cache, there are " +
                              std::to_string(all.size()) + (all.empty() ? " (call add_sequence() first)" : ""));
        }
        return all.front();
    }

private:
    KVCache cache_;
};

std::unique_ptr<PyKVCache> make_cache(int n_layers, int n_kv_heads, int head_dim, std::optional<int> n_heads,
                                      std::string key_codec, std::string value_codec, int block_tokens,
                                      int64_t max_blocks, int64_t initial_blocks, int64_t grow_blocks,
                                      std::optional<float> scale, float softcap, const py::object& sliding_window,
                                      const std::string& seal, bool center_keys, const std::string& nan_policy,
                                      int threads, uint64_t seed, const std::string& staging,
                                      const py::object& layer_codecs, int64_t max_bytes, bool int8_value_weights,
                                      const py::object& exact_tail_tokens, const py::object& key_scales,
                                      std::optional<int> head_dim_v, bool latent_values) {
    CacheConfig c;
    c.n_layers = n_layers;
    c.n_kv_heads = n_kv_heads;
    c.n_heads = n_heads.value_or(0);
    c.head_dim = head_dim;
    c.head_dim_v = head_dim_v.value_or(0);  // None (or 0): head_dim
    c.latent_values = latent_values;
    c.key_codec = std::move(key_codec);
    c.value_codec = std::move(value_codec);
    c.block_tokens = block_tokens;
    c.max_blocks = non_negative(max_blocks, "max_blocks");
    c.max_bytes = non_negative(max_bytes, "max_bytes");
    c.layer_codecs = parse_layer_codecs(layer_codecs);
    c.initial_blocks = non_negative(initial_blocks, "initial_blocks");
    c.grow_blocks = non_negative(grow_blocks, "grow_blocks");
    c.scale = scale.value_or(0.0f);  // 0 (or None) = 1/sqrt(head_dim); validate_config checks the rest
    c.softcap = softcap;
    c.sliding_window = parse_sliding_window(sliding_window, n_layers);
    c.seal = parse_seal(seal);
    c.staging = parse_staging(staging);
    c.center_keys = center_keys;
    c.nan_policy = parse_nan_policy(nan_policy);
    c.int8_value_weights = int8_value_weights;
    c.exact_tail_tokens = parse_exact_tail_tokens(exact_tail_tokens);
    c.key_scales = parse_key_scales(key_scales, n_layers, n_kv_heads, head_dim);
    c.threads = threads;
    c.seed = seed;
    return std::make_unique<PyKVCache>(c);
}

py::dict config_dict(const CacheConfig& c, int n_heads) {
    py::dict d;
    d["n_layers"] = c.n_layers;
    d["n_kv_heads"] = c.n_kv_heads;
    d["n_heads"] = n_heads;
    d["head_dim"] = c.head_dim;
    d["head_dim_v"] = c.head_dim_v;
    d["latent_values"] = c.latent_values;
    d["key_codec"] = c.key_codec;
    d["value_codec"] = c.value_codec;
    d["block_tokens"] = c.block_tokens;
    d["max_blocks"] = c.max_blocks;
    d["max_bytes"] = c.max_bytes;
    py::object layers = py::none();
    if (!c.layer_codecs.empty()) {
        py::list l;
        for (const LayerCodecs& x : c.layer_codecs) {
            l.append(py::make_tuple(x.key.empty() ? py::object(py::none()) : py::str(x.key),
                                    x.value.empty() ? py::object(py::none()) : py::str(x.value)));
        }
        layers = l;
    }
    d["layer_codecs"] = layers;
    d["initial_blocks"] = c.initial_blocks;
    d["grow_blocks"] = c.grow_blocks;
    d["scale"] = c.scale > 0 ? py::object(py::float_(c.scale)) : py::object(py::none());
    d["softcap"] = c.softcap;
    d["sliding_window"] = c.sliding_window;
    d["seal"] = c.seal == SealPolicy::on_block_full ? "on_block_full" : "on_append";
    d["center_keys"] = c.center_keys;
    d["staging"] = c.staging == StagingType::f16 ? "f16" : "f32";
    d["nan_policy"] = c.nan_policy == NanPolicy::reject ? "reject" : "propagate";
    d["int8_value_weights"] = c.int8_value_weights;
    d["exact_tail_tokens"] = c.exact_tail_tokens;
    py::object scales = py::none();
    if (!c.key_scales.empty()) {
        py::array_t<float> a = new_float_array({c.n_layers, c.n_kv_heads, c.head_dim});
        std::copy(c.key_scales.begin(), c.key_scales.end(), a.mutable_data());
        scales = a;
    }
    d["key_scales"] = scales;
    d["threads"] = c.threads;
    d["seed"] = c.seed;
    return d;
}

py::dict pool_stats_dict(const PoolStats& s) {
    return py::dict("block_bytes"_a = s.block_bytes, "blocks_total"_a = s.blocks_total,
                    "blocks_used"_a = s.blocks_used, "blocks_shared"_a = s.blocks_shared,
                    "blocks_reserved"_a = s.blocks_reserved, "max_blocks"_a = s.max_blocks,
                    "bytes_total"_a = s.bytes_total, "bytes_used"_a = s.bytes_used,
                    "bytes_reserved"_a = s.bytes_reserved, "max_bytes"_a = s.max_bytes);
}

void bind_cache(py::module_& m) {
    m.attr("MAX_BLOCK_TOKENS") = kMaxBlockTokens;  // KVCache(block_tokens=...) takes 1..this
    m.attr("MAX_EXACT_TAIL_TOKENS") = kMaxExactTailTokens;  // KVCache(exact_tail_tokens=...) takes 0..this
    py::register_exception<PoolExhausted>(m, "PoolExhausted", PyExc_MemoryError);
    py::register_exception<FileIOError>(m, "FileIOError", PyExc_OSError);
    py::register_exception<BadCacheFile>(m, "BadCacheFile", PyExc_ValueError);
    py::register_exception<ConfigMismatch>(m, "ConfigMismatch", PyExc_ValueError);
    py::register_exception<UnknownCodec>(m, "UnknownCodec", PyExc_ValueError);
    py::register_exception<BadHeadDim>(m, "BadHeadDim", PyExc_ValueError);
    py::register_exception<BadParams>(m, "BadParams", PyExc_ValueError);
    py::register_exception<NonFiniteInput>(m, "NonFiniteInput", PyExc_ValueError);

    py::class_<PyKVCache>(m, "KVCache", R"doc(
A paged KV cache that stores keys and values quantized (keys q8_0, values q4_0 by default) and computes
decode attention directly on the stored bytes.

    cache = kvq.KVCache(n_layers=32, n_kv_heads=8, head_dim=128, n_heads=32)
    seq = cache.add_sequence()
    cache.append(layer, k, v, seq=seq)      # k, v: (tokens, n_kv_heads, head_dim) float32
    out = cache.attend(layer, q, seq=seq)   # q: (n_heads, head_dim) -> (n_heads, head_dim) float32

key_codec is a codec of kvq.codecs() or, for keys only, "chan2" .. "chan8" (per-channel keys: per block
an fp16 minimum and step per channel; seal="on_block_full" only), then optionally "+center" (each block's
keys minus their fp16 mean per channel, kept beside the block; not for chanB) and "+sinkN" (the first N
keys of a sequence kept in fp16), in that order: "q4_0+rot+center+sink1". A layer's own key codec
(layer_codecs) takes them too. center_keys=True (deprecated) is "+center" on every key codec; config
reports center_keys=True when every key codec has it. seq=None means the cache's only sequence. Bad input raises ValueError and changes nothing; a pool with
max_blocks or max_bytes that runs out raises kvq.PoolExhausted (a MemoryError) and changes nothing; max_bytes
counts the blocks, the open blocks' float staging and each sequence's bookkeeping. Any call may come from
any thread with any id: different sequences run in parallel (the GIL is released while kvq works), calls
on one sequence wait for its appends and truncates, and a sequence removed by another thread meanwhile is
a ValueError. A Python exit with daemon threads inside kvq waits for their calls, then exits cleanly. int8_value_weights=True
multiplies q4_0 values by int8 weights (CacheConfig::int8_value_weights: each softmax weight times block
scale rounded to an int8 step per group of 16 rows of a block; faster at the avx2 and avx512 levels).
exact_tail_tokens=T keeps the most recent T tokens of each sequence and layer in the staging precision
(CacheConfig::exact_tail_tokens): a block is quantized only once all its tokens are more than T tokens old;
needs seal="on_block_full"; its staging counts in bytes_used, max_blocks and max_bytes. key_scales=s, an
array of shape (n_layers, n_kv_heads, head_dim) of positive finite floats (CacheConfig::key_scales), stores
keys as k * s and attends with q / s (s of the query head's kv head): the same scores, the keys' rounding
error moved to the channels where s is small; values untouched; saved in cache files.)doc")
        .def(py::init(&make_cache), "n_layers"_a, "n_kv_heads"_a, "head_dim"_a, "n_heads"_a = py::none(),
             "key_codec"_a = "q8_0", "value_codec"_a = "q4_0", py::kw_only(), "block_tokens"_a = 32,
             "max_blocks"_a = 0, "initial_blocks"_a = 0, "grow_blocks"_a = 64, "scale"_a = py::none(),
             "softcap"_a = 0.0f, "sliding_window"_a = py::none(), "seal"_a = "on_block_full",
             "center_keys"_a = false, "nan_policy"_a = "reject", "threads"_a = 1, "seed"_a = kDefaultSeed,
             "staging"_a = "f32", "layer_codecs"_a = py::none(), "max_bytes"_a = 0, "int8_value_weights"_a = false,
             "exact_tail_tokens"_a = 0, "key_scales"_a = py::none(), "head_dim_v"_a = py::none(),
             "latent_values"_a = false)
        .def_property_readonly("config", [](const PyKVCache& c) { return config_dict(c.config(), c.n_heads()); },
                               "The configuration as a dict (the constructor's keyword arguments).")
        .def_property_readonly("n_layers", [](const PyKVCache& c) { return c.config().n_layers; })
        .def_property_readonly("n_kv_heads", [](const PyKVCache& c) { return c.config().n_kv_heads; })
        .def_property_readonly("n_heads", &PyKVCache::n_heads)
        .def_property_readonly("head_dim", [](const PyKVCache& c) { return c.config().head_dim; })
        .def_property_readonly("head_dim_v", [](const PyKVCache& c) { return c.config().head_dim_v; },
                               "The values' (and results') head size: head_dim unless set apart.")
        .def_property_readonly("latent_values", [](const PyKVCache& c) { return c.config().latent_values; })
        .def_property_readonly("key_codec", [](const PyKVCache& c) { return c.cache().key_spec(); },
                               "The key codec as the configuration names it (with '+center' and '+sinkN').")
        .def_property_readonly("value_codec", [](const PyKVCache& c) { return c.cache().value_codec().name(); })
        .def(
            "layer_codecs",
            [](const PyKVCache& c) {
                std::vector<std::pair<std::string, std::string>> out;
                for (int l = 0; l < c.config().n_layers; ++l) out.emplace_back(c.cache().key_spec(l), c.cache().value_codec(l).name());
                return out;
            },
            "Each layer's (key codec, value codec) names (the key codec with '+center' and '+sinkN').")
        .def("add_sequence", &PyKVCache::add_sequence, "A new empty sequence; returns its id.")
        .def("fork", &PyKVCache::fork, "seq"_a = py::none(),
             "A new sequence with the same tokens as seq (full blocks shared, the open block copied); returns its id.")
        .def("truncate", &PyKVCache::truncate, "n_tokens"_a, py::kw_only(), "seq"_a = py::none(),
             "Keeps the first n_tokens tokens of every layer of seq: truncate(n_tokens, seq=seq). seq is\n"
             "keyword-only (C's kvq_cache_truncate takes the sequence first; two ints in either order would\n"
             "silently truncate another sequence).")
        .def("remove", &PyKVCache::remove, "seq"_a, "Removes a sequence; its blocks return to the pool.")
        .def("append", &PyKVCache::append, "layer"_a, "k"_a, "v"_a, "seq"_a = py::none(),
             "Appends tokens to one layer of seq: k and v of shape (tokens, n_kv_heads, head_dim), float32 or float16.")
        .def("attend", &PyKVCache::attend, "layer"_a, "q"_a, "seq"_a = py::none(),
             "Decode attention over every token of seq in this layer (its window, if it has one):\n"
             "q of shape (n_heads, head_dim) -> (n_heads, head_dim) float32.")
        .def("attend_prefill", &PyKVCache::attend_prefill, "layer"_a, "q"_a, "seq"_a = py::none(),
             "Causal attention for the last n_queries tokens of seq: q of shape (n_queries, n_heads, head_dim);\n"
             "query i sees the tokens up to and including its own. Returns the same shape, float32.")
        .def("attend_batch", &PyKVCache::attend_batch, "layer"_a, "q"_a, py::kw_only(), "seqs"_a,
             "Decode attention of several sequences of one layer in one call: q of shape (len(seqs), n_heads,\n"
             "head_dim) -> the same shape, float32; row i is bit-identical to attend(layer, q[i], seq=seqs[i]).\n"
             "The GIL is released and the work split across sequences, block ranges and kv heads.")
        .def("_time_attend", &PyKVCache::time_attend, "layer"_a, "q"_a, "seq"_a = py::none(), "calls"_a = 1,
             "Benchmark helper: seconds per attend call when a C++ loop makes `calls` calls.")
        .def("save", &PyKVCache::save, "path"_a, "seq"_a = py::none(),
             "Writes every sequence (seq=None) or one to path (str or os.PathLike): a temporary file beside it,\n"
             "synced and renamed over path, so an existing file is replaced whole or not at all. Raises\n"
             "kvq.FileIOError (an OSError) if the file cannot be written.")
        .def_static("load", &PyKVCache::load, "path"_a, py::kw_only(), "max_blocks"_a = 0, "max_bytes"_a = 0, "grow_blocks"_a = 64,
                    "threads"_a = 1, "int8_value_weights"_a = false,
                    "A new cache with the file's configuration and sequences (ids 0, 1, ... in the file's order).\n"
                    "Files store no pool limits and nothing of how attend runs: max_blocks, max_bytes (0 = no limit),\n"
                    "grow_blocks, threads and int8_value_weights are as for the constructor; the pool takes exactly\n"
                    "the file's blocks, and a file with more than max_blocks raises kvq.PoolExhausted before\n"
                    "anything is allocated. Raises kvq.FileIOError (OSError; also for\n"
                    "anything but a regular file) or kvq.BadCacheFile (ValueError: wrong magic or version,\n"
                    "truncated, corrupted, or rows the file's nan_policy does not admit).")
        .def("load_into", &PyKVCache::load_into, "path"_a,
             "Adds the file's sequences to this cache and returns their new ids. Raises kvq.FileIOError,\n"
             "kvq.BadCacheFile, kvq.ConfigMismatch (a ValueError naming the field that differs) or\n"
             "kvq.PoolExhausted, and then has changed nothing.")
        .def("n_tokens", &PyKVCache::n_tokens, "seq"_a = py::none(), "layer"_a = 0, "Tokens of seq in a layer.")
        .def("sequences", [](const PyKVCache& c) { return c.cache().sequences(); }, "Ids of the live sequences.")
        .def("__contains__", [](const PyKVCache& c, SequenceId s) { return c.cache().contains(s); })
        .def("bytes_used", [](const PyKVCache& c) { return c.cache().bytes_used(); },
             "Bytes of the blocks in use (shared blocks counted once), the float staging of open blocks and\n"
             "the per-sequence bookkeeping (metadata_bytes()); max_bytes bounds it with the free blocks.")
        .def("metadata_bytes", [](const PyKVCache& c) { return c.cache().metadata_bytes(); },
             "Bytes of the per-sequence bookkeeping (per-layer state of every sequence and 24 bytes per\n"
             "block-table entry), part of bytes_used() and counted against max_bytes.")
        .def(
            "bytes_per_token",
            [](const PyKVCache& c, std::optional<int> layer) {
                return layer ? c.cache().bytes_per_token(*layer) : c.cache().bytes_per_token();
            },
            "layer"_a = py::none(),
            "Key + value bytes per token, all layers (or one) and kv heads, in the sealed format (the exact tail\n"
            "is not in it: average_bytes_per_token counts it).")
        .def(
            "average_bytes_per_token",
            [](const PyKVCache& c, int layer, int64_t n_tokens) {
                return c.cache().average_bytes_per_token(layer, non_negative(n_tokens, "n_tokens"));
            },
            "layer"_a, "n_tokens"_a,
            "One layer's bytes per token averaged over a sequence of n_tokens tokens there: the exact tail's\n"
            "min(n_tokens, exact_tail_tokens) tokens at the staging precision, the rest sealed.")
        .def("pool_stats", [](const PyKVCache& c) { return pool_stats_dict(c.cache().pool_stats()); },
             "The block pool: block_bytes (of layer 0's codecs), blocks_total, blocks_used, blocks_shared,\n"
             "max_blocks, blocks_reserved (the open blocks' float staging, counted against max_blocks), and the\n"
             "same in bytes: bytes_total, bytes_used, bytes_reserved, max_bytes.")
        .def("dump", [](const PyKVCache& c) { return c.cache().dump(); }, "Block tables, for debugging.")
        .def("__repr__", [](const PyKVCache& c) {
            const auto& k = c.config();
            return "KVCache(n_layers=" + std::to_string(k.n_layers) + ", n_kv_heads=" + std::to_string(k.n_kv_heads) +
                   ", head_dim=" + std::to_string(k.head_dim) + ", n_heads=" + std::to_string(c.n_heads()) +
                   ", key_codec='" + k.key_codec + "', value_codec='" + k.value_codec + "', sequences=" +
                   std::to_string(c.cache().sequences().size()) + ")";
        });
}

const Registration registration("cache", bind_cache);

}  // namespace
}  // namespace kvq::python
