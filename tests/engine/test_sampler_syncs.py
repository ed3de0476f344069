"""How often the Sampler makes the host wait for the device (review problem 9).

On a GPU, reading a tensor's value on the host (.item(), int(t), bool(t),
.tolist()) waits until every kernel queued before it has run: 20-50 us each,
as long as a small model's whole step. A step of M sampled rows should wait a
fixed number of times, not once per row. No GPU is needed to count the waits:
on a CPU the same reads go through the same torch calls, and a dispatch mode
sees each one. The GPU-only choice (draw_rows' batched path) is forced by hand."""
import functools
from collections import Counter

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from tinyinfer import SamplingParams

V = 512


class HostReads(TorchDispatchMode):
    """Counts the reads of tensor values on the host and the tensors made from
    Python data (on a GPU, a copy from the host). item(), int(), bool() and
    float() all dispatch to aten._local_scalar_dense (seen as aten.item, and
    bool() as aten.is_nonzero, under inference_mode); .tolist() reads the data without dispatching, so the
    function mode below counts it."""

    def __init__(self):
        super().__init__()
        self.ops = Counter()
        self.methods = _Methods()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self.methods.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        return self.methods.__exit__(*exc)

    @property
    def reads(self) -> int:
        scalars = self.ops["_local_scalar_dense"] + self.ops["item"] + self.ops["is_nonzero"]
        return scalars + self.methods.calls["tolist"] + self.methods.calls["numpy"]

    @property
    def from_python(self) -> int:  # torch.tensor(list) and x[list] both make one
        return self.ops["lift_fresh"]

    @property
    def list_indexing(self) -> int:
        return self.methods.list_indexing


class _Methods(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = Counter()
        self.list_indexing = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        self.calls[name] += 1
        if name == "__getitem__" and isinstance(args[1], list):
            self.list_indexing += 1
        return func(*args, **(kwargs or {}))


def _seq(params, request_id):
    from tinyinfer.request import Request

    return Request(request_id, None, [1, 2, 3], params, eos_token_ids=()).samples[0]


# Sixteen unseeded rows that together ask for every processor.
MIXED = [SamplingParams(temperature=0.5 + i / 10, top_k=(0, 5, 50, -1)[i % 4],
                        top_p=0.9 if i % 2 else 1.0, min_p=0.05 if i % 3 == 0 else 0.0) for i in range(16)]


def _logits(m, seed=0):
    return torch.randn(m, V, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.fixture
def batched(monkeypatch):
    """The Sampler on the path a CUDA tensor takes: draw_rows batched."""
    from tinyinfer import sampler as sampler_module
    from tinyinfer.sampling import draw_rows

    monkeypatch.setattr(sampler_module, "draw_rows", functools.partial(draw_rows, batched=True))


def _count(params, logits):
    from tinyinfer.sampler import Sampler

    seqs = [_seq(p, str(i)) for i, p in enumerate(params)]
    with HostReads() as counted:
        tokens = Sampler()(logits, seqs).token_ids
    return counted, tokens


def test_sixteen_sampled_rows_read_the_host_once(batched):
    counted, tokens = _count(MIXED, _logits(16))
    assert counted.reads == 1, counted.ops  # the one .tolist() of all 16 tokens (it was 18)
    assert counted.from_python <= 1  # the settings table, copied once from pinned memory
    assert counted.list_indexing == 0
    assert len(tokens) == 16 and all(0 <= t < V for t in tokens)


def test_a_greedy_step_reads_once_and_indexes_nothing():
    counted, _ = _count([SamplingParams(temperature=0)] * 8, _logits(8))
    assert counted.reads == 1
    assert counted.from_python == 0 and counted.ops["index"] == counted.ops["index_select"] == 0


def test_a_mixed_step_picks_its_groups_without_list_indexing(batched):
    params = [SamplingParams(temperature=0) if i % 3 == 0 else MIXED[i] for i in range(16)]
    counted, tokens = _count(params, _logits(16))
    assert counted.reads == 2  # the greedy rows' tokens, the sampled rows' tokens
    assert counted.list_indexing == 0
    assert counted.from_python <= 3  # two row indices and the settings, each from pinned memory
    assert tokens[::3] == _logits(16)[::3].argmax(-1).tolist()


def test_each_seeded_row_still_reads_once(batched):
    # Kept on purpose (see Sampler.__call__): a seeded row is drawn alone, so
    # its tokens do not depend on the batch; that costs one read per such row.
    params = MIXED[:13] + [SamplingParams(temperature=0.8, seed=s) for s in range(3)]
    counted, _ = _count(params, _logits(16))
    assert counted.reads == 1 + 3


# --- the batched inverse CDF gives exactly the row-by-row indices ---------------------


def _weights(m, v, seed):
    """Probability-like rows with the awkward cases: zeros (also at both ends),
    a single nonzero entry, tiny weights a float64 sum cannot see, ties."""
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(m, v, generator=g).pow(8)
    w[torch.rand(m, v, generator=g) < 0.5] = 0  # half the entries off, as after top-p
    w[0, :] = 0
    w[0, 7] = 1  # one token left
    w[1, -5:] = 0  # zeros after the last weight
    w[2] = 0.25  # all tied
    w[3, :] = 0
    w[3, :3] = torch.tensor([1.0, 1e-30, 1e-38])  # the last two are invisible to the float64 sum
    w[:, 0] += 1e-3  # no row is all zeros
    return w.softmax(-1) * (w > 0) if seed % 2 else w  # normalised or not


@pytest.mark.parametrize("seed", range(4))
def test_batched_inverse_gives_the_row_by_row_indices(seed):
    from tinyinfer.sampling import _invert_running_sum, _invert_running_sums

    m, v = 300, 1000
    weights = _weights(m, v, seed)
    u = torch.rand(m, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    u[1] = u[3] = 1.0  # u * total == total: only rounding gets here (about 1 in 2**53); force it
    u[5] = 0.0
    cdf = weights.double().cumsum(-1)
    u[6] = cdf[6, 10] / cdf[6, -1]  # exactly on a step of the running sum (up to rounding)
    row_by_row = [_invert_running_sum(w, u_row) for w, u_row in zip(weights, u)]
    assert _invert_running_sums(weights, u) == row_by_row
    assert row_by_row[1] == int(torch.nonzero(weights[1])[-1]) and row_by_row[3] == 2  # the last weighted entry
    assert all(weights[i, t] > 0 for i, t in enumerate(row_by_row))


def test_draw_rows_gives_the_same_tokens_on_both_paths():
    from tinyinfer.sampling import draw_rows

    weights = _weights(64, 49152, 1)
    one, other = (torch.Generator().manual_seed(3) for _ in range(2))
    for _ in range(5):
        assert draw_rows(weights, one, batched=True) == draw_rows(weights, other, batched=False)


def test_draw_rows_picks_the_path_by_device(monkeypatch):
    from tinyinfer import sampling

    paths = []
    monkeypatch.setattr(sampling, "_invert_running_sums", lambda w, u: paths.append("batched") or [0])
    monkeypatch.setattr(sampling, "_invert_running_sum", lambda w, u: paths.append("row") or 0)
    sampling.draw_rows(torch.rand(2, 4))
    assert paths == ["row", "row"]  # a CPU tensor: row by row, as before
    sampling.draw_rows(torch.rand(2, 4), batched=True)
    assert paths[2:] == ["batched"]


# --- the batched filter reads its settings from Python, not from tensors -------------


def test_batched_filter_reads_nothing_and_copies_its_settings_once():
    from tinyinfer.sampling import processed_probs_batch

    with HostReads() as counted:
        processed_probs_batch(_logits(16), MIXED)
    assert counted.reads == 0 and counted.from_python == 1
