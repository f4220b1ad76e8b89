"""The venv engine, for hosts without Docker: one cached virtualenv per env's pins.

Owns creating, verifying and reusing those venvs (the marker written last proves a venv matches
its pins), sharing identical files between them with hard links (engine.py), and layered venvs:
a small venv on top of a cached one for probes that change only DeepSpeed (layer.py).
"""
