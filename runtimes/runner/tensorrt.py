"""TensorRT's engine cache in the bundle: cache/trt/KEY/, keyed by the model, its input shapes,
the TensorRT version and the GPU, and a note when the engine is built on a first run. Shipped
with gpu_facts.py, in a bundle whose providers include a GPU one."""

import glob
import hashlib
import json
import os
import sys

from .gpu_facts import gpu_name, tensorrt_version


def trt_cache_key(part, trt_version, gpu):
    """Engines depend on the model, its input shapes, the TensorRT version and the GPU."""
    shapes = ";".join("%s:%s:%s" % (i["name"], "x".join(map(str, i["shape"])), i["dtype"])
                      for i in part["inputs"])
    raw = "|".join([part["model"]["sha256"], shapes, trt_version, gpu])
    return "%s-%s" % (part["name"], hashlib.sha256(raw.encode()).hexdigest()[:16])


def trt_cache_dir(bundle, part, graph):
    """cache/trt/<key>/ for *part*'s *graph* (not created here)."""
    key = trt_cache_key(dict(part, model=graph), tensorrt_version(), gpu_name())
    return os.path.join(bundle, "cache", "trt", key)


def write_cache_key(path, part, graph):
    """key.json: what the engines in *path* were built for (once TensorRT really runs)."""
    target = os.path.join(path, "key.json")
    if not os.path.exists(target):
        with open(target, "w") as f:
            json.dump({"model_sha256": graph["sha256"], "inputs": part["inputs"],
                       "tensorrt": tensorrt_version(),
                       "gpu": gpu_name()}, f, indent=2)


def say_engine_build(bundle, part, cache):
    """A note on stderr when the engine in *cache* is built on this run (it takes minutes)."""
    if not glob.glob(os.path.join(cache, "*.engine")) and \
            tensorrt_version() != "unknown":   # (libnvinfer: tried)
        sys.stderr.write(
            "edgepack: building the TensorRT engine for %s: first run with this model, "
            "input shape, TensorRT and GPU; this takes minutes on a Jetson and is "
            "cached in %s\n" % (part["name"], os.path.relpath(cache, bundle)))
