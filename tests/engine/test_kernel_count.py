"""How many kernels a recorded decode step launches per layer, counted on a CPU.

On a GPU a decode step of a small model is launch-bound: every operation is a
kernel, and a CUDA graph's replay runs them back to back, a microsecond or two
each. The count is taken here from PyTorch's dispatcher, one operation at a
time, over one replay of the CPU stand-in for CUDA graphs, in fp32: there the
model takes the very path it takes on a GPU in any dtype (RMSNorm as one
F.rms_norm call). Views cost nothing and are not counted; operations that write
into a tensor in place are. Layers are counted as the difference between a
2-layer and a 1-layer model, in both head layouts of gpu_check.py's shapes.
cuda_graphs.py's docstring states the count; this test keeps it true.
"""
import re
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tinyinfer import cuda_graphs
from tinyinfer.config import ModelConfig
from tinyinfer.model import LlamaForCausalLM
from tinyinfer.model_runner import ModelRunner


class KernelCount(TorchDispatchMode):
    """Counts the operations that compute: a new tensor, or a write in place."""

    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        outs = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(o, torch.Tensor)]
        is_view = bool(outs) and all(o.untyped_storage().data_ptr() in inputs for o in outs)
        if func._schema.is_mutable or not is_view:
            self.ops[func.overloadpacket.__name__] += 1
        return out


def count_step(layers: int, heads: int, kv_heads: int, batch: int = 4) -> Counter:
    config = ModelConfig(vocab_size=1024, hidden_size=64 * heads, intermediate_size=256, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=64,
                         max_position_embeddings=256, tie_word_embeddings=True)
    torch.manual_seed(0)
    runner = ModelRunner(LlamaForCausalLM(config), torch.device("cpu"), torch.float32, num_blocks=32, block_size=16,
                         enforce_eager=False, max_num_seqs=4, graph_backend=cuda_graphs.EagerStandIn())
    runner.compile_or_warm_up_model()
    graphs = runner.cuda_graphs
    with torch.inference_mode(), KernelCount() as counter:
        graphs.graphs[batch, graphs.lengths[0]]()  # one replay: what a real graph would launch
    return counter.ops


def stated(pattern: str) -> int:
    found = re.search(pattern, cuda_graphs.__doc__.replace("\n", " "))
    assert found, f"cuda_graphs.py's docstring no longer says {pattern!r}"
    return int(found.group(1))


@pytest.mark.parametrize("heads, kv_heads", [(9, 3), (32, 32)], ids=["135M layout", "1.7B layout"])
def test_kernels_per_layer_are_the_docstrings(heads, kv_heads):
    one, two = count_step(1, heads, kv_heads), count_step(2, heads, kv_heads)
    per_layer, outside = two - one, one - (two - one)
    # Per layer: 2 RMSNorms (fused), 4 matrix products, RoPE (mul, cat, mul, add), the K/V writes and
    # reads, attention, SiLU and its product, 2 residual adds. No mask conversion, no negation.
    assert sum(per_layer.values()) == stated(r"\((\d+) per layer"), dict(per_layer)
    assert sum(outside.values()) == stated(r"some (\d+) outside them"), dict(outside)
    assert per_layer["rms_norm"] == 2 and "neg" not in per_layer and "to" not in per_layer
    assert per_layer["linear"] == 4 and per_layer["scaled_dot_product_attention"] == 1
