# Env rocm57: generated from env_matrix/envs.toml
# by `python -m repro dockerfiles --write`: edit the matrix, not this file.
#
# torch 2.2 raises ValueError from _IllegalWork; DeepSpeed 0.14.5 is the first release checked
# that catches it in the MiCS handle without the 0.13.2-0.14.2 debug print. Likely (the code path
# is pure Python, shared by NCCL and RCCL): flat MiCS warns and races, hierarchical MiCS crashes
# with ValueError.
#
# Build from the repository root (plain `docker build`, no BuildKit needed):
#   docker build -f docker/rocm57.Dockerfile -t mics-repro:rocm57-82b2396f0971 .
# Build arguments, stand-in builds and how to run it (GPU devices): docker/README.md.

ARG BASE_IMAGE=rocm/dev-ubuntu-22.04:5.7
FROM ${BASE_IMAGE}
ARG BASE_IMAGE

# GPU bases carry AMD's/NVIDIA's apt sources, whose signing keys expire and rotate: they are parked
# before `apt-get update` (docker/README.md), as only the distribution's own packages are needed.
COPY docker/disable-vendor-apt.sh /opt/mics-repro/disable-vendor-apt.sh
# Extra CA certificates for a TLS-intercepting proxy: any *.crt/*.pem in docker/certs/ are added
# to a bundle that apt and pip then use. With none there, nothing changes.
COPY docker/certs/ /opt/mics-repro/certs/
ARG OS_PACKAGES="python3.10 python3.10-venv python3.10-dev g++"
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
    sh /opt/mics-repro/disable-vendor-apt.sh; \
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
ARG PYTHON=python3.10
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
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/rocm5.7
ARG TORCH_SPEC=torch==2.2.2+rocm5.7
# hadolint ignore=DL3013
RUN python -m pip install --index-url "$TORCH_INDEX_URL" --extra-index-url "$PIP_INDEX_URL" \
        "$TORCH_SPEC" numpy==1.26.4

# DeepSpeed's runtime deps, all pinned, no resolver; `pip check` proves the set complete.
RUN python -m pip install --no-deps annotated-types==0.8.0 hjson==3.1.0 ninja==1.13.2 \
        packaging==26.4 psutil==7.2.2 py-cpuinfo==9.0.0 pydantic==2.14.4 pydantic-core==2.50.5 \
        tqdm==4.70.1 typing-extensions==4.16.0 typing-inspection==0.4.5 && \
    python -m pip check

# DeepSpeed's setup.py imports torch (no build isolation); its ops are JIT-compiled on use. GPUs
# hidden: on a GPU it runs nvcc / reads ROCM_HOME (harmless here, where a build sees none).
RUN DS_BUILD_OPS=0 CUDA_VISIBLE_DEVICES='' HIP_VISIBLE_DEVICES='' ROCR_VISIBLE_DEVICES='' python -m pip install --no-deps --no-build-isolation \
        deepspeed==0.14.5

# The GPU architectures DeepSpeed's JIT-compiled ops (FusedAdam...) are built for: MI100, MI200
# (and MI300 on ROCm 6+), so a user config with such an op runs on all of them.
ARG ROCM_ARCH="gfx908;gfx90a"
ENV PYTORCH_ROCM_ARCH=${ROCM_ARCH}

# Fail the build unless every pin (and, with STRICT=1, the Python/ROCm/CUDA stack) is what the
# matrix says. Stand-in builds on another base pass STRICT=0.
ARG STRICT=1
COPY docker/verify_image.py /opt/mics-repro/verify_image.py
RUN python /opt/mics-repro/verify_image.py --strict "$STRICT" --python 3.10 --rocm 5.7 --torch-hip 5.7 \
        annotated-types==0.8.0 deepspeed==0.14.5 hjson==3.1.0 ninja==1.13.2 numpy==1.26.4 \
        packaging==26.4 pip==26.3 psutil==7.2.2 py-cpuinfo==9.0.0 pydantic==2.14.4 \
        pydantic-core==2.50.5 setuptools==80.10.2 torch==2.2.2 tqdm==4.70.1 \
        typing-extensions==4.16.0 typing-inspection==0.4.5 wheel==0.48.0 && \
    python -m pip freeze --all > /opt/mics-repro/pip-freeze.txt && \
    mkdir -p /results

# The workload last: editing it rebuilds only these layers.
COPY repro/__init__.py /opt/mics-repro/src/repro/__init__.py
COPY repro/workload/ /opt/mics-repro/src/repro/workload/
ENV PYTHONPATH=/opt/mics-repro/src
WORKDIR /results

LABEL org.opencontainers.image.title="mics-repro rocm57" \
      org.opencontainers.image.description="DeepSpeed MiCS + torch _IllegalWork reproduction: torch 2.2.2, DeepSpeed 0.14.5" \
      org.opencontainers.image.version="rocm57-82b2396f0971" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      mics-repro.env="rocm57" \
      mics-repro.pins-key="82b2396f0971" \
      mics-repro.annotated-types="0.8.0" \
      mics-repro.base-image="rocm/dev-ubuntu-22.04:5.7" \
      mics-repro.deepspeed="0.14.5" \
      mics-repro.hjson="3.1.0" \
      mics-repro.ninja="1.13.2" \
      mics-repro.numpy="1.26.4" \
      mics-repro.packaging="26.4" \
      mics-repro.pip="26.3" \
      mics-repro.platform="rocm" \
      mics-repro.psutil="7.2.2" \
      mics-repro.py-cpuinfo="9.0.0" \
      mics-repro.pydantic="2.14.4" \
      mics-repro.pydantic-core="2.50.5" \
      mics-repro.python="3.10" \
      mics-repro.recipe="2" \
      mics-repro.rocm="5.7" \
      mics-repro.setuptools="80.10.2" \
      mics-repro.torch="2.2.2" \
      mics-repro.torch-index="https://download.pytorch.org/whl/rocm5.7" \
      mics-repro.tqdm="4.70.1" \
      mics-repro.typing-extensions="4.16.0" \
      mics-repro.typing-inspection="0.4.5" \
      mics-repro.wheel="0.48.0"

# The reproduction suite; results (suite.json, logs, ds_report) land in /results.
CMD ["python", "-m", "repro.workload.suite", "--env", "rocm57", "--out", "/results", "--scenarios", "zero3,mics,mics-hier,mics-replica", "--patches", "stock,fixed", "--transports", "async", "--device", "rocm"]
