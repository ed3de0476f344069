"""Moved: LLM lives in llm.py (as in vLLM and nano-vllm). Kept so older imports work."""
from .llm import LLM  # noqa: F401
from .llm_engine import LLMEngine  # noqa: F401
