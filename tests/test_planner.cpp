// The memory planner reproduces the published fp16 KV-cache sizes, reads Hugging Face configs of the
// main model families, and counts every stored byte of each K/V format.
#include <doctest/doctest.h>

#include <stdexcept>

#include "kvq/cache.hpp"
#include "kvq/research/planner.hpp"
#include "kvq/research/report.hpp"
#include "test_util.hpp"

namespace {

const kvq::KVFormat kF16 = kvq::KVFormat::parse("f16/f16");

double fp16_per_token(const char* preset) { return kvq::kv_bytes_per_token(kvq::model_preset(preset), kF16); }

}  // namespace

TEST_CASE("planner: fp16 bytes per token of the presets match the published figures") {
    CHECK(fp16_per_token("gpt2-xl") == 300.0 * 1024);      // 48 layers × 25 heads × 64 × 2 (K,V) × 2 bytes
    CHECK(fp16_per_token("llama-3-8b") == 128.0 * 1024);   // 32 layers × 8 kv heads × 128 × 2 × 2
    CHECK(fp16_per_token("llama-3-70b") == 320.0 * 1024);  // 80 layers × 8 kv heads × 128 × 2 × 2
    CHECK(fp16_per_token("mistral-7b") == 128.0 * 1024);
    CHECK(fp16_per_token("deepseek-v3") == 61 * (512 + 64) * 2);  // 70272 bytes
    CHECK(kvq::human_bytes(fp16_per_token("deepseek-v3")) == "68.6 KiB");
    CHECK(kvq::human_bytes(fp16_per_token("gpt2-xl")) == "300.0 KiB");
    CHECK(kvq::human_bytes(fp16_per_token("llama-3-8b")) == "128.0 KiB");
}

TEST_CASE("planner: Gemma 3 keeps five of every six layers in a 1024-token window") {
    const auto m = kvq::model_preset("gemma-3-27b");
    REQUIRE(m.n_layers == 62);
    CHECK(m.local_layers() == 52);  // layers 5, 11, ..., 59 are global: 10 of them
    CHECK(m.window(5) == 0);
    CHECK(m.window(0) == 1024);
    const double per_layer_token = 16 * 128 * 2 * 2;
    CHECK(kvq::kv_bytes(m, kF16, 32768) == per_layer_token * (10 * 32768.0 + 52 * 1024.0));
    CHECK(kvq::kv_bytes(m, kF16, 512, 3) == per_layer_token * 62 * 512 * 3);  // shorter than the window
}

TEST_CASE("planner: quantized formats count scales and centering means") {
    const auto llama = kvq::model_preset("llama-3-8b");
    // q8_0: 34 bytes per 32 values; q4_0: 18 bytes per 32 values.
    CHECK(kvq::kv_bytes_per_token(llama, kvq::KVFormat::parse("q8_0/q4_0")) == 32 * 8 * (4 * 34 + 4 * 18));
    // +center: one fp16 mean per channel per 32-token block = 2·128/32 bytes per token and kv head.
    CHECK(kvq::kv_bytes_per_token(llama, kvq::KVFormat::parse("q4_0+center/q4_0")) == 32 * 8 * (4 * 18 + 8 + 4 * 18));
    CHECK(kvq::kv_bytes_per_token(llama, kvq::KVFormat::parse("q4_0+rot/q4_0")) ==
          kvq::kv_bytes_per_token(llama, kvq::KVFormat::parse("q4_0/q4_0")));
    // MLA: the key codec stores the 576-value latent row; the value codec does not apply.
    const auto ds = kvq::model_preset("deepseek-v3");
    CHECK(kvq::kv_bytes_per_token(ds, kvq::KVFormat::parse("q8_0/q4_0")) == 61 * 18 * 34);
    CHECK(kvq::kv_bytes_per_token(ds, kvq::KVFormat::parse("q8_0/f32")) == 61 * 18 * 34);

    const auto rows = kvq::plan_memory(llama, kvq::parse_kv_formats("f16/f16,q8_0/q4_0"), {.context = 8192, .batch = 2});
    REQUIRE(rows.size() == 2);
    CHECK(rows[0].compression == 1.0);
    CHECK(rows[1].bytes_total == 32.0 * 8 * (4 * 34 + 4 * 18) * 8192 * 2);
    CHECK(rows[1].fp16_bytes_total == 128.0 * 1024 * 8192 * 2);
    CHECK(rows[1].compression == doctest::Approx(128.0 * 1024 / (32 * 8 * 208)));
}

TEST_CASE("planner: a format of its own for sliding-window layers (K/V|K2/V2) counts each layer at its pair") {
    const kvq::ModelShape m = kvq::model_preset("gemma-3-4b");  // 34 layers, 29 in a window
    REQUIRE(m.local_layers() == 29);
    const auto layered = kvq::KVFormat::parse("q8_0/q8_0|q4_0+rot/q4_0");
    CHECK(layered.label() == "q8_0/q8_0|q4_0+rot/q4_0");
    CHECK(layered.on_layer(true).key_codec == "q4_0+rot");
    CHECK(layered.on_layer(false).value_codec == "q8_0");
    const auto q8 = kvq::KVFormat::parse("q8_0/q8_0"), q4 = kvq::KVFormat::parse("q4_0+rot/q4_0");
    const double per_layer8 = kvq::kv_bytes_per_token(m, q8) / m.n_layers, per_layer4 = kvq::kv_bytes_per_token(m, q4) / m.n_layers;
    CHECK(kvq::kv_bytes_per_token(m, layered) == doctest::Approx(5 * per_layer8 + 29 * per_layer4));
    const size_t context = 8192;
    CHECK(kvq::kv_bytes(m, layered, context) == doctest::Approx(5 * per_layer8 * context + 29 * per_layer4 * 1024));
    const auto row = kvq::plan_memory(m, {layered})[0];
    CHECK(row.key_bits == doctest::Approx((5 * 8.5 + 29 * 4.5) / 34));
    CHECK(row.value_bits == doctest::Approx((5 * 8.5 + 29 * 4.5) / 34));
    CHECK_THROWS_WITH_AS(kvq::KVFormat::parse("q8_0/q8_0|q4_0/q4_0|f16/f16"), doctest::Contains("at most one '|'"), std::invalid_argument);
    CHECK_THROWS_AS(kvq::KVFormat::parse("q8_0/q8_0|q4_0"), std::invalid_argument);
    // Keys centered on some layers only: "+center" is a layer's key spec, so a KVCache holds it.
    const auto half = kvq::plan_memory(m, {kvq::KVFormat::parse("q8_0/q8_0|q4_0+center/q4_0")})[0];
    CHECK(half.supported);
    CHECK(half.error.empty());
}

TEST_CASE("planner: a head size a codec cannot take gives an unsupported row, not a crash") {
    kvq::ModelShape phi = kvq::model_from_hf_config(
        R"({"model_type": "phi", "num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 2560})", "phi-2");
    CHECK(phi.head_dim == 80);
    const auto rows = kvq::plan_memory(phi, kvq::parse_kv_formats("f16/f16,q4_0/q4_0"));
    CHECK(rows[0].supported);
    CHECK_FALSE(rows[1].supported);
    CHECK(rows[1].error.find("multiple of 32") != std::string::npos);
}

TEST_CASE("planner: Hugging Face configs of the main families") {
    SUBCASE("Llama 3 8B") {
        const auto m = kvq::model_from_hf_config(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
            "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rope_scaling": null,
            "model_type": "llama", "rope_theta": 500000.0, "tie_word_embeddings": false})");
        CHECK(kvq::kv_bytes_per_token(m, kF16) == 128 * 1024);
        CHECK(m.sliding_window.empty());
    }
    SUBCASE("GPT-2 XL") {
        const auto m = kvq::model_from_hf_config(R"({"model_type": "gpt2", "n_embd": 1600, "n_head": 25, "n_layer": 48})");
        CHECK(kvq::kv_bytes_per_token(m, kF16) == 300 * 1024);
    }
    SUBCASE("DeepSeek V3 (MLA)") {
        const auto m = kvq::model_from_hf_config(R"({"model_type": "deepseek_v3", "num_hidden_layers": 61,
            "num_attention_heads": 128, "num_key_value_heads": 128, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 128, "v_head_dim": 128, "hidden_size": 7168})");
        CHECK(m.is_mla());
        CHECK(kvq::kv_bytes_per_token(m, kF16) == 70272);
    }
    SUBCASE("Gemma 3 12B, multimodal config with text_config and no layer_types") {
        const auto m = kvq::model_from_hf_config(R"({"architectures": ["Gemma3ForConditionalGeneration"],
            "model_type": "gemma3", "text_config": {"model_type": "gemma3_text", "head_dim": 256, "hidden_size": 3840,
            "num_attention_heads": 16, "num_hidden_layers": 48, "num_key_value_heads": 8, "sliding_window": 1024},
            "vision_config": {"num_hidden_layers": 27}})");
        CHECK(m.n_layers == 48);
        CHECK(m.head_dim == 256);
        CHECK(m.local_layers() == 40);
        CHECK(m.window(11) == 0);
        CHECK(m.window(10) == 1024);
    }
    SUBCASE("layer_types lists each layer's attention") {
        const auto m = kvq::model_from_hf_config(R"({"num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 64, "sliding_window": 512,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]})");
        CHECK(m.sliding_window == std::vector<int>{512, 0, 512});
    }
    SUBCASE("Mistral v0.1 windows every layer; Qwen 2 ignores sliding_window unless use_sliding_window") {
        const auto mistral = kvq::model_from_hf_config(R"({"model_type": "mistral", "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096, "sliding_window": 4096})");
        CHECK(mistral.local_layers() == 32);
        const auto qwen = kvq::model_from_hf_config(R"({"model_type": "qwen2", "num_hidden_layers": 28,
            "num_attention_heads": 28, "num_key_value_heads": 4, "hidden_size": 3584, "sliding_window": 131072,
            "use_sliding_window": false})");
        CHECK(qwen.sliding_window.empty());
        CHECK(kvq::kv_bytes_per_token(qwen, kF16) == 28 * 4 * 128 * 2 * 2);
    }
}

TEST_CASE("planner: bad configs and names are clear errors") {
    CHECK_THROWS_WITH_AS(kvq::model_from_hf_config("{\"num_hidden_layers\": 2,", "broken"),
                         doctest::Contains("not valid JSON"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(kvq::model_from_hf_config(R"({"hidden_size": 64})", "x"), doctest::Contains("no layer count"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(kvq::model_from_hf_config(R"({"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 64})", "x"),
                         doctest::Contains("not a multiple"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(kvq::model_from_hf_config(R"({"num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 64,
                         "layer_types": ["full_attention"]})", "x"), doctest::Contains("layer_types has 1 entries"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(kvq::model_preset("llama-9"), doctest::Contains("gpt2-xl"), std::invalid_argument);
    CHECK_THROWS_AS(kvq::load_model("/nonexistent/config.json"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(kvq::KVFormat::parse("q8_0"), doctest::Contains("KEY_CODEC/VALUE_CODEC"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(kvq::KVFormat::parse("q8_0/q3_9"), doctest::Contains("unknown codec 'q3_9'"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(kvq::KVFormat::parse("q8_0/q4_0+center"), doctest::Contains("keys only"), std::invalid_argument);
}

TEST_CASE("the planner's KVCache figure holds within 1% of a real cache (blocks, staging, windows, bookkeeping)") {
    kvq::ModelShape m;
    m.name = "small";
    m.n_layers = 4;
    m.n_heads = 8;
    m.n_kv_heads = 2;
    m.head_dim = 64;
    // Both orders: a per-layer pair's block size must come from each layer's own pair (Gemma 3 starts
    // with windowed layers; the full layers' blocks were once taken from layer 0's pair).
    for (const std::vector<int>& windows : {std::vector<int>{0, 96, 0, 96}, std::vector<int>{96, 96, 0, 96}}) {
    m.sliding_window = windows;
    for (const kvq::KVFormat& f : {kvq::KVFormat::parse("q8_0/q4_0"), kvq::KVFormat::parse("q4_0+center/q4_0"),
                                   kvq::KVFormat::parse("q8_0/q8_0|q4_0+rot/q4_0"),
                                   kvq::KVFormat::parse("chan3/q4_0"), kvq::KVFormat::parse("q8_0/q4_0|chan4/polar:budget=3.5")}) {
      for (const kvq::StagingType staging : {kvq::StagingType::f32, kvq::StagingType::f16}) {
        for (size_t context : {size_t(40), size_t(1040)}) {
            CAPTURE(f.label());
            CAPTURE(context);
            CAPTURE(staging == kvq::StagingType::f16);
            const size_t batch = 3;
            kvq::CacheConfig cfg;
            cfg.n_layers = m.n_layers;
            cfg.n_kv_heads = m.n_kv_heads;
            cfg.n_heads = m.n_heads;
            cfg.head_dim = m.head_dim;
            cfg.key_codec = f.key_codec;
            cfg.value_codec = f.value_codec;
            cfg.center_keys = f.center_keys;
            cfg.sliding_window = m.sliding_window;
            for (int l = 0; f.window && l < m.n_layers; ++l) {
                const kvq::KVFormat& lf = f.on_layer(m.window(l) > 0);
                cfg.layer_codecs.push_back({lf.key_codec, lf.value_codec});
            }
            cfg.staging = staging;
            kvq::KVCache cache(cfg);
            const auto k = kvq::test::gaussian(size_t(m.n_kv_heads) * m.head_dim, 3);
            for (size_t b = 0; b < batch; ++b) {
                const auto s = cache.add_sequence();
                for (size_t t = 0; t < context; ++t) {  // decode: a token at a time
                    for (int l = 0; l < m.n_layers; ++l) cache.append(l, s, k.data(), k.data(), 1);
                }
            }
            const double plan = kvq::plan_memory(m, {f}, {context, batch, 32, staging})[0].cache_bytes_total;
            CAPTURE(windows[0]);
            CHECK(plan == doctest::Approx(static_cast<double>(cache.bytes_used())).epsilon(0.01));
        }
      }
    }
    }
}

TEST_CASE("kvq plan for DeepSeek V3 at 128k tokens: a real latent cache's bytes (one layer's, times 61)") {
    // The preset's latent row (512 + 64 rope values) in one layer of a real KVCache with latent_values,
    // filled to 131072 tokens: the plan's figure for 61 layers is 61 of it (plus the bookkeeping).
    const auto ds = kvq::model_preset("deepseek-v3");
    const size_t context = 131072;
    for (const char* codec : {"q8_0", "q4_0", "f16"}) {
        CAPTURE(codec);
        const kvq::KVFormat f = kvq::KVFormat::parse(std::string(codec) + "/" + codec);
        kvq::CacheConfig cfg;
        cfg.n_layers = 1;
        cfg.head_dim = ds.key_row_dim();
        cfg.head_dim_v = ds.mla_latent_dim;
        cfg.latent_values = true;
        cfg.key_codec = codec;
        cfg.value_codec = "";
        kvq::KVCache cache(cfg);
        const auto s = cache.add_sequence();
        const size_t chunk = 8192;
        const auto k = kvq::test::gaussian(chunk * cfg.head_dim, 5);
        for (size_t t = 0; t < context; t += chunk) cache.append(0, s, k.data(), nullptr, chunk);
        const double one_layer = static_cast<double>(cache.bytes_used() - kvq::KVCache::sequence_bookkeeping_bytes(1));
        const auto plan = kvq::plan_memory(ds, {f}, {context, 1, 32})[0];
        REQUIRE(plan.supported);
        const double want = 61 * one_layer + static_cast<double>(kvq::KVCache::sequence_bookkeeping_bytes(61));
        CHECK(plan.cache_bytes_total == doctest::Approx(want).epsilon(0.001));
        // and the planner's per-token figure (the latent row alone) is what the cache stores per token
        CHECK(plan.bytes_per_token == doctest::Approx(61 * cache.bytes_per_token()));
    }
}
