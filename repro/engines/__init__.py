"""Where the suite runs: the Engine protocol (base.py) and its two engines, docker/ and venv/.

Also owns engine selection, the `docker|venv` chain with ENGINE=auto (select.py, the only module
that knows both engine classes), the checks that run before anything long starts (preflight.py)
and the per-machine wheelhouse that both engines install from (wheelhouse.py). A new engine is a
new sub-package implementing `base.Engine`, added to select.py.
"""
