# Env cpu-ds0198: generated from env_matrix/envs.toml
# by `python -m repro dockerfiles --write`: edit the matrix, not this file.
#
# DeepSpeed 0.19.8 has no MiCS (removed in 0.19.7; mics_shard_size is a config error): MiCS runs
# are expected to be unsupported, plain ZeRO-3 clean. Shows where the bug stops being reachable,
# not a fix.
#
# Build from the repository root (plain `docker build`, no BuildKit needed):
#   docker build -f docker/cpu-ds0198.Dockerfile -t mics-repro:cpu-ds0198-1cb444ac7270 .
# Build arguments, stand-in builds and how to run it (GPU devices): docker/README.md.

ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
ARG BASE_IMAGE

# Extra CA certificates for a TLS-intercepting proxy: any *.crt/*.pem in docker/certs/ are added
# to a bundle that apt and pip then use. With none there, nothing changes.
COPY docker/certs/ /opt/mics-repro/certs/
ARG OS_PACKAGES=""
ARG DEBIAN_FRONTEND=noninteractive
RUN set -eu; bundle=/opt/mics-repro/ca-bundle.pem; \
    for cert in /opt/mics-repro/certs/*.crt /opt/mics-repro/certs/*.pem; do \
        [ -f "$cert" ] || continue; \
        if [ ! -f "$bundle" ] && [ -f /etc/ssl/certs/ca-certificates.crt ]; then \
            cp /etc/ssl/certs/ca-certificates.crt "$bundle"; fi; \
        cat "$cert" >> "$bundle"; \
    done; \
    if [ -f "$bundle" ] && [ -d /etc/apt/apt.conf.d ]; then \
        echo "Acquire::https::CAInfo \"$bundle\";" > /etc/apt/apt.conf.d/99mics-repro-ca; fi; \
    if [ -n "$OS_PACKAGES" ]; then \
        apt-get update; \
        apt-get install -y --no-install-recommends $OS_PACKAGES; \
        rm -rf /var/lib/apt/lists/*; fi

# A venv at a fixed path: nothing depends on the distro's pip or site-packages.
# Wheel sources. PIP_FIND_LINKS: a local wheelhouse (URL or path) tried besides the indexes;
# PIP_NO_INDEX=1 installs from it alone; PIP_TRUSTED_HOST lets pip use a plain-http wheelhouse.
# pip reads all of these from the environment.
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_FIND_LINKS=
ARG PIP_NO_INDEX=0
ARG PIP_TRUSTED_HOST=
ARG PYTHON=python3
RUN set -eu; "$PYTHON" -m venv /opt/venv; \
    if [ -f /opt/mics-repro/ca-bundle.pem ]; then \
        printf '[global]\ncert = /opt/mics-repro/ca-bundle.pem\n' > /opt/venv/pip.conf; fi
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1

# pip, setuptools, wheel: pinned.
RUN python -m pip install packaging==26.4 pip==26.3 setuptools==80.10.2 wheel==0.48.0

# torch: the heaviest layer; it is reused as long as torch and numpy stay the same.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_SPEC=torch==2.13.0+cpu
# hadolint ignore=DL3013
RUN python -m pip install --index-url "$TORCH_INDEX_URL" --extra-index-url "$PIP_INDEX_URL" \
        "$TORCH_SPEC" numpy==2.4.6

# DeepSpeed's runtime deps, all pinned, no resolver; `pip check` proves the set complete.
RUN python -m pip install --no-deps annotated-types==0.8.0 einops==0.8.2 hjson==3.1.0 \
        msgpack==1.2.4 ninja==1.13.2 packaging==26.4 psutil==7.2.2 py-cpuinfo==9.0.0 \
        pydantic==2.14.4 pydantic-core==2.50.5 tqdm==4.70.1 typing-extensions==4.16.0 \
        typing-inspection==0.4.5 && \
    python -m pip check

# DeepSpeed's setup.py imports torch (no build isolation); its ops are JIT-compiled on use. GPUs
# hidden: on a GPU it runs nvcc / reads ROCM_HOME (harmless here, where a build sees none).
RUN DS_BUILD_OPS=0 CUDA_VISIBLE_DEVICES='' HIP_VISIBLE_DEVICES='' ROCR_VISIBLE_DEVICES='' python -m pip install --no-deps --no-build-isolation \
        deepspeed==0.19.8

# Fail the build unless every pin (and, with STRICT=1, the Python/ROCm/CUDA stack) is what the
# matrix says. Stand-in builds on another base pass STRICT=0.
ARG STRICT=1
COPY docker/verify_image.py /opt/mics-repro/verify_image.py
RUN python /opt/mics-repro/verify_image.py --strict "$STRICT" --python 3.11 annotated-types==0.8.0 \
        deepspeed==0.19.8 einops==0.8.2 hjson==3.1.0 msgpack==1.2.4 ninja==1.13.2 numpy==2.4.6 \
        packaging==26.4 pip==26.3 psutil==7.2.2 py-cpuinfo==9.0.0 pydantic==2.14.4 \
        pydantic-core==2.50.5 setuptools==80.10.2 torch==2.13.0 tqdm==4.70.1 \
        typing-extensions==4.16.0 typing-inspection==0.4.5 wheel==0.48.0 && \
    python -m pip freeze --all > /opt/mics-repro/pip-freeze.txt && \
    mkdir -p /results

# The workload last: editing it rebuilds only these layers.
COPY repro/__init__.py /opt/mics-repro/src/repro/__init__.py
COPY repro/workload/ /opt/mics-repro/src/repro/workload/
ENV PYTHONPATH=/opt/mics-repro/src
WORKDIR /results

LABEL org.opencontainers.image.title="mics-repro cpu-ds0198" \
      org.opencontainers.image.description="DeepSpeed MiCS + torch _IllegalWork reproduction: torch 2.13.0, DeepSpeed 0.19.8" \
      org.opencontainers.image.version="cpu-ds0198-1cb444ac7270" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      mics-repro.env="cpu-ds0198" \
      mics-repro.pins-key="1cb444ac7270" \
      mics-repro.annotated-types="0.8.0" \
      mics-repro.base-image="python:3.11-slim-bookworm" \
      mics-repro.deepspeed="0.19.8" \
      mics-repro.einops="0.8.2" \
      mics-repro.hjson="3.1.0" \
      mics-repro.msgpack="1.2.4" \
      mics-repro.ninja="1.13.2" \
      mics-repro.numpy="2.4.6" \
      mics-repro.packaging="26.4" \
      mics-repro.pip="26.3" \
      mics-repro.platform="cpu" \
      mics-repro.psutil="7.2.2" \
      mics-repro.py-cpuinfo="9.0.0" \
      mics-repro.pydantic="2.14.4" \
      mics-repro.pydantic-core="2.50.5" \
      mics-repro.python="3.11" \
      mics-repro.recipe="2" \
      mics-repro.setuptools="80.10.2" \
      mics-repro.torch="2.13.0" \
      mics-repro.torch-index="https://download.pytorch.org/whl/cpu" \
      mics-repro.tqdm="4.70.1" \
      mics-repro.typing-extensions="4.16.0" \
      mics-repro.typing-inspection="0.4.5" \
      mics-repro.wheel="0.48.0"

# The reproduction suite; results (suite.json, logs, ds_report) land in /results.
CMD ["python", "-m", "repro.workload.suite", "--env", "cpu-ds0198", "--out", "/results", "--scenarios", "zero3,mics,mics-hier,mics-replica", "--patches", "stock,fixed", "--transports", "async", "--device", "cpu"]
