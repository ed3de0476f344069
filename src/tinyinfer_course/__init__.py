"""The course's code beside the engine: lab checks, analytic models, reports, figures.

Importing it sets one default for the reader's notebook: torch's profiler (kineto)
writes a start and a stop line to stderr for every profile it takes, and chapters 4
and 5 and lab 4 profile many times, so those lines would sit between a page's
results. Level 6 keeps them out (5 is not enough); a level the reader set is kept.
It takes effect for profiles started after the import, torch already loaded or not.
"""
import os

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
