"""The commands the course adds to `tinyinfer` (the entry-point group
"tinyinfer.commands" in pyproject.toml; tinyinfer.cli reads it). Each is a
(module, help) pair; the module, imported only when its command runs, has
add_arguments(parser) and run(args)."""

MEMORY = ("tinyinfer_course.analysis.memory", "weights + KV-cache memory calculator")
FLEET = ("tinyinfer_course.fleet.live_fleet", "N `tinyinfer serve` replicas behind vLLM's router (vllm-router)")
