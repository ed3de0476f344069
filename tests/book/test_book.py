"""The book builds, with warnings as errors, and shows executed output.

This is the slowest test: the build executes every chapter with {code-cell}s
(`execute_notebooks: force` in _config.yml). The lab pages are the solution
notebooks, shown with their stored outputs (tests/book/test_notebooks.py re-runs
them). Skip it with `pytest -m "not book"`.

It builds into a temporary folder, so it neither needs nor touches _build/.
Without -W a failing cell still gives exit code 0; with it, any warning (a
missing page, a broken reference, a cell that raises) fails the build.
Before building, scripts/vendor_js.py installs the site's JavaScript (MathJax,
require.js, the widget manager) from npm; the site must load nothing from a CDN.
tests/book/test_browser.py opens the same build in a browser: the build runs once
per pytest run (build_book), not once per file. When the same run also runs the
notebooks, tests/book/test_notebooks.py starts this build in the background beside
them (start_build, one thread), so that the cores are busy while a notebook
kernel starts or a server waits; the book tests then wait for it.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from html import escape as html_escape
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 1500


def toc_files() -> list[str]:
    """Every page named in _toc.yml (root first), without its suffix."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({k: v for k, v in toc.items() if k != "root"})
    return [str(Path(f).with_suffix("")) if Path(f).suffix in {".md", ".ipynb"} else f for f in files]


def source_of(page: str) -> Path:
    for suffix in (".md", ".ipynb"):
        if (ROOT / (page + suffix)).exists():
            return ROOT / (page + suffix)
    raise FileNotFoundError(f"_toc.yml lists {page!r}, but neither {page}.md nor {page}.ipynb exists")


def jupyter_book() -> str:
    here = Path(sys.executable).parent / "jupyter-book"
    return str(here) if here.exists() else shutil.which("jupyter-book") or "jupyter-book"


_BUILD: dict[str, object] = {}  # the one build of this pytest run: its folder, or why it failed
_BUILDER: list[threading.Thread] = []  # the thread that runs it, once started
_LOCK = threading.Lock()


def start_build(threads: str | None = None) -> None:
    """Start the one build of this pytest run in a background thread (once);
    threads: OMP_NUM_THREADS for it, when it shares the cores with other work."""
    with _LOCK:
        if _BUILDER:
            return
        env = dict(os.environ, **({"OMP_NUM_THREADS": threads} if threads else {}))
        out = Path(tempfile.mkdtemp(prefix="tinyinfer-book-"))
        def build():
            _BUILD.update(_build(out, env), finished=time.monotonic())

        _BUILDER.append(threading.Thread(target=build, daemon=True,
                                         name="book build"))
        _BUILDER[0].start()


def build_finished() -> bool:
    """Whether the build has finished (True if it never started)."""
    return not _BUILDER or not _BUILDER[0].is_alive()


def build_book(tmp_path_factory=None) -> Path:
    """Vendor the site's JavaScript, then build the book once per pytest run.

    Executing every notebook takes minutes, so test_book.py and test_browser.py
    share this build (a failure is remembered too, not retried)."""
    start_build()
    _BUILDER[0].join()
    if "error" in _BUILD:
        pytest.fail(_BUILD["error"], pytrace=False)
    return _BUILD["html"]


def _build(out: Path, env: dict[str, str]) -> dict[str, object]:
    vendor = [sys.executable, str(ROOT / "scripts" / "vendor_js.py")]
    proc = subprocess.run(vendor, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return {"error": f"{' '.join(vendor)}\nexit code {proc.returncode}\n"
                         f"{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}"}
    cmd = [jupyter_book(), "build", str(ROOT), "--path-output", str(out), "-W", "-n", "--keep-going"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"{' '.join(cmd)}\ntimed out after {BUILD_TIMEOUT_S} s"}
    if proc.returncode != 0:
        return {"error": f"{' '.join(cmd)}\nexit code {proc.returncode}\n"
                         f"{proc.stdout[-20000:]}\n{proc.stderr[-20000:]}"}
    return {"html": out / "_build" / "html"}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return build_book(tmp_path_factory)


@pytest.mark.book
def test_every_page_is_built(built: Path) -> None:
    pages = toc_files()
    assert "intro" in pages
    assert any(p.startswith("chapters/") for p in pages)
    assert any(p.startswith("solutions/") for p in pages)
    missing = [p for p in pages if not (built / f"{p}.html").is_file()]
    assert not missing, f"no HTML for {missing} in {built}"


@pytest.mark.book
def test_notebooks_were_executed(built: Path) -> None:
    """Labs (their stored outputs), and chapters with code cells, show cell
    output in the site: the build really ran the chapters."""
    executable = [p for p in toc_files()
                  if source_of(p).suffix == ".ipynb" or "{code-cell}" in source_of(p).read_text()]
    assert any(p.startswith("solutions/") for p in executable)
    for page in executable:
        html = (built / f"{page}.html").read_text()
        assert "cell_output" in html, f"{page}.html shows no executed output"


@pytest.mark.book
def test_markdown_outputs_render_their_tables(built: Path) -> None:
    """A cell that displays Markdown (the peers, GPU and router reports) shows its
    tables as tables. myst-nb parses such outputs as plain CommonMark unless told
    otherwise (nb_render_markdown_format), and CommonMark has no tables: the page
    then shows rows of '|' characters."""
    raw_row = re.compile(r"<p>\|[^<]*\|\s*\n\|[-:| ]+\|")
    shown = [p for p in toc_files() if raw_row.search((built / f"{p}.html").read_text(encoding="utf-8"))]
    assert not shown, f"Markdown tables shown as raw text on {shown}"
    chapter6 = (built / "chapters/06-quantization.html").read_text(encoding="utf-8")
    assert chapter6.count("<table") >= 1


@pytest.mark.book
def test_lab_pages_hide_worked_solutions_and_link_to_the_lab(built: Path) -> None:
    """A self-study reader sees every exercise's answer folded away (a toggle),
    ✓ under each check rather than a wall of ✗, and a link to the lab itself."""
    labs = [p for p in toc_files() if p.startswith("solutions/")]
    assert labs, "_toc.yml lists no lab page (solutions/NN-*)"
    for page in labs:
        html = (built / f"{page}.html").read_text(encoding="utf-8")
        nb = nbformat.read(source_of(page), as_version=4)
        checks = [c for c in nb.cells if "check" in c.metadata.get("tags", [])]
        exercises = [c for c in nb.cells if "exercise" in c.metadata.get("tags", [])]
        assert checks and exercises, f"{page} has no exercise"
        assert html.count("Show the worked solution") >= len(exercises), f"{page}: answers are not folded away"
        assert "tag_hide-input" in html, page
        for cell in checks:  # what the page shows under each check
            shown = "".join(o.get("text", "") for o in cell.outputs)
            assert "✓" in shown and "✗" not in shown, f"{page} shows a failing check: {shown!r}"
            first = shown.split("\n")[0]
            assert first in html or html_escape(first, quote=False) in html, f"{page}: {first!r} is not on the page"
        lab = page.replace("solutions/", "labs/")
        assert f"/blob/main/{lab}.ipynb" in html, f"{page} does not link to {lab}.ipynb in Colab"


def _folded_admonitions(html: str) -> list[str]:
    """The titles of the page's dropdown admonitions, which the site shows folded."""
    found = []
    for match in re.finditer(r'<div class="([^"]*)"[^>]*>\s*<p class="admonition-title">(.*?)</p>', html, re.S):
        if {"admonition", "dropdown"} <= set(match.group(1).split()):
            found.append(re.sub(r"<[^>]+>", "", match.group(2)).strip())
    return found


@pytest.mark.book
def test_lab_pages_fold_our_written_and_quiz_answers(built: Path) -> None:
    """Under each `why` question our answer is a folded dropdown, and each quiz
    answer is folded under "Show our answer" (scripts/make_labs.py)."""
    for page in [p for p in toc_files() if p.startswith("solutions/")]:
        html = (built / f"{page}.html").read_text(encoding="utf-8")
        nb = nbformat.read(source_of(page), as_version=4)
        whys = [c for c in nb.cells if "why" in c.metadata.get("tags", [])]
        quizzes = [c for c in nb.cells if "quiz" in c.metadata.get("tags", [])]
        assert _folded_admonitions(html).count("Our answer") >= len(whys), f"{page}: a why answer is not folded"
        assert html.count("Show our answer") >= len(quizzes), f"{page}: a quiz answer is not folded"


# Attributes through which a page makes the browser fetch something by itself.
# (<a href> only navigates when clicked; link rel=canonical/next/prev fetch nothing.)
FETCHING = {("script", "src"), ("img", "src"), ("iframe", "src"), ("source", "src"),
            ("video", "src"), ("audio", "src"), ("embed", "src"), ("object", "data")}
FETCHING_LINK_RELS = {"stylesheet", "preload", "modulepreload", "icon", "shortcut", "manifest", "prefetch"}
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
CDN = re.compile(r"cdn\.jsdelivr|cdnjs|unpkg")


class _Fetches(HTMLParser):
    """(tag, attribute, url) for everything a page fetches on load."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for name, value in attrs.items():
            if value and ((tag, name) in FETCHING or name == "data-jupyter-widgets-cdn"):
                self.urls.append((tag, name, value))
        rels = set((attrs.get("rel") or "").lower().split())
        if tag == "link" and rels & FETCHING_LINK_RELS and attrs.get("href"):
            self.urls.append((tag, "href", attrs["href"]))


def fetched_urls(html_file: Path) -> list[tuple[str, str, str]]:
    parser = _Fetches()
    parser.feed(html_file.read_text(encoding="utf-8"))
    return parser.urls


@pytest.mark.book
def test_site_loads_nothing_from_the_internet(built: Path) -> None:
    """MathJax, require.js and the widget manager come with the site (vendored
    from npm), so it renders offline: no page names a CDN, nothing a page fetches
    is remote, and every local script or stylesheet it fetches exists."""
    # Built pages, not the theme's template snippets in _static/.
    pages = sorted(p for p in built.rglob("*.html") if p.relative_to(built).parts[0] not in {"_static", "js"})
    assert pages, f"no HTML in {built}"
    cdn = [f"{p.relative_to(built)}: {m.group(0)}" for p in pages
           for m in CDN.finditer(p.read_text(encoding="utf-8"))]
    assert not cdn, "pages still name a CDN:\n" + "\n".join(cdn[:20])
    remote, missing = [], []
    for page in pages:
        for tag, attr, url in fetched_urls(page):
            where = f"{page.relative_to(built)}: <{tag} {attr}={url!r}>"
            if re.match(r"(https?:)?//", url):
                remote.append(where)
            elif not url.startswith("data:") and tag in {"script", "link"}:
                target = (page.parent / url.split("?")[0].split("#")[0]).resolve()
                if not target.is_file():
                    missing.append(where)
    assert not remote, "pages fetch from the internet:\n" + "\n".join(remote[:20])
    assert not missing, "pages fetch files the site lacks:\n" + "\n".join(missing[:20])
    # The vendored files are really wired in: MathJax on pages with math.
    assert any("js/mathjax/tex-chtml.js" in url for p in pages for _, _, url in fetched_urls(p)), \
        "no page loads the vendored MathJax (js/mathjax/tex-chtml.js)"
    for page in pages:
        if WIDGET_STATE in page.read_text(encoding="utf-8"):
            scripts = [url for tag, _, url in fetched_urls(page) if tag == "script"]
            for name in ("js/require.js", "js/html-manager/embed-amd.js"):
                assert any(name in url for url in scripts), f"{page.relative_to(built)} has widgets but no {name}"


@pytest.mark.book
def test_chapters_are_numbered_as_the_text_cites_them(built: Path) -> None:
    """The text cites chapters by number ("chapter 4"): chapters/NN-*.html shows
    "NN." before its title (numbered: 1 in _toc.yml) in the page and in the sidebar,
    and the labs' pages carry no second number beside their "Lab N:"."""
    chapters = [p for p in toc_files() if p.startswith("chapters/")]
    assert chapters
    sidebar = (built / "intro.html").read_text(encoding="utf-8")  # every page has the same sidebar
    for page in chapters:
        html = (built / f"{page}.html").read_text(encoding="utf-8")
        number = int(Path(page).name.split("-")[0])
        # (the first <h1> is the theme's plain copy of the title, for the header bar)
        assert re.search(rf'<h1[^>]*><span class="section-number">{number}\. </span>', html), \
            f"{page}: its title does not show {number}."
        link = re.search(rf'<a class="reference internal" href="{page}\.html">(.*?)</a>', sidebar, re.S)
        assert link and link.group(1).strip().startswith(f"{number}. "), f"{page}: the sidebar does not show {number}."
    lab = (built / "solutions/01-tokens.html").read_text(encoding="utf-8")
    assert not re.search(r'<h1[^>]*><span class="section-number">', lab), "a lab's title got a number"


@pytest.mark.book
def test_pages_load_the_course_stylesheet_and_contents_button(built: Path) -> None:
    """_static/custom.css (the wide article and the contents drawer, issue 57) and
    _static/contents-button.js reach every page: Jupyter Book 1 adds each file in
    _static/ by itself, and only for a build of the whole book."""
    for page in toc_files():
        html = (built / f"{page}.html").read_text(encoding="utf-8")
        for name in ("_static/custom.css", "_static/contents-button.js"):
            assert name in html, f"{page}.html does not load {name}"


class _LinksAndIds(HTMLParser):
    """Every href and every id on one page."""

    def __init__(self):
        super().__init__()
        self.hrefs, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href"):
            self.hrefs.append(attrs["href"])


def broken_links(html_root: Path) -> list[str]:
    """Links between the site's own pages whose file or #anchor does not exist. Sphinx
    checks its cross-references; this catches the rest, such as a link written in a
    report's Markdown output (`[chapter 8](08-fleets.html#side-by-side-on-one-cpu)`)."""
    pages = {}
    for path in html_root.rglob("*.html"):
        parser = _LinksAndIds()
        parser.feed(path.read_text(errors="replace"))
        pages[path.resolve()] = parser
    broken = []
    for path, parser in pages.items():
        for href in parser.hrefs:
            if re.match(r"^[a-z][a-z0-9+.-]*:", href) or href.startswith(("//", "mailto:")):
                continue  # another site (test_site_loads_nothing_from_the_internet covers loads)
            target, _, anchor = href.partition("#")
            file = (path.parent / target).resolve() if target else path
            if file.is_dir():
                file = file / "index.html"
            if target and not file.exists():
                broken.append(f"{path.relative_to(html_root.resolve())}: {href} (no such file)")
            elif anchor and file in pages and anchor not in pages[file].ids:
                broken.append(f"{path.relative_to(html_root.resolve())}: {href} (no such anchor)")
    return broken


@pytest.mark.book
def test_no_link_between_pages_is_broken(built: Path, tmp_path: Path) -> None:
    broken = broken_links(built)
    assert not broken, f"{len(broken)} broken links, the first: {broken[:5]}"
    (tmp_path / "a.html").write_text('<a href="b.html#here">b</a><a href="#top" id="top">t</a>')
    (tmp_path / "b.html").write_text('<p id="there">b</p>')
    assert broken_links(tmp_path) == ["a.html: b.html#here (no such anchor)"]  # the check can fail
