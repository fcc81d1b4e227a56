"""flashattn as a transformers attention implementation, on small random models of three families built
from their configs (no download): Llama (against transformers' SDPA implementation), gpt-oss (learnable
sinks, a sliding-window layer and a full one) and DeepSeek-V3 (MLA: v's head dim below q's and k's), the
last two against transformers' eager implementation (gpt-oss has no SDPA one). Each model's logits match
within the project's bound (twice the error of the same-dtype run of the implementation compared with,
against an fp64 run, plus eps), with and without left padding; every layer runs flashattn (no fallback,
with the sinks, the window and v's own head dim where the model has them); greedy generate() gives the
same tokens. CPU in fp32 here (the CPU path); the gpu-marked cases in bf16 on CUDA."""

import warnings
from collections.abc import Callable
from contextlib import contextmanager
from typing import NamedTuple

import pytest
import torch

transformers = pytest.importorskip("transformers")

import flashattn.integrations.transformers as fa_hf  # noqa: E402
from flashattn.testing import GRAD_EPS, grad_bound, max_abs_diff, output_bound, rounding_floor  # noqa: E402

from helpers import case_seed  # noqa: E402

NAME = fa_hf.register()
VOCAB = 97
DEVICE_DTYPES = [pytest.param("cpu", torch.float32, id="cpu-fp32"),
                 pytest.param("cuda", torch.bfloat16, id="cuda-bf16", marks=pytest.mark.gpu)]
PADDING = pytest.mark.parametrize("padded", [False, True], ids=["no-padding", "left-padding"])


class Call(NamedTuple):
    """One flashattn call of the integration: which function, and what it was given."""

    function: str
    head_dim: int  # q's and k's
    v_head_dim: int
    window_size: tuple[int, int]
    learnable_sink: torch.Tensor | None


@pytest.fixture
def calls(monkeypatch):
    """The flashattn calls the integration makes (so a test sees that flashattn ran, and with what)."""
    seen = []
    for name in ("flash_attn_func", "flash_attn_varlen_func"):
        real = getattr(fa_hf, name)

        def recording(q, k, v, *args, _real=real, _name=name, **kwargs):
            seen.append(Call(_name, q.shape[-1], v.shape[-1], tuple(kwargs["window_size"]),
                             kwargs.get("learnable_sink")))
            return _real(q, k, v, *args, **kwargs)

        monkeypatch.setattr(fa_hf, name, recording)
    return seen


@pytest.fixture(autouse=True)
def fresh_fallback_warnings(monkeypatch):
    """The fallback warns once per reason and process: each test starts with none given, so that a
    fallback in it warns whatever ran before."""
    monkeypatch.setattr(fa_hf, "_warned", set())


@contextmanager
def no_fallback():
    """Turns the integration's fallback warning into an error: everything inside runs on flashattn."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="flashattn")
        yield


def tiny_llama(seed: int):
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


# Routing: the MoE models below send every token to all their experts (top-k = number of experts),
# weighted by the router. With top-k below that, two implementations whose hidden states differ by a bf16
# rounding pick different experts now and then (a tie in the router), and the logits jump by up to ~50
# units in the last place: such a jump says nothing about attention and would decide greedy generate().

GPT_OSS_WINDOW = 5  # well below the prompts' lengths, so the sliding layers' window cuts


def tiny_gpt_oss(seed: int):
    """Two layers, a sliding-window one (GQA, 4 query heads on 2 KV heads) and a full one. The sinks are
    initialised near 0 (std 0.02, where they weigh little against ~20 keys): they are set to logits in
    [-1, 3] here; dropping them moves the fp32 logits by 0.25-0.35, the bound is 1e-4. Dense routing."""
    config = transformers.GptOssConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       num_local_experts=2, num_experts_per_tok=2, sliding_window=GPT_OSS_WINDOW,
                                       layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(seed)
    model = transformers.GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.uniform_(-1.0, 3.0)
    return model


def tiny_deepseek_v3(seed: int):
    """Two layers (an MLP, then 2 routed experts, dense routing, and a shared one), MLA with low-rank q and
    kv: q and k of head dim 48 + 16 (no rotary + rotary), v of head dim 32."""
    config = transformers.DeepseekV3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                           moe_intermediate_size=32, num_hidden_layers=2, first_k_dense_replace=1,
                                           n_routed_experts=2, n_shared_experts=1, num_experts_per_tok=2, n_group=1,
                                           topk_group=1, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32,
                                           kv_lora_rank=32, qk_nope_head_dim=48, qk_rope_head_dim=16, v_head_dim=32,
                                           max_position_embeddings=256, eos_token_id=None)
    torch.manual_seed(seed)
    return transformers.DeepseekV3ForCausalLM(config).eval()


class Family(NamedTuple):
    build: Callable[[int], torch.nn.Module]
    # The implementation whose fp64 run is the exact reference: DeepSeek's eager softmax runs in fp32
    # whatever the input (and turns the -1.8e308 of an fp64 padding mask into -inf: NaN on padded rows),
    # gpt-oss has no SDPA implementation and its eager one computes in the input's dtype.
    exact: str


FAMILIES = {"gpt-oss": Family(tiny_gpt_oss, "eager"), "deepseek-v3": Family(tiny_deepseek_v3, "sdpa")}


def prepare(model, implementation: str, dtype: torch.dtype, device: str):
    model = model.to(device=device, dtype=dtype)
    model.set_attn_implementation(implementation)
    if hasattr(model.config, "num_local_experts") or hasattr(model.config, "n_routed_experts"):
        model.set_experts_implementation("eager")  # one loop over experts: grouped_mm takes no fp64 on CPU
    return model


def logits_of(model, implementation, ids, mask, dtype, device):
    model = prepare(model, implementation, dtype, device)
    with torch.no_grad():
        return model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.double()


def batch(seed_params, padded: bool, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Three sequences of 21 tokens, two of them left-padded (by 5 and 13) if padded."""
    gen = torch.Generator().manual_seed(case_seed(*seed_params, padded))
    ids = torch.randint(0, VOCAB, (3, 21), generator=gen)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :5] = 0
        mask[2, :13] = 0
    return ids.to(device), mask.to(device)


def assert_logits_within_bound(ours, same_dtype, exact, mask, dtype) -> None:
    """The project's bound on the tokens the mask keeps (padded rows see no key: undefined there)."""
    kept = mask.bool()
    err = max_abs_diff(ours[kept], exact[kept])
    bound = output_bound(max_abs_diff(same_dtype[kept], exact[kept]),
                         eps=1e-4 if dtype == torch.float32 else 1e-2)
    assert err <= bound, f"logits: {err:.3g} > {bound:.3g}"


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@PADDING
def test_logits_match_sdpa(calls, device, dtype, padded):
    model = tiny_llama(case_seed("llama", device, padded))
    ids, mask = batch(("ids",), padded, device)
    with no_fallback():  # the padding must run on flashattn
        ours = logits_of(model, NAME, ids, mask, dtype, device)
    assert [c.function for c in calls] == ["flash_attn_varlen_func" if padded else "flash_attn_func"] * 2
    sdpa = logits_of(model, "sdpa", ids, mask, dtype, device)
    exact = logits_of(model, "sdpa", ids, mask, torch.float64, "cpu").to(device)
    assert_logits_within_bound(ours, sdpa, exact, mask, dtype)


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
def test_greedy_generate_matches_sdpa(calls, device, dtype):
    model = tiny_llama(case_seed("generate", device)).to(device=device, dtype=dtype)
    gen = torch.Generator().manual_seed(case_seed("prompt"))
    ids = torch.randint(0, VOCAB, (2, 9), generator=gen).to(device)
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


def assert_served(family: str, model, calls: list[Call]) -> None:
    """Every layer ran flashattn with what the family needs: gpt-oss its layer's sinks (fp32, per query
    head) and window (W keys: W - 1 left of the query's own) on the sliding layer; DeepSeek v's head dim."""
    layers = [layer.self_attn for layer in model.model.layers]
    assert len(calls) % len(layers) == 0 and calls
    for i, call in enumerate(calls):
        attention = layers[i % len(layers)]
        if family == "gpt-oss":
            assert call.learnable_sink is not None and call.learnable_sink.dtype == torch.float32
            torch.testing.assert_close(call.learnable_sink, attention.sinks.float(), rtol=0, atol=0)
            sliding = attention.sliding_window is not None
            assert call.window_size == ((GPT_OSS_WINDOW - 1, -1) if sliding else (-1, -1))
        else:
            assert (call.head_dim, call.v_head_dim) == (64, 32)
            assert call.learnable_sink is None


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@PADDING
def test_logits_match_eager(calls, family, device, dtype, padded):
    model = FAMILIES[family].build(case_seed(family, device, padded))
    ids, mask = batch((family,), padded, device)
    with no_fallback():
        ours = logits_of(model, NAME, ids, mask, dtype, device)
    # Two layers, one call each: the padded batch as one varlen call; without padding flash_attn_func
    # (a sliding layer's mask is the window alone: no keys to pack).
    assert [c.function for c in calls] == ["flash_attn_varlen_func" if padded else "flash_attn_func"] * 2
    assert_served(family, model, calls)
    eager = logits_of(model, "eager", ids, mask, dtype, device)
    exact = logits_of(model, FAMILIES[family].exact, ids, mask, torch.float64, "cpu").to(device)
    assert_logits_within_bound(ours, eager, exact, mask, dtype)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@PADDING
def test_greedy_generate_matches_eager(calls, family, device, dtype, padded):
    """12 new tokens after 9: the prefill, then decoding steps of one query (gpt-oss's sliding layer keeps
    only its last W - 1 keys in the cache); the same tokens as eager's (assert_same_greedy_tokens)."""
    model = FAMILIES[family].build(case_seed("generate", family, device, padded))
    gen = torch.Generator().manual_seed(case_seed("prompt", family, padded))
    ids = torch.randint(1, VOCAB, (3, 9), generator=gen).to(device)  # no 0, the pad token: no right-padding warning
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :3] = 0
        mask[2, :7] = 0
    outputs = {}
    for implementation in (NAME, "eager"):
        model = prepare(model, implementation, dtype, device)
        with torch.no_grad(), no_fallback():
            outputs[implementation] = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12,
                                                     do_sample=False, pad_token_id=0, output_logits=True,
                                                     return_dict_in_generate=True)
    assert_same_greedy_tokens(outputs[NAME], outputs["eager"], dtype)
    assert len(calls) == 2 * 12  # both layers, the prefill and 11 decoding steps, each on flashattn
    assert_served(family, model, calls)


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@PADDING
def test_gpt_oss_trains_through_flashattn(calls, device, dtype, padded):
    """The language-model loss's gradients of the attention layers' parameters, the sinks' among them
    (flashattn's learnable_sink gradient, through the cast to fp32), match eager's within the gradient
    bound: three times eager's same-dtype error against fp64 (at least one unit in the last place),
    plus GRAD_EPS scaled to the gradient's size (~1e-3 here, not ~1). The other parameters' gradients
    are not held to it in bf16: a 2-element router bias summed over every token sat at 2 bf16 units
    from fp64 where eager's own error was below one (H100: 5.7e-5 against a bound of 1.1e-5), luck of
    rounding far from attention; in fp32 every parameter is compared."""
    model = tiny_gpt_oss(case_seed("train", device, padded))
    ids, mask = batch(("train",), padded, device)
    grads = {}
    for implementation, run_dtype, run_device in ((NAME, dtype, device), ("eager", dtype, device),
                                                  ("eager", torch.float64, "cpu")):
        model = prepare(model, implementation, run_dtype, run_device)
        model.zero_grad()
        with no_fallback():
            inputs = {"input_ids": ids, "attention_mask": mask, "labels": ids}
            model(**{key: t.to(run_device) for key, t in inputs.items()}).loss.backward()
        grads[implementation, run_dtype] = {name: p.grad.double().cpu() for name, p in model.named_parameters()}
    assert len(calls) == 2 and all(call.learnable_sink is not None for call in calls)
    exact = grads["eager", torch.float64]
    compared = [name for name in grads[NAME, dtype] if dtype == torch.float32 or ".self_attn." in name]
    assert any(name.endswith("self_attn.sinks") for name in compared)
    for name in compared:
        ours = grads[NAME, dtype][name]
        bound = grad_bound(max_abs_diff(grads["eager", dtype][name], exact[name]), rounding_floor(exact[name], dtype),
                           eps=GRAD_EPS * exact[name].abs().max().item())
        assert max_abs_diff(ours, exact[name]) <= bound, name


def assert_same_greedy_tokens(ours, reference, dtype) -> None:
    """Token for token; in bf16, up to a tie: where the reference's logit of our token is within 4 units
    in the last place of its largest logit of its top one, the two may part, and that row is compared no
    further (the continuations follow different tokens). Two correct bf16 runs differ by 1-2 such units
    (eager rounds the scores to bf16; measured on CPU over 48 prompts: at most 1.7, and every parting at
    a gap below 1), so greedy decoding splits on near-ties however exact both are. fp32 allows no tie."""
    new_tokens = len(reference.logits)
    ours_tokens, reference_tokens = (out.sequences[:, -new_tokens:] for out in (ours, reference))
    for row in range(ours_tokens.shape[0]):
        for step in range(new_tokens):
            token, expected = ours_tokens[row, step], reference_tokens[row, step]
            if token == expected:
                continue
            logits = reference.logits[step][row].float()
            tie = 4 * rounding_floor(logits, dtype)
            gap = (logits[expected] - logits[token]).item()
            assert gap <= tie, f"row {row}, new token {step}: {token} for {expected}, whose logit is {gap:.3g} above"
            break


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


@pytest.mark.parametrize("window", [1, 2, 5, 11])
@pytest.mark.parametrize("seqlen_q", [11, 3, 1], ids=["prefill", "chunk", "decode"])
@PADDING
def test_sliding_window_and_sinks_as_transformers_masks_them(calls, window, seqlen_q, padded):
    """transformers' sliding window W (query i sees keys j with i - W < j <= i) is flashattn's left
    window W - 1: the mask transformers builds for it (with left padding, and for the last queries of
    the keys, as in chunked prefill and decoding) runs on flashattn, with the sinks, and gives gpt-oss's
    eager attention; so does the same call without a mask (no padding), where nothing checks the
    window against a mask."""
    from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function

    seqlen_k = 11
    gen = torch.Generator().manual_seed(case_seed("window", window, seqlen_q, padded))
    query = torch.randn(2, 4, seqlen_q, 16, generator=gen)
    key, value = (torch.randn(2, 2, seqlen_k, 16, generator=gen) for _ in range(2))
    sinks = torch.rand(4, generator=gen) * 4 - 1
    padding = torch.ones(2, seqlen_k, dtype=torch.bool)
    if padded:
        padding[1, :4] = False
    mask = sdpa_mask(batch_size=2, q_length=seqlen_q, kv_length=seqlen_k, q_offset=seqlen_k - seqlen_q,
                     mask_function=sliding_window_causal_mask_function(window), attention_mask=padding,
                     allow_is_causal_skip=False)
    module = _Module().eval()
    module.num_key_value_groups = 2
    expected = _gpt_oss_eager(module, query.double(), key.double(), value.double(), mask, 0.25, sinks.double())
    same_dtype = _gpt_oss_eager(module, query, key, value, mask, 0.25, sinks)
    bound = output_bound(max_abs_diff(same_dtype, expected))
    with no_fallback():
        runs = {"mask": fa_hf.attention_forward(module, query, key, value, mask, scaling=0.25,
                                                sliding_window=window, s_aux=sinks)[0]}
        if not padded and seqlen_q in (1, seqlen_k):  # (without a mask, 1 < Sq < Sk is a static cache's prefill)
            runs["no mask"] = fa_hf.attention_forward(module, query, key, value, None, scaling=0.25,
                                                      sliding_window=window, s_aux=sinks)[0]
    assert len(calls) == len(runs) and all(c.window_size == (window - 1, -1) for c in calls)
    assert all(torch.equal(c.learnable_sink, sinks) for c in calls)
    for how, ours in runs.items():
        assert max_abs_diff(ours, expected) <= bound, how


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
