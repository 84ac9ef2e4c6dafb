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
bundle, 3 an unexpected error (a bug: please report it), 130 interrupted.
"""

import argparse
import functools
import glob
import hashlib
import io
import json
import math
import os
import platform
import re
import struct
import subprocess
import sys
import time
import zipfile

try:  # checked in run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

MANIFEST = "manifest.json"
SUPPORTED_SCHEMA = 2
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
OPT_LEVELS = {"disabled": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
              "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
EXIT_INTERRUPTED = 130   # Ctrl-C, as shells and `edgepack build` report it
EXIT_BUG = 3             # an unexpected exception: a bug, as in `edgepack`


class BundleError(Exception):
    """The bundle or the command line is unusable (exit 2); in `serve`, a bad request (400)."""

    status = 400


class TooLarge(BundleError):
    """An input over a size limit (exit 2; in `serve`, 413)."""

    status = 413


# A 1 MB PNG can decode to 20000x20000 (1.2 GB): images are measured from their header first.
MAX_PIXELS = 50 * 1000 * 1000
MAX_UNPACKED = 256 * 1024 * 1024   # bytes an .npz may inflate to


# --------------------------------------------------------------------------- preprocessing
# The packager calls these same functions for calibration, so host and device preprocess alike.


def read_image(path, spec):
    """Decode an image file into an HxWxC uint8 array in the spec's colour order."""
    return decode_image(np.fromfile(str(path), dtype=np.uint8), spec, path)


def image_size(data):
    """(width, height) from a PNG, JPEG, BMP or WebP header in *data* (bytes-like), else None."""
    mv = memoryview(data).cast("B")
    head = mv[:32].tobytes()
    try:
        if head.startswith(b"\x89PNG\r\n\x1a\n") and head[12:16] == b"IHDR":
            return struct.unpack(">II", head[16:24])
        if head.startswith(b"BM"):
            if struct.unpack("<I", head[14:18])[0] == 12:   # OS/2 core header
                return struct.unpack("<HH", head[18:22])
            w, h = struct.unpack("<ii", head[18:26])
            return abs(w), abs(h)
        if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
            chunk = head[12:16]
            if chunk == b"VP8 ":
                w, h = struct.unpack("<HH", head[26:30])
                return w & 0x3FFF, h & 0x3FFF
            if chunk == b"VP8L":
                bits = struct.unpack("<I", head[21:25])[0]
                return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
            if chunk == b"VP8X":
                return (int.from_bytes(head[24:27], "little") + 1,
                        int.from_bytes(head[27:30], "little") + 1)
            return None
        if head.startswith(b"\xff\xd8"):
            i, segments = 2, 0
            while i + 9 <= len(mv) and segments < 1000:   # then OpenCV's own limit applies
                segments += 1
                if mv[i] != 0xFF:
                    return None
                marker = mv[i + 1]
                if marker == 0xFF:   # fill byte
                    i += 1
                    continue
                if marker == 0x01 or 0xD0 <= marker <= 0xD8:   # no length
                    i += 2
                    continue
                if marker in (0xD9, 0xDA):   # end of image, start of scan: no frame header
                    return None
                if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                    h, w = struct.unpack(">HH", mv[i + 5:i + 9].tobytes())
                    return w, h
                i += 2 + struct.unpack(">H", mv[i + 2:i + 4].tobytes())[0]
    except struct.error:   # a header cut short: the decoder will say it is unreadable
        return None
    return None


def decode_image(data, spec, path, max_pixels=MAX_PIXELS):
    """Decode encoded image bytes (a uint8 array) named *path* in messages; refuse an image
    over *max_pixels* before decoding it."""
    size = image_size(data)
    if size is not None and size[0] * size[1] > max_pixels:
        raise TooLarge("%s: the image is %dx%d (%.0f MP), over the %.0f MP limit; resize it, "
                       "or raise --max-megapixels" % (path, size[0], size[1],
                                                      size[0] * size[1] / 1e6, max_pixels / 1e6))
    try:
        import cv2
    except ImportError:
        raise BundleError("image input needs OpenCV: pip install opencv-python-headless "
                          "(or pass .npy/.npz tensors)") from None
    if hasattr(cv2, "setLogLevel"):
        cv2.setLogLevel(0)  # a broken file gets our one-line message, not decoder noise
    elif hasattr(getattr(cv2, "utils", None), "logging"):   # OpenCV 5 moved it
        cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
    try:
        image = cv2.imdecode(data, cv2.IMREAD_UNCHANGED) if data.size else None
    except cv2.error as exc:
        if "MAX_IMAGE_PIXELS" in str(exc):
            raise TooLarge("%s: the image is over the %.0f MP limit; resize it, or raise "
                           "--max-megapixels" % (path, max_pixels / 1e6)) from None
        image = None
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
    if not isinstance(manifest, dict) or manifest.get("schema_version") != SUPPORTED_SCHEMA:
        raise BundleError("%s: schema_version %r, this runner reads %d; rebuild the bundle"
                          % (path, manifest.get("schema_version") if isinstance(manifest, dict)
                             else None, SUPPORTED_SCHEMA))
    check_manifest(manifest)
    return manifest


class ManifestShape(object):
    """Checks that a manifest has the types this runner reads, naming the first that does not
    (a damaged or hand-edited manifest is a broken bundle, not a crash)."""

    def __init__(self):
        self.where = []

    def fail(self, what):
        raise BundleError("%s: %s is not %s; rebuild the bundle with edgepack"
                          % (MANIFEST, "".join(self.where) or "the top level", what))

    def at(self, key, value, kind, what, optional=False):
        self.where.append("[%d]" % key if isinstance(key, int) else
                          ("." if self.where else "") + str(key))
        if value is None and optional:
            pass
        elif kind is str and not (isinstance(value, str) and value):
            self.fail(what)
        elif kind is not str and not isinstance(value, kind):
            self.fail(what)
        return value

    def pop(self):
        self.where.pop()

    def table(self, parent, key, optional=True, nullable=False):
        """parent[key] as an object; absent is fine when *optional*, null when *nullable*."""
        absent = optional and key not in parent
        value = self.at(key, parent.get(key), dict, "an object", absent or nullable)
        return value or {}

    def items(self, parent, key, optional=True, nullable=False):
        absent = optional and key not in parent
        value = self.at(key, parent.get(key), list, "a list", absent or nullable)
        return value or []


def check_manifest(manifest):
    m = ManifestShape()
    for key in ("target", "session", "budget"):
        m.table(manifest, key)
        m.pop()
    for rel, digest in m.table(manifest, "files").items():
        m.at(rel, digest, str, "a sha256")
        m.pop()
    m.pop()
    for i, entry in enumerate(m.items(manifest, "providers")):
        m.at(i, entry, dict, "an object")
        m.at("name", entry.get("name"), str, "a provider name")
        m.pop()
        m.table(entry, "options")
        m.pop()
        m.pop()
    m.pop()
    for i, part in enumerate(m.items(manifest, "parts", optional=False)):
        m.at(i, part, dict, "an object")
        m.at("name", part.get("name"), str, "a name")
        m.pop()
        files = [m.table(part, "model", optional=False)]
        m.pop()
        for j, graph in enumerate(m.items(part, "graphs")):
            m.at(j, graph, dict, "an object")
            files.append(graph)
            for k, name in enumerate(m.items(graph, "providers", optional=False)):
                m.at(k, name, str, "a provider name")
                m.pop()
            m.pop()
            m.pop()
        m.pop()
        offline = m.table(part, "offline")
        if "file" in offline:
            files.append(offline)
            m.at("family", offline.get("family"), str, "an onnxruntime version family")
            m.pop()
        m.pop()
        for entry in files:
            for key in ("file", "sha256"):
                m.at(key, entry.get(key), str, "a file name" if key == "file" else "a sha256")
                m.pop()
        for key in ("inputs", "outputs"):
            for j, value in enumerate(m.items(part, key, optional=False)):
                m.at(j, value, dict, "an object")
                m.at("name", value.get("name"), str, "a tensor name")
                m.pop()
                if key == "inputs":
                    for k, dim in enumerate(m.items(value, "shape", optional=False)):
                        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
                            m.at(k, dim, int, "a size")
                            m.fail("a size")
                    m.pop()
                    m.at("dtype", value.get("dtype"), str, "a dtype")
                    m.pop()
                m.pop()
            m.pop()
        for key in ("preprocess", "precision", "accuracy"):
            m.table(part, key, nullable=key == "preprocess")
            m.pop()
        precision = part.get("precision") or {}
        m.at("precision", precision, dict, "an object")
        m.at("precision", precision.get("precision"), str, "a precision name", optional=True)
        m.pop()
        m.pop()
        for j, label in enumerate(m.items(part, "labels", nullable=True)):
            m.at(j, label, str, "a label")
            m.pop()
        m.pop()
        golden = m.table(part, "golden", optional=False)
        m.at("inputs", golden.get("inputs"), str, "a file name")
        m.pop()
        for key in ("outputs", "shipped", "reference", "shipped_provider"):
            m.at(key, golden.get(key), str, "a name", optional=True)
            m.pop()
        m.pop()
        m.pop()
    m.pop()


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


RUNNER_FILE = "run.py"
IMPORTABLE = (".py", ".pyc", ".so", ".pth")


def manifest_files(manifest):
    """The files a bundle cannot do without: the runner, each part's graphs and golden data."""
    needed = [RUNNER_FILE]
    for part in manifest.get("parts") or []:
        needed.append(part.get("model", {}).get("file"))
        needed += [g.get("file") for g in part.get("graphs", [])]
        if (part.get("offline") or {}).get("file"):
            needed.append(part["offline"]["file"])
        golden = part.get("golden", {})
        needed += [golden.get(k) for k in ("inputs", "outputs", "shipped") if golden.get(k)]
    return needed


def integrity_problems(bundle, manifest):
    """One line per problem: a file missing or changed, a file the manifest's table leaves out,
    a part whose model hash disagrees with the table, a floor that is not a cosine, a stray
    module Python would import before run.py's own. (The manifest itself is vouched for by its
    digest, which `edgepack verify` and `deploy` record and compare.)"""
    problems = []
    files = manifest.get("files") or {}
    for rel in files:
        if os.path.isabs(rel) or ".." in rel.replace("\\", "/").split("/"):
            problems.append("manifest: file table entry %r points outside the bundle" % rel)
    for rel in manifest_files(manifest):
        if not rel or rel not in files:
            problems.append("manifest: %s is not in its file table" % rel)
    for i, part in enumerate(manifest.get("parts") or []):
        entries = [("parts[%d].model" % i, part.get("model", {}))] + [
            ("parts[%d].graphs[%d]" % (i, j), g) for j, g in enumerate(part.get("graphs", []))]
        if (part.get("offline") or {}).get("file"):
            entries.append(("parts[%d].offline" % i, part["offline"]))
        for where, entry in entries:
            if entry.get("file") in files and entry.get("sha256") != files[entry["file"]]:
                problems.append("manifest: %s.sha256 differs from the file table" % where)
        golden = part.get("golden", {})
        floors = [("parts[%d].golden.%s" % (i, k), golden.get(k))
                  for k in ("min_cosine", "reproduce_min_cosine")
                  if k in golden or (k == "reproduce_min_cosine" and golden.get("shipped"))]
        floors += [("parts[%d].graphs[%d].min_cosine" % (i, j), g.get("min_cosine"))
                   for j, g in enumerate(part.get("graphs", []))]
        for where, value in floors:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not 0.0 < value <= 1.0:
                problems.append("manifest: %s = %r is not a cosine floor in (0, 1]"
                                % (where, value))
    for rel, expected in sorted(files.items()):
        path = os.path.join(bundle, rel)
        if not os.path.isfile(path):
            problems.append("%s: missing" % rel)
        elif sha256(path) != expected:
            problems.append("%s: sha256 mismatch (file changed or truncated in transfer)" % rel)
    listed = set(rel.split("/")[0] for rel in files)
    try:
        names = sorted(os.listdir(bundle))
    except OSError:
        names = []
    for name in names:
        path = os.path.join(bundle, name)
        if name in listed or name == MANIFEST:
            continue
        if name.endswith(IMPORTABLE) or os.path.isfile(os.path.join(path, "__init__.py")):
            problems.append("%s: not part of the bundle, and Python would import it before "
                            "run.py's own modules; remove it" % name)
    return problems


SESSION_OVERRIDES = (("intra_op_threads", "threads"), ("inter_op_threads", "inter_threads"),
                     ("graph_optimization_level", "opt_level"),
                     ("execution_mode", "execution_mode"))


def session_settings(manifest, args=None):
    """The target's session options, then this device's tuned ones (session.tuned.json, written
    by `bench --tune`), then the command line's overrides."""
    conf = dict(manifest.get("session", {}))
    conf.update((getattr(args, "tuned", None) or {}).get("session", {}))
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


@functools.lru_cache(maxsize=None)   # a directory scan; asked per session and per cache key
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


@functools.lru_cache(maxsize=None)   # may run nvidia-smi: once per process
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


def offline_choice(part, graph, provider):
    """(file to load, note): the part's offline-optimised graph on the CPU where this
    onnxruntime is the version family that made it; else the graph itself, and why."""
    import onnxruntime as ort

    offline = part.get("offline") or {}
    if provider != CPU or not offline.get("file") or graph.get("file") != part["model"]["file"]:
        return graph["file"], ""
    here = ".".join(ort.__version__.split(".")[:2])
    if here != offline["family"]:
        return graph["file"], ("%s was optimised offline by onnxruntime %s and this is %s, so "
                               "%s is loaded (same result, slower start)" % (
                                   offline["file"], offline.get("onnxruntime", offline["family"]),
                                   ort.__version__, graph["file"]))
    return offline["file"], ""


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
        load, offline_note = offline_choice(part, graph, name)
        start = time.perf_counter()
        error = None
        with CapturedOutput() as out:
            try:
                session = ort.InferenceSession(
                    os.path.join(bundle, load),
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
                load, load_reason(name, error, out.text)))
        not_running[name] = load_reason(name, error, out.text)
        session = None
        for folder in reversed(folders):   # nothing left behind by a provider that did not run
            while folder.startswith(bundle + os.sep) and os.path.isdir(folder) and \
                    not os.listdir(folder):
                os.rmdir(folder)
                folder = os.path.dirname(folder)
    info = {"load_ms": load_ms, "provider": name, "graph": graph["file"], "entry": graph,
            "loaded": load, "offline_note": offline_note,
            "precision": graph.get("precision"), "not_running": not_running,
            "provider_options": session.get_provider_options().get(name, {})}
    line = "edgepack: %s running on %s (%s%s%s)" % (
        part["name"], name, graph["file"],
        ", " + graph["precision"].upper() if graph.get("precision") else "",
        ", loaded from %s, optimised offline" % load if load != graph["file"] else "")
    if offline_note:
        line += "; " + offline_note
    missing = [p for p in requested if p in not_running]
    if missing:
        line += "; requested but not running here: " + "; ".join(
            "%s (%s)" % (p, not_running[p]) for p in missing)
    if not getattr(args, "quiet_open", False):
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
    """This process's peak resident memory in MB. Linux: VmHWM, which exec resets; getrusage's
    ru_maxrss keeps the parent's peak across fork + exec (883 MB for a 77 KB model run from
    `edgepack verify`, 72 MB from a shell)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0


# --------------------------------------------------------------------------- commands


def read_npz(bundle, rel):
    """The arrays of a golden .npz of the bundle (no pickles, whatever the manifest points at)."""
    try:
        with np.load(os.path.join(bundle, rel), allow_pickle=False) as f:
            if not hasattr(f, "files"):
                raise ValueError("not an .npz archive")
            return {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise BundleError("%s: not golden data (%s); rebuild the bundle"
                          % (rel, one_line(exc))) from None


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
        min_cosine = opened["entry"]["min_cosine"] if own else golden.get("min_cosine", 0.99)
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
                 "loaded": opened["loaded"],
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
    report["session"] = full_session(session_settings(manifest, args))
    report["session_from"] = session_origin(manifest, args)
    return report


def target_note(manifest, running, arch=None):
    """'' on the target's arch and first provider, else what differs: a pass elsewhere says
    nothing of the target's kernels. *arch*: the machine's (default: this one's; '' unknown)."""
    target = manifest.get("target", {})
    wanted = [p["name"] for p in manifest.get("providers", [])]
    arch = platform.machine() if arch is None else arch
    differs = []
    if target.get("arch") and arch and arch != target["arch"]:
        differs.append("this machine is %s, %s is %s" % (arch, target.get("name"),
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
        "loaded": opened["loaded"],
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
    ops = (part.get("operations") or {}).get("per_call")
    if isinstance(ops, (int, float)) and ops > 0:
        result["operations_per_call"] = ops
        result["achieved_gops"] = ops / (result["latency_ms"]["p50"] * 1e6)
    return result


def roofline_feeds(spec):
    """{"fp32": ..., "int8": ...}: the inputs of the manifest's roofline graphs (*spec*)."""
    n = int(spec.get("size", 512))
    rng = np.random.RandomState(0)
    return {"fp32": {"a": rng.rand(n, n).astype(np.float32),
                     "b": rng.rand(n, n).astype(np.float32)},
            "int8": {"a": rng.randint(0, 127, (n, n)).astype(
                np.uint8 if spec.get("int8_kind") == "u8s8" else np.int8),
                "b": rng.randint(-64, 64, (n, n)).astype(np.int8)}}


def roofline(bundle, manifest, args, threads):
    """GOP/s of an FP32 MatMul and of the bundle's MatMulInteger kind on this device with the
    same threads: the ceiling the bundle's GOP/s is a share of."""
    import onnxruntime as ort

    spec = manifest.get("roofline") or {}
    if not spec.get("fp32") or not spec.get("int8"):
        raise BundleError("this bundle has no roofline graphs (built by an older edgepack); "
                          "rebuild it to use --roofline")
    n = int(spec.get("size", 512))
    feeds = roofline_feeds(spec)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    result = {"threads": threads, "size": n, "int8_kind": spec.get("int8_kind")}
    for kind in ("fp32", "int8"):
        session = ort.InferenceSession(os.path.join(bundle, spec[kind]), sess_options=so,
                                       providers=[CPU])
        times = timed(lambda s=session, f=feeds[kind]: s.run(None, f), 3, 10)
        result["%s_gops" % kind] = 2.0 * n ** 3 / (float(np.percentile(times, 50)) * 1e6)
    return result


def require_intact(bundle, manifest):
    """bench, infer and serve run nothing from a bundle that fails its integrity check."""
    problems = integrity_problems(bundle, manifest)
    if problems:
        raise BundleError("integrity check failed: %s; copy the bundle again" % problems[0])


def session_origin(manifest, args):
    """Where the session options in use come from, in words."""
    if any(getattr(args, attr, None) is not None for _, attr in SESSION_OVERRIDES):
        return "the command line"
    if getattr(args, "tuned", None) and full_session(session_settings(manifest, args)) != \
            full_session(manifest.get("session", {})):
        return "%s, tuned on this device" % TUNED
    return "the manifest"


def cmd_bench(bundle, manifest, args):
    require_intact(bundle, manifest)
    tuning = None
    if getattr(args, "tune", False):
        tuning = tune(bundle, manifest, args)
        tuning["saved"] = None if args.no_save else save_tuned(bundle, manifest, tuning)
        args.tuned = {"session": tuning["chosen"]}
    parts = {}
    for part in select_parts(manifest, args.part):
        parts[part["name"]] = bench_part(bundle, manifest, part, args)
    first = next(iter(parts.values()))
    ceiling = None
    if getattr(args, "roofline", False):
        threads = int(session_settings(manifest, args).get("intra_op_threads", 0)) or \
            (os.cpu_count() or 1)
        ceiling = roofline(bundle, manifest, args, threads)
        for entry in parts.values():
            if "achieved_gops" in entry:
                kind = "int8" if entry["precision"] == "int8" else "fp32"
                entry["roofline_share"] = entry["achieved_gops"] / ceiling[kind + "_gops"]
    return {
        "tuning": tuning,
        "session_from": session_origin(manifest, args),
        "roofline": ceiling,
        "bundle": manifest.get("name"),
        "target": manifest.get("target", {}).get("name"),
        "runs": args.runs, "warmup": args.warmup,
        "session": full_session(session_settings(manifest, args)),
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
        if arr.dtype.kind == "c":   # a cast would drop the imaginary part without a word
            raise BundleError("%s: input %s is %s, the model wants %s; pass real values"
                              % (source, spec["name"], arr.dtype, spec["dtype"]))
        if arr.dtype.kind not in "biuf":
            raise BundleError("%s: input %s holds %s, not numbers; the model wants %s"
                              % (source, spec["name"], arr.dtype, spec["dtype"]))
        if list(arr.shape) != list(spec["shape"]):
            raise BundleError("%s: %s has shape %s, the model wants %s"
                              % (source, spec["name"], list(arr.shape), spec["shape"]))
        out[spec["name"]] = arr.astype(spec["dtype"], copy=False)
    return out


def image_feed(data, part, source, max_pixels=MAX_PIXELS):
    spec = part.get("preprocess")
    if not spec:
        raise BundleError("%s: %s has no image preprocessing; send .npy/.npz/JSON tensors"
                          % (source, part["name"]))
    image = decode_image(data, spec, source, max_pixels)
    return {part["inputs"][0]["name"]: preprocess(image, spec)}


def single_input(arr, part, source):
    if len(part["inputs"]) != 1:
        raise BundleError("%s: %s has %d inputs (%s); send an .npz or JSON keyed by input name"
                          % (source, part["name"], len(part["inputs"]),
                             ", ".join(i["name"] for i in part["inputs"])))
    return {part["inputs"][0]["name"]: arr}


def load_input_file(path, part, max_pixels=MAX_PIXELS):
    """Return {input name: tensor} for one .npy/.npz/image file."""
    lower = path.lower()
    try:
        if lower.endswith(".npz"):
            feed = read_npz_input(path, path)
        elif lower.endswith(".npy"):
            feed = single_input(np.load(path, allow_pickle=False), part, path)
        elif lower.endswith(IMAGE_SUFFIXES):
            feed = image_feed(np.fromfile(path, dtype=np.uint8), part, path, max_pixels)
        else:
            raise BundleError("%s: unsupported input (use an image, .npy or .npz)" % path)
    except MemoryError:
        raise TooLarge("%s: too large to load here; pass a smaller input" % path) from None
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:   # truncated, damaged
        raise BundleError("%s: cannot read it (%s); save it again with numpy.save/savez"
                          % (path, one_line(exc))) from None
    return check_feed(feed, part, path)


def one_line(exc):
    text = " ".join(str(exc).split())
    return (text[:300] + "...") if len(text) > 300 else text or type(exc).__name__


def read_npz_input(source, name):
    """{key: array} from an .npz (a path or a file object), refusing a zip bomb unread."""
    with np.load(source, allow_pickle=False) as f:
        unpacked = sum(info.file_size for info in f.zip.infolist())
        if unpacked > MAX_UNPACKED:
            raise TooLarge("%s: the .npz unpacks to %d MB, over the %d MB limit; send the "
                           "model's inputs only" % (name, unpacked // 2 ** 20,
                                                    MAX_UNPACKED // 2 ** 20))
        return {k: f[k] for k in f.files}


def npy_body(body, source):
    """An .npy held in *body*, its declared size checked against the bytes there first."""
    fp = io.BytesIO(body)
    version = np.lib.format.read_magic(fp)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
        np.lib.format.read_array_header_2_0
    shape, _, dtype = read_header(fp)
    needed = math.prod(shape) * dtype.itemsize
    if needed > len(body):
        raise BundleError("%s: the .npy header says shape %s %s (%d bytes), the body holds %d "
                          "bytes; send the whole file" % (source, list(shape), dtype, needed,
                                                          len(body)))
    fp.seek(0)
    return np.load(fp, allow_pickle=False)


IMAGE_MAGIC = (b"\x89PNG", b"\xff\xd8", b"BM", b"RIFF")


MAX_JSON_DEPTH = 64
NOT_JSON_SYNTAX = bytes(c for c in range(256) if c not in b'[]{}"')


def json_depth(text, limit=MAX_JSON_DEPTH):
    """How deep [ and { nest in JSON *text* (bytes), strings skipped, counted without recursion
    (json.loads recurses once per level) and stopping past *limit*."""
    # after \\ pairs go, a backslash left before a quote escapes it
    kept = text.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, NOT_JSON_SYNTAX)
    step = np.zeros(256, dtype=np.int64)
    step[list(b"[{")] = 1
    step[list(b"]}")] = -1
    deepest = depth = quotes = 0
    for start in range(0, len(kept), 1 << 20):
        chunk = np.frombuffer(kept[start:start + (1 << 20)], dtype=np.uint8)
        is_quote = chunk == ord('"')
        in_string = (quotes + np.cumsum(is_quote)) % 2 == 1
        levels = depth + np.cumsum(np.where(in_string, 0, step[chunk]))
        deepest, depth = max(deepest, int(levels.max())), int(levels[-1])
        quotes += int(is_quote.sum())
        if deepest > limit:
            break
    return deepest


def decode_body(body, content_type, part, max_pixels=MAX_PIXELS):
    """An HTTP request body (image, .npy, .npz or JSON) as a checked feed for *part*."""
    source = "request body"
    ctype = content_type.split(";")[0].strip().lower()
    if not body:
        raise BundleError("empty request body; POST an image, a .npy/.npz file or JSON")
    try:
        if ctype.startswith("image/") or body.startswith(IMAGE_MAGIC):
            feed = image_feed(np.frombuffer(body, dtype=np.uint8), part, source, max_pixels)
        elif body.startswith(b"\x93NUMPY"):
            feed = single_input(npy_body(body, source), part, source)
        elif body.startswith(b"PK"):
            feed = read_npz_input(io.BytesIO(body), source)
        elif ctype == "application/json" or body.lstrip()[:1] in (b"{", b"["):
            if json_depth(body) > MAX_JSON_DEPTH:
                raise BundleError("the JSON body nests deeper than %d levels; send "
                                  "{\"inputs\": {name: nested list}}" % MAX_JSON_DEPTH)
            data = json.loads(body.decode("utf-8"))
            if isinstance(data, dict) and isinstance(data.get("inputs"), dict):
                data = data["inputs"]
            feed = (dict((k, np.asarray(v)) for k, v in data.items()) if isinstance(data, dict)
                    else single_input(np.asarray(data), part, source))
        else:
            raise BundleError("unsupported body (Content-Type %r); send an image, a .npy/.npz "
                              "file or JSON {\"inputs\": {name: nested list}}" % ctype)
    except BundleError:
        raise
    except MemoryError:
        raise TooLarge("the request body unpacks to more than this device can hold; send "
                       "the model's inputs only") from None
    except Exception as exc:  # whatever the bytes were, they were the client's
        raise BundleError("cannot decode the request body: %s" % one_line(exc)) from None
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


def input_files(paths, part):
    """*paths* with each folder replaced by its supported files, in sorted order."""
    suffixes = (".npy", ".npz") + (IMAGE_SUFFIXES if part.get("preprocess") else ())
    files = []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(os.path.join(path, name) for name in os.listdir(path)
                           if name.lower().endswith(suffixes) and
                           os.path.isfile(os.path.join(path, name)))
            if not found:
                raise BundleError("%s: a folder with no %s files; pass a folder or files this "
                                  "model reads" % (path, "/".join(s[1:] for s in suffixes)))
            files.extend(found)
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise BundleError("%s: no such file or folder" % path)
    return files


def cmd_infer(bundle, manifest, args):
    require_intact(bundle, manifest)
    part = one_part(manifest, args.part)
    files = input_files(args.files, part)
    session, _ = open_session(bundle, manifest, part, args)
    names = [o.name for o in session.get_outputs()]
    results, arrays = [], {}
    max_pixels = args.max_megapixels * 1e6
    for path in files:
        feed = load_input_file(path, part, max_pixels)
        try:
            outputs = session.run(names, feed)
        except Exception as exc:  # e.g. a token id past the vocabulary: the input's fault
            raise BundleError("%s: onnxruntime refused it: %s" % (path, one_line(exc))) from None
        for name, value in zip(names, outputs):
            arrays["%s/%s" % (os.path.basename(path), name)] = value
        results.append({"file": path, "outputs": describe_outputs(
            names, outputs, part.get("labels"), args.top)})
    if args.out:
        np.savez(args.out, **arrays)
    return {"results": results, "providers": session.get_providers(), "passed": True}


MAX_BODY = 64 * 1024 * 1024
QUEUE_WAIT_S = 2.0   # a request over --max-concurrent waits this long, then gets a 503


def cmd_serve(bundle, manifest, args):
    """A small HTTP endpoint (stdlib only). Bad requests get a 4xx; the server keeps running."""
    import errno
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlsplit

    require_intact(bundle, manifest)
    parts = select_parts(manifest, args.part)
    sessions = {}
    for part in parts:
        session, _ = open_session(bundle, manifest, part, args)
        names = [o.name for o in session.get_outputs()]
        # warm up before listening: the first run allocates and picks kernels (454 ms on an
        # H100, measured for issue 12)
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

    slots = threading.BoundedSemaphore(args.max_concurrent)
    max_pixels = args.max_megapixels * 1e6

    class Handler(BaseHTTPRequestHandler):
        server_version = "edgepack-run"
        timeout = args.timeout   # on the socket: a stalled client lets go of its thread

        def log_message(self, fmt, *values):
            if not args.quiet:
                sys.stderr.write("%s %s\n" % (self.address_string(), fmt % values))

        def reply(self, code, obj, headers=()):
            body = json.dumps(obj).encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for key, value in headers:
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def parse_request(self):
            try:
                return BaseHTTPRequestHandler.parse_request(self)
            except socket.timeout:   # headers begun, never finished (http.server just hangs up)
                self.close_connection = True
                self.reply(408, {"error": "the headers did not arrive in time (--timeout %g s)"
                                          % args.timeout})
                return False

        def __getattr__(self, name):   # PUT, DELETE, BREW...: 405 where http.server says 501
            if name.startswith("do_"):
                return self.not_allowed
            raise AttributeError(name)

        def not_allowed(self):
            self.reply(405, {"error": "method %s not allowed: use POST /infer, GET /health, "
                                      "GET /metadata" % self.command[:20]},
                       [("Allow", "GET, POST")])

        def target(self):
            """(path, query) of the request, or None after a 400."""
            try:
                url = urlsplit(self.path)
            except ValueError:
                self.reply(400, {"error": "cannot parse the request target %r" % self.path[:100]})
                return None
            return url.path, url.query

        def do_GET(self):
            url = self.target()
            if url is None:
                return
            path = url[0]
            if path == "/health":
                self.reply(200, {"status": "ok", "bundle": manifest.get("name"),
                                 "providers": dict((n, s.get_providers())
                                                   for n, (_, s, _) in sessions.items())})
            elif path == "/metadata":
                self.reply(200, metadata)
            else:
                self.reply(404, {"error": "no such path %s: use POST /infer, GET /health, "
                                          "GET /metadata" % path[:200]})

        def do_POST(self):
            try:
                self.infer()
            except (ConnectionError, socket.timeout):   # the client left or stalled mid-reply
                self.close_connection = True

        def infer(self):
            url = self.target()
            if url is None:
                return
            path, query = url
            if path != "/infer" and not path.startswith("/infer/"):
                return self.reply(404, {"error": "no such path %s: POST /infer" % path[:200]})
            name = path[len("/infer/"):] or parse_qs(query).get("part", [default])[0]
            if name is None:
                return self.reply(400, {"error": "this bundle holds several models (%s); "
                                                 "POST /infer/<part>" % ", ".join(sessions)})
            if name not in sessions:
                return self.reply(404, {"error": "no part named %s (parts: %s)"
                                                 % (name[:200], ", ".join(sessions))})
            length = self.content_length()
            if length is None:
                return None
            # the bound is taken before the body is read: bodies in memory are bounded too
            if not slots.acquire(timeout=QUEUE_WAIT_S):
                return self.reply(503, {"error": "busy: %d requests are running (--max-concurrent);"
                                                 " retry shortly" % args.max_concurrent},
                                  [("Retry-After", "1")])
            try:
                code, answer = self.run_part(sessions[name], length)
            finally:
                slots.release()
            self.reply(code, answer)

        def content_length(self):
            """The declared body length, or None after a 4xx."""
            values = self.headers.get_all("Content-Length") or []
            if not values:
                if self.headers.get("Transfer-Encoding"):
                    self.reply(411, {"error": "send a Content-Length (chunked bodies are not "
                                              "read)"})
                    return None
                return 0
            value = values[0].strip()
            if len(set(v.strip() for v in values)) > 1 or not re.match(r"[0-9]+\Z", value):
                self.reply(400, {"error": "Content-Length %r is not one byte count; send the "
                                          "body's length in bytes" % ", ".join(values)[:60]})
                return None
            if len(value) > 12 or int(value) > MAX_BODY:
                self.reply(413, {"error": "body of %s bytes is over the %d MB limit"
                                          % (value[:20], MAX_BODY // 2 ** 20)})
                return None
            return int(value)

        def read_body(self, length):
            """The body; the client gets --timeout seconds of silence at most, and the whole
            body must come at 1 MB/s after the first --timeout seconds."""
            deadline = time.monotonic() + args.timeout + length / 1e6
            chunks, got = [], 0
            while got < length:
                if time.monotonic() > deadline:
                    raise socket.timeout("the body is arriving too slowly")
                chunk = self.rfile.read1(min(length - got, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
            return b"".join(chunks)

        def run_part(self, entry, length):
            """(status, answer) for one request to the part in *entry*."""
            part, session, names = entry
            try:
                body = self.read_body(length)
            except socket.timeout:
                self.close_connection = True
                return 408, {"error": "the body did not arrive in time (--timeout %g s); send "
                                      "it whole" % args.timeout}
            if len(body) < length:
                self.close_connection = True
                return 400, {"error": "the body ended after %d of the %d bytes its "
                                      "Content-Length declares" % (len(body), length)}
            try:
                feed = decode_body(body, self.headers.get("Content-Type", ""), part, max_pixels)
                start = time.perf_counter()
                outputs = session.run(names, feed)
                ms = (time.perf_counter() - start) * 1000.0
                return 200, {"part": part["name"], "latency_ms": ms, "outputs": describe_outputs(
                    names, outputs, part.get("labels"), args.top)}
            except BundleError as exc:
                return exc.status, {"error": str(exc)}
            except Exception as exc:
                # names, shapes and dtypes are checked: what onnxruntime still calls an invalid
                # argument (a token id past the vocabulary) is the input's fault, the rest ours
                code = 400 if type(exc).__name__ == "InvalidArgument" else 500
                return code, {"error": "%s: %s" % (type(exc).__name__, str(exc)[:500])}

    class Server(ThreadingHTTPServer):
        request_queue_size = 128   # a burst of clients waits in the kernel, not reset (was 5)
        daemon_threads = True

        def handle_error(self, request, client_address):
            exc = sys.exc_info()[1]
            if not isinstance(exc, (ConnectionError, socket.timeout)):   # a client that left
                sys.stderr.write("edgepack: a request from %s failed: %s: %s\n"
                                 % (client_address[0], type(exc).__name__, one_line(exc)))

    try:
        server = Server((args.host, args.port), Handler)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise BundleError("%s:%d is in use (%s); pass another --port, or --port 0 for a free "
                              "one" % (args.host, args.port, exc.strerror)) from None
        raise BundleError("cannot listen on %s:%d (%s); check --host and --port"
                          % (args.host, args.port, exc.strerror or one_line(exc))) from None
    host, port = server.server_address[:2]
    sys.stderr.write("edgepack: serving %s on http://%s:%d (POST /infer, GET /health, "
                     "GET /metadata)\n" % (manifest.get("name"), host, port))
    sys.stderr.flush()
    try:
        server.serve_forever()
    finally:   # Ctrl-C: stop listening, then exit 130 (run_command)
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


def print_tuning(tuning):
    print("tuning: %d settings tried on %d cores, %d runs each (p50, summed over parts):" % (
        len(tuning["tried"]), tuning["cores"], tuning["runs"]))
    print("  %-7s %-8s %-10s %-8s %9s  %s" % ("threads", "inter-op", "mode", "opt", "p50 ms",
                                               "stage"))
    fastest = min(t["p50_ms"] for t in tuning["tried"])
    for t in tuning["tried"]:
        conf = t["session"]
        print("  %-7s %-8s %-10s %-8s %9.3f  %s%s" % (
            conf["intra_op_threads"] or "auto", conf["inter_op_threads"] or "auto",
            conf["execution_mode"], conf["graph_optimization_level"], t["p50_ms"], t["stage"],
            "  <- fastest" if t["p50_ms"] == fastest else ""))
    print("tuning %s %s: %s%s" % (
        "kept the current settings," if tuning["chosen"] == tuning["current"] else "chose",
        describe_session(tuning["chosen"]), tuning["reason"],
        "; saved in %s" % tuning["saved"] if tuning.get("saved") else
        "; nothing saved" if tuning.get("saved") is None else ""))


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
        tuning = report.get("tuning")
        if tuning:
            print_tuning(tuning)
        print("%s on %s (%s, %s cores), %d runs" % (
            report["bundle"], report["providers"][0], report["device"]["arch"],
            report["device"]["cores"], report["runs"]))
        print("session: %s (from %s)" % (describe_session(report["session"]),
                                         report["session_from"]))
        for part, entry in report["parts"].items():
            lat = entry["latency_ms"]
            print("%s (%s, %s): p50 %.3f  p90 %.3f  p99 %.3f  mean %.3f  std %.3f ms, %.1f/s" % (
                part, entry["graph"], entry["precision"], lat["p50"], lat["p90"], lat["p99"],
                lat["mean"], lat["std"], entry["throughput_per_s"]))
            print("%s: session load %.1f ms%s" % (
                part, entry["session_load_ms"], " (%s, optimised offline)" % entry["loaded"]
                if entry.get("loaded", entry["graph"]) != entry["graph"] else ""))
            if entry.get("achieved_gops"):
                share = entry.get("roofline_share")
                print("%s: %.3g GOP per call, %.1f GOP/s%s" % (
                    part, entry["operations_per_call"] / 1e9, entry["achieved_gops"],
                    " (%.0f%% of this device's %s MatMul rate)" % (
                        100 * share, (report["roofline"]["int8_kind"] if entry["precision"] ==
                                      "int8" else "FP32")) if share is not None else ""))
            bound = entry.get("io_binding")
            if bound:
                lat = bound["latency_ms"]
                print("%s with I/O binding on %s: p50 %.3f  p90 %.3f  p99 %.3f ms, %.1f/s" % (
                    part, bound["device"], lat["p50"], lat["p90"], lat["p99"],
                    bound["throughput_per_s"]))
            if entry.get("gpu_memory_mb") is not None:
                print("%s: GPU memory %.0f MB" % (part, entry["gpu_memory_mb"]))
        ceiling = report.get("roofline")
        if ceiling:
            print("roofline (%dx%d MatMul, %d threads, CPU): FP32 %.1f GOP/s, %s "
                  "MatMulInteger %.1f GOP/s" % (ceiling["size"], ceiling["size"],
                                                ceiling["threads"], ceiling["fp32_gops"],
                                                ceiling["int8_kind"], ceiling["int8_gops"]))
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


# --------------------------------------------------------------------------- session tuning

TUNED = "session.tuned.json"
TUNE_MARGIN = 0.03   # a setting replaces the current one only when this much faster
TUNE_LEVELS = ("basic", "extended", "all")
TUNE_ROUNDS = 3      # the winner and the current settings, timed alternately
MODES = ("sequential", "parallel")


def manifest_digest(bundle):
    return "sha256:" + sha256(os.path.join(bundle, MANIFEST))


def tuned_problem(data):
    """What is wrong with a session.tuned.json's content, or ''."""
    if not isinstance(data, dict):
        return "not a JSON object"
    for key, kind in (("manifest", str), ("onnxruntime", str), ("cores", int),
                      ("session", dict)):
        if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
            return "%r is missing or not a %s" % (key, kind.__name__)
    for key, value in data["session"].items():
        if key in ("intra_op_threads", "inter_op_threads"):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 4096:
                return "session.%s must be a thread count, got %r" % (key, value)
        elif key == "graph_optimization_level":
            if value not in OPT_LEVELS:
                return "session.%s must be one of %s" % (key, ", ".join(sorted(OPT_LEVELS)))
        elif key == "execution_mode":
            if value not in MODES:
                return "session.%s must be sequential or parallel" % key
        else:
            return "unknown session option %r" % key
    return ""


def load_tuned(bundle, manifest):
    """This device's tuned session options ({"session": ...}), or None: there are none, or they
    were measured for another version of the bundle, another onnxruntime or another core count
    (a note says so, and the manifest's options apply)."""
    import onnxruntime as ort

    path = os.path.join(bundle, TUNED)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            data = json.load(f)
        problem = tuned_problem(data)
    except (OSError, ValueError) as exc:
        problem = one_line(exc)
    if problem:
        raise BundleError("%s: %s; delete it, or run `run.py bench --tune` again to rewrite it"
                          % (TUNED, problem))
    stale = []
    if data["manifest"] != manifest_digest(bundle):
        stale.append("another version of this bundle")
    if data["onnxruntime"] != ort.__version__:
        stale.append("onnxruntime %s (this is %s)" % (data["onnxruntime"], ort.__version__))
    if data["cores"] != os.cpu_count():
        stale.append("%d cores (this device has %s)" % (data["cores"], os.cpu_count()))
    if stale:
        sys.stderr.write("edgepack: %s was tuned for %s; ignored, the manifest's session options "
                         "apply (run `run.py bench --tune` again)\n" % (TUNED, " and ".join(stale)))
        return None
    return data


def full_session(conf):
    """*conf* with every option spelled out (the defaults where it says nothing)."""
    return {"intra_op_threads": int(conf.get("intra_op_threads", 0)),
            "inter_op_threads": int(conf.get("inter_op_threads", 0)),
            "graph_optimization_level": conf.get("graph_optimization_level", "all"),
            "execution_mode": conf.get("execution_mode", "sequential")}


def describe_session(conf):
    return "threads %s, inter-op %s, %s, opt %s" % (
        conf.get("intra_op_threads", 0) or "auto", conf.get("inter_op_threads", 0) or "auto",
        conf.get("execution_mode", "sequential"), conf.get("graph_optimization_level", "all"))


def tune_threads(cores):
    counts, n = set([cores]), 1
    while n < cores:
        counts.add(n)
        n *= 2
    return sorted(counts)


class TuneProgress(object):
    """'tune: 3/9 ... about 0:12 left' in place on a terminal; nothing elsewhere."""

    def __init__(self, total):
        self.total, self.done, self.start = total, 0, time.perf_counter()
        self.live = hasattr(sys.stderr, "isatty") and sys.stderr.isatty()

    def step(self, what):
        self.done += 1
        if not self.live:
            return
        elapsed = time.perf_counter() - self.start
        left = elapsed / self.done * max(self.total - self.done, 0)
        sys.stderr.write("\r\x1b[Ktune: %d/%d %s · about %d:%02d left" % (
            self.done, self.total, what, left // 60, left % 60))
        sys.stderr.flush()

    def close(self):
        if self.live:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def tune(bundle, manifest, args):
    """Time the bundle under thread counts, then optimisation levels, then the parallel
    execution mode, each step keeping the fastest so far; re-time the winner against the
    current settings alternately; keep it only when it is TUNE_MARGIN faster and still passes
    check. Returns the table of what was tried and what was chosen."""
    parts = select_parts(manifest, args.part)
    feeds = []
    for part in parts:
        inputs, _ = load_golden(bundle, part)
        feeds.append((part, {k: np.asarray(v[0]) for k, v in inputs.items()}))
    current = full_session(session_settings(manifest, args))
    cores = os.cpu_count() or 1
    threads = tune_threads(cores)
    progress = TuneProgress(len(threads) + len(TUNE_LEVELS) + (cores > 1) + 2 * TUNE_ROUNDS)

    def trial(conf):
        trial_args = argparse.Namespace(**vars(args))
        trial_args.tuned, trial_args.quiet_open = {"session": conf}, True
        total = 0.0
        for part, feed in feeds:
            session, _ = open_session(bundle, manifest, part, trial_args)
            names = [o.name for o in session.get_outputs()]
            total += float(np.percentile(timed(
                lambda s=session, n=names, f=feed: s.run(n, f), args.warmup, args.runs), 50))
        return total

    tried, seen = [], {}

    def consider(stage, conf):
        key = json.dumps(conf, sort_keys=True)
        if key in seen:
            return
        seen[key] = p50 = trial(conf)
        tried.append({"stage": stage, "session": conf, "p50_ms": p50})
        progress.step("%s: p50 %.3f ms" % (describe_session(conf), p50))

    def best():
        return min(tried, key=lambda t: t["p50_ms"])["session"]

    base = dict(current, inter_op_threads=0, execution_mode="sequential")
    try:
        for n in threads:
            consider("threads", dict(base, intra_op_threads=n))
        for level in TUNE_LEVELS:
            consider("optimisation level", dict(best(), graph_optimization_level=level))
        if cores > 1:
            consider("execution mode", dict(best(), execution_mode="parallel",
                                            inter_op_threads=2))
        winner, rounds = best(), {"current": [], "winner": []}
        if winner != current:
            for _ in range(TUNE_ROUNDS):
                for name, conf in (("current", current), ("winner", winner)):
                    rounds[name].append(trial(conf))
                    progress.step("re-timing %s settings" % name)
    finally:
        progress.close()
    result = {"runs": args.runs, "warmup": args.warmup, "cores": cores, "tried": tried,
              "current": current, "margin": TUNE_MARGIN}
    if not rounds["winner"]:
        result.update(chosen=current, chosen_p50_ms=seen[json.dumps(current, sort_keys=True)],
                      speedup=1.0, reason="the current settings are the fastest tried")
        return result
    now, new = float(np.median(rounds["current"])), float(np.median(rounds["winner"]))
    result.update(current_p50_ms=now, winner=winner, winner_p50_ms=new, speedup=now / new)
    if now < new * (1 + TUNE_MARGIN):
        result.update(chosen=current, chosen_p50_ms=now,
                      reason="the fastest tried (%s) is not %d%% faster than these when "
                             "re-timed (x%.3f)" % (describe_session(winner), 100 * TUNE_MARGIN,
                                                   now / new))
        return result
    check_args = argparse.Namespace(**vars(args))
    check_args.tuned, check_args.quiet_open = {"session": winner}, True
    checked = cmd_check(bundle, manifest, check_args)
    if not checked["passed"]:
        result.update(chosen=current, chosen_p50_ms=now,
                      reason="the fastest tried (%s) fails check: its outputs differ beyond "
                             "the bundle's floors" % describe_session(winner))
        return result
    result.update(chosen=winner, chosen_p50_ms=new,
                  reason="x%.2f faster than the current settings, check passed" % (now / new))
    return result


def save_tuned(bundle, manifest, tuning):
    """Write (or, when the manifest's own settings won, remove) session.tuned.json, atomically."""
    import onnxruntime as ort

    path = os.path.join(bundle, TUNED)
    if tuning["chosen"] == full_session(manifest.get("session", {})):
        if os.path.exists(path):
            os.remove(path)
        return None
    data = {"manifest": manifest_digest(bundle), "onnxruntime": ort.__version__,
            "cores": os.cpu_count(), "session": tuning["chosen"],
            "tuned": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device": device_info(),
            "tried": tuning["tried"], "speedup": tuning.get("speedup", 1.0)}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    return TUNED


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
            p.add_argument("--roofline", action="store_true",
                           help="also time an FP32 MatMul and the bundle's MatMulInteger with "
                                "the same threads, and report the model's share of that rate")
            p.add_argument("--tune", action="store_true",
                           help="first try thread counts, optimisation levels and the parallel "
                                "execution mode on this device, keep the fastest (when %d%% "
                                "faster and check still passes) in %s, then bench with it; "
                                "--runs applies to each setting tried" % (100 * TUNE_MARGIN,
                                                                          TUNED))
            p.add_argument("--no-save", action="store_true",
                           help="with --tune: report only, write nothing")
            p.add_argument("--io-binding", action="store_true",
                           help="also time runs with inputs and outputs bound on the provider's "
                                "device (no host copies per call), as an application would")
        if name == "infer":
            p.add_argument("files", nargs="+", help="image, .npy or .npz files")
            p.add_argument("--out", default=None, help="also write all outputs to this .npz")
        if name in ("infer", "serve"):
            p.add_argument("--top", type=int, default=5, help="classes shown per output")
            p.add_argument("--max-megapixels", type=float, default=MAX_PIXELS / 1e6,
                           help="refuse images larger than this, measured from their header "
                                "before decoding (default %(default)g)")
        if name == "serve":
            p.add_argument("--host", default="127.0.0.1",
                           help="address to listen on (0.0.0.0 for the network)")
            p.add_argument("--port", type=int, default=8080, help="0 picks a free port")
            p.add_argument("--quiet", action="store_true", help="do not log requests")
            p.add_argument("--timeout", type=float, default=30.0,
                           help="seconds a client may stay silent while sending its request "
                                "(then 408 and the connection closes; default 30)")
            p.add_argument("--max-concurrent", type=int, default=max(4, 2 * (os.cpu_count() or 1)),
                           help="requests read and run at once; one more waits %g s, then gets "
                                "503 with Retry-After (default 2 x cores, at least 4: "
                                "%%(default)d here)" % QUEUE_WAIT_S)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        raise SystemExit(EXIT_BAD_INPUT)
    if args.command == "bench" and (args.runs < 1 or args.warmup < 0):
        parser.error("--runs must be >= 1 and --warmup >= 0")
    if args.command == "bench" and args.no_save and not args.tune:
        parser.error("--no-save goes with --tune")
    if args.command == "bench" and args.tune and any(
            getattr(args, attr) is not None for _, attr in SESSION_OVERRIDES):
        parser.error("--tune tries the session options itself; drop --threads, "
                     "--inter-threads, --opt-level and --execution-mode")
    if args.command in ("infer", "serve") and not args.max_megapixels > 0:
        parser.error("--max-megapixels must be > 0")
    if args.command == "serve" and (not args.timeout > 0 or args.max_concurrent < 1):
        parser.error("--timeout must be > 0 and --max-concurrent >= 1")
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


def check_dependencies(manifest):
    """numpy and onnxruntime importable here, else one line naming the manifest's install line
    (the import error alone names neither this Python nor the fix)."""
    install = (manifest.get("target") or {}).get("install") or \
        "python3 -m pip install -r requirements.txt"
    missing = "numpy" if np is None else None
    if missing is None:
        try:
            import onnxruntime  # noqa: F401
        except ImportError as exc:
            if exc.name != "onnxruntime":   # installed, but broken (a library it loads)
                raise BundleError("onnxruntime is installed for %s but does not import (%s); "
                                  "reinstall it on the device with: %s"
                                  % (sys.executable, one_line(exc), install)) from None
            missing = "onnxruntime"
    if missing:
        raise BundleError("%s is not installed for %s; install it on the device with: %s"
                          % (missing, sys.executable, install))


def run_command(args, json_out=None):
    commands = {"check": cmd_check, "bench": cmd_bench, "infer": cmd_infer, "serve": cmd_serve}
    try:
        manifest = load_manifest(args.bundle)
        check_dependencies(manifest)
        args.tuned = load_tuned(args.bundle, manifest)
        if getattr(args, "max_megapixels", None):
            # for formats whose header decode_image does not read (TIFF, ...): OpenCV's own
            # limit, which it reads once, when it first decodes
            os.environ["OPENCV_IO_MAX_IMAGE_PIXELS"] = str(int(args.max_megapixels * 1e6))
        report = commands[args.command](args.bundle, manifest, args)
    except KeyboardInterrupt:   # Ctrl-C; serve has closed its socket by now
        sys.stderr.write("interrupted%s\n" % (": the server is closed"
                                              if args.command == "serve" else ""))
        return EXIT_INTERRUPTED
    except BundleError as exc:
        sys.stderr.write("error: %s\n" % exc)
        return EXIT_BAD_INPUT
    except ProviderMissing as exc:
        sys.stderr.write("error: %s\n" % exc)
        return EXIT_FAILED
    except OSError as exc:  # e.g. serve's port in use
        sys.stderr.write("error: %s\n" % exc)
        return EXIT_BAD_INPUT
    except Exception as exc:  # a bug in run.py (or a bundle it does not know how to refuse)
        if os.environ.get("EDGEPACK_DEBUG"):
            raise
        sys.stderr.write("error: unexpected %s: %s; this is a bug in run.py: please report it "
                         "with the command line (EDGEPACK_DEBUG=1 shows the traceback)\n"
                         % (type(exc).__name__, one_line(exc)))
        return EXIT_BUG
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
