"""Lab 10 (beyond one reply): wrong implementations each check must reject, the
reference each must accept, and the course answers each must refuse.
Collected by tests/course/test_labs.py.

The tool-call parser below (_parse) is written here, so that no wrong
implementation calls the engine's parse_tool_call, which the first check refuses."""
import json
import re

from tinyinfer_course.text import context, tools
from tinyinfer_course import labcheck
from tinyinfer_course.text.context import STOPWORDS
from tinyinfer_course.text.tools import AgentResult, ToolCall

# ------------------------------------------------------------ parse_tool_call


def _parse(text):
    """A correct parser: the first JSON object after <tool_call>, if it is a well-formed call."""
    match = re.search(r"<tool_call>\s*", text)
    if not match:
        return None
    try:
        obj, _ = json.JSONDecoder().raw_decode(text, match.end())
    except json.JSONDecodeError:
        return None
    if type(obj) is not dict:
        return None
    name, arguments = obj.get("name"), obj.get("arguments", {})
    if not (isinstance(name, str) and name.strip()) or type(arguments) is not dict:
        return None
    return ToolCall(name.strip(), arguments)

def _needs_closing_tag(text):
    # a reply cut at the stop string "</tool_call>" never parses
    m = re.search(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL)
    if not m:
        return None
    return _parse(m.group(0))


def _json_loads_everything(text):
    # json.loads on all that follows the tag: the closing tag or trailing text breaks it
    if "<tool_call>" not in text:
        return None
    try:
        obj = json.loads(text.split("<tool_call>", 1)[1].removesuffix("</tool_call>"))
    except json.JSONDecodeError:
        return None
    return ToolCall(obj["name"], obj.get("arguments", {})) if isinstance(obj, dict) and obj.get("name") else None


def _no_validation(text):
    # takes any JSON after the tag, whatever its shape
    if "<tool_call>" not in text:
        return None
    try:
        obj, _ = json.JSONDecoder().raw_decode(text.split("<tool_call>", 1)[1].lstrip())
    except json.JSONDecodeError:
        return None
    return ToolCall(obj.get("name") if isinstance(obj, dict) else str(obj),
                    obj.get("arguments", {}) if isinstance(obj, dict) else {})


def _last_call(text):
    # the last call instead of the first
    return _parse("<tool_call>" + text.split("<tool_call>")[-1]) if "<tool_call>" in text else None


def _bare_json_too(text):
    # also treats plain JSON as a call: an answer that happens to be JSON would run a tool
    if "<tool_call>" not in text and text.lstrip().startswith("{"):
        text = "<tool_call>" + text
    return _parse(text)


def _arguments_none(text):
    # a call without arguments gets None, which f(**None) cannot take
    call = _parse(text)
    if call is not None and "arguments" not in text:
        return ToolCall(call.name, None)
    return call


# ------------------------------------------------------------ run_agent


def _loop(generate, tools, messages, max_passes, *, tool_role="tool", append_reply=True, copy=True,
          stop_after_tool=False, count_passes="model", unknown="message", on_error="message", last_prompt=False,
          parse=None, catch=Exception, positional=False):
    """A configurable agent loop; each wrong implementation below changes one thing."""
    transcript = list(messages) if copy else messages
    r = AgentResult(None, transcript, 0, 0, 0, 0)
    for _ in range(max_passes):
        reply = generate(list(transcript))
        r.passes += 1
        r.prompt_tokens = reply.prompt_tokens if last_prompt else r.prompt_tokens + reply.prompt_tokens
        r.output_tokens += reply.output_tokens
        if append_reply:
            transcript.append({"role": "assistant", "content": reply.text})
        call = (parse or _parse)(reply.text)
        if call is None:
            r.answer = reply.text
            break
        r.tool_calls += 1
        if call.name not in tools:
            if unknown == "stop":
                break
            content = f"error: unknown tool {call.name!r}"
        else:
            try:
                tool = tools[call.name]
                content = str(tool(*call.arguments.values()) if positional else tool(**call.arguments))
            except catch as e:
                if on_error == "stop":
                    break
                content = f"error: {e}" if on_error == "short" else f"error: {type(e).__name__}: {e}"
        transcript.append({"role": tool_role, "content": content})
        if stop_after_tool:
            r.answer = content
            break
    if count_passes == "tools":
        r.passes = r.tool_calls
    return r


WRONG_AGENTS = [
    lambda g, t, m, n: _loop(g, t, m, n, tool_role="user"),  # the result comes back as the user speaking
    lambda g, t, m, n: _loop(g, t, m, n, append_reply=False),  # the model never sees its own call
    lambda g, t, m, n: _loop(g, t, m, n, copy=False),  # appends to the caller's list
    lambda g, t, m, n: _loop(g, t, m, n, stop_after_tool=True),  # returns the tool's output: no second pass
    lambda g, t, m, n: _loop(g, t, m, n, count_passes="tools"),  # counts tool calls, not model runs
    lambda g, t, m, n: _loop(g, t, m, n, unknown="stop"),  # gives up on an unknown tool
    lambda g, t, m, n: _loop(g, t, m, n, on_error="short"),  # the error message without its type
    lambda g, t, m, n: _loop(g, t, m, max(n - 1, 1)),  # one pass short of max_passes
    # adds up output tokens but keeps only the last pass's prompt: misses the re-reading
    lambda g, t, m, n: _loop(g, t, m, n, last_prompt=True),
    # The given parse_call ignored, the loop parsing calls its own way:
    lambda g, t, m, n: _loop(g, t, m, n, parse=_needs_closing_tag),  # a regex up to </tool_call>
    lambda g, t, m, n: _loop(g, t, m, n, parse=_json_loads_everything),  # json.loads on the rest of the reply
    lambda g, t, m, n: _loop(g, t, m, n, parse=_no_validation),  # any JSON after the tag is a call
    # Issue 56: only some exceptions caught, or the tool called with its arguments in order.
    lambda g, t, m, n: _loop(g, t, m, n, catch=TypeError),  # the one error a missing argument raises
    lambda g, t, m, n: _loop(g, t, m, n, catch=(TypeError, ValueError)),  # the errors the author thought of
    lambda g, t, m, n: _loop(g, t, m, n, catch=(TypeError, ValueError, KeyError)),
    lambda g, t, m, n: _loop(g, t, m, n, positional=True),  # tools[name](*arguments.values())
]

# ------------------------------------------------------------ select_context


def _words(text, lower=True, stop=True):
    found = set(re.findall(r"[a-z0-9]+" if lower else r"[A-Za-z0-9]+", text.lower() if lower else text))
    return found - STOPWORDS if stop else found


def _select(chunks, question, budget, count, *, order="document", lower=True, stop=True, occurrences=False,
            keep_zero=False, fit="skip", strict=False, tie="earlier"):
    q = _words(question, lower, stop)

    def score(c):
        if occurrences:
            found = re.findall(r"[a-z0-9]+", c.lower())
            return sum(1 for w in found if w in q)
        return len(_words(c, lower, stop) & q)
    scores = [score(c) for c in chunks]
    idx = [i for i in range(len(chunks)) if keep_zero or scores[i] > 0]
    ranked = sorted(idx, key=lambda i: (-scores[i], i if tie == "earlier" else -i))
    chosen, used = [], 0
    for i in ranked:
        cost = count(chunks[i])
        if (used + cost < budget) if strict else (used + cost <= budget):
            chosen.append(i)
            used += cost
        elif fit == "stop":
            break
    return [chunks[i] for i in (sorted(chosen) if order == "document" else chosen)]


WRONG_SELECTORS = [
    lambda c, q, b, n: _select(c, q, b, n, order="rank"),  # best first, not in document order
    lambda c, q, b, n: _select(c, q, b, n, lower=False),  # case-sensitive
    lambda c, q, b, n: _select(c, q, b, n, stop=False),  # stopwords count as matches
    lambda c, q, b, n: _select(c, q, b, n, occurrences=True),  # counts occurrences, not distinct words
    lambda c, q, b, n: _select(c, q, b, n, keep_zero=True),  # sends chunks that share nothing
    lambda c, q, b, n: _select(c, q, b, n, fit="stop"),  # stops at the first chunk that does not fit
    lambda c, q, b, n: _select(c, q, b, n, strict=True),  # a chunk that fills the budget exactly is refused
    lambda c, q, b, n: _select(c, q, b, n, tie="later"),  # ties go to the later chunk
]

# ------------------------------------------------------------ cheapest_option


def _seconds_per_token(steps, mine, other, *, mixed=False, mean_rate=False):
    """Seconds one token of a kind takes, from the steps that timed it; None if none did."""
    timed = [s for s in steps if s[mine] > 0 and (mixed or s[other] == 0)]
    if not timed:
        return None
    if mean_rate:
        return 1 / (sum(s[mine] / s["step_time_s"] for s in timed) / len(timed))
    return sum(s["step_time_s"] for s in timed) / sum(s[mine] for s in timed)


def _cheapest(options, input_tokens, output_tokens, *, mixed=False, mean_rate=False, per_hour=False,
              per_token_list=False, rank="cost", missing="none", tie="first", strict_missing=False):
    """A correct choice with every default; each wrong one below changes one decision."""
    costs, per_million = {}, {}
    for name, o in options.items():
        if "steps" in o:
            per_second = o["price_per_hour"] if per_hour else o["price_per_hour"] / 3600
            s_in = _seconds_per_token(o["steps"], "num_prefill_tokens", "num_decode_tokens", mixed=mixed,
                                      mean_rate=mean_rate)
            s_out = _seconds_per_token(o["steps"], "num_decode_tokens", "num_prefill_tokens", mixed=mixed,
                                       mean_rate=mean_rate)
            prices = [None if s is None else per_second * s for s in (s_in, s_out)]  # dollars per token
        else:
            scale = 1 if per_token_list else 1e6
            prices = [o["input_per_million"] / scale, o["output_per_million"] / scale]
        per_million[name] = sum(p * 1e6 for p in prices if p is not None)
        total = 0.0
        for tokens, price in zip((input_tokens, output_tokens), prices):
            if price is None and (tokens or strict_missing):
                if missing == "free":
                    continue
                total = None
                break
            total += tokens * price if price is not None else 0.0
        costs[name] = total
    names = [n for n in costs if costs[n] is not None]
    if not names:
        return None, costs
    key = {"cost": lambda n: costs[n], "per_million": lambda n: per_million[n]}[rank]
    ordered = names if tie == "first" else names[::-1]
    return min(ordered, key=key), costs


WRONG_CHOICES = [
    lambda o, i, n: _cheapest(o, i, n, mixed=True),  # times a mixed step's whole seconds for both kinds
    lambda o, i, n: _cheapest(o, i, n, mean_rate=True),  # the mean of per-step rates
    lambda o, i, n: _cheapest(o, i, n, per_hour=True),  # forgets that the price is per hour
    lambda o, i, n: _cheapest(o, i, n, per_token_list=True),  # reads a price list as dollars per token
    lambda o, i, n: _cheapest(o, i, n, rank="per_million"),  # ranks by list prices, not by this workload's mix
    lambda o, i, n: _cheapest(o, i, n, missing="free"),  # a kind the log never timed is treated as free
    lambda o, i, n: _cheapest(o, i, n, strict_missing=True),  # refuses a log that lacks a kind the workload needs not
    lambda o, i, n: _cheapest(o, i, n, tie="last"),  # a tie goes to the option listed last
    lambda o, i, n: (lambda r: (r[0] if r[0] is not None else next(iter(o)), r[1]))(_cheapest(o, i, n)),
    # ^ picks the first option when none can be priced, instead of None
]

# ------------------------------------------------------------ token_trie


class _Trie:
    """A correct prefix tree with every default (nested dicts; a node's token ids
    under the key None); each wrong one below changes one decision."""
    leaves_only = past_end = no_eos = empty_text = first_only = ignore_prefix = all_choices = False
    strict = overwrite = strip = eos_always = eos_only = False
    lstrip = blank_special = zero_special = truthy_ids = strip_rest = False  # issue 56: spaces and token 0

    def __init__(self, vocab):
        self.root = {}
        for i, text in enumerate(vocab):
            if self.strip:
                text = text.strip()
            if self.lstrip:
                text = text.lstrip()
            if not text and not self.empty_text:
                continue
            if self.blank_special and not text.strip():  # a token of spaces only taken for a special token
                continue
            if self.zero_special and not i:  # token 0 taken for the special token it is in many vocabularies
                continue
            node = self.root
            for char in text:
                node = node.setdefault(char, {})
            if self.overwrite:
                node[None] = [i]
            else:
                node.setdefault(None, []).append(i)

    def _ids(self, node):
        if self.leaves_only and any(k is not None for k in node):
            return []
        if self.truthy_ids:  # filter(None, ids): drops id 0
            return list(filter(None, node.get(None, [])))
        return node.get(None, [])

    def _subtree(self, node):
        return [i for k, child in node.items() for i in (child if k is None else self._subtree(child))]

    def allowed(self, prefix, choices, eos_token_id):
        out = set(self.root.get(None, [])) if self.empty_text else set()
        open_choices = [c for c in choices if self.all_choices or c.startswith(prefix)]
        for choice in open_choices[:1] if self.first_only else open_choices:
            rest = choice if self.ignore_prefix else choice[len(prefix):]
            if self.strip_rest:
                rest = rest.lstrip()
            node = self.root
            for n, char in enumerate(rest):
                if char not in node:
                    break
                node = node[char]
                if self.strict and n == len(rest) - 1:
                    break
                out.update(self._ids(node))
            else:
                if self.past_end and rest:
                    out.update(self._subtree(node))
        if (prefix in choices and not self.no_eos) or self.eos_always:
            out.add(eos_token_id)
        if prefix in choices and self.eos_only:
            out = {eos_token_id}
        return out


def _wrong_trie(comment, **changes):
    return type("WrongTrie", (_Trie,), {"__doc__": comment, **changes})


class _ScanDressedAsATrie:
    """Keeps the vocabulary and tests every token in each row: the right ids, a scan's work."""
    def __init__(self, vocab):
        self.vocab = vocab

    def allowed(self, prefix, choices, eos_token_id):
        out = {i for i, text in enumerate(self.vocab) if text and any(c.startswith(prefix + text) for c in choices)}
        return out | ({eos_token_id} if prefix in choices else set())


class _RebuiltEveryRow(_Trie):
    """Builds the tree inside allowed(), for every row: it reads the whole vocabulary each time."""
    def __init__(self, vocab):
        self.vocab = vocab

    def allowed(self, prefix, choices, eos_token_id):
        _Trie.__init__(self, self.vocab)
        return _Trie.allowed(self, prefix, choices, eos_token_id)


class _ByFirstCharacter:
    """Files the tokens by their first character and scans that bucket: fewer tokens than a scan, still thousands."""
    def __init__(self, vocab):
        self.buckets = {}
        for i, text in enumerate(vocab):
            if text:
                self.buckets.setdefault(text[0], []).append((i, text))

    def allowed(self, prefix, choices, eos_token_id):
        out = {eos_token_id} if prefix in choices else set()
        for choice in choices:
            rest = choice[len(prefix):] if choice.startswith(prefix) else ""
            out.update(i for i, text in self.buckets.get(rest[:1], []) if rest.startswith(text))
        return out


class _AList(_Trie):
    def allowed(self, prefix, choices, eos_token_id):
        return sorted(_Trie.allowed(self, prefix, choices, eos_token_id))


class _Texts(_Trie):
    def __init__(self, vocab):
        super().__init__(vocab)
        self.vocab = vocab

    def allowed(self, prefix, choices, eos_token_id):
        return {self.vocab[i] for i in _Trie.allowed(self, prefix, choices, eos_token_id) if i != eos_token_id}


WRONG_TRIES = [
    _ScanDressedAsATrie,  # the right ids, but it tests every token in each row
    _RebuiltEveryRow,  # builds the tree again in every row
    _ByFirstCharacter,  # a bucket per first character, scanned
    _wrong_trie("keeps a token only where no longer token goes on", leaves_only=True),
    _wrong_trie("allows the tokens that run past the choice's end", past_end=True),
    _wrong_trie("never lets the reply end", no_eos=True),
    _wrong_trie("lets the reply end anywhere", eos_always=True),
    _wrong_trie("a whole choice must end, though a longer one goes on", eos_only=True),
    _wrong_trie("files the tokens with no text at the root and allows them", empty_text=True),
    _wrong_trie("walks only the first choice that fits", first_only=True),
    _wrong_trie("walks each whole choice, not what remains after the prefix", ignore_prefix=True),
    _wrong_trie("walks what follows len(prefix) in every choice, even those the prefix rules out", all_choices=True),
    _wrong_trie("stops one character short: no token may finish a choice", strict=True),
    _wrong_trie("keeps one token per node: the last of two with the same text", overwrite=True),
    _wrong_trie("strips the texts' spaces: ' get' is filed as 'get'", strip=True),
    _wrong_trie("strips only the leading spaces: ' Paris' is filed as 'Paris', ' ' not at all", lstrip=True),
    _wrong_trie("takes a token of spaces only for a special token, as it does an empty one", blank_special=True),
    _wrong_trie("skips token 0, as if it were always the special end-of-sequence token", zero_special=True),
    _wrong_trie("drops id 0 from a row with filter(None, ...)", truthy_ids=True),
    _wrong_trie("strips the spaces at the start of what remains of a choice", strip_rest=True),
    _AList,  # a sorted list, not a set
    _Texts,  # the tokens' texts, not their ids
]


class _CallsTheScan:
    """The course's scan behind a tree's interface."""
    def __init__(self, vocab):
        self.vocab = vocab

    def allowed(self, prefix, choices, eos_token_id):
        return labcheck.scan_allowed_tokens(prefix, choices, self.vocab, eos_token_id)


class _CallsTheEngine:
    """The engine's own mask (llguidance) behind a tree's interface."""
    def __init__(self, vocab):
        self.vocab = vocab

    def allowed(self, prefix, choices, eos_token_id):
        from tinyinfer.structured_output import StructuredOutputsParams, allowed_token_ids

        return set(allowed_token_ids(None, StructuredOutputsParams(choice=list(choices)), []))


WRONG = {
    "check_parse_tool_call": [_needs_closing_tag, _json_loads_everything, _no_validation, _last_call, _bare_json_too,
                              _arguments_none],
    "check_run_agent": WRONG_AGENTS,
    "check_select_context": WRONG_SELECTORS,
    "check_cheapest_option": WRONG_CHOICES,
    "check_token_trie": WRONG_TRIES,
}
# Correct implementations, written here: each helper above with its defaults.
REFERENCE = {
    "check_parse_tool_call": lambda: _parse,
    "check_run_agent": lambda: _loop,
    "check_select_context": lambda: _select,
    "check_cheapest_option": lambda: _cheapest,
    "check_token_trie": lambda: _Trie,
}
ANSWERS = {
    "check_parse_tool_call": [labcheck.reference_parse_tool_call, tools.parse_tool_call],
    "check_run_agent": [labcheck.reference_run_agent, tools.run_agent],
    "check_select_context": [labcheck.reference_select_context, context.select_context],
    "check_cheapest_option": [labcheck.reference_cheapest_option],
    "check_token_trie": [labcheck.ReferenceTokenTrie, _CallsTheScan, _CallsTheEngine],
}
