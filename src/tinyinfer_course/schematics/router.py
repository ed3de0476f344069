"""Chapter 8's picture of a fleet's front door: a load balancer in front of
replicas, choosing with the fleet simulator's own routing policy from what it
can see (health-check results and outstanding requests)."""
from __future__ import annotations

from types import SimpleNamespace

from ..fleet.router import make_policy
from .draw import arrow, box, canvas, label

EXAMPLE_OUTSTANDING = (3, 1, 0, 2)  # unfinished requests per replica, as the balancer counts them
EXAMPLE_DOWN = (2,)  # replicas whose last health check failed


def draw_router(outstanding=EXAMPLE_OUTSTANDING, down=EXAMPLE_DOWN, policy: str = "least_outstanding"):
    """Clients on the left send requests to one load balancer; on the right sit
    the replicas, each a whole copy of the model with its count of outstanding
    requests. The balancer health-checks every replica (dashed lines); one failed
    its check and is skipped, even though it looks idle. The bold arrow is where
    the fleet simulator's `policy` sends the next request, computed by calling it."""
    replicas = [SimpleNamespace(id=i, outstanding=o, queue_full=lambda: False) for i, o in enumerate(outstanding)]
    healthy = [r for r in replicas if r.id not in down]
    chosen = make_policy(policy).choose(SimpleNamespace(prefix_id=None), healthy)
    n = len(replicas)
    fig, ax = canvas(16.4, max(4.6, 1.4 * n + 0.7))
    mid = 0.9 + 1.4 * (n - 1) / 2  # the middle of the column of replicas
    for i in range(3):  # clients
        y = mid + 1.3 - i * 1.3
        box(ax, 0.3, y - 0.35, 2.0, 0.7, "client", "purple", fontsize=9)
        arrow(ax, (2.3, y), (4.6, mid + 0.2 * (1 - i)), color="grey")
    box(ax, 4.6, mid - 1.0, 3.4, 2.0, f"load balancer\npolicy: {policy.replace('_', ' ')}", "orange", fontsize=9)
    for r in replicas:
        y = 1.4 * (n - 1 - r.id) + 0.9
        is_down = r.id in down
        text = (f"replica {r.id}: {r.outstanding} outstanding,\nbut its health check failed" if is_down
                else f"replica {r.id}: {r.outstanding} outstanding")
        box(ax, 11.4, y - 0.4, 4.7, 0.8, text, "grey" if is_down else "blue", fontsize=9, dashed=is_down)
        ax.plot([8.0, 11.4], [mid - 0.6, y - 0.15], color="#999999", linewidth=0.7, linestyle=(0, (2, 2)))
        if r is chosen:
            arrow(ax, (8.0, mid + 0.3), (11.4, y + 0.1), "next request", color="vermillion", fontsize=9)
    label(ax, 13.75, 0.15, "each replica: a whole copy of the model", fontsize=9, italic=True)
    label(ax, 6.3, mid - 1.35, "dashed: GET /health every few seconds", fontsize=9, italic=True)
    return fig
