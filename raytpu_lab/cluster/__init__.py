"""The Ray side of a cluster: the local emulator and connecting a driver.

- :mod:`~raytpu_lab.cluster.emulator` (with ``_nodes``, ``_launcher``, the agent shims and
  ``_site``): start, find and stop emulated TPU clusters of real Ray nodes;
- :mod:`~raytpu_lab.cluster.gke_env`: the environment GKE and KubeRay give a TPU host;
- :mod:`~raytpu_lab.cluster.connect`: probe, connect and disconnect a Ray driver;
- :mod:`~raytpu_lab.cluster.jax_slice`: JAX's view of an emulated slice.

KubeRay (manifests, the Kubernetes client, emulating a manifest) is :mod:`raytpu_lab.kuberay`.
Nothing is imported here: the emulator's host processes import single modules of this package.
"""
