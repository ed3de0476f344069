"""Schematic figures for the book, drawn by code.

Every figure here is a function that returns a matplotlib Figure, so the book
draws it offline on every build, a test can draw it too, and a reader can
change it (more layers, another block size) and run the cell again. Each one
says in its docstring what it shows; the chapter cell that draws it gives the
same sentence to screen readers as the image's alt text
(`mystnb: image: alt: ...` in the cell's metadata).

The shapes (boxes, arrows, rows of blocks) come from draw.py, so every
schematic in the book shares one look. One file per picture.
"""
from .stack import draw_stack  # noqa: F401
