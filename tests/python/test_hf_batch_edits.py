"""kvq.hf.KVQCache batch edits (issue 36, item 10): reorder_cache, batch_select_indices,
batch_repeat_interleave and crop take the indices and counts torch's own edits take (index_select,
indexing, repeat_interleave, an int) and refuse the rest with the reason; a refused or failed edit
(PoolExhausted) changes nothing. Skipped without torch and transformers."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import kvq  # noqa: E402
import kvq.hf  # noqa: E402


def tiny_llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   pad_token_id=0, head_dim=32)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.set_attn_implementation("kvq")
    return model


def filled_cache(model, rows=3, tokens=20, **kw):
    """A cache after one forward of `rows` different prompts."""
    cache = kvq.hf.KVQCache(model.config, "q8_0", "q4_0", **kw)
    ids = torch.randint(1, 96, (rows, tokens), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(ids, use_cache=True, **{kvq.hf.cache_keyword(model): cache})
    return cache


def state(cache):
    """What a batch edit may change: every kvq sequence's id and tokens, the rows' sequences, the masks."""
    return ([(c.sequences(), [c.n_tokens(s, 0) for s in c.sequences()], c.bytes_used()) for c in cache.kvq_caches],
            [list(g.seqs) for g in cache._groups], [None if l.valid is None else l.valid.clone() for l in cache.layers],
            cache.get_seq_length())


def same_state(a, b):
    return a[:2] == b[:2] and a[3] == b[3] and all(
        (x is None and y is None) or torch.equal(x, y) for x, y in zip(a[2], b[2]))


def same_logits(a, b):  # batches of other sizes run other matrix kernels: float rounding apart
    return torch.allclose(a, b, rtol=0, atol=1e-5)


def next_logits(model, cache, rows):
    with torch.no_grad():
        return model(torch.full((rows, 1), 7), use_cache=True, **{kvq.hf.cache_keyword(model): cache}).logits


@pytest.mark.parametrize("index, message", [
    (torch.tensor([0.0, 1.0, 2.0]), "must hold integers.*float32"),
    ([0.0, 1.0], "must hold integers.*float32"),
    (torch.tensor([True, False, True]), "must hold integers.*bool"),
    ([True, True, False], "must hold integers.*bool"),
    (torch.tensor([], dtype=torch.long), "is empty"),
    ([], "is empty"),
    (torch.tensor([[0, 1], [2, 0]]), "must be 1-D"),
    (torch.tensor(1), "must be 1-D"),
    (torch.tensor([0, 3]), r"row 3 out of range \(3 rows: 0..2"),
    (torch.tensor([-1, 0]), r"row -1 out of range \(3 rows: 0..2, as index_select takes\)"),
    (torch.tensor([0, 1], dtype=torch.uint8), "must hold integers.*uint8"),
    (torch.tensor([0, 1], dtype=torch.int8), "must hold integers.*int8"),  # issue 50: index_select refuses it
    (torch.tensor([0, 1], dtype=torch.int16), "must hold integers.*int16"),
    (["a"], "must be a 1-D integer tensor or list"),
])
def test_reorder_cache_refuses_what_index_select_refuses_and_changes_nothing(index, message):
    model = tiny_llama()
    cache = filled_cache(model)
    before = state(cache)
    with pytest.raises(ValueError, match=message):
        cache.reorder_cache(index)
    assert same_state(state(cache), before)
    assert next_logits(model, cache, 3).shape[0] == 3  # the next forward still runs


def test_reorder_cache_takes_what_index_select_takes():
    model = tiny_llama()
    cache = filled_cache(model)
    reference = filled_cache(model)
    ref_logits = next_logits(model, reference, 3)
    for index in (torch.tensor([2, 0, 2, 1], dtype=torch.int32), [2, 0, 2, 1]):
        cache = filled_cache(model)
        cache.reorder_cache(index)
        assert cache.rows == 4
        logits = next_logits(model, cache, 4)
        for new, old in enumerate([2, 0, 2, 1]):
            assert same_logits(logits[new], ref_logits[old])


def test_batch_select_indices_takes_negative_indices_and_masks_as_torch_indexing_does():
    model = tiny_llama()
    ref_logits = next_logits(model, filled_cache(model), 3)
    for index, rows in ((torch.tensor([-1, 0]), [2, 0]), (torch.tensor([True, False, True]), [0, 2]), ([1], [1])):
        cache = filled_cache(model)
        cache.batch_select_indices(index)
        logits = next_logits(model, cache, len(rows))
        for new, old in enumerate(rows):
            assert same_logits(logits[new], ref_logits[old])
    cache = filled_cache(model)
    before = state(cache)
    for index, message in ((torch.tensor([False, False, False]), "selects no row"),
                           (torch.tensor([True, False]), "a bool mask of 2 entries for 3 rows"),
                           (torch.tensor([-4]), r"row -4 out of range \(3 rows: -3..2"),
                           (torch.tensor([0.5]), "must hold integers or a bool mask.*float32")):
        with pytest.raises(ValueError, match=message):
            cache.batch_select_indices(index)
        assert same_state(state(cache), before)


@pytest.mark.parametrize("repeats", [0, -1, 1.5, 2.0, True, "2"])
def test_batch_repeat_interleave_takes_only_a_positive_integer(repeats):
    model = tiny_llama()
    cache = filled_cache(model)
    before = state(cache)
    with pytest.raises(ValueError, match="repeats must be"):
        cache.batch_repeat_interleave(repeats)
    assert same_state(state(cache), before)
    assert next_logits(model, cache, 3).shape[0] == 3


def test_batch_repeat_interleave_repeats_each_row_in_place():
    model = tiny_llama()
    ref_logits = next_logits(model, filled_cache(model), 3)
    cache = filled_cache(model)
    cache.batch_repeat_interleave(torch.tensor(2).item())
    logits = next_logits(model, cache, 6)
    for new in range(6):
        assert same_logits(logits[new], ref_logits[new // 2])


def fits(make) -> bool:
    try:
        make()
        return True
    except kvq.PoolExhausted:
        return False


def test_a_reorder_that_runs_out_of_blocks_changes_nothing():
    model = tiny_llama()
    # The smallest pool that holds the forward of 3 rows of 20 tokens (2 layers, 16-token blocks; 36 blocks
    # today), and a third more: room for the first fork or so (each copies its row's open blocks), not 5.
    smallest = next(m for m in range(1, 200)
                    if fits(lambda: filled_cache(model, rows=3, block_tokens=16, max_blocks=m)))
    cache = filled_cache(model, rows=3, block_tokens=16, max_blocks=smallest + smallest // 3)
    ref_logits = next_logits(model, filled_cache(model, rows=3, block_tokens=16), 3)
    before = state(cache)
    with pytest.raises(kvq.PoolExhausted):
        cache.reorder_cache(torch.tensor([0, 1, 1, 2, 2]))
    assert same_state(state(cache), before)  # no fork left behind
    with pytest.raises(kvq.PoolExhausted):
        cache.batch_repeat_interleave(2)
    assert same_state(state(cache), before)
    assert same_logits(next_logits(model, cache, 3), ref_logits)


@pytest.mark.parametrize("tokens", [-2.5, -2.0, True, "-2", torch.tensor(-2.0)])
def test_crop_takes_an_integer_only(tokens):
    model = tiny_llama()
    cache = filled_cache(model)
    before = state(cache)
    with pytest.raises(ValueError, match="tokens_to_remove must be an integer"):
        cache.crop(tokens)
    assert same_state(state(cache), before)
    cache.crop(torch.tensor(-2))  # a 0-d integer tensor is a count
    assert cache.get_seq_length() == 18


@pytest.mark.parametrize("repeats", [10**7, 2**62])
def test_batch_repeat_interleave_is_bounded_before_its_row_list_is_made(repeats):
    """Issue 50, item 4: without max_batch_size, n × rows was listed before any check (minutes, 13 GB)."""
    import time
    model = tiny_llama()
    cache = filled_cache(model)
    before = state(cache)
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"exceed KVQCache.MAX_ROWS=65536"):
        cache.batch_repeat_interleave(repeats)
    assert time.monotonic() - start < 1.0
    assert same_state(state(cache), before)
    big = torch.zeros(kvq.hf.KVQCache.MAX_ROWS + 1, dtype=torch.long)
    for edit in (cache.reorder_cache, cache.batch_select_indices):
        with pytest.raises(ValueError, match=r"65537 rows exceed KVQCache.MAX_ROWS"):
            edit(big)
    assert same_state(state(cache), before)
    limited = filled_cache(model, max_batch_size=4)
    with pytest.raises(ValueError, match="exceed max_batch_size=4"):
        limited.batch_repeat_interleave(2)
