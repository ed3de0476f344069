"""tinyinfer against Hugging Face transformers on the same weights.

Tiny random models check the architecture in every variant (GQA/MHA, tied/untied);
the default model checks real weights, long prompts and batches."""
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM as HFLlama

from tinyinfer import SamplingParams
from tinyinfer.kv_cache import KVCache
from tinyinfer.weights import load_model

LONG_PROMPT = (Path(__file__).resolve().parents[1] / "data" / "long_prompt.txt").read_text()
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Here is a short poem about the sea:\n",
    LONG_PROMPT + "\nIn one sentence, the keeper's advice was",
]


def tiny_hf_model(tmp_path, heads, kv_heads, tied, seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=64,
                      tie_word_embeddings=tied, rope_theta=10000.0)
    hf = HFLlama(cfg).eval()
    hf.save_pretrained(tmp_path)
    return hf


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 4), (4, 1)], ids=["gqa", "mha", "mqa"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_tiny_random_model_logits_match_transformers(tmp_path, heads, kv_heads, tied):
    hf = tiny_hf_model(tmp_path, heads, kv_heads, tied)
    ours = load_model(tmp_path, torch.float32, torch.device("cpu"))
    ids = torch.randint(0, 128, (3, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        cache = KVCache(ours.config, 3, 17, torch.float32, "cpu")
        got = ours.compute_logits(ours(ids, torch.arange(17).expand(3, -1), cache))
    assert (got - ref).abs().max().item() < 1e-4


def test_tiny_model_incremental_decode_equals_full_forward(tmp_path):
    """Prefill 10 tokens, then feed 6 one at a time through the cache: the logits
    must equal one full forward pass over all 16 (the KV cache changes cost, not results)."""
    hf = tiny_hf_model(tmp_path, 4, 2, tied=False)
    ours = load_model(tmp_path, torch.float32, torch.device("cpu"))
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits
        cache = KVCache(ours.config, 2, 16, torch.float32, "cpu")
        steps = [ours.compute_logits(ours(ids[:, :10], torch.arange(10).expand(2, -1), cache))]
        for t in range(10, 16):
            steps.append(ours.compute_logits(ours(ids[:, t : t + 1], torch.full((2, 1), t), cache)))
    assert (torch.cat(steps, dim=1) - ref).abs().max().item() < 1e-4


@pytest.mark.slow
def test_prompt_logprobs_match_transformers(llm, hf_model):
    text = PROMPTS[3]
    out = llm.generate([text], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))[0]
    ids = out.prompt_token_ids
    assert len(ids) > 500
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), -1)
    assert out.prompt_logprobs[0] is None
    got = torch.tensor([out.prompt_logprobs[t][ids[t]].logprob for t in range(1, len(ids))])
    want = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    assert (got - want).abs().max().item() < 1e-3


_hf_greedy_cache = {}


def hf_greedy(hf_model, ids, n):
    """transformers' greedy continuation (memoised: several tests ask for the same one)."""
    key = (tuple(ids), n)
    if key not in _hf_greedy_cache:
        with torch.no_grad():
            out = hf_model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                                    attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        _hf_greedy_cache[key] = out[0, len(ids):].tolist()
    return _hf_greedy_cache[key]


# Alone: the shortest prompt and the 500-token one. The batch test below
# compares every prompt, these two included, with transformers' output for it alone.
@pytest.mark.slow
@pytest.mark.parametrize("prompt", [PROMPTS[0], PROMPTS[3]], ids=["france", "long"])
def test_greedy_64_tokens_match_transformers_generate(llm, hf_model, prompt):
    out = llm.generate([prompt], SamplingParams(max_tokens=64, temperature=0))[0]
    ref = hf_greedy(hf_model, out.prompt_token_ids, 64)
    assert out.outputs[0].token_ids == ref
    if len(ref) < 64:  # transformers stopped at EOS; so must we
        assert out.outputs[0].finish_reason == "stop"


@pytest.mark.slow
def test_batch_of_unequal_prompts_matches_each_alone(llm, hf_model):
    """Right-padded batch of prompts with 6 to 500+ tokens: every row must equal
    transformers' greedy output for that prompt on its own."""
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=64, temperature=0))
    assert len({len(o.prompt_token_ids) for o in outs}) == len(PROMPTS)
    for o in outs:
        assert o.outputs[0].token_ids == hf_greedy(hf_model, o.prompt_token_ids, 64), o.prompt[:40]


@pytest.mark.slow
def test_llm_loads_a_local_hf_folder(tmp_path, default_model_dir):
    """Weights from a local Hugging Face folder: a tiny random model saved with
    save_pretrained plus the default model's tokenizer files."""
    import shutil

    from tinyinfer import LLM

    cfg = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      eos_token_id=2, bos_token_id=1, tie_word_embeddings=True)
    torch.manual_seed(0)
    hf = HFLlama(cfg).eval()
    hf.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(default_model_dir / name, tmp_path / name)
    llm = LLM(str(tmp_path), dtype="float32", device="cpu")
    out = llm.generate(["Hello there"], SamplingParams(max_tokens=12, temperature=0))[0]
    assert llm.max_model_len == 256
    with torch.no_grad():
        ids = out.prompt_token_ids
        ref = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
    assert out.outputs[0].token_ids == ref


def test_hub_id_offline_gives_a_clear_error(monkeypatch):
    from tinyinfer.weights import resolve_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="Hugging Face Hub.*smollm2-135m-instruct"):
        resolve_model("no-such-org/no-such-model")
