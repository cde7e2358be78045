"""The sliding-window rules of Hugging Face configs live in two places on purpose: the planner (C++,
lib/eval/hf_config.cpp) reads a config.json without transformers, and kvq.hf (Python) reads the windows of
the live model from the config transformers resolved (layer_types). This test holds them to one answer:
for each family, transformers' own config, saved as config.json, gives the planner the windows kvq.hf
reads. Skipped without transformers."""

import json

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")
import kvq  # noqa: E402
import kvq.hf  # noqa: E402

COMMON = dict(vocab_size=64, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16)


@pytest.mark.parametrize("name,make", [
    ("llama", lambda: transformers.LlamaConfig(num_hidden_layers=4, **COMMON)),
    ("mistral", lambda: transformers.MistralConfig(num_hidden_layers=4, sliding_window=128, **COMMON)),
    ("mistral-none", lambda: transformers.MistralConfig(num_hidden_layers=4, sliding_window=None, **COMMON)),
    ("gemma2", lambda: transformers.Gemma2Config(num_hidden_layers=5, sliding_window=64, **COMMON)),
    ("gemma3", lambda: transformers.Gemma3TextConfig(num_hidden_layers=13, sliding_window=512, **COMMON)),
    ("qwen2-off", lambda: transformers.Qwen2Config(num_hidden_layers=6, sliding_window=256, **COMMON)),
    ("qwen2-on", lambda: transformers.Qwen2Config(num_hidden_layers=6, sliding_window=256, use_sliding_window=True,
                                                  max_window_layers=4, **COMMON)),
])
def test_planner_and_kvq_hf_read_the_same_windows(name, make, tmp_path):
    config = make()
    hf_windows = kvq.hf._layer_windows(config)
    (tmp_path / "config.json").write_text(config.to_json_string())
    plan = json.loads(kvq.plan(str(tmp_path / "config.json"), ["f16/f16"]).format("json"))
    planner = plan["model"]["sliding_window"] or [0] * config.num_hidden_layers
    assert planner == hf_windows, name
