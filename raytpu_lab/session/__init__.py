"""The services one session (:class:`raytpu_lab.lab.Session`) wires, each testable alone.

- :mod:`~raytpu_lab.session.reader`: :class:`StateReader`, how every service reads the
  cluster (over :mod:`raytpu_lab.state.fetch`; tests give recorded or synthetic states);
- :mod:`~raytpu_lab.session.connection`: which cluster, emulator up/down, kernel exit;
- :mod:`~raytpu_lab.session.hosts`: per-host processes of each reservation;
- :mod:`~raytpu_lab.session.kuberay_control`: RayClusters on Kubernetes (connect, apply,
  scale, delete);
- :mod:`~raytpu_lab.session.map_feed`: the live map, status view and highlights, fed by
  :mod:`~raytpu_lab.session.refresher` (the session's one poller).

The reservation service itself is :mod:`raytpu_lab.reservations.service`. Calls go one way:
session -> services -> reader -> :mod:`raytpu_lab.state.fetch` / Ray; no service imports the
session. Import the modules directly (this package imports nothing).
"""
