"""Lab 4, exercise 3 (a profile of one step, by module): wrong groupings the
check must reject, correct ones written here (independently of labcheck) that
it must accept, and the course's own answer it must refuse. Collected by
tests/course/test_labs.py."""
import bisect

from tinyinfer_course import labcheck

MODULE = "module::"


def _group(trace, *, nested=False, outermost=False, unit=1e3, other=True, ranges_too=False, ignore_end=False,
           order="start, longest first", pop_once=False, op_end_inclusive=False, module_end_inclusive=False):
    """One grouping, with one of several realistic mistakes switched on.
    order: "start, longest first" (right), "as listed" (no sort), "start" (a
    stable sort on ts alone: ties stay as listed), "start, shortest first".
    pop_once: open ranges kept as stacks, and at most one ended entry popped
    per event ("ranges": for the module ranges only; True: for the operators
    too). *_end_inclusive: a range still holds an event that starts exactly at
    its end (`t >= start` where `t > start` belongs)."""
    keys = {"start, longest first": lambda e: (e["ts"], -e["dur"]), "start": lambda e: e["ts"],
            "start, shortest first": lambda e: (e["ts"], e["dur"])}
    events = list(trace["traceEvents"]) if order == "as listed" else sorted(trace["traceEvents"], key=keys[order])
    ops, modules, out = [], [], {}
    for e in events:
        start, end = e["ts"], e["ts"] + e["dur"]
        if pop_once:
            if pop_once == "ranges":  # the operators right, the module ranges popped once
                ops = [t for t in ops if t > start]
            elif ops and ops[-1] <= start:
                ops.pop()
            if modules and modules[-1][0] <= start and not ignore_end:
                modules.pop()
        else:
            ops = [t for t in ops if (t >= start if op_end_inclusive else t > start)]
            if not ignore_end:
                modules = [(t, k) for t, k in modules if (t >= start if module_end_inclusive else t > start)]
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


def _by_top_level_end(trace, strict=False, every_end=False):
    """Correct as written, and unlike the course's answer: one number for the
    operators (the end of the last top-level one: top-level operators never
    overlap) and a stack of module ranges, popped while its top has ended.
    strict=True: `>` where `>=` belongs, so an operator that starts as the last
    one ends is taken as inside it; every_end=True: every operator's end, a
    nested one's too, replaces the number."""
    events = sorted(trace["traceEvents"], key=lambda e: (e["ts"], -(e["ts"] + e["dur"])))  # same as longest first
    reach, stack, totals = float("-inf"), [], {}
    for e in events:
        start, end = e["ts"], e["ts"] + e["dur"]
        while stack and stack[-1][0] <= start:  # every range that has ended, however many
            stack.pop()
        if e["cat"] == "user_annotation" and e["name"].startswith(MODULE):
            stack.append((end, e["name"].split("::", 1)[1]))
        elif e["cat"] == "cpu_op":
            if (start > reach) if strict else (start >= reach):
                kind = stack[-1][1] if stack else "other"
                totals[kind] = totals.get(kind, 0.0) + (end - start) / 1000
                reach = end
            elif every_end:
                reach = end  # wrong: a nested operator's end replaces its parent's
    return totals


def _by_intervals(trace, closed=False, latest_start=False):
    """For every operator, look up the operators and module ranges that contain
    its start through sorted starts and bisect, instead of one sweep with open
    stacks. Correct as written (and unlike the course's answer); closed=True:
    [ts, ts + dur] holds its end too; latest_start=True: the innermost range
    taken as the one that started last, ties left to the list's order."""
    events = trace["traceEvents"]
    ops = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] == "cpu_op"]
    mods = [(e["ts"], e["ts"] + e["dur"], e["name"].split("::", 1)[1]) for e in events
            if e["cat"] == "user_annotation" and e["name"].startswith(MODULE)]
    if not latest_start:
        mods.sort()
    mod_starts = sorted(s for s, _, _ in mods)
    totals, reach = {}, float("-inf")  # reach: the latest end of the operators started so far
    for s, end in sorted(ops, key=lambda o: (o[0], -o[1])):  # a parent before a child that starts with it
        inside, reach = (reach >= s) if closed else (reach > s), max(reach, end)
        if inside:
            continue  # inside another operator
        if latest_start:
            holding = [m for m in mods if m[0] <= s < m[1]]
            kind = max(holding, key=lambda m: m[0])[2] if holding else "other"
        else:
            holding = [m for m in mods[:bisect.bisect_right(mod_starts, s)] if (m[1] >= s if closed else m[1] > s)]
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
        # The events' order.
        lambda t: _group(t, order="as listed"),  # walked as the file lists them, never sorted
        lambda t: _group(t, order="start"),  # sorted by start alone: a child listed first stays first
        lambda t: _group(t, order="start, shortest first"),  # the tie rule reversed: children before parents
        lambda t: _by_intervals(t, latest_start=True),  # innermost = started last, a tie left to the list
        # Ended ranges.
        lambda t: _group(t, pop_once=True),  # one ended entry popped per event, not all of them
        lambda t: _group(t, pop_once="ranges"),  # the same for the module ranges only: two ending together
        lambda t: _group(t, op_end_inclusive=True),  # an operator starting at another's end counted as inside it
        lambda t: _group(t, module_end_inclusive=True),  # an operator starting at a range's end given to it
        lambda t: _by_intervals(t, closed=True),  # [ts, ts + dur] closed at both ends
        lambda t: _by_top_level_end(t, every_end=True),  # the last operator's end, a nested one's too, as the bar
        lambda t: _by_top_level_end(t, strict=True),  # `>` where `>=` belongs: back-to-back operators dropped
    ],
}
REFERENCE = {
    "check_breakdown_by_module": lambda: _by_intervals,
}
# More correct ways, each unlike the course's answer; the check must accept every one.
ALTERNATIVES = {
    "check_breakdown_by_module": [_by_intervals, _by_top_level_end],
}
ANSWERS = {
    "check_breakdown_by_module": [labcheck.reference_breakdown_by_module],
}
