"""Lab 4, exercise 3 (a profile of one step, by module): wrong groupings the
check must reject, a correct one written here (independently of labcheck) that
it must accept, and the course's own answer it must refuse. Collected by
tests/course/test_labs.py."""
import bisect

from tinyinfer_course import labcheck

MODULE = "module::"


def _group(trace, *, nested=False, outermost=False, unit=1e3, other=True, ranges_too=False, ignore_end=False):
    """One grouping, with one of several realistic mistakes switched on."""
    events = sorted(trace["traceEvents"], key=lambda e: (e["ts"], -e["dur"]))
    ops, modules, out = [], [], {}
    for e in events:
        start, end = e["ts"], e["ts"] + e["dur"]
        ops = [t for t in ops if t > start]
        if not ignore_end:
            modules = [(t, k) for t, k in modules if t > start]
        is_module = e["cat"] == "user_annotation" and e["name"].startswith(MODULE)
        if is_module:
            modules.append((end, e["name"][len(MODULE):]))
        if e["cat"] == "cpu_op" or (ranges_too and e["name"] != "step"):
            if not ops or nested:
                inner = [k for t, k in modules if not (is_module and t == end and k == e["name"][len(MODULE):])]
                kind = (inner[0] if outermost else inner[-1]) if inner else "other"
                if kind != "other" or other:
                    out[kind] = out.get(kind, 0.0) + e["dur"] / unit
            if e["cat"] == "cpu_op":
                ops.append(end)
    return out


def _by_intervals(trace):
    # Correct, and unlike the course's answer: for every operator, look up the
    # operators and module ranges that contain its start through sorted starts
    # and bisect, instead of one sweep with open stacks.
    events = trace["traceEvents"]
    ops = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] == "cpu_op"]
    mods = sorted((e["ts"], e["ts"] + e["dur"], e["name"].split("::", 1)[1]) for e in events
                  if e["cat"] == "user_annotation" and e["name"].startswith(MODULE))
    mod_starts = [s for s, _, _ in mods]
    totals, reach = {}, float("-inf")  # reach: the latest end of the operators started so far
    for s, end in sorted(ops, key=lambda o: (o[0], -o[1])):  # a parent before a child that starts with it
        inside, reach = reach > s, max(reach, end)
        if inside:
            continue  # inside another operator
        holding = [m for m in mods[:bisect.bisect_right(mod_starts, s)] if m[1] > s]
        kind = min(holding, key=lambda m: m[1] - m[0])[2] if holding else "other"  # innermost: the shortest
        totals[kind] = totals.get(kind, 0) + (end - s) / 1000
    return totals


WRONG = {
    "check_breakdown_by_module": [
        lambda t: _group(t, nested=True),  # every operator counted, aten::mm inside aten::linear too
        lambda t: _group(t, outermost=True),  # the outermost module: everything goes to "layer"
        lambda t: _group(t, unit=1.0),  # microseconds, not milliseconds
        lambda t: _group(t, other=False),  # operators outside every module dropped
        lambda t: _group(t, ranges_too=True),  # the module ranges' own durations added as if operators
        lambda t: _group(t, ignore_end=True),  # a range that has ended still holds what comes after it
    ],
}
REFERENCE = {
    "check_breakdown_by_module": lambda: _by_intervals,
}
ANSWERS = {
    "check_breakdown_by_module": [labcheck.reference_breakdown_by_module],
}
