"""Lab 11 (your engine): forward passes and engines the checks must reject, one
each must accept, and the course's own they must refuse. Collected by
tests/course/test_labs.py.

The correct engine below is written for these tests (its own RoPE, attention
and cache); each wrong one is it with one plausible assembly mistake. The
scheduler and allocator are the course's references, and so is the loop except
in one alternative: the check is about putting the pieces together (the
forward pass, the sampler, the loop's settings, the paged attention given). The forward passes use the
pieces the check hands them (RoPE, paged attention, attention), as the
exercise does; each wrong one has one mistake of the layer's wiring."""
import math
from collections import deque

import torch

from tinyinfer_course import labcheck
from tinyinfer.model_runner import ModelRunner


def _rope(x, positions, theta):  # x [heads, N, D], positions [N]
    d = x.shape[-1]
    angle = positions[:, None].float() * theta ** (-torch.arange(0, d, 2).float() / d)[None]  # [N, D/2]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()], -1)


def _attention(q, k, v):
    """Causal grouped-query attention, q [1, H, n, D] the last n of k, v [1, Hkv, ctx, D]."""
    H, Hkv, n, ctx, D = q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3]
    k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    allowed = torch.arange(ctx)[None, :] <= torch.arange(ctx - n, ctx)[:, None]
    return (q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(~allowed, -math.inf).softmax(-1) @ v


def _draw(logits, temperature, generator):
    """The engine's draw, written out: one float64 number inverts the running total."""
    if temperature == 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, -1)
    total = probs.double().cumsum(-1)
    u = torch.rand(1, dtype=torch.float64, generator=generator) * total[-1]
    return min(int((total <= u).sum()), probs.numel() - 1)  # the first id whose running total exceeds u


def _own_loop(requests, allocator, schedule, execute_model, sample, token_budget, max_num_seqs, eos_token_ids):
    """Lab 7's loop, written here: a set of end-of-sequence ids, the steps counted."""
    waiting, running, stop, steps = deque(requests), [], set(eos_token_ids), 0
    while waiting or running:
        step = schedule(waiting, running, allocator, token_budget, max_num_seqs)
        logits = execute_model(step.scheduled, allocator)
        steps += 1
        for req, n in step.scheduled:
            req.num_computed += n
            if req.seq_id in logits:
                req.output_ids.append(sample(logits[req.seq_id], req.temperature, req.generator))
                if req.output_ids[-1] in stop or len(req.output_ids) == req.max_tokens:
                    allocator.free(req.seq_id)
                    running.remove(req)
    return steps


def make_serve(absolute_positions=True, read_cache=True, rotate_cached_keys=True, mlp_residual=True,
               last_token=True, interleave_heads=True, theta=None, scale_dim=None, sampler="engine",
               swap_budget=False, returns=True, use_paged=True, eos="all", rope_dtype=None, own_loop=False):
    """A correct engine when every flag has its default (theta, scale_dim None: a
    literal in their place is a model constant hard-coded). sampler: "engine"
    (right: the request's temperature and generator), "argmax", "global" (torch's
    global stream, not the request's generator), "shared" (one generator for all
    requests), "t=1" (the temperature dropped), "times t" (logits times T), or a
    sampler(logits, temperature, generator) to use.
    eos: which end-of-sequence ids reach the loop ("all", "first", "last").
    rope_dtype: RoPE computed and returned in that dtype. own_loop: lab 7's loop
    written here instead of the course's (also correct)."""

    def rope(x, positions, theta):
        if rope_dtype is None:
            return _rope(x, positions, theta)
        return _rope(x.to(rope_dtype), positions, theta)  # float64 in, float64 out: the cache is float32

    def execute(model, pool_k, pool_v, block_size, scheduled, allocator, paged):
        cfg = model.config
        H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        base = theta or cfg.rope_theta
        ids, pos, spans = [], [], []
        for req, n in scheduled:
            table = allocator.block_tables[req.seq_id]
            p = torch.arange(req.num_computed + n)
            slots = torch.tensor(table)[p // block_size] * block_size + p % block_size
            spans.append((req, len(ids), n, slots))
            ids += req.token_ids[req.num_computed : req.num_computed + n]
            pos += range(req.num_computed, req.num_computed + n) if absolute_positions else range(n)
        pos = torch.tensor(pos)
        with torch.no_grad():
            x = model.model.embed_tokens(torch.tensor(ids))
            for i, layer in enumerate(model.model.layers):
                h = layer.self_attn.qkv_proj(layer.input_layernorm(x)).view(len(ids), H + 2 * Hkv, D).transpose(0, 1)
                q, k, v = rope(h[:H], pos, base), rope(h[H : H + Hkv], pos, base), h[H + Hkv :]
                if paged is not None:  # the paged attention serve was handed (section 6's grouped one)
                    batch = [(n, req.num_computed + n, list(allocator.block_tables[req.seq_id]))
                             for req, _, n, _ in spans]
                    o = paged(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), pool_k[i], pool_v[i], batch,
                              block_size, _attention)
                    x = x + layer.self_attn.o_proj(o.reshape(len(ids), H * D))
                    m = layer.mlp(layer.post_attention_layernorm(x))
                    x = x + m if mlp_residual else m
                    continue
                new = torch.cat([s[-n:] for _, _, n, s in spans])
                pool_k[i][new] = (k if rotate_cached_keys else h[H : H + Hkv]).transpose(0, 1)
                pool_v[i][new] = v.transpose(0, 1)
                out = torch.zeros(len(ids), H * D)
                for req, first, n, slots in spans:
                    if read_cache:
                        keys, values = pool_k[i][slots].transpose(0, 1), pool_v[i][slots].transpose(0, 1)
                    else:
                        keys, values = k[:, first : first + n], v[:, first : first + n]
                    rep = H // Hkv
                    if interleave_heads:
                        keys, values = keys.repeat_interleave(rep, 0), values.repeat_interleave(rep, 0)
                    else:
                        keys, values = keys.repeat(rep, 1, 1), values.repeat(rep, 1, 1)
                    qs = q[:, first : first + n]
                    scores = qs @ keys.transpose(1, 2) / math.sqrt(scale_dim or D)  # [H, n, ctx]
                    ctx = keys.shape[1]
                    allowed = torch.arange(ctx)[None, :] <= torch.arange(ctx - n, ctx)[:, None]
                    w = scores.masked_fill(~allowed, -math.inf).softmax(-1)
                    out[first : first + n] = (w @ values).transpose(0, 1).reshape(n, H * D)
                x = x + layer.self_attn.o_proj(out)
                m = layer.mlp(layer.post_attention_layernorm(x))
                x = x + m if mlp_residual else m
            x = model.model.norm(x)
            done = [(req, first + n - 1 if last_token else first) for req, first, n, _ in spans
                    if req.num_computed + n == req.num_tokens]
            logits = model.lm_head(x[[r for _, r in done]])
        return {req.seq_id: logits[j] for j, (req, _) in enumerate(done)}

    def serve(model, requests, num_blocks, block_size, token_budget, max_num_seqs, eos_token_ids, paged=None):
        cfg = model.config
        shape = (cfg.num_hidden_layers, num_blocks * block_size, cfg.num_key_value_heads, cfg.head_dim)
        pool_k, pool_v = torch.zeros(shape), torch.zeros(shape)
        shared = torch.Generator().manual_seed(next((r.seed for r in requests if r.seed is not None), 0))
        samplers = {"engine": _draw,
                    "argmax": lambda logits, t, g: int(logits.argmax()),
                    "global": lambda logits, t, g: _draw(logits, t, None),
                    "shared": lambda logits, t, g: _draw(logits, t, shared),
                    "t=1": lambda logits, t, g: _draw(logits, 1.0 if t else 0.0, g),
                    "times t": lambda logits, t, g: _draw(logits * t, 1.0, g) if t else _draw(logits, 0.0, g)}
        sample = sampler if callable(sampler) else samplers[sampler]
        stop = {"all": list(eos_token_ids), "first": list(eos_token_ids[:1]), "last": list(eos_token_ids[-1:])}[eos]
        budget, cap = (max_num_seqs, token_budget) if swap_budget else (token_budget, max_num_seqs)
        loop = _own_loop if own_loop else labcheck.reference_run_engine
        steps = loop(requests, labcheck.ReferenceBlockAllocator(num_blocks, block_size), labcheck.reference_schedule,
                     lambda scheduled, allocator: execute(model, pool_k, pool_v, block_size, scheduled, allocator,
                                                          paged if use_paged else None),
                     sample, budget, cap, stop)
        return steps if returns else None

    return serve


def _no_paged_argument(serve):
    """serve without its paged= argument (the signature before section 6 needed it)."""
    def old_serve(model, requests, num_blocks, block_size, token_budget, max_num_seqs, eos_token_ids):
        return serve(model, requests, num_blocks, block_size, token_budget, max_num_seqs, eos_token_ids)

    return old_serve


def make_forward(absolute_positions=True, attention_residual=True, mlp_residual=True, second_norm=True,
                 final_norm=True, last_token=True, heads_in_order=True, rope_on_values=False, theta=None,
                 shape=None):
    """A forward pass with the exercise's signature; correct when every flag has its default.
    theta, shape: a model constant written as a literal (the RoPE base; H, Hkv, D)."""

    def make_execute_model(model, num_blocks, block_size, rope, paged_attention, attention):
        cfg = model.config
        H, Hkv, D = shape or (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        base = theta or cfg.rope_theta
        pools = torch.zeros(2, cfg.num_hidden_layers, num_blocks * block_size, Hkv, D)

        def execute_model(scheduled, allocator):
            ids, pos, batch, last = [], [], [], []
            for req, n in scheduled:
                ids += req.token_ids[req.num_computed : req.num_computed + n]
                pos += range(req.num_computed, req.num_computed + n) if absolute_positions else range(n)
                batch.append((n, req.num_computed + n, list(allocator.block_tables[req.seq_id])))
                if req.num_computed + n == req.num_tokens:
                    last.append((req.seq_id, len(ids) - 1 if last_token else len(ids) - n))
            pos = torch.tensor(pos)
            with torch.no_grad():
                x = model.model.embed_tokens(torch.tensor(ids))
                for i, layer in enumerate(model.model.layers):
                    h = layer.self_attn.qkv_proj(layer.input_layernorm(x)).view(len(ids), H + 2 * Hkv, D)
                    q, k, v = h[:, :H], h[:, H : H + Hkv], h[:, H + Hkv :]  # [N, heads, D]
                    q = rope(q.transpose(0, 1)[None], pos, base)[0].transpose(0, 1)
                    k = rope(k.transpose(0, 1)[None], pos, base)[0].transpose(0, 1)
                    if rope_on_values:
                        v = rope(v.transpose(0, 1)[None], pos, base)[0].transpose(0, 1)
                    o = paged_attention(q, k, v, pools[0, i], pools[1, i], batch, block_size, attention)
                    o = o.reshape(len(ids), H * D) if heads_in_order else o.transpose(0, 1).reshape(len(ids), H * D)
                    a = layer.self_attn.o_proj(o)
                    x = x + a if attention_residual else a
                    m = layer.mlp((layer.post_attention_layernorm if second_norm else layer.input_layernorm)(x))
                    x = x + m if mlp_residual else m
                if final_norm:
                    x = model.model.norm(x)
                logits = model.lm_head(x[[row for _, row in last]])
            return {sid: logits[j] for j, (sid, _) in enumerate(last)}

        return execute_model

    return make_execute_model


def _engine_forward(model, num_blocks, block_size, rope, paged_attention, attention):
    """tinyinfer's ModelRunner behind the exercise's signature (labcheck's given model step)."""
    return labcheck.make_execute_model(model, num_blocks, block_size)


def _model_forward(model, num_blocks, block_size, rope, paged_attention, attention):
    """The model's own forward (tinyinfer.forward.forward_tokens), recomputing each request from scratch."""
    from tinyinfer.forward import forward_tokens

    def execute_model(scheduled, allocator):
        return {req.seq_id: forward_tokens(model, req.token_ids)[-1] for req, n in scheduled
                if req.num_computed + n == req.num_tokens}

    return execute_model


def _tinyinfer_forward_serve(model, requests, num_blocks, block_size, token_budget, max_num_seqs, eos_token_ids):
    """Lab 7's engine: tinyinfer's model forward and paged cache do the arithmetic."""
    return labcheck.reference_run_engine(
        requests, labcheck.ReferenceBlockAllocator(num_blocks, block_size), labcheck.reference_schedule,
        labcheck.make_execute_model(model, num_blocks, block_size), lambda x, t, g: int(x.argmax()),
        token_budget, max_num_seqs, eos_token_ids)


def _model_runner_serve(model, requests, num_blocks, block_size, token_budget, max_num_seqs, eos_token_ids):
    """tinyinfer's ModelRunner behind the lab's interface."""
    runner = ModelRunner(model, torch.device("cpu"), torch.float32, num_blocks, block_size)
    return runner


WRONG = {
    "check_forward_pass": [
        make_forward(absolute_positions=False),  # RoPE positions restart at 0 every step
        make_forward(attention_residual=False),  # attention's output replaces the residual stream
        make_forward(mlp_residual=False),  # the MLP's output replaces the residual stream
        make_forward(second_norm=False),  # the MLP reads the first norm's weights, not post_attention_layernorm's
        make_forward(final_norm=False),  # the LM head reads the last layer's output without the final norm
        make_forward(last_token=False),  # samples from a chunk's first token, not its last
        make_forward(heads_in_order=False),  # [N, H, D] flattened head-major: heads and tokens mixed up
        make_forward(rope_on_values=True),  # rotates the values as well as the queries and keys
        # A model constant written as a literal: right for one model only.
        make_forward(theta=10000.0),  # the usual Llama RoPE base, not the model's
        make_forward(theta=100000.0),  # SmolLM2's RoPE base
    ],
    "check_your_engine": [
        make_serve(absolute_positions=False),  # RoPE positions restart at 0 every step
        make_serve(read_cache=False),  # attention sees only this step's keys, not the cached ones
        make_serve(rotate_cached_keys=False),  # caches the keys before RoPE
        make_serve(mlp_residual=False),  # the MLP's output replaces the residual stream
        make_serve(last_token=False),  # samples from a chunk's first token, not its last
        make_serve(interleave_heads=False),  # query head h reads K/V head h % Hkv, not h // group
        make_serve(theta=10000.0),  # the usual Llama RoPE base, not the model's
        make_serve(theta=100000.0),  # SmolLM2's RoPE base
        make_serve(scale_dim=64),  # scores divided by sqrt(64), SmolLM2's head size, whatever the model's
        make_serve(scale_dim=16),  # the same with the first check model's head size
        # The sampler: greedy tokens are the same whatever it does, so only a sampled request shows these.
        make_serve(sampler="argmax"),  # the sampler replaced by argmax: every request greedy
        make_serve(sampler="global"),  # draws from torch's global stream, not the request's generator
        make_serve(sampler="shared"),  # one generator for every request: each draw depends on the others
        make_serve(sampler="t=1"),  # the request's temperature dropped: T = 1 for every sampled request
        make_serve(sampler="times t"),  # logits multiplied by the temperature, not divided
        # The loop's settings and what serve returns: the tokens stay the same, the steps do not.
        make_serve(swap_budget=True),  # token_budget and max_num_seqs swapped in the call to the loop
        make_serve(returns=False),  # serve runs the loop but returns nothing
        make_serve(own_loop=True, swap_budget=True),  # the same swap with a loop of its own
        # End-of-sequence ids: only one of them stops a request.
        make_serve(eos="first"),  # eos_token_ids[0] only
        make_serve(eos="last"),  # the last id only
        # The paged attention serve is handed (section 6 passes the grouped one).
        make_serve(use_paged=False),  # paged= accepted and ignored
        _no_paged_argument(make_serve()),  # serve written without the paged= argument
        # A piece that returns float64: the ✗ names it.
        make_serve(rope_dtype=torch.float64),  # RoPE in float64, its output written into a float32 cache
    ],
}
REFERENCE = {"check_forward_pass": lambda: make_forward(), "check_your_engine": lambda: make_serve()}
# More correct engines, each unlike the reference: the check must accept every one.
ALTERNATIVES = {
    "check_your_engine": [make_serve(own_loop=True)],  # lab 7's loop written here, a set of stop ids
}
ANSWERS = {
    "check_forward_pass": [labcheck.reference_make_execute_model, _engine_forward, _model_forward],
    "check_your_engine": [_tinyinfer_forward_serve, _model_runner_serve],
}
