"""The checks that lab notebooks call after each exercise (see core.py).

Every lab's checks live in a module of this package that declares its lab
(`LAB = Lab(...)`, registry.py); the package re-exports every name those
declarations list, so notebooks write `labcheck.check_bpe_encode_piece(fn)`
or `labcheck.reference_rope` whatever the module. Besides them:
- core.py: Case and run_check, from which every check is made;
- watch.py: the forbidden-call watch that refuses the course's own answers;
- quiz.py: compare_prediction and grade_answer, for "predict, then measure";
- quiz_answers.py: the expected answers of quizzes, computed out of sight;
- machine.py: what a lab says about the machine its timings come from
  (warn_if_busy, a one-line warning on a busy machine; bf16_units);
- my_engine.py: the learner's pieces, kept by one lab for the next;
- fixtures.py, records.py, given.py: what several labs' checks share.
"""
from . import my_engine, quiz_answers, registry, watch  # noqa: F401
from .core import Case, run_check  # noqa: F401
from ..machine import bf16_units  # noqa: F401  (lab 6 asks labcheck.bf16_units())
from .machine import busy_note, warn_if_busy  # noqa: F401
from .quiz import compare_prediction, grade_answer  # noqa: F401

LABS = registry.labs()  # ((module, Lab), ...) for every lab, by number
globals().update(registry.exports(LABS))  # labcheck.check_rope, labcheck.reference_rope, labcheck.Request, ...
