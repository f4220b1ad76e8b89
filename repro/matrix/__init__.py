"""The env matrix: which environments exist and what each one installs.

Owns the env model (`Env`, `Matrix`, derived envs with other torch/DeepSpeed pins: model.py),
loading and validating env_matrix/envs.toml (schema.py: `load_matrix`), what is known about torch
and DeepSpeed releases as data (compat.py: wheel indexes, Python support, dependency pins) and
the release lists that bisect and survey walk (versions.py). Pure data and checks: nothing here
builds or runs anything. A new env goes in env_matrix/envs.toml; a new platform or torch index in
compat.py.
"""
