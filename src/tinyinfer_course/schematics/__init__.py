"""Schematic figures for the book, drawn by code.

Every figure here is a function that returns a matplotlib Figure, so the book
draws it offline on every build, a test can draw it too, and a reader can
change it (more layers, another block size) and run the cell again. Each one
says in its docstring what it shows; the chapter cell that draws it gives the
same sentence to screen readers as the image's alt text
(`mystnb: image: alt: ...` in the cell's metadata).

The shapes (boxes, arrows, rows of blocks) come from draw.py, so every
schematic in the book shares one look. One file per picture: every draw_*
function of every module in this folder is exported here, so adding a picture
means adding a file, nothing else.
"""
import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "draw":
        _loaded = importlib.import_module(f"{__name__}.{_module.name}")
        globals().update({name: f for name, f in vars(_loaded).items() if name.startswith("draw_")})
