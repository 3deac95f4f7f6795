"""Developer tools run from a checkout (not installed with raytpu_lab): ``python -m tools.demo``."""
