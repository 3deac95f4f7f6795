"""The Jupyter side of raytpu_lab: the "Ray TPU" sidebar's server extension and its lab extension.

The lab extension (TypeScript in ``extensions/raytpu-sidebar``, built into ``labextension/`` here)
talks to the handlers of :mod:`raytpu_lab.jupyter.handlers`. Settings (``jupyter_server_config``)::

    c.RaytpuSidebar.kuberay_clusters = ["default/my-tpu-cluster"]   # also $RAYTPU_SIDEBAR_KUBERAY
    c.RaytpuSidebar.interval_s = 1.0
    c.RaytpuSidebar.idle_after_s = 900

The server process never calls ``ray.init``: one poller process per watched cluster does
(:mod:`raytpu_lab.jupyter.poll_worker`).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["LABEXTENSION_NAME"]

LABEXTENSION_NAME = "raytpu-sidebar"


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": LABEXTENSION_NAME}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "raytpu_lab.jupyter"}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    from raytpu_lab.jupyter.handlers import SidebarState, setup_handlers

    cfg = server_app.config.get("RaytpuSidebar", {})
    kuberay = list(cfg.get("kuberay_clusters", []))
    kuberay += [x for x in os.environ.get("RAYTPU_SIDEBAR_KUBERAY", "").split(",") if x.strip()]
    state = SidebarState(kuberay=kuberay, interval_s=float(cfg.get("interval_s", 1.0)),
                         idle_after_s=float(cfg.get("idle_after_s", 900.0)))
    setup_handlers(server_app.web_app, state)
    server_app.log.info("raytpu_lab sidebar: /raytpu/api (clusters polled from a subprocess each)")
