"""Copy the JavaScript the book's pages load in a reader's browser into _vendor/js/.

Left alone, the static site loads MathJax (equations), require.js and the
ipywidgets HTML manager (widgets saved in executed pages) from CDNs, so it shows
raw TeX and no widgets without the internet. Instead they come from npm packages
pinned in package.json / package-lock.json, installed at build time, and
_config.yml points Sphinx at the copies:

    _vendor/js/mathjax/tex-chtml.js        + the components and fonts it loads lazily
    _vendor/js/require.js                  the AMD loader the widget manager needs
    _vendor/js/html-manager/embed-amd.js   renders the widget state embedded in a page
                                           (+ the font files its CSS points at, and
                                           embed-setup.js, which tells require.js where
                                           they are and lets widgets use MathJax 3)

_config.yml lists _vendor in html_extra_path, so the site gets them as js/...
They must not live under _static/: Jupyter Book 1 turns every .js file there
into a <script> tag on every page.

Each package's licence goes along, into _vendor/js/licenses/.

Running it again is quick: stamps record what was installed and copied; npm
runs only when package.json or package-lock.json changes, and the copy is
redone only when they or the list of files below change.

    python scripts/vendor_js.py            # install if needed, then copy
    python scripts/vendor_js.py --force    # reinstall and copy again
"""
from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE_MODULES = ROOT / "node_modules"
VENDOR = ROOT / "_vendor"
OUT = VENDOR / "js"
STAMP = VENDOR / ".stamp"
NPM_STAMP = NODE_MODULES / ".vendor_js-stamp"

# (source under node_modules, destination under _vendor/js). A folder is copied whole.
MATHJAX = "mathjax/es5"
FILES = [
    ("requirejs/require.js", "require.js"),
    ("@jupyter-widgets/html-manager/dist/embed-amd.js", "html-manager/embed-amd.js"),
    (f"{MATHJAX}/tex-chtml.js", "mathjax/tex-chtml.js"),
    # tex-chtml.js fetches these on demand, relative to its own URL: fonts,
    # TeX extensions (\require, autoloaded macros), the menu and its a11y tools.
    *[(f"{MATHJAX}/{d}", f"mathjax/{d}") for d in ("output", "input", "a11y", "adaptors", "ui", "sre")],
]
PACKAGES = ["requirejs", "mathjax", "@jupyter-widgets/html-manager"]  # for their licences
# The widget manager's CSS names font files by content hash next to embed-amd.js.
FONT_SUFFIXES = {".woff2", ".woff", ".ttf", ".eot", ".svg"}

# Loaded between require.js and embed-amd.js (see nb_ipywidgets_js in _config.yml).
SETUP_JS = """\
// Written by scripts/vendor_js.py; loaded after require.js, before embed-amd.js.
(function () {
  // embed-amd.js defines the AMD module "@jupyter-widgets/html-manager/dist/libembed-amd"
  // and looks for its font files next to the URL require.js gives that name. By
  // default that is a folder under the page's own URL; point it at this folder.
  var here = document.currentScript.src.replace(/[?#].*$/, "").replace(/\\/[^\\/]*$/, "");
  window.require.config({ paths: { "@jupyter-widgets/html-manager/dist": here } });

  // Widgets typeset their labels with MathJax 2's MathJax.Hub.Queue; the site
  // loads MathJax 3, which has no Hub. Forward to MathJax 3's typesetPromise.
  // MathJax (a deferred script) has replaced window.MathJax by DOMContentLoaded,
  // and widgets render later, on the window's load event.
  document.addEventListener("DOMContentLoaded", function () {
    var mj = window.MathJax;
    if (!mj || mj.Hub) return;
    mj.Hub = {
      Queue: function (job) {
        var element = job && job[2];
        if (!element || !mj.startup) return;
        mj.startup.promise
          .then(function () { return mj.typesetPromise([element]); })
          .catch(function (err) { console.warn("MathJax could not typeset a widget label:", err); });
      },
    };
  });
})();
"""


def lock_hash() -> str:
    """The npm packages wanted: package.json and its lock file."""
    digest = hashlib.sha256()
    for name in ("package.json", "package-lock.json"):
        path = ROOT / name
        digest.update(path.read_bytes() if path.exists() else b"")
    return digest.hexdigest()


def copy_hash() -> str:
    """What _vendor/js holds: the packages and the list of files taken from them."""
    return hashlib.sha256((lock_hash() + repr(FILES) + repr(PACKAGES) + SETUP_JS).encode()).hexdigest()


def npm_install() -> None:
    """`npm ci`, unless node_modules already holds exactly the locked packages."""
    if NPM_STAMP.exists() and NPM_STAMP.read_text() == lock_hash():
        return
    npm = shutil.which("npm")
    if npm is None:
        sys.exit("vendor_js: npm is not installed; the book needs it once to vendor MathJax and the "
                 "widget manager (Debian/Ubuntu: apt-get install npm; or https://nodejs.org)")
    # `npm ci` installs exactly the lock file. Only plain files are used, so no install scripts.
    has_lock = (ROOT / "package-lock.json").exists()
    cmd = [npm, "ci" if has_lock else "install", "--ignore-scripts", "--no-audit", "--no-fund"]
    print("vendor_js: npm", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    NPM_STAMP.write_text(lock_hash())


def copy_files() -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    for src, dst in FILES:
        source, target = NODE_MODULES / src, OUT / dst
        if not source.exists():
            sys.exit(f"vendor_js: {source.relative_to(ROOT)} is missing after npm install")
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy2(source, target)
    dist = NODE_MODULES / "@jupyter-widgets/html-manager/dist"
    for font in dist.iterdir():
        if font.suffix in FONT_SUFFIXES:
            shutil.copy2(font, OUT / "html-manager" / font.name)
    (OUT / "html-manager" / "embed-setup.js").write_text(SETUP_JS)
    for package in PACKAGES:
        for licence in (NODE_MODULES / package).glob("LICEN[CS]E*"):
            target = OUT / "licenses" / package.replace("/", "__") / licence.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(licence, target)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="run npm and copy even when up to date")
    args = parser.parse_args(argv)
    want = copy_hash()
    if not args.force and STAMP.exists() and STAMP.read_text() == want and OUT.is_dir():
        print("vendor_js: _vendor/js is up to date")
        return 0
    if args.force:
        NPM_STAMP.unlink(missing_ok=True)
    npm_install()
    copy_files()
    STAMP.write_text(want)
    size = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"vendor_js: wrote {OUT.relative_to(ROOT)} ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
