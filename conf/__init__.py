"""Hydra config groups of the runner; a package so Hydra finds them as pkg://runner.conf when installed.

Hydra imports this package to read its YAML, so the schema that config.yaml's defaults list names
(base_config) is registered here: any compose of pkg://runner.conf (a notebook's, a test's) finds it.
"""

from runner.config.schema import register

register()
