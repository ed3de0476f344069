"""tinyinfer_course.analysis.memory: the source's worked numbers, the real model's parameters and
KV allocation, bad input, and `tinyinfer memory` on the command line."""
from __future__ import annotations

import json
import re

import pytest
import torch

from tinyinfer import cli
from tinyinfer_course.analysis import memory
from tinyinfer.config import ModelConfig
from tinyinfer.kv_cache import KVCache

# The explainer's 7B example: 32 layers, 8 KV heads, head dim 128, FP16 cache.
SEVEN_B = dict(num_params=7e9, num_layers=32, num_kv_heads=8, head_dim=128)
# Llama-3-70B's published shape (Inference 101's "about 320 KB per token").
LLAMA3_70B = ModelConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                         num_attention_heads=64, num_key_value_heads=8, head_dim=128, max_position_embeddings=8192)


# ------------------------------------------------------------ the source's numbers, as printed


@pytest.mark.parametrize("bits, printed", [(16, "13.04 GiB"), (8, "6.52 GiB"), (4, "3.26 GiB"),
                                           ("fp16", "13.04 GiB"), ("int8", "6.52 GiB"), ("int4", "3.26 GiB")])
def test_raw_weights_of_7b(bits, printed):
    assert memory.format_gib(memory.weight_bytes(7e9, bits)) == printed


def test_weights_are_decimal_params_in_binary_units():
    assert memory.weight_bytes(7e9, 16) == 14e9  # 14 billion bytes ...
    assert memory.format_gib(14e9) != "14.00 GiB"  # ... are not 14 GiB


def test_kv_per_token_of_the_7b_example():
    per_token = memory.kv_bytes_per_token(32, 8, 128, 2)
    assert per_token == 131_072
    assert memory.format_kib(per_token) == "128 KiB"


def test_the_default_example_4096_tokens():
    est = memory.estimate(**SEVEN_B, context_tokens=4096, num_requests=1)
    assert memory.format_gib(est.kv_total) == "0.50 GiB"
    assert memory.format_gib(est.total) == "13.54 GiB"
    report = est.report()
    for printed in ("13.04 GiB", "128 KiB", "131,072 bytes", "0.50 GiB", "13.54 GiB"):
        assert printed in report, printed


def test_report_states_units_and_what_is_excluded():
    report = memory.estimate(**SEVEN_B).report()
    assert "1 KiB = 1,024 bytes" in report and "1 GiB = 1,073,741,824 bytes" in report
    for excluded in ("activations", "temporary buffers", "metadata", "runtime overhead"):
        assert excluded in report, excluded
    for excluded in ("activations", "temporary buffers", "metadata", "runtime overhead"):
        assert excluded in memory.__doc__, excluded


@pytest.mark.parametrize("requests", [1, 2, 4, 16])
def test_kv_grows_with_requests_while_weights_stay(requests):
    one = memory.estimate(**SEVEN_B, context_tokens=4096, num_requests=1)
    many = memory.estimate(**SEVEN_B, context_tokens=4096, num_requests=requests)
    assert many.weights == one.weights
    assert many.kv_total == requests * one.kv_total
    assert many.total == one.weights + requests * one.kv_total


def test_kv_grows_linearly_with_context():
    est = [memory.estimate(**SEVEN_B, context_tokens=t).kv_total for t in (1024, 2048, 4096)]
    assert est[1] == 2 * est[0] and est[2] == 4 * est[0]


def test_weight_precision_leaves_the_cache_alone():
    fp16 = memory.estimate(**SEVEN_B, weight_bits=16)
    int4 = memory.estimate(**SEVEN_B, weight_bits="int4")
    assert int4.weights == fp16.weights / 4 and int4.kv_total == fp16.kv_total


def test_70b_is_320_kib_per_token_and_about_1_3_gb_for_4000_tokens():
    est = memory.estimate(LLAMA3_70B, context_tokens=4000)
    assert est.kv_per_token == 327_680
    assert memory.format_kib(est.kv_per_token) == "320 KiB"
    assert f"{est.kv_total / 1e9:.1f} GB" == "1.3 GB"  # the source's decimal "about 1.3 GB"
    # and by hand, with the same numbers
    hand = memory.estimate(num_params=70e9, num_layers=80, num_kv_heads=8, head_dim=128, context_tokens=4000)
    assert hand.kv_total == est.kv_total


def test_every_kv_formula_gives_the_hand_count():
    """A key and a value (2) per layer (80) per KV head (8) of 128 numbers of 2 bytes."""
    from tinyinfer.config import ModelConfig
    from tinyinfer.config import kv_bytes_per_token

    by_hand = 2 * 80 * 8 * 128 * 2
    assert memory.kv_bytes_per_token(80, 8, 128, 2) == by_hand == 327_680
    assert kv_bytes_per_token(LLAMA3_70B, 2) == by_hand
    smollm2 = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192)
    assert smollm2.kv_bytes_per_token(4) == 2 * 30 * 3 * 64 * 4 == 46_080  # what the engine sizes its pool by


def test_kv_dtype_by_name():
    assert memory.estimate(**SEVEN_B, kv_bytes_per_value="fp8").kv_per_token == 65_536
    assert memory.estimate(**SEVEN_B, kv_bytes_per_value="fp32").kv_per_token == 262_144


# ------------------------------------------------------------ against the real model and cache


@pytest.fixture(scope="module")
def llm():
    from tinyinfer import LLM

    return LLM("smollm2-135m-instruct", dtype="float32", device="cpu")


def test_params_from_config_equals_the_model(llm):
    counted = sum(p.numel() for p in llm.model.parameters())  # parameters() yields a tied weight once
    assert memory.params_from_config(llm.model_config) == counted
    assert memory.estimate(llm.model_config).num_params == counted


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch, max_len", [(1, 64), (3, 100)])
def test_kv_per_token_matches_the_engines_allocation(llm, dtype, batch, max_len):
    config = llm.model_config
    cache = KVCache(config, batch, max_len, dtype, "cpu")
    bytes_per_value = torch.finfo(dtype).bits // 8
    est = memory.estimate(config, context_tokens=max_len, num_requests=batch, kv_bytes_per_value=bytes_per_value)
    assert est.kv_total == cache.nbytes()
    assert memory.kv_bytes_per_token(config.num_hidden_layers, config.num_key_value_heads, config.head_dim,
                                     bytes_per_value) * max_len * batch == cache.nbytes()


def test_params_from_a_tiny_hf_model(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    for tied in (True, False):
        hf_config = LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
        model = LlamaForCausalLM(hf_config)
        expected = sum(p.numel() for p in model.parameters())
        as_dict = hf_config.to_dict()
        assert memory.params_from_config(as_dict) == expected
        (tmp_path / "config.json").write_text(json.dumps(as_dict))
        assert memory.params_from_config(tmp_path / "config.json") == expected  # a config.json file
        assert memory.params_from_config(tmp_path) == expected  # a folder holding one


def test_reads_shapes_of_configs_the_engine_cannot_run():
    d = {"model_type": "qwen2", "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
         "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
         "rope_scaling": {"rope_type": "yarn", "factor": 4.0}, "attention_bias": True}
    est = memory.estimate(d, context_tokens=10)
    assert est.kv_per_token == 2 * 4 * 2 * 32 * 2  # head_dim = 256 / 8


# ------------------------------------------------------------ bad input


@pytest.mark.parametrize("kwargs, field", [
    (dict(SEVEN_B, num_layers=0), "num_layers"),
    (dict(SEVEN_B, num_kv_heads=-8), "num_kv_heads"),
    (dict(SEVEN_B, head_dim=12.5), "head_dim"),
    (dict(SEVEN_B, num_params=0), "num_params"),
    (dict(SEVEN_B, num_params=float("nan")), "num_params"),
    (dict(SEVEN_B, weight_bits=0), "weight_bits"),
    (dict(SEVEN_B, weight_bits="int3"), "weight_bits"),
    (dict(SEVEN_B, kv_bytes_per_value=-2), "kv_bytes_per_value"),
    (dict(SEVEN_B, kv_bytes_per_value="fp3"), "kv_bytes_per_value"),
    (dict(SEVEN_B, context_tokens=-1), "context_tokens"),
    (dict(SEVEN_B, num_requests=1.5), "num_requests"),
    (dict(SEVEN_B, num_requests=True), "num_requests"),
    (dict(num_params=7e9, num_layers=32), "num_kv_heads"),
])
def test_bad_input_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        memory.estimate(**kwargs)


def test_bad_input_states_the_allowed_range():
    with pytest.raises(ValueError, match=r"num_layers must be an integer in \[1, 10000\], got 0"):
        memory.kv_bytes_per_token(0, 8, 128, 2)


def test_bad_config_names_the_missing_field(tmp_path):
    with pytest.raises(ValueError, match="num_hidden_layers"):
        memory.params_from_config({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
                                   "num_attention_heads": 2})
    with pytest.raises(ValueError, match="config.json"):
        memory.estimate(tmp_path)  # a folder without config.json


# ------------------------------------------------------------ the command line


def _cli(capsys, *argv):
    rc = cli.main(["memory", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_reproduces_the_7b_example(capsys):
    rc, out, _ = _cli(capsys, "--params", "7e9", "--weight-bits", "16", "--layers", "32", "--kv-heads", "8",
                      "--head-dim", "128", "--kv-bytes", "2", "--tokens", "4096", "--requests", "1")
    assert rc == 0
    for printed in ("13.04 GiB", "128 KiB", "0.50 GiB", "13.54 GiB", "not included"):
        assert printed in out, printed


def test_cli_requests_double_the_cache(capsys):
    rc, out, _ = _cli(capsys, "--params", "7e9", "--weight-bits", "int4", "--layers", "32", "--kv-heads", "8",
                      "--head-dim", "128", "--tokens", "4096", "--requests", "2")
    assert rc == 0
    assert "3.26 GiB" in out and "1.00 GiB" in out and re.search(r"total\s+4\.26 GiB", out)


def test_cli_reads_the_default_model(capsys, llm):
    rc, out, _ = _cli(capsys, "--model", "smollm2-135m-instruct", "--tokens", "8192")
    assert rc == 0
    config = llm.model_config
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2
    assert f"{per_token:,} bytes" in out and "8,192 tokens" in out
    assert f"{config.num_parameters():,} params" in out


def test_cli_reads_a_local_folder(capsys, tmp_path, llm):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2}))
    rc, out, _ = _cli(capsys, "--model", str(tmp_path), "--tokens", "100", "--kv-bytes", "4")
    assert rc == 0 and "4 layers x 2 KV heads x 32 head dim x 4 bytes" in out


@pytest.mark.parametrize("argv, field", [
    (["--layers", "32", "--kv-heads", "8", "--head-dim", "128"], "num_params"),
    (["--params", "7e9", "--layers", "0", "--kv-heads", "8", "--head-dim", "128"], "num_layers"),
    (["--params", "7e9", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--tokens", "-5"],
     "context_tokens"),
    (["--params", "7e9", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--weight-bits", "int3"],
     "weight_bits"),
])
def test_cli_bad_input_is_a_clear_error(capsys, argv, field):
    rc, out, err = _cli(capsys, *argv)
    assert rc == 2 and out == "" and field in err and err.startswith("tinyinfer: error:")


# ------------------------------------------------------------ state-space layers: a state that does not grow


def test_mamba2_state_of_mamba2_2_7b():
    # By hand, Mamba-2 2.7B (d_model 2560, defaults d_state 128, expand 2, head dim 64, 1 group, d_conv 4):
    # d_inner 5,120, 80 heads; SSM state 80 x 64 x 128 = 655,360; conv state 3 x (5,120 + 2 x 128) = 16,128;
    # 671,488 numbers x 2 bytes = 1,342,976 bytes per layer.
    assert memory.mamba2_state_bytes(2560) == 1_342_976
    assert memory.mamba2_state_bytes(2560, bytes_per_value=4) == 2 * 1_342_976


def test_mamba1_layer_is_zero_groups():
    # Jamba's Mamba-1 layer (d_model 4096, d_state 16, expand 2): 8,192 x 16 + 3 x 8,192 = 155,648 numbers.
    assert memory.mamba2_state_bytes(4096, d_state=16, n_groups=0, bytes_per_value=1) == 155_648


def test_mamba2_state_does_not_depend_on_head_split():
    # The state is d_inner x d_state numbers however d_inner is cut into heads.
    assert memory.mamba2_state_bytes(2560, head_dim=64) == memory.mamba2_state_bytes(2560, head_dim=128)


@pytest.mark.parametrize("bad", [dict(d_model=0), dict(d_model=2560, head_dim=100), dict(d_model=2560, d_conv=0)])
def test_mamba2_state_bad_input(bad):
    with pytest.raises(ValueError):
        memory.mamba2_state_bytes(**bad)


def test_the_calculators_size_slider_reads_as_the_report_prints():
    """Its readout is the default exactly ("7", for 7,000,000,000), not a log step's 7.08e+9."""
    ipywidgets = pytest.importorskip("ipywidgets")

    def walk(w):
        yield w
        for c in getattr(w, "children", ()) or ():
            yield from walk(c)

    widget = memory.calculator_widget(num_params=7e9)
    (size,) = [w for w in walk(widget) if isinstance(w, ipywidgets.SelectionSlider)]
    assert size.label == "7" and size.value == 7
    (view,) = [w for w in walk(widget) if isinstance(w, ipywidgets.HTML)]
    assert "7,000,000,000 params" in view.value
    odd = memory.calculator_widget(num_params=2.5e9)
    assert [w.label for w in walk(odd) if isinstance(w, ipywidgets.SelectionSlider)] == ["2.5"]
