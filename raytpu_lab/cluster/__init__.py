"""The Ray side of a cluster: the local emulator and connecting a driver.

- :mod:`~raytpu_lab.cluster.emulator` (with ``_nodes``, ``_node_checks``, ``_node_environment``,
  ``_priority``, ``_process_groups``, ``_addresses``, ``_launcher``, the agent shims and ``_site``):
  start emulated TPU clusters of real Ray nodes;
- :mod:`~raytpu_lab.cluster.emulator_state`: the record of a running emulated cluster; find, list
  and stop them (its names are importable from ``emulator`` too);
- :mod:`~raytpu_lab.cluster.gke_env`: the environment GKE and KubeRay give a TPU host;
- :mod:`~raytpu_lab.cluster.connect`: probe, connect and disconnect a Ray driver;
- :mod:`~raytpu_lab.cluster.jax_slice`: JAX's view of an emulated slice.

KubeRay (manifests, the Kubernetes client, emulating a manifest) is :mod:`raytpu_lab.kuberay`.
Nothing is imported here: the emulator's host processes import single modules of this package.
"""
