"""The book's prose stays true to the book.

1. Cross-references resolve: "chapter N" and "lab N" exist; a {doc} link named
   "chapter N" goes to chapter N; "chapter N's X section" names a heading of
   chapter N; "section N" and "exercise N" exist in the lab (or in "lab M");
   and a reference that says what a lab section holds, or what a chapter or a
   lab does, is listed in ANCHORS with a word the target must contain.
   The claim's verb says where (section 1b): "measures" and "times" need a code
   cell of the target that measures (reads the clock, runs the profiler, reads
   the engine's timings, renders a stored report) and holds the word; "uses"
   needs the word in the target's code; "counts", "prints" and "shows" need it
   in the target. So "chapter 7 measures the time saved" fails when chapter 7
   only counts the cached tokens. A glossary entry's "See chapter N" needs the
   term in chapter N (section 1c).
2. Each chapter's "Try it yourself" links its lab and names the lab's exercise
   functions (the cells tagged `exercise`, see scripts/make_labs.py), with the
   two exceptions stated in NO_TRY_IT_YOURSELF and LAB_WITHOUT_CHAPTER.
3. No timing, speed ratio or bandwidth is written into the prose as a literal
   that the next machine would contradict: it is glued from the page's own
   computation, or its sentence names the machine and a date, or it sets up a
   made-up case ("suppose ..."), or it is a cited figure in ALLOWED_LITERALS.
   Nor is a rounded count of what the code counts ("some 5,000 checks"): it is
   glued, or a cited fact in ALLOWED_COUNTS (section 3b).

The prose is the chapters, intro.md, glossary.md, misconceptions.md,
further-reading.md and the markdown cells of solutions/*.ipynb (the labs are
generated from those); the cross-references and the count lint read README.md
too. Code cells and docstrings are out of scope.

To run the same checks on older text, point them at a folder holding a copy of
those files:

    git archive a752feb chapters labs solutions intro.md glossary.md misconceptions.md \
        further-reading.md README.md | tar -x -C /tmp/old
    PROSE_ROOT=/tmp/old python -m pytest tests/book/test_prose.py
    python tests/book/test_prose.py /tmp/old      # the same findings, listed by check

An old sentence that today's ANCHORS no longer lists shows as an unchecked claim. To
judge it by the word the old test anchored it to, name that test as well:

    git show a752feb:tests/test_prose.py > /tmp/old_test_prose.py
    python tests/book/test_prose.py /tmp/old /tmp/old_test_prose.py
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import nbformat

ROOT = Path(os.environ.get("PROSE_ROOT") or Path(__file__).resolve().parents[2])
BOOK_PAGES = ["intro.md", "glossary.md", "misconceptions.md", "further-reading.md"]


# ---------------------------------------------------------------- reading the prose


@dataclass(frozen=True)
class Line:
    where: str  # "chapters/04-prefill-decode.md:123" or "solutions/04-….ipynb cell <id>, line 3"
    path: str  # the file, relative to ROOT
    text: str
    cell: int | None = None  # index of the markdown cell, for notebooks


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the prose in MyST text: code fences (code cells,
    ```python blocks) are left out; admonitions and other directives are prose."""
    out, stack = [], []  # stack of (fence, is_code)
    for number, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^\s*(`{3,}|~{3,})(.*)$", line)
        if m:
            fence, info = m.group(1), m.group(2).strip()
            if stack and not info and fence[0] == stack[-1][0][0] and len(fence) >= len(stack[-1][0]):
                stack.pop()
                continue
            if not (stack and stack[-1][1]):  # no fence opens inside a code block
                is_code = info.startswith("{code-cell}") or not info.startswith("{")
                stack.append((fence, is_code))
                title = re.sub(r"^\{[\w:-]+\}\s*", "", info)
                if not is_code and title:  # a dropdown's or an admonition's title is prose
                    out.append((number, title))
                continue
        if stack and stack[-1][1]:
            continue
        if stack and re.match(r"^\s*:\w[\w-]*:", line):  # a directive's option line
            continue
        out.append((number, line))
    return out


def chapter_paths() -> list[Path]:
    return sorted((ROOT / "chapters").glob("*.md"))


def solution_paths() -> list[Path]:
    return sorted((ROOT / "solutions").glob("[0-9][0-9]*.ipynb"))


@lru_cache(maxsize=None)
def notebook(path: Path):
    return nbformat.read(path, as_version=4)


def page_lines(path: Path) -> list[Line]:
    rel = str(path.relative_to(ROOT))
    if path.suffix == ".md":
        return [Line(f"{rel}:{n}", rel, t) for n, t in prose_lines(path.read_text())]
    lines = []
    for i, cell in enumerate(notebook(path).cells):
        if cell.cell_type == "markdown":
            label = cell.get("id", i)
            lines += [Line(f"{rel} cell {label} (index {i}), line {n}", rel, t, i) for n, t in prose_lines(cell.source)]
    return lines


def all_prose() -> list[Path]:
    return chapter_paths() + [ROOT / p for p in BOOK_PAGES] + solution_paths()


def claim_pages() -> list[Path]:
    """The prose and the README: what the cross-references and the count lint read."""
    return all_prose() + [p for p in [ROOT / "README.md"] if p.exists()]


def _join_sentences(text: str) -> list[str]:
    # split on ". " followed by a capital or a marker, not inside "e.g. " or "2.3"
    parts = re.split(r"(?<=[.!?])\s+(?=[A-Z*`({\[\"'])", text)
    return [p for p in parts if p.strip()]


def paragraph_sentences(lines: list[Line]) -> list[tuple[Line, str, str]]:
    """Sentences of the prose, each with the line it starts on and its paragraph
    (a heading, a table row or a list item is a paragraph of its own)."""
    out, para = [], []

    def flush():
        if para:
            text = " ".join(t for _, t in para)
            pos, starts = 0, []
            for line, t in para:
                starts.append((pos, line))
                pos += len(t) + 1
            cursor = 0
            for s in _join_sentences(text):
                at = text.find(s, cursor)
                cursor = at + len(s)
                out.append(([ln for off, ln in starts if off <= at][-1], s, text))
            para.clear()

    for line in lines:
        t = line.text.strip()
        new_block = (not t or t.startswith(("#", "|", "- ", "* ", "+ ")) or re.match(r"\d+\.\s", t)
                     or (para and para[-1][0].cell != line.cell))
        if new_block:
            flush()
        if t:
            para.append((line, t))
        if t.startswith(("#", "|")):
            flush()
    flush()
    return out


# ---------------------------------------------------------------- what the references point at


def headings_of_page(path: Path) -> list[str]:
    return [re.sub(r"^#+\s*", "", t).strip() for _, t in prose_lines(path.read_text()) if re.match(r"#{1,6}\s", t)]


def chapter_files() -> dict[int, Path]:
    return {int(p.name[:2]): p for p in chapter_paths()}


def lab_files() -> dict[str, Path]:
    """Lab number as written ("4", "7a") -> its solution notebook."""
    return {re.match(r"0*(\d+[a-z]?)", p.name).group(1): p for p in solution_paths()}


@dataclass
class Section:
    number: int
    title: str
    text: str  # every cell of the section: markdown, code and text outputs


def cell_text(cell) -> str:
    text = cell.source
    for out in cell.get("outputs", []):
        if "text" in out:
            text += "\n" + "".join(out["text"])
        for value in out.get("data", {}).values():
            if isinstance(value, str):
                text += "\n" + value
    return text


def lab_sections(path: Path) -> dict[int, Section]:
    sections, current = {}, None
    for cell in notebook(path).cells:
        if cell.cell_type == "markdown":
            m = re.search(r"^## (\d+)\. (.+)$", cell.source, re.M)
            if m:
                current = Section(int(m.group(1)), m.group(2).strip(), "")
                sections[current.number] = current
            elif re.search(r"^## ", cell.source, re.M):
                current = None  # "What you measured": not a numbered section
        if current is not None:
            current.text += "\n" + cell_text(cell)
    return sections


def lab_title(path: Path) -> str:
    m = re.search(r"^# Lab \w+: (.+)$", notebook(path).cells[0].source, re.M)
    return m.group(1).strip() if m else ""


def exercise_cells(path: Path) -> list:
    return [c for c in notebook(path).cells if c.cell_type == "code" and "exercise" in c.metadata.get("tags", [])]


def exercise_names(path: Path) -> list[str]:
    """The functions and classes each exercise cell asks for (scripts/make_labs.py: cells tagged `exercise`)."""
    names = []
    for cell in exercise_cells(path):
        names += re.findall(r"^(?:def|class) (\w+)", cell.source, re.M)
    return names


def page_code(path: Path) -> str:
    """A chapter's code cells (what it computes and shows)."""
    text, inside = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```{code-cell}"):
            inside = True
        elif inside and line.startswith("```"):
            inside = False
        elif inside:
            text.append(line)
    return "\n".join(text)


def normal(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", s.lower().replace("’", "'")).strip()


# ---------------------------------------------------------------- 1. cross-references

NUMBER_LIST = r"(\d+[a-z]?(?:(?:\s*,\s*|\s+(?:and|or|to)\s+|\s*[-–]\s*)\d+[a-z]?)*)"

# A reference that claims what a lab section or a chapter holds must say where the thing
# is: each entry is (file, a piece of the sentence with its number written as #, the
# anchor the target must contain). For a lab section, the anchor is looked for in the
# section's cells (markdown, code and printed output); for "chapter N measures/times/
# counts ..." in the chapter's code cells; for "lab N measures ..." in the lab's cells.
# A new reference of these kinds fails until it is added here, after checking it.
ANCHORS = [
    # lab 1
    ("01-tokens.ipynb", "(section #) #", "rank"),  # "exercise 1 (section 3)" in the time line
    ("01-tokens.ipynb", "engine folder (section # explains how)", "my_engine"),
    ("01-tokens.ipynb", "Section # comes back to that", "<|im_end|>"),
    ("01-tokens.ipynb", "early printing (section # uses it", "PROSE"),
    ("01-tokens.ipynb", "early printing from section #", "printing"),
    # lab 3
    ("03-sampling.ipynb", "probability printed in section #", "Paris"),
    ("03-sampling.ipynb", "table from section #", "Paris"),
    ("03-sampling.ipynb", "slider in section #", "distribution_widget"),
    ("03-sampling.ipynb", "tail's share grows (section #)", "temperature"),
    ("03-sampling.ipynb", "two logits printed in section #", "logit"),
    ("03-sampling.ipynb", "the recipe of section #", "float64"),
    # lab 4
    ("04-prefill-decode.ipynb", "chat question of section #", "sky blue"),
    ("04-prefill-decode.ipynb", "Section # shows why that arithmetic is what counts", "arithmetic intensity"),
    ("04-prefill-decode.ipynb", "(section #'s single product", "bandwidth"),
    ("04-prefill-decode.ipynb", "came out low: run section # again", "bandwidth"),
    ("04-prefill-decode.ipynb", "matrix-vector product of section #", "bandwidth"),
    ("04-prefill-decode.ipynb", "you computed in section #", "fraction of the bound"),
    ("04-prefill-decode.ipynb", "Section # printed your ratio", "ttft_ratio"),
    ("04-prefill-decode.ipynb", "measured; run section # again", "ttft_ratio"),
    # lab 5
    ("05-kv-cache.ipynb", "(section # printed its shape)", "shape"),
    ("05-kv-cache.ipynb", "The token counts of section #", "tokens"),
    # lab 6
    ("06-quantization.ipynb", "short last group, as section # will need", "576"),
    ("06-quantization.ipynb", "(the measure of section #)", "relative error"),
    ("06-quantization.ipynb", "(section # shows what g64 costs in perplexity)", "perplexity"),
    ("06-quantization.ipynb", "Section # times the INT4 g32 model", "ms"),
    ("06-quantization.ipynb", "for the reason you saw in sections # and #", "group"),
    ("06-quantization.ipynb", "Q4_1 grid (section #)", "Q4_1"),
    # lab 7
    ("07-batching.ipynb", "(section # printed how much)", "reserved"),
    # lab 8
    ("08-fleets.ipynb", "Sections # to # and # work with real servers", "tinyinfer"),
    ("08-fleets.ipynb", "Sections #, # and # are a simulation", "simulat"),
    ("08-fleets.ipynb", "Sections # and # were simulated", "simulat"),
    # lab 9
    ("09-toolbox.ipynb", "§# measures the ratio on yours", "pass_seconds"),
    # lab 10
    ("10-beyond-one-reply.ipynb", "the factor §# printed", "prefill"),
    # lab 11
    ("11-your-engine.ipynb", "in section #, the server around", "tinyinfer serve"),
    ("11-your-engine.ipynb", "yours gets one in section #", "PrefixCache"),
    ("11-your-engine.ipynb", "around its parts (for section #)", "spent"),
    ("11-your-engine.ipynb", "(the running total in float64, section # of lab #)", "float64"),
    ("11-your-engine.ipynb", "Section # prints the time each part took", "spent"),
    ("11-your-engine.ipynb", "Section # says where your engine loses time", "spent"),
    ("11-your-engine.ipynb", "the ratio in section #'s table before", "tok/s"),
    ("11-your-engine.ipynb", "the stopwatch of section #", "def stopwatch"),
    ("11-your-engine.ipynb", "`paged_attention` of section #", "def paged_attention"),
    ("11-your-engine.ipynb", "(section # says how many per request and layer)", "per request and layer"),
    # chapters and labs that claim to measure, time, count, print, show or use something
    ("06-quantization.md", "chapter # <#-prefill-decode>` measured why", "matmuls"),
    ("06-quantization.md", "chapter # <#-prefill-decode>` times the kernels", "GB/s"),
    ("09-toolbox.md", "as chapter # measured on this machine", "GB/s"),
    ("09-toolbox.md", "({doc}`#-prefill-decode` measured why)", "matmuls"),
    ("09-toolbox.md", "{doc}`#-quantization` measured perplexity", "perplexity"),
    ("09-toolbox.md", "{doc}`#-quantization` measures both", "int4"),
    ("09-toolbox.md", "{doc}`#-quantization` measures, on the machine that runs it", "int8"),
    ("09-toolbox.md", "chapter # used, `forward_cost", "forward_cost"),
    ("misconceptions.md", "{doc}`chapters/#-kv-cache`, times decoding with and without", "use_cache"),
    ("misconceptions.md", "lab # measures it on the real engine", "throughput"),
    ("misconceptions.md", "chapter # also times INT8 and INT4", "int4"),
    ("misconceptions.md", "{doc}`chapters/#-quantization`, measures", "int4"),
    ("misconceptions.md", "{doc}`chapters/#-tokens`, shows how byte-pair encoding", "byte-pair"),
    ("misconceptions.md", "Chapter # shows the third rule", "end-of-turn"),
    ("03-sampling.md", "as chapter # showed", "leading space"),
    ("03-sampling.md", "Lab # uses it to make", "StructuredOutputsParams"),
    ("04-prefill-decode.md", "(lab # measures it on yours)", "batch_sizes"),
    ("04-prefill-decode.md", "Labs #, # and # print a note", "gpu_notes"),
    ("07-batching.md", "(lab # measures both on your machine)", "ridge point"),
    ("07-batching.md", "(lab # measures this on yours)", "batch_sizes"),
    ("07-batching.md", "Chapter # showed why", "memory-bound"),
    ("07-batching.md", "the arithmetic of {doc}`chapter # <#-prefill-decode>` shows why", "arithmetic intensity"),
    ("08-fleets.md", "chapter # and the misconceptions page all use", "tensor_parallel_step"),
    ("08-fleets.md", "Chapter # showed that prefill and decode", "compute-bound"),
    ("10-beyond-one-reply.md", "(lab # measures yours)", "ridge point"),
    ("10-beyond-one-reply.md", "(lab # measures it)", "prefix_cache_hit_tokens"),
    ("01-tokens.ipynb", "labs #, # and # then print", "gpu_notes"),
    ("03-sampling.ipynb", "chapter # shows how a real engine avoids that work", "KV cache"),
    ("05-kv-cache.ipynb", "lab # measured both", "prompt tokens per second"),
    ("07-batching.ipynb", "chapter # counts the", "cached"),
    ("07-batching.ipynb", "lab # measures the time", "time_to_first_tokens"),
    ("07-batching.ipynb", "the one lab # printed for yours", "ridge_point"),
    ("08-fleets.ipynb", "(lab # printed yours)", "ridge_point"),
    ("09-toolbox.ipynb", "the one lab # printed on most CPUs", "ridge_point"),
    ("09-toolbox.md", "lab # times one such pass", "pass_seconds"),
    ("10-beyond-one-reply.ipynb", "lab # measured yours", "ridge point"),
    ("README.md", "what labs #, # and # print on a GPU", "gpu_notes"),
]

CLAIM_VERBS = r"(?:measures?|measured|times|timed|counts?|counted|prints?|printed|uses?|used|shows?|showed|shown)"
# "chapter 7 measures ...", "labs 4, 7 and 11 print ...", "{doc}`06-quantization` measures ...",
# "Chapter 5, {doc}`chapters/05-kv-cache`, measures ...": a target, then (within a clause) its verb.
CLAIM = re.compile(
    r"\b(?P<kind>[Cc]hapter|[Ll]ab)s?\s+(?P<nums>\d+[a-z]?(?:(?:\s*,\s*|\s+(?:and|or|to)\s+|\s*[-–]\s*)\d+[a-z]?)*)"
    r"[^.;,()]{0,40}?\b(?P<verb>" + CLAIM_VERBS + r")\b"
    r"|\{doc\}`(?:[^`<]*<)?(?:\.\./)?(?:chapters/)?(?P<doc>\d\d)-[\w-]+>?`,?\s+(?P<docverb>" + CLAIM_VERBS + r")\b")


def _masked(sentence: str) -> str:
    return re.sub(r"\b\d+[a-z]?\b", "#", sentence)


def _anchor_for(path: Path, flat: str, start: int, end: int) -> tuple[str, str] | None:
    """The ANCHORS entry (key, anchor) whose key covers flat[start:end] (numbers masked as #)."""
    masked, where = [], []  # where[i]: index in the masked text of flat[i]
    last = 0
    for m in re.finditer(r"\b\d+[a-z]?\b", flat):
        for i in range(last, m.start()):
            where.append(len(masked))
            masked.append(flat[i])
        where.extend([len(masked)] * (m.end() - m.start()))
        masked.append("#")
        last = m.end()
    for i in range(last, len(flat)):
        where.append(len(masked))
        masked.append(flat[i])
    where.append(len(masked))
    masked = "".join(masked)
    lo, hi = where[start], where[end]
    for name, key, anchor in ANCHORS:
        if path.name != name:
            continue
        for k in re.finditer(re.escape(key), masked):
            if k.start() < hi and lo < k.end():
                return key, anchor
    return None


def holds(text: str, anchor: str) -> bool:
    """Whether text contains anchor, ignoring case and line breaks."""
    return " ".join(anchor.lower().split()) in " ".join(text.lower().split())


def _numbers(spec: str) -> list[str]:
    """"4, 5 and 7" -> ['4', '5', '7']; "1-4" and "1 to 4" -> ['1', '2', '3', '4']."""
    out = []
    for m in re.finditer(r"(\d+)[a-z]?\s*(?:[-–]|\s+to\s+)\s*(\d+)|(\d+[a-z]?)", spec):
        if m.group(3):
            out.append(m.group(3))
        else:
            out += [str(i) for i in range(int(m.group(1)), int(m.group(2)) + 1)]
    return out


# ---------------------------------------------------------------- 1b. what a claim's verb needs
#
# A claim names a target ("chapter 7", "lab 4", "section 5", "{doc}`06-quantization`") and a
# verb, and the verb says what the target must *do*, not only what it must mention:
#   measures, times          a code cell of the target measures (below) and holds the anchor;
#   uses                     the target's code holds the anchor;
#   counts, prints, shows    the target holds the anchor (a chapter's code for counts and
#                            prints, its whole text for shows; a lab's cells and outputs).
# So "chapter 7 measures the time saved" fails when chapter 7 only counts the cached tokens.
#
# A code cell measures when it reads the clock (time.perf_counter; time.monotonic, the clock
# of deadlines, does not count), runs torch's profiler, reads a request's metrics (the
# engine's clock), calls one of the course's functions that time something or pool the
# engine's timings (MEASURING_CALLS, each checked to exist), calls a function its own page
# defines that does (directly or through another), runs `tinyinfer bench`, or renders a
# stored report (a measurement made elsewhere, shown with its machine and stamp).

MEASURING_CALLS = ("perf_counter", "time.time", "timeit", "profile", "best_time", "summarize", "replay",
                   "measure_bandwidth", "measure_matmul_flops", "Roofline.measure", "time_allreduce",
                   "measure_policy", "run_benchmark", "calibrate_steps", "reference_time_step")
MEASURING = re.compile(r"(?<![\w.])(?:\w+\.)*(?:" + "|".join(re.escape(c) for c in MEASURING_CALLS) + r")\s*\("
                       r"|\.metrics\b(?!\s+import)"  # a RequestOutput's metrics: the engine's clock, read for each token
                       r"|^\s*%%?timeit\b|^\s*!\s*tinyinfer bench\b|\btinyinfer_course\.reports\b", re.M)


# Claims whose verb is right although the target's code does not show it, each with why.
VERB_EXCEPTIONS = [
    ("09-toolbox.md", "{doc}`06-quantization` measured perplexity",
     "chapter 6 prints the perplexities as a table that benchmarks/quant.py measured, naming the machine and "
     "the date: scoring every format takes minutes, too long for the page's own build"),
]


def verb_excepted(path: Path, flat: str) -> bool:
    return any(path.name == name and piece in flat for name, piece, _ in VERB_EXCEPTIONS)


@dataclass
class Target:
    """What a claim points at: a chapter, a lab, or sections of a lab."""

    name: str  # "chapter 7", "lab 4", "lab 6's section 7"
    code: list[tuple[str, str]]  # each code cell: (its source, its source and printed output)
    text: str  # everything it shows: prose, code and outputs
    timers: frozenset[str]  # the functions its page defines that measure

    def measuring_cells(self) -> list[str]:
        return [shown for source, shown in self.code if cell_measures(source, self.timers)]


def cell_measures(source: str, timers: frozenset[str] = frozenset()) -> bool:
    return bool(MEASURING.search(source) or any(re.search(rf"(?<![\w.]){t}\s*\(", source) for t in timers))


def _python(source: str) -> str:
    """A code cell's source as plain Python: shell (!) and magic (%) lines and MyST
    option lines (:tags: ...) become `pass`, so that ast can read the rest."""
    return "\n".join(re.sub(r"^(\s*)(?:[!%]|:\w[\w-]*:).*", r"\1pass", line) for line in source.splitlines())


def page_timers(sources: list[str]) -> frozenset[str]:
    """The functions a page defines whose body measures, directly or by calling another one,
    and the names it gives them (`timer = time_step if ok else labcheck.reference_time_step`)."""
    import ast

    bodies, aliases = {}, {}
    for source in sources:
        try:
            tree = ast.parse(_python(source))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                bodies[node.name] = ast.get_source_segment(_python(source), node) or ""
            elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                  and isinstance(node.value, (ast.Name, ast.Attribute, ast.IfExp))):  # a function by another name
                values = [node.value.body, node.value.orelse] if isinstance(node.value, ast.IfExp) else [node.value]
                aliases[node.targets[0].id] = {v.id if isinstance(v, ast.Name) else v.attr for v in values
                                               if isinstance(v, (ast.Name, ast.Attribute))}
    calls = {c.rsplit(".", 1)[-1] for c in MEASURING_CALLS}
    timers: set[str] = set()
    while True:
        more = {name for name, body in bodies.items() if name not in timers and cell_measures(body, frozenset(timers))}
        more |= {name for name, named in aliases.items() if name not in timers and named & (timers | calls)}
        if not more:
            return frozenset(timers)
        timers |= more


def chapter_code_cells(path: Path) -> list[str]:
    cells, current = [], None
    for line in path.read_text().splitlines():
        if current is None and line.startswith("```{code-cell}"):
            current = []
        elif current is not None and line.startswith("```"):
            cells.append("\n".join(current))
            current = None
        elif current is not None:
            current.append(line)
    return cells


def chapter_target(number: int) -> Target | None:
    path = chapter_files().get(number)
    if path is None:
        return None
    code = chapter_code_cells(path)
    return Target(f"chapter {number}", [(c, c) for c in code], path.read_text(), page_timers(code))


def _lab_cells(path: Path, sections: list[int] | None = None) -> list:
    """The lab's cells, or those of the numbered sections (see lab_sections)."""
    if sections is None:
        return list(notebook(path).cells)
    out, current = [], None
    for cell in notebook(path).cells:
        if cell.cell_type == "markdown":
            m = re.search(r"^## (\d+)\. (.+)$", cell.source, re.M)
            if m:
                current = int(m.group(1))
            elif re.search(r"^## ", cell.source, re.M):
                current = None
        if current in sections:
            out.append(cell)
    return out


def lab_target(lab: str, sections: list[int] | None = None) -> Target | None:
    path = lab_files().get(lab)
    if path is None:
        return None
    code = [(c.source, cell_text(c)) for c in _lab_cells(path, sections) if c.cell_type == "code"]
    timers = page_timers([c.source for c in notebook(path).cells if c.cell_type == "code"])
    name = f"lab {lab}" if sections is None else f"lab {lab}'s section {', '.join(map(str, sections))}"
    return Target(name, code, "\n".join(cell_text(c) for c in _lab_cells(path, sections)), timers)


def verb_problem(target: Target, verb: str, anchor: str) -> str | None:
    """Why the target does not do what the verb says about the anchor (None: it does)."""
    if re.match(r"(?i)measur|tim", verb):
        cells = target.measuring_cells()
        if not cells:
            return (f"{target.name} measures nothing (no code cell reads the clock or renders a stored report): "
                    "say what it does (counts, computes, shows) or point at what measures it")
        if not any(holds(cell, anchor) for cell in cells):
            return f"{target.name} measures, but none of its measuring cells holds {anchor!r}"
        return None
    if re.match(r"(?i)use", verb):
        return None if any(holds(source, anchor) for source, _ in target.code) else \
            f"{target.name}'s code does not use {anchor!r}"
    if target.name.startswith("chapter") and not re.match(r"(?i)show", verb):
        text = "\n".join(source for source, _ in target.code)  # "chapter N counts/prints": its code does
        return None if holds(text, anchor) else f"{target.name}'s code does not hold {anchor!r}"
    return None if holds(target.text, anchor) else f"{target.name} does not hold {anchor!r}"


def reference_problems() -> list[str]:
    """Every reference in the prose that does not resolve, with where it is and why."""
    chapters = chapter_files()
    labs = lab_files()
    chapter_heads = {n: [normal(h) for h in headings_of_page(p)] for n, p in chapters.items()}
    problems = []
    for path in claim_pages():
        is_lab = path.suffix == ".ipynb"
        own_lab = re.match(r"0*(\d+[a-z]?)", path.name).group(1) if is_lab else None
        for line, sentence, paragraph in paragraph_sentences(page_lines(path)):
            flat = " ".join(sentence.split())
            here = f"{line.where}: "

            def bad(ref, why):
                problems.append(f"{here}{ref!r}: {why}")

            # chapter N (and lists), with {doc} targets and titles checked
            for m in re.finditer(r"\b[Cc]hapters?\s+" + NUMBER_LIST, flat):
                for n in _numbers(m.group(1)):
                    if not n.isdigit() or int(n) not in chapters:
                        bad(m.group(0), f"there is no chapter {n}")
            for m in re.finditer(r"\{doc\}`[Cc]hapter (\d+) <([^>]+)>`", flat):
                target = Path(m.group(2)).name[:2]
                if int(target) != int(m.group(1)):
                    bad(m.group(0), f"the link goes to chapter {int(target)}")
            for m in re.finditer(r"\b[Cc]hapter (\d+)(?: <[^>]*>`)?(?:'s|’s) ([^.,;:()]+?) section\b", flat):
                n, what = int(m.group(1)), normal(m.group(2))
                if n in chapters and not any(what in h for h in chapter_heads[n]):
                    owners = [c for c, hs in chapter_heads.items() if any(what in h for h in hs)]
                    bad(m.group(0), f"chapter {n} has no heading with {m.group(2)!r}" + (f" (chapter {owners[0]} has)" if owners else ""))
            for m in re.finditer(r"\b[Cc]hapter (\d+), \*([^*]+)\*", flat):
                n = int(m.group(1))
                if n in chapters and normal(m.group(2)) != chapter_heads[n][0]:
                    bad(m.group(0), f"chapter {n} is titled {headings_of_page(chapters[n])[0]!r}")
            for m in re.finditer(r"\{doc\}`(?:[^`<]*<)?([\w/.-]+?)>?`,? § ([^.,;)]+)", flat):
                target = (path.parent / m.group(1)).with_suffix(".md")
                if not target.exists() or not any(normal(m.group(2)) == normal(h) for h in headings_of_page(target)):
                    bad(m.group(0), f"no heading {m.group(2)!r} in {m.group(1)}")
            # lab N (and lists); lab N ("Title")
            for m in re.finditer(r"\b[Ll]abs?\s+" + NUMBER_LIST, flat):
                for n in _numbers(m.group(1)):
                    if n not in labs:
                        bad(m.group(0), f"there is no lab {n}")
            for m in re.finditer(r"\blab (\d+[a-z]?) \(\"([^\"]+)\"\)", flat):
                if m.group(1) in labs and normal(m.group(2)) != normal(lab_title(labs[m.group(1)])):
                    bad(m.group(0), f"lab {m.group(1)} is titled {lab_title(labs[m.group(1)])!r}")
            # section N / § N / exercise N: of the same lab, or of the lab named with it
            for m in re.finditer(r"(?:\b[Ss]ections?\s+|§\s?)" + NUMBER_LIST + r"(?:'s)?(?: of lab (\d+[a-z]?))?", flat):
                lab = m.group(2) or own_lab
                if lab is None:
                    bad(m.group(0), "a chapter has no numbered sections: name the heading")
                    continue
                sections = lab_sections(labs[lab]) if lab in labs else {}
                missing = [n for n in _numbers(m.group(1)) if not n.isdigit() or int(n) not in sections]
                if missing:
                    bad(m.group(0), f"lab {lab} has no section {', '.join(missing)}")
                    continue
                if lab == own_lab and line.cell == 0 and re.search(r"\d+ minutes", paragraph):
                    continue  # the time estimate in the lab's first cell lists sections, it claims nothing
                entry = _anchor_for(path, flat, m.start(), m.end())
                if entry is None:
                    bad(m.group(0), "unchecked section reference: add it to ANCHORS with what the section must contain")
                    continue
                text = "\n".join(sections[int(n)].text for n in _numbers(m.group(1)))
                if not holds(text, entry[1]):
                    holders = [f"section {s.number}" for s in lab_sections(labs[lab]).values() if holds(s.text, entry[1])]
                    bad(m.group(0), f"lab {lab}'s section {m.group(1)} does not hold {entry[1]!r}"
                        + (f" ({', '.join(holders)} does)" if holders else ""))
                    continue
                # "section 5 times ...", "sections 1 to 6 measure ...": what the verb needs, in each section
                verb = re.match(r"\s+(?:(?:also|then|again|all|both)\s+)?(" + CLAIM_VERBS + r")\b", flat[m.end():])
                if verb:
                    for n in _numbers(m.group(1)):
                        why = None if verb_excepted(path, flat) else verb_problem(lab_target(lab, [int(n)]),
                                                                                  verb.group(1), entry[1])
                        if why:
                            bad(m.group(0) + " " + verb.group(1), why)
            for m in re.finditer(r"\b[Ee]xercises?\s+" + NUMBER_LIST + r"(?: of lab (\d+[a-z]?))?", flat):
                lab = m.group(2) or own_lab
                if lab is None:
                    continue  # "exercise 3" in a chapter only ever names a lab's exercise with its lab
                count = len(exercise_cells(labs[lab])) if lab in labs else 0
                for n in _numbers(m.group(1)):
                    if not n.isdigit() or not 1 <= int(n) <= count:
                        bad(m.group(0), f"lab {lab} has {count} exercises")
            if re.search(r"\bcells? \d", flat):
                bad(re.search(r"\bcells? \d+", flat).group(0), "cell numbers change: name the section instead")
            # "chapter N measures ...", "lab N uses ...", "{doc}`06-quantization` measures ...": what the verb needs
            for m in CLAIM.finditer(flat):
                if re.search(r"\bsections? \d", m.group(0)):
                    continue
                entry = _anchor_for(path, flat, m.start(), m.end())
                if entry is None:
                    bad(m.group(0), "unchecked claim: add it to ANCHORS with what the chapter's code or the lab must contain")
                    continue
                if m.group("doc"):
                    targets, verb = [chapter_target(int(m.group("doc")))], m.group("docverb")
                elif m.group("kind").lower() == "lab":
                    targets, verb = [lab_target(n) for n in _numbers(m.group("nums"))], m.group("verb")
                else:
                    targets, verb = [chapter_target(int(n)) for n in _numbers(m.group("nums"))], m.group("verb")
                for target in filter(None, targets):  # a missing chapter or lab is reported above
                    why = None if verb_excepted(path, flat) else verb_problem(target, verb, entry[1])
                    if why:
                        bad(m.group(0), why)
    return problems


def test_cross_references_resolve():
    problems = reference_problems()
    assert not problems, f"{len(problems)} references do not resolve:\n" + "\n".join(problems)


def test_anchor_list_has_no_dead_entries():
    """Every ANCHORS entry still matches a sentence (so the list cannot rot into a blanket pass)."""
    texts = {}
    for path in claim_pages():
        texts.setdefault(path.name, []).extend(_masked(s) for _, s, _ in paragraph_sentences(page_lines(path)))
    dead = [entry for entry in ANCHORS if not any(entry[1] in s for s in texts.get(entry[0], []))]
    assert not dead, "ANCHORS entries that match no sentence (remove or update them):\n" + "\n".join(map(repr, dead))


def test_verb_exceptions_are_still_needed():
    texts = {}
    for path in claim_pages():
        texts.setdefault(path.name, []).extend(" ".join(s.split()) for _, s, _ in paragraph_sentences(page_lines(path)))
    dead = [e for e in VERB_EXCEPTIONS if not any(e[1] in s and CLAIM.search(s) for s in texts.get(e[0], []))]
    assert not dead, "VERB_EXCEPTIONS entries that match no claim (remove them):\n" + "\n".join(map(repr, dead))


def test_the_verb_check_can_fail():
    """A target that only counts does not measure; one that measures must hold the anchor
    in a measuring cell; a page's own timer counts; "uses" looks in the code."""
    counts = Target("chapter 7", [("cached = bm.allocate(second, n)", "")], "prefix caching", frozenset())
    assert "measures nothing" in verb_problem(counts, "measures", "prefix")
    assert verb_problem(counts, "counts", "cached") is None
    assert "does not use" in verb_problem(counts, "uses", "prefix")
    cells = ["import time\ndef timed(f):\n    t = time.perf_counter()\n    f()\n    return time.perf_counter() - t",
             "print(timed(lambda: bm.allocate(second, n)))", "print(roof.ridge_point)"]
    timers = page_timers(cells)
    assert timers == {"timed"}
    page = Target("lab 7", [(c, c) for c in cells], "", timers)
    assert verb_problem(page, "times", "bm.allocate") is None
    assert "none of its measuring cells holds" in verb_problem(page, "measures", "ridge_point")
    assert cell_measures("from tinyinfer_course.reports import peers") and not cell_measures("x = time.monotonic()")


def test_measuring_calls_exist():
    """Each name in MEASURING_CALLS is a function of the course's code (or the clock's)."""
    src = "\n".join(p.read_text() for p in (Path(__file__).resolve().parents[2] / "src").rglob("*.py"))
    missing = [c for c in MEASURING_CALLS if c not in ("perf_counter", "time.time", "timeit", "profile")
               and not re.search(rf"\bdef {c.rsplit('.', 1)[-1]}\(", src)]
    assert not missing, missing


# ---------------------------------------------------------------- 1c. the glossary's "See chapter N"
#
# A glossary entry's "See {doc}`chapters/NN-...`" sends the reader to chapter NN for the term,
# so chapter NN must use it: the term or one of its names (the entry's other headwords, the
# parts of "Rejection (HTTP 429)"), in any case, a plural too, or a name in GLOSSARY_ALIASES.

GLOSSARY_ALIASES = {
    "Critical batch size": ("critical batch", "the chapters say 'the critical batch'"),
    "Draft model": ("draft", "chapter 9's draft is a prompt lookup, not a model, and it says 'draft'"),
    "OpenAI-compatible API": ("OpenAI-compatible", "chapter 8 says 'OpenAI-compatible server' and '... endpoint'"),
    "Queueing": ("queue", "chapter 7's requests wait 'in the queue' for a batch slot or a free block"),
}


def glossary_entries(path: Path) -> list[tuple[list[str], str]]:
    """(headwords, definition) of each entry of the page's {glossary} block."""
    m = re.search(r"^```\{glossary\}\n(.*?)^```", path.read_text(), re.S | re.M)
    entries = []
    for line in (m.group(1) if m else "").splitlines():
        if not line.strip() or line.startswith(":"):
            continue
        if not line.startswith(" "):
            if not entries or entries[-1][1]:
                entries.append(([], ""))
            entries[-1][0].append(line.strip())
        else:
            entries[-1] = (entries[-1][0], entries[-1][1] + " " + line.strip())
    return entries


def glossary_problems() -> list[str]:
    problems, chapters = [], chapter_files()
    for terms, definition in glossary_entries(ROOT / "glossary.md"):
        names = []
        for term in terms:
            names.append(term)
            split = re.match(r"^(.*?)\s*\((.*)\)$", term)  # "Rejection (HTTP 429)": "Rejection", "HTTP 429"
            names += list(split.groups()) if split else []
        names += [GLOSSARY_ALIASES[t][0] for t in terms if t in GLOSSARY_ALIASES]
        for m in re.finditer(r"\{doc\}`(?:[^`<]*<)?chapters/(\d+)[\w-]*>?`", definition):
            n = int(m.group(1))
            if n not in chapters:
                continue  # reported by the cross-reference test
            text = normal(chapters[n].read_text())
            if not any(re.search(rf"\b{re.escape(normal(name))}(?:s|es)?\b", text) for name in names):
                others = f" (nor {', '.join(map(repr, names[1:]))})" if names[1:] else ""
                problems.append(f"glossary.md, {terms[0]!r}: see chapter {n}, which never uses the term{others}")
    return problems


def test_glossary_sends_readers_to_chapters_that_use_the_term():
    problems = glossary_problems()
    assert not problems, "\n".join(problems)


def test_glossary_aliases_are_still_needed():
    entries = {t: d for terms, d in glossary_entries(ROOT / "glossary.md") for t in terms}
    assert set(GLOSSARY_ALIASES) <= set(entries), set(GLOSSARY_ALIASES) - set(entries)
    saved = dict(GLOSSARY_ALIASES)
    try:
        for term in saved:
            del GLOSSARY_ALIASES[term]
            assert any(repr(term) in p for p in glossary_problems()), f"GLOSSARY_ALIASES[{term!r}] is not needed"
            GLOSSARY_ALIASES[term] = saved[term]
    finally:
        GLOSSARY_ALIASES.update(saved)


# ---------------------------------------------------------------- 3. no measured literal in the prose

UNIT_TIME = r"(?:ms|µs|us|ns|s|seconds?|milliseconds?|microseconds?)"
LITERAL = re.compile(
    r"(?<![\w.])(?P<num>\d[\d,]*(?:\.\d+)?)(?:\s*(?:[-–]|to)\s*\d[\d,]*(?:\.\d+)?)?"
    r"(?:\s?(?P<time>" + UNIT_TIME + r")\b(?!/)"
    r"|\s?(?P<rate>(?:tok|tokens|req|requests)\s?(?:/\s?s|per second)\b)"
    r"|\s?(?P<bw>(?:[kKMGTP]i?B|[kMGT]?bit|[GT]?FLOP)/s)"
    r"|(?P<ratio>(?:x|×)(?![\w-])(?!\s*\d)|\s?-?(?:times|fold)\b(?!\s*\d)))"
)
# a ratio ("1.4×", "2 times", "3-fold") counts when its sentence is about speed
SPEED = re.compile(r"(?i)\b(?:fast\w*|slow\w*|quick\w*|speed\w*|throughput|latency|TTFT|TPOT|tok/s|per second|took|takes?|time|measur\w*|quiet|busy|idle)\b")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b(?:January|February|March|April|May|June|July|August|September|October|November|December) 20\d\d\b")
# A sentence that sets up a made-up case ("Suppose an accelerator that reads ...") states no measurement.
HYPOTHETICAL = re.compile(r"(?i)\b(?:suppose|imagine|assume|assuming)\b")
MACHINE = re.compile(r"\b(?:CPU|Xeon|EPYC|Ryzen|Core i\d|Apple M\d|H100|H200|B200|A100|GPU|laptop)\b")


def literal_hits(sentence: str) -> list[str]:
    """Timing, speed-ratio and bandwidth literals in a sentence of prose; glued values
    ({glue:...}`name`, {eval}`...`) and inline code are computed, not literals."""
    text = re.sub(r"\{(?:glue|eval)[^}]*\}`[^`]*`", " ", sentence)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\$[^$]*\$", " ", text)  # maths
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    speed = SPEED.search(text)
    return [m.group(0) for m in LITERAL.finditer(text) if (speed or not m.group("ratio"))
            and not re.search(r"(?i)\b(?:lab|chapter|section|exercise)\s*$", text[:m.start()])]  # "lab 9 times ..."


def literal_problems(allow) -> list[str]:
    problems = []
    for path in all_prose():
        for line, sentence, _ in paragraph_sentences(page_lines(path)):
            flat = " ".join(sentence.split())
            hits = literal_hits(flat)
            if not hits or (DATE.search(flat) and MACHINE.search(flat)) or HYPOTHETICAL.search(flat):
                continue
            if any(path.name == name and key in flat for name, key, _ in allow):
                continue
            problems.append(f"{line.where}: {', '.join(hits)} in: {flat[:160]}")
    return problems


# Literals that are not measurements of this course's engine: figures cited from the
# source texts and data sheets, the assumptions of a worked example, and settings of a
# simulation. Each entry: (file, a piece of the sentence, why it may stay a literal).
ALLOWED_LITERALS = [
    ("04-prefill-decode.md", "a TPOT of 30 ms starts after 0.5 s", "an invented request whose round numbers show how TTFT and TPOT add up"),
    ("04-prefill-decode.md", "an NVIDIA H100, whose memory moves about 3.35 TB/s", "Inference 101's H100 figure (source text)"),
    ("04-prefill-decode.md", "NVIDIA's dense BF16 figure for the H100 SXM, 989 TFLOP/s", "the H100 data sheet, cited"),
    ("04-prefill-decode.md", "on one imaginary chip big enough to hold it, reading 3.35 TB/s", "Inference 101's worked example (source text)"),
    ("04-prefill-decode.md", "which brings a token down to roughly 10–20 ms", "quoted from Inference 101"),
    ("04-prefill-decode.md", "on a GPU with 1 TB/s of bandwidth", "the assumption of a check-yourself question"),
    ("04-prefill-decode.md", "16 GB ÷ 1 TB/s = 16 ms per token", "the answer to that question, worked out from its assumption"),
    ("06-quantization.md", "on the H100 figures used there (989 TFLOP/s", "the source's H100 figures"),
    ("06-quantization.md", "(not 4 times: the metadata is read too)", "16 bits over 4 bits, a ratio of widths, not of timings"),
    ("07-batching.md", "on an H100-class memory of 3.35 TB/s", "Inference 101's H100 figure"),
    ("08-fleets.md", "on H100-class GPUs (3.35 TB/s", "Inference 101's H100 figure and the H100 data sheet"),
    ("08-fleets.md", "the 10 to 20 ms per token that *Inference 101* quotes", "quoted from Inference 101"),
    ("08-fleets.md", "dies 30 s into the run and restarts 30 s later", "settings of the simulated failure"),
    ("08-fleets.md", "(every 2 s here)", "a setting of the simulated load balancer"),
    ("08-fleets.md", "over ordinary 10 Gbit/s Ethernet", "a link's nominal speed, an assumption"),
    ("09-toolbox.md", "with a fast link (50 GB/s) and a slow one", "settings of the simulated links"),
    ("09-toolbox.md", "at about 42 ms per token on one H100 by the back-of-envelope rule", "Inference 101's estimate"),
    ("09-toolbox.md", "What does the same rule give on an H200 (4.8 TB/s)", "the H200 data sheet, cited in the question"),
    ("09-toolbox.md", "the paper reports more than 2.2 times", "Medusa's reported speed-ups (Cai et al. 2024), cited"),
    ("09-toolbox.md", "For LLaMA2-Chat 70B the paper reports 2.7 to 3.5", "EAGLE's reported speed-ups (Li et al. 2024), cited"),
    ("09-toolbox.md", "verification and reports 1.5 to 2.8 times faster", "SpecInfer's reported speed-ups (Miao et al. 2023), cited"),
    ("10-beyond-one-reply.md", "starts from *Inference 101*'s figure", "Inference 101's estimate"),
    ("10-beyond-one-reply.md", "At *Inference 101*'s 42 ms per decode step", "Inference 101's estimate"),
    ("10-beyond-one-reply.md", "Its decode step takes 20 ms.", "the assumption of a check-yourself question"),
    ("10-beyond-one-reply.md", "About 3,200 × 20 ms = 64 s of decoding", "the answer to that question, from its assumption"),
    ("glossary.md", "about 3.35 TB/s on an H100", "the H100 figure of the source texts"),
    ("glossary.md", "such as \"p95 TTFT under 500 ms\"", "an example of a target, not a measurement"),
    ("misconceptions.md", "The figures are illustrative: the H100's 3.35 TB/s", "cited and assumed figures, said to be so"),
    ("further-reading.md", "the 140 GB ÷ 3.35 TB/s ≈ 42 ms back-of-the-envelope estimate", "describes the source's estimate"),
    ("04-prefill-decode.ipynb", "The *Inference 101* source text makes exactly this estimate", "quoted from Inference 101"),
    ("08-fleets.ipynb", "dies 30 s into the run and comes back 30 s later", "settings of the simulated failure"),
    ("08-fleets.ipynb", "(every 2 s here)", "a setting of the simulated load balancer"),
    ("08-fleets.ipynb", "8 with replica 0 down from 20 s to 50 s", "settings of the routing check's failure case"),
]


def test_no_measured_literal_in_the_prose():
    """A timing, a speed ratio or a bandwidth in the prose is computed on the page
    (glue), names its machine and date, or is a cited figure listed in ALLOWED_LITERALS."""
    problems = literal_problems(ALLOWED_LITERALS)
    assert not problems, (f"{len(problems)} sentences state a measurement as a literal: glue it, name the machine "
                          "and date, or add a cited figure to ALLOWED_LITERALS with the reason:\n" + "\n".join(problems))


def test_allowed_literals_are_still_used():
    used = {entry: False for entry in ALLOWED_LITERALS}
    for path in all_prose():
        for _, sentence, _ in paragraph_sentences(page_lines(path)):
            flat = " ".join(sentence.split())
            for entry in ALLOWED_LITERALS:
                if path.name == entry[0] and entry[1] in flat and literal_hits(flat):
                    used[entry] = True
    dead = [entry for entry, ok in used.items() if not ok]
    assert not dead, "ALLOWED_LITERALS entries that allow nothing any more (remove them):\n" + "\n".join(map(repr, dead))


def test_the_literal_lint_can_fail():
    assert literal_hits("Decode took 41.3 ms per step, 2.3× slower, at 30.5 GB/s.") == ["41.3 ms", "2.3×", "30.5 GB/s"]
    assert literal_hits("It ran 1.4 times faster.") == ["1.4 times"]
    assert literal_hits("A step takes {glue:text}`step_ms:.1f` ms, `2 * 3` s.") == []
    assert literal_hits("Two tensors of 9 × 8,192 values.") == []


# ---------------------------------------------------------------- 3b. no counted literal in the prose
#
# "some 5,000 checks for this model": a count of something the course's code can count
# (checks, tests, tokens, layers, kernels ...), written down once, rounded, and left to drift
# from what the code does today. The lint flags a number of at least 100 after a qualifier
# that says it was rounded (some, about, roughly, nearly, around, almost, over ...) and
# before such a noun. An exact count is not flagged (most are settings of an example: "a
# prompt of 2,000 tokens"), nor is a sentence that cites its source (Inference 101, a source
# text, a link) or sets up a made-up case; a cited fact about a published model or tool goes
# in ALLOWED_COUNTS with its source. A count the page computes is glued.

COUNTED = (r"(?:checks|guards|tests|tokens|layers|parameters|weights|blocks|requests|lines|cells|kernels|launches"
           r"|operations|operators|merges|steps|passes|positions|experts|heads|entries|calls|files|modules|functions"
           r"|words|sequences|prompts|replies)")
COUNT_LITERAL = re.compile(
    r"\b(?:some|about|roughly|nearly|around|almost|approximately|over|more than|close to)\s+(?:~\s*)?"
    r"(?P<num>\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(?:\s+(?P<scale>thousand|million|billion))?"
    r"(?:\s+[\w-]+){0,2}?\s+" + COUNTED + r"\b|[~≈]\s*(?P<num2>\d{1,3}(?:,\d{3})+|\d+)(?:\s+[\w-]+){0,2}?\s+" + COUNTED + r"\b")
CITES = re.compile(r"Inference 101|source texts?\b|rule of thumb|\]\(https?://")


def count_hits(sentence: str) -> list[str]:
    """Rounded counts (at least 100) of what the code counts, outside glue, code and maths."""
    text = re.sub(r"\{(?:glue|eval)[^}]*\}`[^`]*`", " ", sentence)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\$[^$]*\$", " ", text)
    hits = []
    for m in COUNT_LITERAL.finditer(text):
        value = float((m.group("num") or m.group("num2")).replace(",", ""))
        if value >= 100 or m.group("scale"):
            hits.append(m.group(0))
    return hits


def count_problems(allow) -> list[str]:
    problems = []
    for path in claim_pages():
        for line, sentence, _ in paragraph_sentences(page_lines(path)):
            flat = " ".join(sentence.split())
            hits = count_hits(flat)
            if not hits or CITES.search(flat) or HYPOTHETICAL.search(flat):
                continue
            if any(path.name == name and key in flat for name, key, _ in allow):
                continue
            problems.append(f"{line.where}: {', '.join(hits)} in: {flat[:160]}")
    return problems


# Rounded counts that are cited facts or the page's own settings. Each: (file, a piece of
# the sentence, where the number comes from).
ALLOWED_COUNTS = [
    ("intro.md", "about 135 million parameters", "the model's published size, in its name (SmolLM2-135M)"),
    ("01-tokens.ipynb", "about 100,000 merges", "cl100k_base's published size, in its name (its ranks file has 100,256)"),
    ("01-tokens.ipynb", "(about 300 words)", "the passage's length, printed exactly (312) by the table in section 6"),
    ("05-kv-cache.ipynb", "runs the whole prefix (over 512 tokens)", "the experiment's own setting: a context of 512"),
    ("05-kv-cache.ipynb", "pushes over 500 tokens through the model", "the experiment's own setting: a context of 512"),
    ("10-beyond-one-reply.md", "each turn adds about 100 tokens", "the assumption of a check-yourself question"),
    ("10-beyond-one-reply.md", "computes only the new ~100 tokens", "the answer to that question, from its assumption"),
]


def test_no_counted_literal_in_the_prose():
    """A rounded count of what the code counts is glued from the page's computation, or is a
    cited fact or a setting listed in ALLOWED_COUNTS."""
    problems = count_problems(ALLOWED_COUNTS)
    assert not problems, (f"{len(problems)} sentences state a count the code can compute as a literal: glue it, "
                          "or add a cited fact to ALLOWED_COUNTS with its source:\n" + "\n".join(problems))


def test_allowed_counts_are_still_used():
    used = {entry: False for entry in ALLOWED_COUNTS}
    for path in claim_pages():
        for _, sentence, _ in paragraph_sentences(page_lines(path)):
            flat = " ".join(sentence.split())
            for entry in ALLOWED_COUNTS:
                if path.name == entry[0] and entry[1] in flat and count_hits(flat):
                    used[entry] = True
    dead = [entry for entry, ok in used.items() if not ok]
    assert not dead, "ALLOWED_COUNTS entries that allow nothing any more (remove them):\n" + "\n".join(map(repr, dead))


def test_the_count_lint_can_fail():
    assert count_hits("PyTorch checks them, some 5,000 checks for this model.") == ["some 5,000 checks"]
    assert count_hits("It ran about 1,374 tests, over 30 layers and roughly 2 million parameters.") == [
        "about 1,374 tests", "roughly 2 million parameters"]
    assert count_hits("A prompt of 2,000 tokens; about {glue:text}`n_checks:,` checks; `about 500 lines`.") == []


# ---------------------------------------------------------------- 2. "Try it yourself" names the lab's exercises

# A chapter without a "Try it yourself" section, and where its lab is introduced instead.
NO_TRY_IT_YOURSELF = {
    9: ("Speculative decoding", "chapter 9 surveys the toolbox; its lab covers only speculative decoding, "
        "so that section introduces the lab and its exercise"),
}
# A lab without a chapter of its own, and the chapter whose "Try it yourself" introduces it.
# The intro's map of the course must link it too.
LAB_WITHOUT_CHAPTER = {
    "11": (7, "the capstone puts the scheduler and loop of lab 7 around a forward pass of your own; "
           "chapter 7 is where that engine core is taught"),
}


def section_text(path: Path, heading: str) -> str | None:
    """The prose under a `## heading` of a chapter, up to the next heading of that level or higher."""
    lines, inside = [], False
    for _, line in prose_lines(path.read_text()):
        m = re.match(r"(#{1,6})\s+(.*)", line)
        if m and inside and len(m.group(1)) <= 2:
            break
        if m and m.group(2).strip() == heading:
            inside = True
            continue
        if inside:
            lines.append(line)
    return "\n".join(lines) if inside else None


def try_it_yourself_problems() -> list[str]:
    problems = []
    chapters, labs = chapter_files(), lab_files()
    for lab, lab_path in labs.items():
        number = int(re.match(r"\d+", lab).group(0))
        link = f"solutions/{lab_path.stem}"
        if lab in LAB_WITHOUT_CHAPTER:
            chapter, _ = LAB_WITHOUT_CHAPTER[lab]
            heading = "Try it yourself"
            if link not in (ROOT / "intro.md").read_text():
                problems.append(f"intro.md does not link lab {lab} ({link})")
        elif number in NO_TRY_IT_YOURSELF:
            chapter, (heading, _) = number, NO_TRY_IT_YOURSELF[number]
        else:
            chapter, heading = number, "Try it yourself"
        if chapter not in chapters:
            problems.append(f"lab {lab} has no chapter {chapter}")
            continue
        text = section_text(chapters[chapter], heading)
        where = f"{chapters[chapter].relative_to(ROOT)}, section {heading!r}"
        if text is None:
            problems.append(f"{chapters[chapter].relative_to(ROOT)} has no section {heading!r}")
            continue
        if f"../{link}" not in text:
            problems.append(f"{where} does not link lab {lab} ({{doc}}`../{link}`)")
        for name in exercise_names(lab_path):
            if f"`{name}`" not in text:
                problems.append(f"{where} does not name lab {lab}'s exercise `{name}`")
    for number, path in chapters.items():
        if number not in NO_TRY_IT_YOURSELF and section_text(path, "Try it yourself") is None:
            problems.append(f"{path.relative_to(ROOT)} has no 'Try it yourself' section "
                            "(or add it to NO_TRY_IT_YOURSELF with the reason)")
    return problems


def test_try_it_yourself_names_the_labs_exercises():
    problems = try_it_yourself_problems()
    assert not problems, "\n".join(problems)


if __name__ == "__main__":  # python tests/book/test_prose.py [FOLDER [OLD_TEST]]: every finding, by check
    import ast
    import sys

    ROOT = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT
    if len(sys.argv) > 2:  # an older copy of this file: its ANCHORS first, so old sentences keep their old anchors
        old = next(n.value for n in ast.parse(Path(sys.argv[2]).read_text()).body if isinstance(n, ast.Assign)
                   and getattr(n.targets[0], "id", None) == "ANCHORS")
        ANCHORS[:0] = ast.literal_eval(old)
    for title, found in [("cross-references and claims", reference_problems()),
                         ("glossary", glossary_problems()),
                         ("timing literals", literal_problems(ALLOWED_LITERALS)),
                         ("counted literals", count_problems(ALLOWED_COUNTS)),
                         ("try it yourself", try_it_yourself_problems())]:
        print(f"== {title}: {len(found)}" + "".join("\n" + line for line in found))
