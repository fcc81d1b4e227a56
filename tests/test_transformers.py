"""flashattn as a transformers attention implementation: a small random Llama-style model (built from a
config, no download) gives the logits of transformers' own SDPA implementation within the project's bound
(twice the error of the same-dtype SDPA run against an fp64 run, plus eps), with and without left padding,
and greedy generate() produces the same tokens. CPU in fp32 here (the CPU path); the gpu-marked case in
bf16 on CUDA."""

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

import flashattn.integrations.transformers as fa_hf  # noqa: E402

from helpers import case_seed  # noqa: E402

NAME = fa_hf.register()


@pytest.fixture
def calls(monkeypatch):
    """The flashattn functions the integration calls (so a test sees that flashattn ran at all)."""
    seen = []
    for name in ("flash_attn_func", "flash_attn_varlen_func"):
        real = getattr(fa_hf, name)

        def counting(*args, _real=real, _name=name, **kwargs):
            seen.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(fa_hf, name, counting)
    return seen


@pytest.fixture(autouse=True)
def fresh_fallback_warnings(monkeypatch):
    """The fallback warns once per reason and process: each test starts with none given, so that a
    fallback in it warns whatever ran before."""
    monkeypatch.setattr(fa_hf, "_warned", set())


def tiny_llama(seed: int):
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def logits_of(model, implementation, ids, mask, dtype, device):
    model = model.to(device=device, dtype=dtype)
    model.set_attn_implementation(implementation)
    with torch.no_grad():
        return model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.double()


@pytest.mark.parametrize("device, dtype", [("cpu", torch.float32),
                                           pytest.param("cuda", torch.bfloat16, marks=pytest.mark.gpu)])
@pytest.mark.parametrize("padded", [False, True], ids=["no-padding", "left-padding"])
def test_logits_match_sdpa(calls, device, dtype, padded):
    model = tiny_llama(case_seed("llama", device, padded))
    gen = torch.Generator().manual_seed(case_seed("ids", padded))
    ids = torch.randint(0, 97, (3, 21), generator=gen).to(device)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :5] = 0
        mask[2, :13] = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to SDPA would warn: the padding must run on flashattn
        ours = logits_of(model, NAME, ids, mask, dtype, device)
    assert calls == ["flash_attn_varlen_func" if padded else "flash_attn_func"] * 2  # both layers
    sdpa = logits_of(model, "sdpa", ids, mask, dtype, device)
    exact = logits_of(model, "sdpa", ids, mask, torch.float64, "cpu").to(device)
    kept = mask.bool()
    err = (ours - exact)[kept].abs().max().item()
    bound = 2 * (sdpa - exact)[kept].abs().max().item() + (1e-4 if dtype == torch.float32 else 1e-2)
    assert err <= bound, f"logits: {err:.3g} > {bound:.3g}"


@pytest.mark.parametrize("device, dtype", [("cpu", torch.float32),
                                           pytest.param("cuda", torch.bfloat16, marks=pytest.mark.gpu)])
def test_greedy_generate_matches_sdpa(calls, device, dtype):
    model = tiny_llama(case_seed("generate", device)).to(device=device, dtype=dtype)
    gen = torch.Generator().manual_seed(case_seed("prompt"))
    ids = torch.randint(0, 97, (2, 9), generator=gen).to(device)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    outputs = {}
    for implementation in (NAME, "sdpa"):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            outputs[implementation] = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8,
                                                     do_sample=False, pad_token_id=0)
    assert torch.equal(outputs[NAME], outputs["sdpa"])
    assert calls


def test_names_with_flash_are_refused():
    with pytest.raises(ValueError, match="flash"):
        fa_hf.register("flashattn")


class _Module(torch.nn.Module):
    is_causal = True
    sliding_window = None


def _gpt_oss_eager(module, query, key, value, mask, scaling, sinks):
    """transformers' gpt-oss eager attention on a boolean mask (it adds the mask: 0 / -inf)."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    module.sinks = torch.nn.Parameter(sinks.to(query.dtype), requires_grad=False)  # it reads them from the module
    float_mask = torch.zeros(mask.shape, dtype=query.dtype).masked_fill(~mask, float("-inf"))
    return eager_attention_forward(module, query, key, value, float_mask, scaling=scaling, dropout=0.0)[0]


def test_fallback_keeps_sinks_and_softcap_exactly():
    """A mask flashattn cannot serve (an arbitrary one) warns and runs the attention the way transformers'
    eager functions do: with gpt-oss's sinks, as its own eager function computes them; with a softcap."""
    gen = torch.Generator().manual_seed(case_seed("sinks"))
    query, key, value = (torch.randn(2, h, 9, 16, generator=gen, dtype=torch.float64) for h in (4, 2, 2))
    mask = torch.rand(2, 1, 9, 9, generator=gen) < 0.7
    mask[..., 0] = True
    module = _Module().eval()
    module.num_key_value_groups = 2
    sinks = torch.randn(4, generator=gen, dtype=torch.float64)
    with pytest.warns(UserWarning, match="not the causal or full pattern"):
        ours, _ = fa_hf.attention_forward(module, query, key, value, mask, scaling=0.25, s_aux=sinks)
    torch.testing.assert_close(ours, _gpt_oss_eager(module, query, key, value, mask, 0.25, sinks))
    fa_hf._warned.clear()
    with pytest.warns(UserWarning, match="not the causal or full pattern"):
        capped, _ = fa_hf.attention_forward(module, query, key, value, mask, scaling=0.25, softcap=2.0)
    scores = 2.0 * torch.tanh((query @ key.repeat_interleave(2, 1).transpose(-1, -2)) * 0.25 / 2.0)
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    torch.testing.assert_close(capped, (probs @ value.repeat_interleave(2, 1)).transpose(1, 2))


def test_fallback_without_a_mask_masks_as_flashattn_would():
    """A call without a mask (transformers builds none for plain causal attention) that falls back (here
    for a position_bias) attends causally and in the window, as flash_attn_func would have."""
    gen = torch.Generator().manual_seed(case_seed("no mask"))
    query, key, value = (torch.randn(1, 2, 7, 8, generator=gen) for _ in range(3))
    bias = torch.randn(1, 2, 7, 7, generator=gen)
    module = _Module().eval()
    with pytest.warns(UserWarning, match="position_bias"):
        ours, _ = fa_hf.attention_forward(module, query, key, value, None, scaling=0.5, position_bias=bias,
                                          sliding_window=3)
    rows, cols = torch.arange(7).unsqueeze(1), torch.arange(7)
    hidden = (cols > rows) | (cols <= rows - 3)  # keys after the query, or 3 and more before it
    probs = torch.softmax((query @ key.transpose(-1, -2) * 0.5 + bias).masked_fill(hidden, float("-inf")), dim=-1)
    torch.testing.assert_close(ours, (probs @ value).transpose(1, 2))


def test_value_head_dim_above_query_falls_back():
    """v's head dim above q's (no model has it; flashattn's kernels take dv <= d): plain PyTorch, warned."""
    gen = torch.Generator().manual_seed(case_seed("dv > d"))
    query, key = (torch.randn(1, 2, 5, 8, generator=gen) for _ in range(2))
    value = torch.randn(1, 2, 5, 16, generator=gen)
    module = _Module().eval()
    with pytest.warns(UserWarning, match="value head dim above"):
        ours, _ = fa_hf.attention_forward(module, query, key, value, None, scaling=0.5)
    probs = torch.softmax((query @ key.transpose(-1, -2) * 0.5).masked_fill(torch.ones(5, 5).triu(1).bool(),
                                                                              float("-inf")), dim=-1)
    torch.testing.assert_close(ours, (probs @ value).transpose(1, 2))
