# serve_app image: Ray 2.60 with serve_app installed, for the KubeRay manifests in deploy/k8s.
#
#   CPU:  docker build -t registry.example.com/serve-app:0.1.0 .
#   GPU:  docker build -t registry.example.com/serve-app:0.1.0-gpu \
#           --build-arg BASE_IMAGE=rayproject/ray:2.60.0-py311-gpu --build-arg EXTRAS=gpu .
#
# The base's Ray must equal the ray[serve] pin in pyproject.toml (2.60.0) and rayVersion in the
# RayService; pip keeps it and adds serve_app's own pins (grpcio-reflection<1.85, protobuf<7).
# rayproject/ray images also carry what KubeRay needs besides Ray: bash and wget (its injected
# probes), and the `ray` user (uid 1000).  A python:3.11-slim base with `pip install .` works for
# serve_app but lacks wget, so KubeRay's default head and worker probes would fail there.
ARG BASE_IMAGE=rayproject/ray:2.60.0-py311
FROM ${BASE_IMAGE}

# Comma-separated extras of pyproject.toml: "gpu" (onnxruntime-gpu, TensorRT), "torch", ...
ARG EXTRAS=""

COPY --chown=1000:100 pyproject.toml README.md /tmp/serve_app/
COPY --chown=1000:100 serve_app /tmp/serve_app/serve_app

# onnxruntime (a base dependency) and onnxruntime-gpu install the same `onnxruntime` module, and
# whichever pip writes last wins: with the gpu extra, reinstall the GPU build over it.
RUN set -eux; \
    pip install --no-cache-dir "/tmp/serve_app${EXTRAS:+[${EXTRAS}]}"; \
    case ",${EXTRAS}," in \
      *,gpu,*) ort_gpu="$(grep -o 'onnxruntime-gpu[^"]*' /tmp/serve_app/pyproject.toml)"; \
               pip uninstall -y onnxruntime onnxruntime-gpu; \
               pip install --no-cache-dir "${ort_gpu}";; \
    esac; \
    rm -rf /tmp/serve_app; \
    python -c "import serve_app.app, ray; assert ray.__version__ == '2.60.0', ray.__version__"
