#!/usr/bin/env python3
"""Run an edgepack bundle with ONNX Runtime: check, bench, infer.

This file is copied into every bundle as ``run.py``. It is standalone on purpose: Python 3.8+,
the standard library, numpy and onnxruntime only (OpenCV only for image inputs). It reads
``manifest.json`` beside it and never installs anything.

    python3 run.py check                 # integrity, the host's outputs reproduced, FP32 budget
    python3 run.py bench --runs 200 --json
    python3 run.py infer photo.jpg --json
    python3 run.py bench --part decoder  # bundles with several models: one of them
    python3 run.py serve --port 8080     # HTTP: POST /infer, GET /health, GET /metadata

Exit codes: 0 passed, 1 a check failed (integrity, accuracy, provider), 2 bad input or a broken
bundle.
"""

import argparse
import glob
import hashlib
import io
import json
import os
import platform
import re
import subprocess
import sys
import time

import numpy as np

MANIFEST = "manifest.json"
SUPPORTED_SCHEMA = 2
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
OPT_LEVELS = {"disabled": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
              "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class BundleError(Exception):
    """The bundle or the command line is unusable (exit 2)."""


# --------------------------------------------------------------------------- preprocessing
# The packager calls these same functions for calibration, so host and device preprocess alike.


def read_image(path, spec):
    """Decode an image file into an HxWxC uint8 array in the spec's colour order."""
    return decode_image(np.fromfile(str(path), dtype=np.uint8), spec, path)


def decode_image(data, spec, path):
    """Decode encoded image bytes (a uint8 array) named *path* in messages."""
    try:
        import cv2
    except ImportError:
        raise BundleError("image input needs OpenCV: pip install opencv-python-headless "
                          "(or pass .npy/.npz tensors)") from None
    if hasattr(cv2, "setLogLevel"):
        cv2.setLogLevel(0)  # a broken file gets our one-line message, not decoder noise
    image = cv2.imdecode(data, cv2.IMREAD_UNCHANGED) if data.size else None
    if image is None:
        raise BundleError("%s: not a readable image (corrupt or unsupported format); "
                          "remove it or re-save it as PNG/JPEG" % path)
    if image.dtype != np.uint8:
        image = cv2.convertScaleAbs(image, alpha=255.0 / max(float(image.max()), 1.0))
    channels = 1 if image.ndim == 2 else image.shape[2]
    color = spec.get("color", "rgb")
    if color == "gray":
        if channels != 1:
            raise BundleError("%s: %d channels, but the preprocessing spec says color=gray; "
                              "convert the image to grayscale or use color=rgb" % (path, channels))
        return image[:, :, None]
    if channels == 4:  # drop alpha: RGBA PNGs are the common case, not an error
        image = image[:, :, :3]
        channels = 3
    if channels != 3:
        raise BundleError("%s: %d channel(s), but the preprocessing spec says color=%s "
                          "(3 channels); convert the image or use color=gray"
                          % (path, channels, color))
    if color == "rgb":
        image = image[:, :, ::-1]
    return np.ascontiguousarray(image)


def preprocess(image, spec):
    """Turn an HxWxC uint8 image into a model input tensor with a batch axis of 1."""
    import cv2

    width, height = spec["size"]
    h, w = image.shape[:2]
    mode = spec.get("resize", "stretch")
    if mode == "stretch":
        out = cv2.resize(image, (width, height), interpolation=cv2.INTER_LINEAR)
    elif mode == "letterbox":
        r = min(float(width) / w, float(height) / h)
        nw, nh = max(1, int(round(w * r))), max(1, int(round(h * r)))
        resized = cv2.resize(image, (nw, nh), interpolation=cv2.INTER_LINEAR)
        out = np.full((height, width, image.shape[2]), spec.get("pad", 114), dtype=np.uint8)
        top, left = (height - nh) // 2, (width - nw) // 2
        out[top:top + nh, left:left + nw] = resized.reshape(nh, nw, -1)
    elif mode == "center-crop":
        r = max(float(width) / w, float(height) / h)
        nw, nh = max(width, int(round(w * r))), max(height, int(round(h * r)))
        resized = cv2.resize(image, (nw, nh), interpolation=cv2.INTER_LINEAR)
        top, left = (nh - height) // 2, (nw - width) // 2
        out = resized[top:top + height, left:left + width]
    else:
        raise BundleError("unknown resize mode %r (stretch, letterbox, center-crop)" % mode)
    out = out.reshape(height, width, -1)
    dtype = spec.get("dtype", "float32")
    if dtype == "uint8":
        tensor = out
    else:
        tensor = out.astype(np.float32) * np.float32(spec.get("scale", 1.0))
        if spec.get("mean") is not None:
            tensor = tensor - np.asarray(spec["mean"], dtype=np.float32)
        if spec.get("std") is not None:
            tensor = tensor / np.asarray(spec["std"], dtype=np.float32)
    if spec.get("layout", "nchw") == "nchw":
        tensor = tensor.transpose(2, 0, 1)
    return np.ascontiguousarray(tensor[None].astype(dtype))


# --------------------------------------------------------------------------- bundle + session


def load_manifest(bundle):
    path = os.path.join(bundle, MANIFEST)
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as exc:
        raise BundleError("%s: cannot read the manifest (%s); is this an edgepack bundle?"
                          % (path, exc)) from None
    if manifest.get("schema_version") != SUPPORTED_SCHEMA:
        raise BundleError("%s: schema_version %r, this runner reads %d; rebuild the bundle"
                          % (path, manifest.get("schema_version"), SUPPORTED_SCHEMA))
    return manifest


def select_parts(manifest, name=None):
    """The parts (models) of the bundle to run: all of them, or the one named."""
    parts = manifest.get("parts") or []
    if not parts:
        raise BundleError("the manifest lists no models; rebuild the bundle with edgepack")
    if name is None:
        return parts
    for part in parts:
        if part["name"] == name:
            return [part]
    raise BundleError("no part named %r in this bundle (parts: %s)"
                      % (name, ", ".join(p["name"] for p in parts)))


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def integrity_problems(bundle, manifest):
    """Return one line per file that is missing or whose sha256 differs from the manifest."""
    problems = []
    for rel, expected in sorted(manifest.get("files", {}).items()):
        path = os.path.join(bundle, rel)
        if not os.path.isfile(path):
            problems.append("%s: missing" % rel)
        elif sha256(path) != expected:
            problems.append("%s: sha256 mismatch (file changed or truncated in transfer)" % rel)
    return problems


SESSION_OVERRIDES = (("intra_op_threads", "threads"), ("inter_op_threads", "inter_threads"),
                     ("graph_optimization_level", "opt_level"),
                     ("execution_mode", "execution_mode"))


def session_settings(manifest, args=None):
    """The target's session options with the command line's overrides applied."""
    conf = dict(manifest.get("session", {}))
    for key, attr in SESSION_OVERRIDES:
        value = getattr(args, attr, None)
        if value is not None:
            conf[key] = value
    return conf


def session_options(ort, conf):
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(conf.get("intra_op_threads", 0))
    so.inter_op_num_threads = int(conf.get("inter_op_threads", 0))
    level = OPT_LEVELS.get(conf.get("graph_optimization_level", "all"), "ORT_ENABLE_ALL")
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    if conf.get("execution_mode") == "parallel":
        so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    return so


# --------------------------------------------------------------------------- TensorRT caches


def tensorrt_version():
    """TensorRT's version from its library's file name (libnvinfer.so.X.Y.Z), else 'unknown'."""
    dirs = ["/usr/lib/aarch64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/local/cuda/lib64"]
    dirs += [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    found = []
    for d in dirs:
        for path in glob.glob(os.path.join(d, "libnvinfer.so.*")):
            match = re.search(r"libnvinfer\.so\.([\d.]+)$", path)
            if match:
                found.append(match.group(1))
    return max(found, key=lambda v: [int(x) for x in v.split(".") if x]) if found else "unknown"


def gpu_name():
    """The Jetson module's name, or the first GPU's name and compute capability, else 'unknown'."""
    try:
        with open("/proc/device-tree/model") as f:
            model = f.read().strip("\x00\n ")
        if model:
            return model
    except OSError:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


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
                       "tensorrt": tensorrt_version(), "gpu": gpu_name()}, f, indent=2)


CPU = "CPUExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"


def graph_for(part, provider):
    """The model entry that serves *provider*: its own graph when the part ships one for it
    (e.g. FP16 for CUDA beside an INT8 QDQ graph for TensorRT and the CPU), else the part's."""
    for graph in part.get("graphs", []):
        if provider in graph.get("providers", []):
            return graph
    return dict(part["model"], precision=part.get("precision", {}).get("precision"))


def provider_plan(bundle, manifest, part):
    """[{name, options, graph}] in the manifest's order, CPU always last. Option values
    "{bundle}/..." become paths in the bundle; "{cache}" the graph's keyed TensorRT cache."""
    plan, seen = [], set()
    entries = list(manifest.get("providers") or [])
    for entry in entries + [{"name": CPU}]:
        name = entry["name"]
        if name in seen:
            continue
        seen.add(name)
        graph = graph_for(part, name)
        opts = dict(entry.get("options", {}))
        for key, value in list(opts.items()):
            if value == "{cache}":
                opts[key] = trt_cache_dir(bundle, part, graph)
            elif isinstance(value, str) and value.startswith("{bundle}"):
                opts[key] = os.path.join(bundle, value[len("{bundle}/"):])
        plan.append({"name": name, "options": opts, "graph": graph})
    return plan


class CapturedOutput(object):
    """Everything written to file descriptors 1 and 2 inside the block (onnxruntime prints its
    fallback banner to stdout and its load errors to stderr, from Python and from C++)."""

    def __enter__(self):
        import tempfile

        sys.stdout.flush()
        sys.stderr.flush()
        self.file = tempfile.TemporaryFile()
        self.saved = [os.dup(1), os.dup(2)]
        os.dup2(self.file.fileno(), 1)
        os.dup2(self.file.fileno(), 2)
        self.text = ""
        return self

    def __exit__(self, *exc):
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in zip((1, 2), self.saved):
            os.dup2(saved, fd)
            os.close(saved)
        self.file.seek(0)
        self.text = re.sub(r"\x1b\[[0-9;]*m", "", self.file.read().decode("utf-8", "replace"))
        self.file.close()
        return False


LIBRARY_ERROR = re.compile(r"Failed to load library \S*providers_(\w+)\.so\S* with error: (.+)")


def load_reason(name, error, text):
    """One line on why *name* did not start: the library load error when there is one."""
    kind = {"TensorrtExecutionProvider": "tensorrt", "CUDAExecutionProvider": "cuda"}.get(name)
    for match in LIBRARY_ERROR.finditer(text):
        if match.group(1) == kind:
            return match.group(2).strip()
    if error is not None:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return re.sub(r"^\S+\.(cc|h):\d+ .*?\) ", "", first)[:300]
    return "onnxruntime did not start it"


def open_session(bundle, manifest, part, args=None):
    """A session on the first provider of the manifest's list that really starts here, each
    with its own options and graph, created one by one (onnxruntime's own fallback drops the
    options and prints to stdout). Returns (session, info): load_ms, provider, graph,
    precision, not_running {name: reason}."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    settings = session_settings(manifest, args)
    requested = [p["name"] for p in manifest.get("providers", [])]
    not_running = {}
    session = None
    for step in provider_plan(bundle, manifest, part):
        name, options, graph = step["name"], step["options"], step["graph"]
        if name not in available:
            not_running[name] = "not in this onnxruntime build"
            continue
        folders = sorted(set(v for k, v in options.items() if k.endswith("_path") and
                             isinstance(v, str) and v.startswith(bundle) and
                             not os.path.isdir(v)))
        for folder in folders:
            os.makedirs(folder)
        cache = options.get("trt_engine_cache_path") if name == TENSORRT else None
        if cache and not glob.glob(os.path.join(cache, "*.engine")) and \
                tensorrt_version() != "unknown":   # (libnvinfer is there: it will be tried)
            sys.stderr.write(
                "edgepack: building the TensorRT engine for %s: first run with this model, "
                "input shape, TensorRT and GPU; this takes minutes on a Jetson and is "
                "cached in %s\n" % (part["name"], os.path.relpath(cache, bundle)))
        providers = [name] if name == CPU else [name, CPU]
        start = time.perf_counter()
        error = None
        with CapturedOutput() as out:
            try:
                session = ort.InferenceSession(
                    os.path.join(bundle, graph["file"]),
                    sess_options=session_options(ort, settings), providers=providers,
                    provider_options=[options] if name == CPU else [options, {}],
                    enable_fallback=0)
            except Exception as exc:  # the provider (or, on CPU, the model) failed to load
                session, error = None, exc
        load_ms = (time.perf_counter() - start) * 1000.0
        if session is not None and session.get_providers()[0] == name:
            if hasattr(session, "disable_fallback"):
                session.disable_fallback()   # a failing run must not retry without options
            if out.text.strip():
                sys.stderr.write(out.text if out.text.endswith("\n") else out.text + "\n")
            if cache:
                write_cache_key(cache, part, graph)
            break
        if name == CPU:
            raise BundleError("onnxruntime cannot load %s: %s" % (
                graph["file"], load_reason(name, error, out.text)))
        not_running[name] = load_reason(name, error, out.text)
        session = None
        for folder in reversed(folders):   # nothing left behind by a provider that did not run
            while folder.startswith(bundle + os.sep) and os.path.isdir(folder) and \
                    not os.listdir(folder):
                os.rmdir(folder)
                folder = os.path.dirname(folder)
    info = {"load_ms": load_ms, "provider": name, "graph": graph["file"],
            "precision": graph.get("precision"), "not_running": not_running,
            "provider_options": session.get_provider_options().get(name, {})}
    line = "edgepack: %s running on %s (%s%s)" % (
        part["name"], name, graph["file"],
        ", " + graph["precision"].upper() if graph.get("precision") else "")
    missing = [p for p in requested if p in not_running]
    if missing:
        line += "; requested but not running here: " + "; ".join(
            "%s (%s)" % (p, not_running[p]) for p in missing)
    sys.stderr.write(line + "\n")
    require = getattr(args, "require_provider", None)
    if require and require != name:
        raise ProviderMissing("required provider %s is not running (running: %s%s)" % (
            require, name, "; %s: %s" % (require, not_running[require])
            if require in not_running else ""))
    return session, info


class ProviderMissing(Exception):
    """--require-provider named a provider that did not start (exit 1)."""


# --------------------------------------------------------------------------- metrics


def compare(got, ref):
    """Per-output agreement between two (samples, ...) arrays."""
    a = got.reshape(got.shape[0], -1).astype(np.float64)
    b = ref.reshape(ref.shape[0], -1).astype(np.float64)
    ref_norm = np.linalg.norm(b, axis=1)
    norms = np.linalg.norm(a, axis=1) * ref_norm
    err = np.abs(a - b).max(axis=1) if a.size else np.zeros(len(a))
    cos = np.where(norms > 0, (a * b).sum(axis=1) / np.maximum(norms, 1e-30),
                   np.where(err == 0, 1.0, 0.0))
    # A sample whose reference is near silence (a text detector's map of a photo with no
    # text: 1e-5 everywhere) has no direction to compare: there the output must stay within
    # 1 % of the outputs' range over all samples instead (false text there still fails).
    silent = ref_norm < 1e-3 * ref_norm.max() if len(ref_norm) else ref_norm > 0
    scale = float(np.abs(b).max()) if b.size else 0.0
    cos = np.where(silent, np.where(err <= 0.01 * scale, 1.0, 0.0), cos)
    result = {"cosine_min": float(cos.min()), "cosine_mean": float(cos.mean()),
              "max_abs": float(err.max()) if a.size else 0.0}
    if silent.any():
        result["silent_samples"] = int(silent.sum())
    if looks_like_scores(ref):
        result["top1_agreement"] = float((a.argmax(axis=1) == b.argmax(axis=1)).mean())
    return result


def looks_like_scores(arr):
    """Class scores: float, shape (samples, 1, classes) with at least two classes."""
    return arr.dtype.kind == "f" and arr.ndim == 3 and arr.shape[1] == 1 and arr.shape[2] >= 2


def device_info():
    import onnxruntime as ort

    info = {"arch": platform.machine(), "cpu": platform.processor() or "", "cores": os.cpu_count(),
            "python": platform.python_version(), "onnxruntime": ort.__version__,
            "available_providers": ort.get_available_providers()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key = line.split(":")[0].strip()
                if key in ("model name", "Model") and ":" in line:
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    for key, path in (("governor", "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
                      ("cpu_max_mhz", "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"),
                      ("board", "/proc/device-tree/model")):
        try:
            with open(path) as f:
                value = f.read().strip("\x00\n ")
        except OSError:
            continue
        info[key] = int(value) // 1000 if key == "cpu_max_mhz" and value.isdigit() else value
    power = jetson_power_mode()
    if power:
        info["nvpmodel"] = power
    return info


def jetson_power_mode():
    """The Jetson power mode (`nvpmodel -q`), e.g. 'MAXN', or None off a Jetson."""
    try:
        out = subprocess.run(["nvpmodel", "-q"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"NV Power Mode:\s*(.+)", out.stdout)
    return match.group(1).strip() if match else None


# --------------------------------------------------------------------------- GPU facts


def loaded_library(prefix):
    """The file of a loaded shared library named PREFIX.so*, from /proc/self/maps, else None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if "/" in line else ""
                if os.path.basename(path).startswith(prefix + ".so"):
                    return path
    except OSError:
        pass
    return None


def _library_call(prefix, function):
    """FUNCTION of the loaded library PREFIX (loaded by onnxruntime: no new CUDA context)."""
    import ctypes

    path = loaded_library(prefix)
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
        return getattr(lib, function), ctypes
    except (OSError, AttributeError):
        return None


def _int_out(prefix, function, *args):
    found = _library_call(prefix, function)
    if found is None:
        return None
    fn, ctypes = found
    value = ctypes.c_int(0)
    try:
        return value.value if fn(ctypes.byref(value), *args) == 0 else None
    except Exception:
        return None


def _version(number, width):
    """12040 -> '12.4' (CUDA, width 1000 major), 90100 -> '9.1.0' (cuDNN 9 / TensorRT 10)."""
    if not number:
        return None
    if width == 1000:
        return "%d.%d" % (number // 1000, number % 1000 // 10)
    major = number // 10000 if number >= 10000 else number // 1000
    rest = number % 10000 if number >= 10000 else number % 1000
    return "%d.%d.%d" % (major, rest // 100, rest % 100)


def gpu_facts():
    """GPU, driver, CUDA, cuDNN and TensorRT versions as loaded by this process's onnxruntime
    (call after a GPU session started); None where unknown."""
    facts = {"name": None, "compute_capability": None, "driver": None, "cuda_driver": None,
             "cuda_runtime": None, "cudnn": None, "tensorrt": None}
    facts["cuda_runtime"] = _version(_int_out("libcudart", "cudaRuntimeGetVersion"), 1000)
    facts["cuda_driver"] = _version(_int_out("libcudart", "cudaDriverGetVersion"), 1000)
    major = _int_out("libcudart", "cudaDeviceGetAttribute", 75, 0)
    minor = _int_out("libcudart", "cudaDeviceGetAttribute", 76, 0)
    if major is not None and minor is not None:
        facts["compute_capability"] = "%d.%d" % (major, minor)
    for key, prefix, function, size in (("cudnn", "libcudnn", "cudnnGetVersion", True),
                                        ("tensorrt", "libnvinfer", "getInferLibVersion", False)):
        found = _library_call(prefix, function)
        if found is not None:
            fn, ctypes = found
            fn.restype = ctypes.c_size_t if size else ctypes.c_int
            try:
                facts[key] = _version(int(fn()), 10000)
            except Exception:
                pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=10)
        fields = [x.strip() for x in out.stdout.splitlines()[0].split(",")] \
            if out.returncode == 0 and out.stdout.strip() else []
        if len(fields) == 3:
            facts["name"] = fields[0]
            facts["compute_capability"] = facts["compute_capability"] or fields[1]
            facts["driver"] = fields[2]
    except (OSError, subprocess.SubprocessError):
        pass
    if facts["name"] is None:
        name = gpu_name()
        facts["name"] = None if name == "unknown" else name
    return facts


def gpu_memory_mb():
    """GPU memory this process holds (nvidia-smi), or None where it cannot tell (a Jetson's
    integrated GPU shares the RAM: see peak RSS there)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.stdout.splitlines():
        fields = [x.strip() for x in line.split(",")]
        if len(fields) == 2 and fields[0] == str(os.getpid()):
            try:
                return float(fields[1])
            except ValueError:
                return None
    return None


def peak_rss_mb():
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0


# --------------------------------------------------------------------------- commands


def read_npz(bundle, rel):
    with np.load(os.path.join(bundle, rel)) as f:
        return {k: f[k] for k in f.files}


def load_golden(bundle, part):
    """The golden inputs and the outputs they are judged against: the FP32 reference's, or in a
    bundle without one, the host's outputs of the shipped model."""
    golden = part.get("golden") or {}
    reference = golden.get("outputs") or golden.get("shipped")
    if not reference:
        raise BundleError("the manifest has no golden data; rebuild the bundle with edgepack")
    return read_npz(bundle, golden["inputs"]), read_npz(bundle, reference)


def run_samples(session, inputs):
    """Run each sample (axis 0 of every array) through the session; stack outputs per name."""
    names = [o.name for o in session.get_outputs()]
    count = len(next(iter(inputs.values())))
    # np.asarray: indexing a stack of scalars (an int64 sample rate) gives numpy scalars,
    # which onnxruntime refuses
    rows = [session.run(names, {k: np.asarray(v[i]) for k, v in inputs.items()})
            for i in range(count)]
    return {name: np.stack([row[j] for row in rows]) for j, name in enumerate(names)}


def cmd_check(bundle, manifest, args):
    """Integrity, then per output two promises: the device reproduces the host's outputs of the
    shipped model (a kernel that computes differently here fails it), and it keeps the accuracy
    floor against the reference (the FP32 model's outputs, or the host's when there is none)."""
    report = {"bundle": manifest.get("name"), "integrity": integrity_problems(bundle, manifest),
              "parts": {}, "device": {"arch": platform.machine()}}
    if report["integrity"]:
        report["passed"] = False
        return report
    passed = True
    for part in select_parts(manifest, args.part):
        session, opened = open_session(bundle, manifest, part, args)
        report.setdefault("providers", session.get_providers())
        inputs, reference = load_golden(bundle, part)
        golden = part["golden"]
        got = run_samples(session, inputs)
        own = opened["graph"] != part["model"]["file"]   # this provider's own graph
        graph = graph_for(part, opened["provider"])
        min_cosine = graph["min_cosine"] if own else golden.get("min_cosine", 0.99)
        host = golden.get("shipped_provider", "CPUExecutionProvider")
        running = opened["provider"]
        if not golden.get("shipped"):
            skipped = "the bundle has no host outputs of its model (built by an older edgepack)"
        elif running != host:
            skipped = "the host ran %s, this device runs %s, whose kernels differ by design" % (
                host, running)
        elif own:
            skipped = "the host's outputs are of %s; %s runs %s" % (
                part["model"]["file"], running, opened["graph"])
        else:
            skipped, shipped = None, read_npz(bundle, golden["shipped"])
        entry = {"outputs": {}, "min_cosine": min_cosine,
                 "reference": golden.get("reference", "fp32"),
                 "precision": opened["precision"], "graph": opened["graph"],
                 "not_running": opened["not_running"],
                 "samples": len(next(iter(inputs.values()))), "providers": session.get_providers()}
        for name, ref in reference.items():
            stats = compare(got[name], ref)
            stats["min_cosine"] = min_cosine
            stats["passed"] = stats["cosine_min"] >= min_cosine
            if skipped:
                stats["reproduce"] = {"checked": False, "reason": skipped}
            else:
                same = compare(got[name], shipped[name])
                same.update(checked=True, min_cosine=golden["reproduce_min_cosine"])
                same["passed"] = same["cosine_min"] >= same["min_cosine"]
                stats["reproduce"] = same
                stats["passed"] = stats["passed"] and same["passed"]
            passed = passed and stats["passed"]
            entry["outputs"][name] = stats
        entry["passed"] = all(o["passed"] for o in entry["outputs"].values())
        report["parts"][part["name"]] = entry
    report["passed"] = passed
    report["target_note"] = target_note(manifest, report.get("providers", [""])[0])
    return report


def target_note(manifest, running):
    """'' on the target's arch and first provider, else what differs: a pass elsewhere says
    nothing of the target's kernels."""
    target = manifest.get("target", {})
    wanted = [p["name"] for p in manifest.get("providers", [])]
    differs = []
    if target.get("arch") and platform.machine() != target["arch"]:
        differs.append("this machine is %s, %s is %s" % (platform.machine(), target.get("name"),
                                                         target["arch"]))
    if wanted and running and running != wanted[0]:
        differs.append("%s ran, %s runs %s first" % (running, target.get("name"), wanted[0]))
    return "; ".join(differs)


def latency_stats(times):
    t = np.asarray(times)
    return {"p50": float(np.percentile(t, 50)), "p90": float(np.percentile(t, 90)),
            "p99": float(np.percentile(t, 99)), "mean": float(t.mean()), "std": float(t.std()),
            "min": float(t.min()), "max": float(t.max())}


def timed(call, warmup, runs):
    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000.0)
    return times


def io_binding_call(session, feed, names, device):
    """One run with inputs and outputs kept on *device* ('cuda' under CUDA and TensorRT), as an
    application that chains GPU work would: no host copies inside the timed call."""
    import onnxruntime as ort

    binding = session.io_binding()
    for name, value in feed.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, device, 0))
    for name in names:
        binding.bind_output(name, device)

    def call():
        session.run_with_iobinding(binding)
    return call


def bench_part(bundle, manifest, part, args):
    session, opened = open_session(bundle, manifest, part, args)
    inputs, _ = load_golden(bundle, part)
    feed = {k: np.asarray(v[0]) for k, v in inputs.items()}
    names = [o.name for o in session.get_outputs()]
    times = timed(lambda: session.run(names, feed), args.warmup, args.runs)
    batch = max(int(next(iter(feed.values())).shape[0]) if feed else 1, 1)
    result = {
        "precision": opened["precision"], "batch": batch,
        "latency_ms": latency_stats(times),
        "throughput_per_s": float(1000.0 * batch / np.mean(times)),
        "session_load_ms": opened["load_ms"], "graph": opened["graph"],
        "not_running": opened["not_running"], "provider_options": opened["provider_options"],
        "providers": session.get_providers(),
    }
    if getattr(args, "io_binding", False):
        device = "cpu" if opened["provider"] == CPU else "cuda"
        bound = timed(io_binding_call(session, feed, names, device), args.warmup, args.runs)
        result["io_binding"] = {"device": device, "latency_ms": latency_stats(bound),
                                "throughput_per_s": float(1000.0 * batch / np.mean(bound))}
    if opened["provider"] != CPU:
        result["gpu_memory_mb"] = gpu_memory_mb()
    return result


def cmd_bench(bundle, manifest, args):
    problems = integrity_problems(bundle, manifest)
    if problems:
        raise BundleError("integrity check failed: %s; copy the bundle again" % problems[0])
    parts = {}
    for part in select_parts(manifest, args.part):
        parts[part["name"]] = bench_part(bundle, manifest, part, args)
    first = next(iter(parts.values()))
    return {
        "bundle": manifest.get("name"),
        "target": manifest.get("target", {}).get("name"),
        "runs": args.runs, "warmup": args.warmup,
        "session": session_settings(manifest, args),
        "parts": parts,
        "providers": first["providers"],
        "peak_rss_mb": peak_rss_mb(),
        "device": device_info(),
        "gpu": gpu_facts() if first["providers"][0] != CPU else None,
        "onnxruntime": __import__("onnxruntime").__version__,
    }


def check_feed(feed, part, source):
    """Check names and shapes against the part's inputs; cast to its dtypes."""
    out = {}
    for spec in part["inputs"]:
        if spec["name"] not in feed:
            raise BundleError("%s: no input named %s (has: %s)"
                              % (source, spec["name"], ", ".join(sorted(feed)) or "none"))
        arr = np.asarray(feed[spec["name"]])
        if list(arr.shape) != list(spec["shape"]):
            raise BundleError("%s: %s has shape %s, the model wants %s"
                              % (source, spec["name"], list(arr.shape), spec["shape"]))
        out[spec["name"]] = arr.astype(spec["dtype"], copy=False)
    return out


def image_feed(data, part, source):
    spec = part.get("preprocess")
    if not spec:
        raise BundleError("%s: %s has no image preprocessing; send .npy/.npz/JSON tensors"
                          % (source, part["name"]))
    return {part["inputs"][0]["name"]: preprocess(decode_image(data, spec, source), spec)}


def single_input(arr, part, source):
    if len(part["inputs"]) != 1:
        raise BundleError("%s: %s has %d inputs (%s); send an .npz or JSON keyed by input name"
                          % (source, part["name"], len(part["inputs"]),
                             ", ".join(i["name"] for i in part["inputs"])))
    return {part["inputs"][0]["name"]: arr}


def load_input_file(path, part):
    """Return {input name: tensor} for one .npy/.npz/image file."""
    lower = path.lower()
    if lower.endswith(".npz"):
        with np.load(path) as f:
            feed = {k: f[k] for k in f.files}
    elif lower.endswith(".npy"):
        feed = single_input(np.load(path), part, path)
    elif lower.endswith(IMAGE_SUFFIXES):
        feed = image_feed(np.fromfile(path, dtype=np.uint8), part, path)
    else:
        raise BundleError("%s: unsupported input (use an image, .npy or .npz)" % path)
    return check_feed(feed, part, path)


IMAGE_MAGIC = (b"\x89PNG", b"\xff\xd8", b"BM", b"RIFF")


def decode_body(body, content_type, part):
    """An HTTP request body (image, .npy, .npz or JSON) as a checked feed for *part*."""
    source = "request body"
    ctype = content_type.split(";")[0].strip().lower()
    if not body:
        raise BundleError("empty request body; POST an image, a .npy/.npz file or JSON")
    try:
        if ctype.startswith("image/") or body.startswith(IMAGE_MAGIC):
            feed = image_feed(np.frombuffer(body, dtype=np.uint8), part, source)
        elif body.startswith(b"\x93NUMPY"):
            feed = single_input(np.load(io.BytesIO(body), allow_pickle=False), part, source)
        elif body.startswith(b"PK"):
            with np.load(io.BytesIO(body), allow_pickle=False) as f:
                feed = {k: f[k] for k in f.files}
        elif ctype == "application/json" or body.lstrip()[:1] in (b"{", b"["):
            data = json.loads(body.decode("utf-8"))
            if isinstance(data, dict) and isinstance(data.get("inputs"), dict):
                data = data["inputs"]
            feed = (dict((k, np.asarray(v)) for k, v in data.items()) if isinstance(data, dict)
                    else single_input(np.asarray(data), part, source))
        else:
            raise BundleError("unsupported body (Content-Type %r); send an image, a .npy/.npz "
                              "file or JSON {\"inputs\": {name: nested list}}" % ctype)
    except (ValueError, OSError) as exc:
        raise BundleError("cannot decode the request body: %s" % exc) from None
    return check_feed(feed, part, source)


def describe_outputs(names, outputs, labels, top):
    """Per output: shape, plus top classes for class scores or the values otherwise."""
    result = {}
    for name, value in zip(names, outputs):
        item = {"shape": list(value.shape)}
        if looks_like_scores(value[None]):
            order = np.argsort(-value[0])[:top]
            item["top"] = [{"index": int(i), "score": float(value[0][i]),
                            "label": labels[i] if labels and i < len(labels) else None}
                           for i in order]
        else:
            item["values"] = value.tolist()
        result[name] = item
    return result


def one_part(manifest, name):
    parts = select_parts(manifest, name)
    if len(parts) > 1:
        raise BundleError("this bundle holds %d models (%s); pick one with --part NAME"
                          % (len(parts), ", ".join(p["name"] for p in parts)))
    return parts[0]


def cmd_infer(bundle, manifest, args):
    part = one_part(manifest, args.part)
    session, _ = open_session(bundle, manifest, part, args)
    names = [o.name for o in session.get_outputs()]
    results, arrays = [], {}
    for path in args.files:
        if not os.path.isfile(path):
            raise BundleError("%s: no such file" % path)
        outputs = session.run(names, load_input_file(path, part))
        for name, value in zip(names, outputs):
            arrays["%s/%s" % (os.path.basename(path), name)] = value
        results.append({"file": path, "outputs": describe_outputs(
            names, outputs, part.get("labels"), args.top)})
    if args.out:
        np.savez(args.out, **arrays)
    return {"results": results, "providers": session.get_providers(), "passed": True}


MAX_BODY = 64 * 1024 * 1024


def cmd_serve(bundle, manifest, args):
    """A small HTTP endpoint (stdlib only). Bad requests get a 4xx; the server keeps running."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlparse

    problems = integrity_problems(bundle, manifest)
    if problems:
        raise BundleError("integrity check failed: %s; copy the bundle again" % problems[0])
    parts = select_parts(manifest, args.part)
    sessions = {}
    for part in parts:
        session, _ = open_session(bundle, manifest, part, args)
        names = [o.name for o in session.get_outputs()]
        # warm up before listening: the first run allocates and picks kernels (454 ms on a GPU)
        inputs, _ = load_golden(bundle, part)
        start = time.perf_counter()
        for _ in range(2):
            session.run(names, {k: np.asarray(v[0]) for k, v in inputs.items()})
        sys.stderr.write("edgepack: %s warmed up (%.0f ms for its first 2 runs)\n" % (
            part["name"], (time.perf_counter() - start) * 1000.0))
        sessions[part["name"]] = (part, session, names)
    default = parts[0]["name"] if len(parts) == 1 else None
    metadata = {"bundle": manifest.get("name"), "target": manifest.get("target", {}),
                "parts": [{"name": p["name"], "inputs": p["inputs"], "outputs": p["outputs"],
                           "preprocess": p.get("preprocess"), "labels": p.get("labels"),
                           "precision": p.get("precision", {}).get("description")}
                          for p in parts]}

    class Handler(BaseHTTPRequestHandler):
        server_version = "edgepack-run"

        def log_message(self, fmt, *values):
            if not args.quiet:
                sys.stderr.write("%s %s\n" % (self.address_string(), fmt % values))

        def reply(self, code, obj):
            body = json.dumps(obj).encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            path = urlparse(self.path).path
            if path == "/health":
                self.reply(200, {"status": "ok", "bundle": manifest.get("name"),
                                 "providers": dict((n, s.get_providers())
                                                   for n, (_, s, _) in sessions.items())})
            elif path == "/metadata":
                self.reply(200, metadata)
            else:
                self.reply(404, {"error": "no such path %s: use POST /infer, GET /health, "
                                          "GET /metadata" % path})

        def do_POST(self):
            try:
                url = urlparse(self.path)
                if url.path != "/infer" and not url.path.startswith("/infer/"):
                    return self.reply(404, {"error": "no such path %s: POST /infer" % url.path})
                name = url.path[len("/infer/"):] or parse_qs(url.query).get("part", [default])[0]
                if name is None:
                    return self.reply(400, {"error": "this bundle holds several models (%s); "
                                                     "POST /infer/<part>" % ", ".join(sessions)})
                if name not in sessions:
                    return self.reply(404, {"error": "no part named %s (parts: %s)"
                                                     % (name, ", ".join(sessions))})
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    return self.reply(413, {"error": "body of %d bytes is over the %d MB limit"
                                                     % (length, MAX_BODY // 2 ** 20)})
                body = self.rfile.read(length) if length > 0 else b""
                part, session, names = sessions[name]
                feed = decode_body(body, self.headers.get("Content-Type", ""), part)
                start = time.perf_counter()
                outputs = session.run(names, feed)
                ms = (time.perf_counter() - start) * 1000.0
                self.reply(200, {"part": name, "latency_ms": ms, "outputs": describe_outputs(
                    names, outputs, part.get("labels"), args.top)})
            except BundleError as exc:
                self.reply(400, {"error": str(exc)})
            except Exception as exc:  # the model failed on this input: report, keep serving
                self.reply(500, {"error": "%s: %s" % (type(exc).__name__, str(exc)[:500])})

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    host, port = server.server_address[:2]
    sys.stderr.write("edgepack: serving %s on http://%s:%d (POST /infer, GET /health, "
                     "GET /metadata)\n" % (manifest.get("name"), host, port))
    sys.stderr.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return None


# --------------------------------------------------------------------------- CLI


def figure(stats, floor, label="", why=""):
    """'cosine 0.99812 >= 0.9950, max abs 0.01: ok', or '... < ... (why), ...: FAILED'."""
    ok = stats["cosine_min"] >= floor
    text = "cosine %.5f %s %s%.4f%s, max abs %.4g" % (
        stats["cosine_min"], ">=" if ok else "<", label, floor, "" if ok else why, stats["max_abs"])
    if "top1_agreement" in stats:
        text += ", top-1 agreement %.1f%%" % (100 * stats["top1_agreement"])
    return text + (": ok" if ok else ": FAILED")


def reproduce_line(entry, rep):
    if not rep["checked"]:
        return "reproduction not checked: " + rep["reason"]
    precision = (entry.get("precision") or "").upper()
    kind = precision + " " if precision in ("INT8", "FP16", "FP32") else ""
    return "reproduces the host's %soutputs: %s" % (kind, figure(
        rep, rep["min_cosine"], why=" (a kernel computes differently on this device)"))


def print_human(command, report):
    if command == "check":
        for line in report.get("integrity", []):
            print("integrity: " + line)
        for part, entry in report.get("parts", {}).items():
            for name, s in entry["outputs"].items():
                print("%s/%s: %s" % (part, name, reproduce_line(entry, s["reproduce"])))
                if entry["reference"] == "fp32":
                    print("%s/%s: vs FP32 reference: %s" % (
                        part, name, figure(s, s["min_cosine"], "budget ")))
                elif not s["reproduce"]["checked"]:  # the host's outputs, with a looser floor
                    print("%s/%s: vs the host's outputs (no FP32 reference): %s" % (
                        part, name, figure(s, s["min_cosine"])))
        note = report.get("target_note")
        print("check %s%s" % ("passed" if report["passed"] else "FAILED",
                              " (not on the target: %s)" % note if note else ""))
    elif command == "bench":
        print("%s on %s (%s, %s cores), %d runs" % (
            report["bundle"], report["providers"][0], report["device"]["arch"],
            report["device"]["cores"], report["runs"]))
        for part, entry in report["parts"].items():
            lat = entry["latency_ms"]
            print("%s (%s, %s): p50 %.3f  p90 %.3f  p99 %.3f  mean %.3f  std %.3f ms, %.1f/s" % (
                part, entry["graph"], entry["precision"], lat["p50"], lat["p90"], lat["p99"],
                lat["mean"], lat["std"], entry["throughput_per_s"]))
            bound = entry.get("io_binding")
            if bound:
                lat = bound["latency_ms"]
                print("%s with I/O binding on %s: p50 %.3f  p90 %.3f  p99 %.3f ms, %.1f/s" % (
                    part, bound["device"], lat["p50"], lat["p90"], lat["p99"],
                    bound["throughput_per_s"]))
            if entry.get("gpu_memory_mb") is not None:
                print("%s: GPU memory %.0f MB" % (part, entry["gpu_memory_mb"]))
        gpu = report.get("gpu")
        if gpu:
            print("GPU %s (compute %s), driver %s, CUDA %s runtime / %s driver, cuDNN %s, "
                  "TensorRT %s" % tuple(gpu.get(k) or "?" for k in (
                      "name", "compute_capability", "driver", "cuda_runtime", "cuda_driver",
                      "cudnn", "tensorrt")))
        rss = report["peak_rss_mb"]
        print("peak RSS %s MB" % ("%.1f" % rss if rss is not None else "n/a"))
    else:
        for entry in report["results"]:
            for output, item in entry["outputs"].items():
                if "top" in item:
                    best = item["top"][0]
                    print("%s: %s = class %d%s (score %.4g)" % (
                        entry["file"], output, best["index"],
                        " '%s'" % best["label"] if best["label"] else "", best["score"]))
                else:
                    print("%s: %s shape %s" % (entry["file"], output, item["shape"]))


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="run.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", default=os.path.dirname(os.path.abspath(__file__)),
                        help="bundle directory (default: the one holding run.py)")
    sub = parser.add_subparsers(dest="command")
    for name, text in (("check", "verify file hashes and accuracy against the golden outputs"),
                       ("bench", "measure latency, throughput and peak memory"),
                       ("infer", "run the model on image / .npy / .npz files"),
                       ("serve", "serve the model over HTTP (POST /infer, GET /health, "
                                 "GET /metadata)")):
        p = sub.add_parser(name, help=text, description=text)
        if name != "serve":
            p.add_argument("--json", action="store_true", help="print one JSON object")
        p.add_argument("--require-provider", default=None,
                       help="fail (exit 1) unless this execution provider runs")
        p.add_argument("--part", default=None,
                       help="only this model of a multi-model bundle (default: all)")
        g = p.add_argument_group("session options (default: the target's, from the manifest)")
        g.add_argument("--threads", type=int, default=None, help="intra-op threads (0 = ORT)")
        g.add_argument("--inter-threads", type=int, default=None, help="inter-op threads")
        g.add_argument("--opt-level", choices=sorted(OPT_LEVELS), default=None,
                       help="graph optimisation level")
        g.add_argument("--execution-mode", choices=("sequential", "parallel"), default=None)
        if name == "bench":
            p.add_argument("--runs", type=int, default=100, help="timed runs (default 100)")
            p.add_argument("--warmup", type=int, default=10, help="untimed runs first")
            p.add_argument("--io-binding", action="store_true",
                           help="also time runs with inputs and outputs bound on the provider's "
                                "device (no host copies per call), as an application would")
        if name == "infer":
            p.add_argument("files", nargs="+", help="image, .npy or .npz files")
            p.add_argument("--out", default=None, help="also write all outputs to this .npz")
        if name in ("infer", "serve"):
            p.add_argument("--top", type=int, default=5, help="classes shown per output")
        if name == "serve":
            p.add_argument("--host", default="127.0.0.1",
                           help="address to listen on (0.0.0.0 for the network)")
            p.add_argument("--port", type=int, default=8080, help="0 picks a free port")
            p.add_argument("--quiet", action="store_true", help="do not log requests")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        raise SystemExit(EXIT_BAD_INPUT)
    if args.command == "bench" and (args.runs < 1 or args.warmup < 0):
        parser.error("--runs must be >= 1 and --warmup >= 0")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if not getattr(args, "json", False):
        return run_command(args)
    # --json: stdout carries the JSON object only. Whatever else prints there (onnxruntime's
    # fallback banner, a library's warning) goes to stderr.
    sys.stdout.flush()
    json_fd = os.dup(1)
    os.dup2(2, 1)
    try:
        return run_command(args, json_out=os.fdopen(os.dup(json_fd), "w"))
    finally:
        sys.stdout.flush()
        os.dup2(json_fd, 1)
        os.close(json_fd)


def run_command(args, json_out=None):
    commands = {"check": cmd_check, "bench": cmd_bench, "infer": cmd_infer, "serve": cmd_serve}
    try:
        manifest = load_manifest(args.bundle)
        report = commands[args.command](args.bundle, manifest, args)
    except BundleError as exc:
        sys.stderr.write("error: %s\n" % exc)
        return EXIT_BAD_INPUT
    except ProviderMissing as exc:
        sys.stderr.write("error: %s\n" % exc)
        return EXIT_FAILED
    except OSError as exc:  # e.g. serve's port in use
        sys.stderr.write("error: %s\n" % exc)
        return EXIT_BAD_INPUT
    if report is None:  # serve: stopped with Ctrl-C
        return EXIT_OK
    if json_out is not None:
        with json_out:
            json_out.write(json.dumps(report, indent=2, sort_keys=True) + "\n")
    else:
        print_human(args.command, report)
    return EXIT_OK if report.get("passed", True) else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
