"""The Docker engine: everything that talks to the Docker daemon, and the Dockerfiles it builds.

Owns the engine and the container context manager with guaranteed clean-up (engine.py), the
build context (build_context.py), Dockerfile generation from the matrix (dockerfiles.py, which
writes docker/*.Dockerfile), a small Dockerfile reader and the lint built on it (parse.py,
lint.py), the locally made base image for hosts with no registry (base_image.py) and the dry-run
text of a build (buildplan.py).
"""
