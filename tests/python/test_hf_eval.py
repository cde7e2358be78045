"""kvq.eval_model and `kvq eval`: perplexity, KL and same-top-token % per K/V pair, on a tiny random Llama
saved with a word-level tokenizer (nothing downloaded). Skipped without torch and transformers."""

import contextlib
import itertools
import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

import kvq  # noqa: E402
from kvq import cli, model_eval  # noqa: E402

WORDS = 60


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny Llama (3 layers, GQA 4/2, head_dim 32) and a word-level tokenizer with a BOS token, saved."""
    root = tmp_path_factory.mktemp("tiny_llama")
    vocab = {"<unk>": 0, "<bos>": 1, "<pad>": 2, **{f"w{i}": 3 + i for i in range(WORDS)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", unk_token="<unk>",
                                                pad_token="<pad>")
    fast.save_pretrained(root)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                      max_position_embeddings=256, bos_token_id=1, pad_token_id=2)
    transformers.LlamaForCausalLM(config).save_pretrained(root)
    rng = np.random.default_rng(3)
    # Some structure to predict: a random walk over the words.
    walk = np.cumsum(rng.integers(-2, 3, size=700)) % WORDS
    (root / "text.txt").write_text(" ".join(f"w{i}" for i in walk))
    return root


@pytest.fixture(scope="module")
def loaded(tiny_dir):
    return model_eval.load_model(tiny_dir)


def test_eval_model_metrics(loaded, tiny_dir):
    model, tok = loaded
    text = (tiny_dir / "text.txt").read_text()
    r = kvq.eval_model(model, tok, text=text, pairs=["f32/f32", "q8_0/q8_0", "q4_0/q4_0", "f16/f16", "q8_0/q4_0"],
                       ctx=64, max_chunks=4)
    base, same, q8, q4, f16, q8q4 = r.rows
    assert base["pair"] == "f32/f32 (baseline)" and r.info["chunks"] == 4 and r.info["scored_tokens"] == 4 * 31
    # The same pair as the baseline computes the same thing: no divergence at all.
    assert same["kl_mean"] == 0 and same["kl_p99"] == 0 and same["same_top"] == 100 and same["ppl"] == base["ppl"]
    assert same["kl_mean_se"] == 0 and same["kl_max"] == 0 and same["same_top_se"] == 0
    assert 0 < q8["kl_mean"] < q4["kl_mean"] and q8["kl_mean"] <= q8["kl_p99"]
    assert q4["kl_median"] <= q4["kl_p99"] <= q4["kl_p99_9"] <= q4["kl_max"] and 0 < q4["kl_mean_se"] < q4["kl_mean"]
    assert q4["same_top"] <= 100 and q4["ppl_ratio"] == pytest.approx(q4["ppl"] / base["ppl"])
    # Bytes per token: 3 layers x 2 kv heads x 32 values, K and V (q8_0: 34 bytes per 32 values).
    assert base["kib_per_token"] == pytest.approx(3 * 2 * 2 * 32 * 4 / 1024)
    assert q8["kib_per_token"] == pytest.approx(3 * 2 * 2 * 34 / 1024)
    # Bits per value, everything stored: q8_0 8.5 (34 bytes per 32 values), q4_0 4.5 (18), the pair their mean.
    bits = {row["pair"]: (row["bits_per_value"], row["key_bits"], row["value_bits"]) for row in r.rows}
    assert bits == {"f32/f32 (baseline)": (32, 32, 32), "f32/f32": (32, 32, 32), "q8_0/q8_0": (8.5, 8.5, 8.5),
                    "q4_0/q4_0": (4.5, 4.5, 4.5), "f16/f16": (16, 16, 16), "q8_0/q4_0": (6.5, 8.5, 4.5)}
    assert all(row["tokens_per_s"] > 0 for row in r.rows)


def test_eval_perplexity_equals_an_independent_computation(loaded, tiny_dir):
    model, tok = loaded
    text = (tiny_dir / "text.txt").read_text()
    r = kvq.eval_model(model, tok, text=text, pairs=["f32/f32"], ctx=64, max_chunks=3, baseline="hf")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    nll = []
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        for c in range(3):
            x = torch.tensor([[tok.bos_token_id] + ids[c * 63:(c + 1) * 63]])
            logp = torch.log_softmax(model(x).logits[0].double(), dim=-1)
            nll += [-logp[t, x[0, t + 1]].item() for t in range(32, 63)]
    model.set_attn_implementation("kvq")
    assert r.rows[0]["ppl"] == pytest.approx(math.exp(np.mean(nll)), rel=1e-5)
    # kvq f32 against transformers' attention: float32 rounding only (measured 3e-8).
    assert r.rows[1]["kl_mean"] < 1e-6 and r.rows[1]["same_top"] == 100


def test_eval_per_layer_and_formats(loaded, tiny_dir, tmp_path):
    model, tok = loaded
    text = (tiny_dir / "text.txt").read_text()
    r = kvq.eval_model(model, tok, text=text, pairs=["q4_0/q4_0"], ctx=64, max_chunks=2, per_layer=True)
    assert [(x["pair"], x["layer"]) for x in r.per_layer] == [("q4_0/q4_0", l) for l in range(3)]
    assert all(x["kl_mean"] > 0 and x["window"] == "full" for x in r.per_layer)
    # One layer quantized diverges less than all three.
    assert max(x["kl_mean"] for x in r.per_layer) < r.rows[1]["kl_mean"]
    md = r.format("markdown")
    assert md.splitlines()[0].startswith("| K/V | bits/value | PPL | PPL ratio | KL mean | ± | KL median | KL p99 |")
    assert "| q4_0/q4_0 | 4.50 |" in md
    assert r.format("csv", table="layers").splitlines()[0] == ("pair,layer,window,bits_per_value,kl_mean,kl_mean_se,"
                                                                "kl_median,kl_p99,kl_p99_9,same_top,ppl")
    assert all(x["bits_per_value"] == 4.5 for x in r.per_layer)
    assert json.loads(r.format("json"))["per_layer"][2]["layer"] == 2
    pytest.importorskip("matplotlib")
    model_eval.plot_per_layer(r.per_layer, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_eval_a_pair_for_sliding_window_layers(loaded, tiny_dir):
    # "K/V|K2/V2": K2/V2 on sliding-window layers only; this Llama has none, so the first pair is everywhere.
    model, tok = loaded
    text = (tiny_dir / "text.txt").read_text()
    r = kvq.eval_model(model, tok, text=text, pairs=["q4_0/q4_0", "q4_0/q4_0|f32/f32", "f32/f32|q4_0/q4_0"],
                       ctx=64, max_chunks=1)
    assert [x["pair"] for x in r.rows[1:]] == ["q4_0/q4_0", "q4_0/q4_0|f32/f32", "f32/f32|q4_0/q4_0"]
    assert r.rows[2]["kl_mean"] == r.rows[1]["kl_mean"] > 0
    assert r.rows[3]["kl_mean"] == 0
    # The pair's "|" is escaped in Markdown, where it would split the cell.
    assert "\n| q4_0/q4_0\\|f32/f32 | 4.50 |" in r.format("markdown")
    assert r.format("csv").splitlines()[3].startswith("q4_0/q4_0|f32/f32,4.50,")


def llama_perplexity_kl_stats(values):
    """What llama.cpp's tools/perplexity/perplexity.cpp prints of per-token KLDs, transcribed from its C++
    (mean_and_uncertainty on running sums, the median, and its percentile lambda on the sorted values)."""
    n = len(values)
    total, total2 = sum(values), sum(x * x for x in values)
    mean = total / n
    var = total2 / n - mean * mean
    se = math.sqrt(var / (n - 1)) if var > 0 and n > 10 else 0.0
    v = sorted(values)
    median = 0.5 * (v[n // 2] + v[n // 2 - 1]) if n % 2 == 0 else v[n // 2]

    def percentile(fraction):
        p = fraction * (n - 1)
        ip = int(p)
        p -= ip
        return (1 - p) * v[ip] + p * v[min(ip + 1, n - 1)]

    return {"kl_mean": mean, "kl_mean_se": se, "kl_median": median, "kl_p90": percentile(0.9),
            "kl_p95": percentile(0.95), "kl_p99": percentile(0.99), "kl_p99_9": percentile(0.999), "kl_max": v[-1],
            "kl_min": v[0]}


def test_kl_statistics_are_llama_perplexity_s():
    # Known values: 0..10 (odd count), 0..9 (even: the median between the middle two).
    s = model_eval.kl_stats(np.arange(11.0))
    assert (s["kl_median"], s["kl_max"], s["kl_min"]) == (5, 10, 0)
    assert (s["kl_p90"], s["kl_p99"], s["kl_p99_9"]) == pytest.approx((9, 9.9, 9.99))
    assert s["kl_mean_se"] == pytest.approx(1.0)  # the sample standard deviation, sqrt(110 / 10), over sqrt(11)
    assert model_eval.kl_stats(np.arange(10.0))["kl_median"] == 4.5
    assert model_eval.kl_stats(np.arange(10.0))["kl_mean_se"] == 0  # n <= 10: llama.cpp prints 0
    # Skewed, as KLs are (a heavy tail), odd and even counts: everything as llama.cpp computes it.
    rng = np.random.default_rng(1)
    for n in (511, 1000, 10220):
        kl = rng.lognormal(-5, 2, size=n)
        ours, theirs = model_eval.kl_stats(kl), llama_perplexity_kl_stats(kl.tolist())
        assert ours.keys() == theirs.keys()
        for k in ours:
            assert ours[k] == pytest.approx(theirs[k], rel=1e-9), k
        assert ours["kl_p99_9"] != np.percentile(kl, 99.9, method="nearest")  # the definition matters here


def test_bits_per_value_of_per_layer_pairs():
    """A tiny Gemma 3 (layers: sliding 12, full, sliding 12): each layer counts at its own pair, every layer
    alike; +center adds a 16-bit mean per channel and block of 32 to the keys."""
    torch.manual_seed(1)
    config = transformers.Gemma3TextConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                           query_pre_attn_scalar=24, sliding_window=12, max_position_embeddings=256,
                                           layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    cache = kvq.hf.KVQCache(config, "q8_0", "q4_0", layer_codecs={0: "f16/f16", 2: "q4_0+center/q8_0"})
    assert [cache.bits_per_value(l) for l in range(3)] == [(16, 16), (8.5, 4.5), (5.0, 8.5)]
    assert cache.bits_per_value() == pytest.approx(((16 + 8.5 + 5) / 3, (16 + 4.5 + 8.5) / 3))
    assert cache.bytes_per_token() == pytest.approx(sum(sum(cache.bits_per_value(l)) for l in range(3)) * 2 * 32 / 8)
    # The same from a per-layer spec, and "K/V|K2/V2" (K2/V2 on the sliding layers 0 and 2).
    spec = kvq.hf.KVQCache.from_spec(config, "f16/f16;q8_0/q4_0;q4_0+center/q8_0")
    assert [spec.bits_per_value(l) for l in range(3)] == [(16, 16), (8.5, 4.5), (5.0, 8.5)]
    windowed = kvq.hf.KVQCache.from_spec(config, "q8_0/q4_0|q4_0/q4_0")
    assert [windowed.bits_per_value(l) for l in range(3)] == [(4.5, 4.5), (8.5, 4.5), (4.5, 4.5)]

    model = transformers.Gemma3ForCausalLM(config).eval()
    tokens = np.random.default_rng(0).integers(1, 64, size=64).tolist()
    r = kvq.eval_model(model, tokens=tokens, pairs=["q8_0/q4_0", "q8_0/q8_0|q4_0/q4_0", "q8_0+center/q4_0|f32/f32"],
                       ctx=32, max_chunks=1, per_layer=True, per_layer_pairs=["q8_0/q8_0|q4_0/q4_0"])
    bits = [(x["bits_per_value"], x["key_bits"], x["value_bits"]) for x in r.rows[1:]]
    centered_keys, values = (9 + 2 * 32) / 3, (4.5 + 2 * 32) / 3  # q8_0+center/q4_0 on layer 1, f32 on 0 and 2
    assert bits == pytest.approx([(6.5, 8.5, 4.5), ((8.5 + 2 * 4.5) / 3,) * 3,
                                  ((centered_keys + values) / 2, centered_keys, values)])
    # One layer quantized: the bits of that layer's pair (q8_0 on the full layer 1, q4_0 on the sliding ones).
    assert [x["bits_per_value"] for x in r.per_layer] == [4.5, 8.5, 4.5]


def test_eval_budget_proposes_and_evaluates_per_layer_pairs(loaded, tiny_dir):
    model, tok = loaded
    text = (tiny_dir / "text.txt").read_text()
    cands = ["q4_0/q4_0", "q8_0/q4_0", "q8_0/q8_0"]  # 4.5, 6.5, 8.5 bits per value
    r = kvq.eval_model(model, tok, text=text, ctx=64, max_chunks=2, budget=[5.5, 7.5], budget_pairs=cands)
    # The sensitivity: each candidate on one layer, the others f32.
    assert [(x["pair"], x["layer"]) for x in r.per_layer] == [(p, l) for p in cands for l in range(3)]
    kl = {(x["pair"], x["layer"]): x["kl_mean"] for x in r.per_layer}
    assert [p["budget"] for p in r.budget] == [5.5, 7.5] and r.info["sensitivity"] == {"chunks": 2}
    for prop in r.budget:
        chosen = [x["pair"] for x in prop["layers"]]
        assert prop["bits_per_value"] <= prop["budget"] and prop["spec"] == kvq._pairs.format_layer_pairs(chosen)
        assert prop["kl_predicted"] == pytest.approx(sum(kl[p, l] for l, p in enumerate(chosen)))
        # The least predicted KL of all 27 choices within the budget.
        bits = {"q4_0/q4_0": 4.5, "q8_0/q4_0": 6.5, "q8_0/q8_0": 8.5}
        best = min(sum(kl[p, l] for l, p in enumerate(c)) for c in itertools.product(cands, repeat=3)
                   if sum(bits[p] for p in c) <= 3 * prop["budget"])
        assert prop["kl_predicted"] == pytest.approx(best)
    # Evaluated after the candidates as uniform pairs, each layer at its pair: the bits add up as proposed.
    labels = [x["pair"] for x in r.rows]
    assert labels[:4] == ["f32/f32 (baseline)"] + cands and set(labels[4:]) == {p["spec"] for p in r.budget}
    for prop in r.budget:
        row = r.rows[labels.index(prop["spec"])]
        assert row["bits_per_value"] == pytest.approx(prop["bits_per_value"]) and row["kl_mean"] == prop["kl_mean"]
        assert prop["best_uniform"]["bits_per_value"] <= prop["budget"]
    assert r.budget[0]["best_uniform"]["pair"] == "q4_0/q4_0"
    # The spec read back by kvq eval: the same cache, so the same KL.
    spec = r.budget[0]["spec"]
    again = kvq.eval_model(model, tok, text=text, ctx=64, max_chunks=2, pairs=[spec])
    assert again.rows[1]["kl_mean"] == r.budget[0]["kl_mean"]
    # Given sensitivity rows, nothing is measured again and the proposals are the same.
    given = kvq.eval_model(model, tok, text=text, ctx=64, max_chunks=1, budget=5.5, sensitivity=r.per_layer,
                           per_layer=True)  # per_layer: the sensitivity rows, no more runs
    assert given.budget[0]["spec"] == spec and given.info["sensitivity"] == "given" and given.per_layer == r.per_layer
    assert [x["pair"] for x in given.rows[1:4]] == cands  # the candidates of the rows, as uniform pairs
    md = given.format("markdown", table="budget")
    assert md.startswith("Budget 5.5 bits/value: ") and f"--pairs '{spec}'" in md and "| layer | window | K/V |" in md
    assert given.format("csv", table="budget").splitlines()[0] == "budget,layer,window,pair,bits_per_value,kl_predicted"
    assert json.loads(given.format("json"))["budget"][0]["spec"] == spec
    with pytest.raises(ValueError, match="below the cheapest choice"):
        kvq.eval_model(model, tok, text=text, ctx=64, max_chunks=1, budget=4.4, sensitivity=r.per_layer)
    with pytest.raises(ValueError, match="names 2 layers; the model has 3"):
        kvq.eval_model(model, tok, text=text, ctx=64, max_chunks=1, pairs=["q8_0/q4_0;q4_0/q4_0"])


def test_eval_budget_without_candidates_takes_the_default_sides(loaded, tiny_dir):
    model, tok = loaded
    text = (tiny_dir / "text.txt").read_text()
    keys, values = model_eval.DEFAULT_BUDGET_KEYS, model_eval.DEFAULT_BUDGET_VALUES
    assert "tcq3+center" in keys and "tcq3" in values  # the rungs of docs/eval.md's best proposals
    r = kvq.eval_model(model, tok, text=text, ctx=64, max_chunks=1, budget=3.5)
    sides = [f"{k}/f32" for k in keys] + [f"f32/{v}" for v in values]
    assert [(x["pair"], x["layer"]) for x in r.per_layer] == [(p, l) for p in sides for l in range(3)]
    prop = r.budget[0]
    assert prop["candidates"] == [f"{k}/{v}" for k in keys for v in values]
    assert prop["bits_per_value"] <= 3.5
    assert [x["pair"] for x in r.rows] == ["f32/f32 (baseline)", prop["spec"]]  # only the proposal is evaluated


def test_eval_budget_over_key_and_value_sides(loaded, tiny_dir, tmp_path):
    model, tok = loaded
    text = (tiny_dir / "text.txt").read_text()
    keys, values = ["q4_0", "q8_0"], ["q4_0", "q8_0"]
    r = kvq.eval_model(model, tok, text=text, ctx=64, max_chunks=1, budget=6.5, budget_keys=keys, budget_values=values)
    # Measured: the sides, one layer at a time; proposed: from the pairs the sides make.
    assert [(x["pair"], x["layer"]) for x in r.per_layer] == [(p, l) for p in ["q4_0/f32", "q8_0/f32", "f32/q4_0",
                                                                                "f32/q8_0"] for l in range(3)]
    kl = {(x["pair"], x["layer"]): x["kl_mean"] for x in r.per_layer}
    prop = r.budget[0]
    assert prop["candidates"] == ["q4_0/q4_0", "q4_0/q8_0", "q8_0/q4_0", "q8_0/q8_0"]
    bits = {"q4_0": 4.5, "q8_0": 8.5}
    best = min(itertools.product(itertools.product(keys, values), repeat=3),
               key=lambda c: (sum(kl[f"{k}/f32", l] + kl[f"f32/{v}", l] for l, (k, v) in enumerate(c))
                              if sum(bits[k] + bits[v] for k, v in c) <= 6 * 6.5 else 1e9))
    assert [x["pair"] for x in prop["layers"]] == [f"{k}/{v}" for k, v in best]
    assert [x["pair"] for x in r.rows] == ["f32/f32 (baseline)", prop["spec"]]  # only the proposal is evaluated
    assert r.rows[1]["bits_per_value"] <= 6.5
    with pytest.raises(ValueError, match="go together"):
        kvq.eval_model(model, tok, text=text, ctx=64, max_chunks=1, budget=6.5, budget_keys=keys)
    with pytest.raises(ValueError, match="not both"):
        kvq.eval_model(model, tok, text=text, ctx=64, max_chunks=1, budget=6.5, budget_keys=keys,
                       budget_values=values, budget_pairs=["q8_0/q4_0"])
    with pytest.raises(ValueError, match="one codec, not a pair"):
        kvq.eval_model(model, tok, text=text, ctx=64, max_chunks=1, budget=6.5, budget_keys=["q8_0/q4_0"],
                       budget_values=values)
    rc = cli.main(["eval", str(tiny_dir), "--text", str(tiny_dir / "text.txt"), "--ctx", "64", "--budget", "6.5",
                   "--budget-keys", "q4_0", "--no-progress"])
    assert rc == 2


def test_eval_rejects_bad_arguments(loaded):
    model, tok = loaded
    with pytest.raises(ValueError, match="KEY/VALUE"):
        kvq.eval_model(model, tok, text="w1 w2", pairs=["q8_0"])
    with pytest.raises(ValueError, match="fewer than one chunk"):
        kvq.eval_model(model, tok, text="w1 w2 w3", pairs=["q8_0/q4_0"], ctx=64)
    with pytest.raises(ValueError, match="text .* or tokens"):
        kvq.eval_model(model, tok, pairs=["q8_0/q4_0"])
    with pytest.raises(ValueError, match="neither a model directory nor a GGUF"):
        model_eval.load_model("/nonexistent/model")


def test_kvq_eval_command(tiny_dir, tmp_path, capsys):
    out = tmp_path / "t.csv"
    plot = tmp_path / "layers.png"
    rc = cli.main(["eval", str(tiny_dir), "--text", str(tiny_dir / "text.txt"), "--pairs", "q8_0/q4_0,q4_0+rot+center/q4_0",
                   "--ctx", "64", "--max-chunks", "2", "--format", "csv", "--output", str(out), "--per-layer",
                   "--per-layer-pairs", "q4_0/q4_0", "--plot", str(plot), "--no-progress"])
    assert rc == 0
    lines = out.read_text().splitlines()
    assert lines[0] == ("pair,bits_per_value,ppl,ppl_ratio,kl_mean,kl_mean_se,kl_median,kl_p99,kl_p99_9,kl_max,same_top,"
                        "kib_per_token,tokens_per_s,key_bits,value_bits,kl_p90,kl_p95,kl_min,same_top_se,scored")
    assert lines[2].startswith("q8_0/q4_0,6.50,") and lines[3].startswith("q4_0+rot+center/q4_0,4.75,")
    assert [l.split(",")[0] for l in lines[1:4]] == ["f32/f32 (baseline)", "q8_0/q4_0", "q4_0+rot+center/q4_0"]
    assert "pair,layer,window" in out.read_text() and plot.exists()
    rc = cli.main(["eval", str(tmp_path / "missing"), "--text", str(tiny_dir / "text.txt")])
    assert rc == 2 and "neither a model directory nor a GGUF file" in capsys.readouterr().err  # a bad argument
    rc = cli.main(["eval", str(tiny_dir), "--text", str(tiny_dir / "text.txt"), "--plot", "x.png"])
    assert rc == 2 and "--per-layer" in capsys.readouterr().err
    rc = cli.main(["eval", str(tiny_dir), "--text", str(tiny_dir / "text.txt"), "--sensitivity", str(out)])
    assert rc == 2 and "go with --budget" in capsys.readouterr().err
    # A directory as the plot, or an output that cannot be written: refused before the model loads.
    plots = tmp_path / "plots"
    plots.mkdir()
    rc = cli.main(["eval", str(tiny_dir), "--text", str(tiny_dir / "text.txt"), "--per-layer", "--plot", str(plots)])
    assert rc == 2 and "is a directory" in capsys.readouterr().err and list(plots.iterdir()) == []
    rc = cli.main(["eval", str(tiny_dir), "--text", str(tiny_dir / "text.txt"), "--output", str(tmp_path / "no" / "t.md")])
    assert rc == 1 and "no such directory" in capsys.readouterr().err
    # key_scales (arrays) are recorded in the JSON as lists.
    model, tok = model_eval.load_model(tiny_dir)
    scales = {0: np.full((2, 32), 2.0, dtype=np.float32)}
    r = kvq.eval_model(model, tok, text=(tiny_dir / "text.txt").read_text(), pairs=["q4_0/q4_0"], ctx=64, max_chunks=1,
                       key_scales=scales)
    assert json.loads(r.format("json"))["info"]["cache_config"]["key_scales"]["0"][1][5] == 2.0
    # --key-scales norms needs per-head query and key norms (Gemma 3, Qwen 3): a Llama has none.
    rc = cli.main(["eval", str(tiny_dir), "--text", str(tiny_dir / "text.txt"), "--key-scales", "norms", "--ctx", "64",
                   "--max-chunks", "1", "--no-progress"])
    assert rc == 2 and "no q_norm and k_norm" in capsys.readouterr().err


def test_one_gguf_parse_shares_the_reader_of_a_file_and_restores_gguf(tmp_path):
    gguf = pytest.importorskip("gguf")
    paths = [tmp_path / "a.gguf", tmp_path / "b.gguf"]
    for i, p in enumerate(paths):
        w = gguf.GGUFWriter(str(p), "llama")
        w.add_uint32("test.value", i)
        w.add_tensor("t", np.arange(4, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    original = gguf.GGUFReader
    with model_eval._one_gguf_parse():
        a, again, b = gguf.GGUFReader(paths[0]), gguf.GGUFReader(str(paths[0])), gguf.GGUFReader(paths[1])
        assert a is again and a is not b
        assert [int(b.fields["test.value"].parts[-1][0]), list(b.tensors[0].data)] == [1, [0, 1, 2, 3]]
    assert gguf.GGUFReader is original
    assert gguf.GGUFReader(paths[0]) is not a


def test_kvq_eval_budget_command(tiny_dir, tmp_path, capsys):
    sens = tmp_path / "sens.json"
    common = ["eval", str(tiny_dir), "--text", str(tiny_dir / "text.txt"), "--ctx", "64", "--max-chunks", "1",
              "--no-progress"]
    rc = cli.main(common + ["--budget", "6", "--budget-pairs", "q4_0/q4_0,q8_0/q8_0", "--format", "json",
                            "--output", str(sens)])
    assert rc == 0
    first = json.loads(sens.read_text())
    assert first["info"]["budget"] == [6.0] and len(first["per_layer"]) == 6 and first["budget"][0]["bits_per_value"] <= 6
    # The per-layer KLs of that run, reused: the same proposal, printed after the table.
    rc = cli.main(common + ["--budget", "6", "--sensitivity", str(sens)])
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("| K/V | bits/value |")
    assert "Budget 6 bits/value: " in out and f"--pairs '{first['budget'][0]['spec']}'" in out
    for args, err in [(["--budget", "0"], "above 0"), (["--budget", "2", "--sensitivity", str(sens)], "below the cheapest"),
                      (["--budget", "6", "--sensitivity", str(tiny_dir / "text.txt")], "not the JSON of kvq eval")]:
        with pytest.raises(SystemExit) if err == "above 0" else contextlib.nullcontext():
            rc = cli.main(common + args)
            assert rc == 2
        assert err in capsys.readouterr().err
