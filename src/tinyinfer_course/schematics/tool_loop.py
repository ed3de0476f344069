"""Chapter 10's picture of the tool-call loop (tinyinfer_course.text.tools.run_agent): the
model writes a request for a tool as text, the application runs the tool and
appends its result, and the model runs again on everything so far. Chapter 10
passes in the prompt and output tokens of each pass of its real run."""
from __future__ import annotations

from .draw import arrow, box, canvas, label

# (prompt tokens, output tokens) per model pass; None: draw the loop without counts.
EXAMPLE_PASSES = None


def draw_tool_loop(passes=EXAMPLE_PASSES, tool: str = "get_weather", call: str = '{"city": "Paris"}',
                   result: str = "Paris: 18 °C, light rain"):
    """The application (centre) sits between the model (left) and the tool
    (right). Pass 1: the application sends the conversation to the model, which
    replies with a tool call in tags instead of an answer. The application parses
    the call, runs the tool, appends the tool's result to the conversation and
    sends all of it again. Pass 2: the model reads the longer prompt and writes
    the answer, which goes back to the user. The loop repeats while a reply asks
    for a tool. `passes` gives each pass's (prompt, output) tokens when known."""
    # Columns, in units: the model, the lanes of pass 1 and 2 (wide enough for a
    # tool call in tags at 9 pt), the application, the lanes to the tool, the tool.
    fig, ax = canvas(19.0, 8.4)
    app, mid, tool_x = 8.5, 10.1, 16.15  # the application's left edge and centre, the tool's left edge
    box(ax, 0.2, 1.9, 2.2, 4.6, "the model\n\none inference\npass per call", "blue", fontsize=9)
    box(ax, app, 1.9, 3.2, 4.6, "", "orange")
    label(ax, mid, 5.6, "the application", fontsize=9)
    label(ax, mid, 5.15, "(run_agent)", fontsize=9)
    label(ax, mid, 3.7, "while a reply is a\ntool call: run the\ntool, append its\nresult, and call\n"
          "the model again", fontsize=9, italic=True)
    box(ax, tool_x, 3.3, 2.65, 1.6, f"the tool\n{tool}", "green", fontsize=9)
    box(ax, mid - 1.8, 7.3, 3.6, 0.8, "user: weather in Paris?", "purple", fontsize=9)
    arrow(ax, (mid, 7.3), (mid, 6.55))

    def tokens(i: int, what: str) -> str:
        if not passes or i >= len(passes):
            return ""
        return f" ({passes[i][0 if what == 'prompt' else 1]} tokens)"

    def link(y, x0, x1, text, color, above=0.25):
        arrow(ax, (x0, y), (x1, y), color=color)
        label(ax, (x0 + x1) / 2, y + above, text, fontsize=9)

    # Pass 1, top: the conversation in, a tool call out.
    link(6.0, app - 0.05, 2.45, f"pass 1: the conversation{tokens(0, 'prompt')}", "blue")
    link(5.0, 2.45, app - 0.05, f"reply{tokens(0, 'output')}: a tool call", "vermillion")
    label(ax, (2.45 + app) / 2, 4.6, f'<tool_call>{{"name": "{tool}", ...}}', fontsize=9, italic=True)
    # The tool, right.
    link(4.5, app + 3.25, tool_x - 0.05, "parse it, run", "green")
    label(ax, (app + 3.2 + tool_x) / 2, 4.1, f"{tool}({call})", fontsize=9, italic=True)
    link(3.6, tool_x - 0.05, app + 3.25, "its result, as text", "green", above=-0.3)
    label(ax, (app + 3.2 + tool_x) / 2, 2.95, f"'{result}'", fontsize=9, italic=True)
    # Pass 2, bottom: all of it again, the answer out.
    link(3.2, app - 0.05, 2.45, f"pass 2: all of that again{tokens(1, 'prompt')}", "blue")
    link(2.3, 2.45, app - 0.05, f"the answer{tokens(1, 'output')}", "vermillion")
    box(ax, mid - 1.8, 0.3, 3.6, 0.8, "answer to the user", "purple", fontsize=9)
    arrow(ax, (mid, 1.85), (mid, 1.15))
    return fig
