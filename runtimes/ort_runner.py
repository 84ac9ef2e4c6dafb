#!/usr/bin/env python3
"""Run an edgepack bundle with ONNX Runtime: check, bench, infer.

This file is copied into every bundle as ``run.py``. It is standalone on purpose: Python 3.8+,
the standard library, numpy and onnxruntime only (OpenCV only for image inputs). It reads
``manifest.json`` beside it and never installs anything.

    python3 run.py check                 # integrity + accuracy against the golden FP32 outputs
    python3 run.py bench --runs 200 --json
    python3 run.py infer photo.jpg --json
    python3 run.py bench --part decoder  # bundles with several models: one of them

Exit codes: 0 passed, 1 a check failed (integrity, accuracy, provider), 2 bad input or a broken
bundle.
"""

import argparse
import hashlib
import json
import os
import platform
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
    try:
        import cv2
    except ImportError:
        raise BundleError("image input needs OpenCV: pip install opencv-python-headless "
                          "(or pass .npy/.npz tensors)") from None
    if hasattr(cv2, "setLogLevel"):
        cv2.setLogLevel(0)  # a broken file gets our one-line message, not decoder noise
    data = np.fromfile(str(path), dtype=np.uint8)
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


def session_options(ort, manifest, threads=None):
    conf = manifest.get("session", {})
    so = ort.SessionOptions()
    intra = conf.get("intra_op_threads", 0) if threads is None else threads
    so.intra_op_num_threads = int(intra)
    so.inter_op_num_threads = int(conf.get("inter_op_threads", 0))
    level = OPT_LEVELS.get(conf.get("graph_optimization_level", "all"), "ORT_ENABLE_ALL")
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    if conf.get("execution_mode") == "parallel":
        so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    return so


def provider_list(ort, bundle, manifest):
    """Return (providers, options) available here, in manifest order, CPU always last."""
    available = ort.get_available_providers()
    names, options = [], []
    for entry in manifest.get("providers", [{"name": "CPUExecutionProvider"}]):
        name = entry["name"]
        if name not in available or name in names:
            continue
        opts = dict(entry.get("options", {}))
        for key, value in list(opts.items()):
            if isinstance(value, str) and value.startswith("{bundle}"):
                opts[key] = os.path.join(bundle, value[len("{bundle}/"):])
                if key.endswith("_path"):
                    os.makedirs(opts[key], exist_ok=True)
        names.append(name)
        options.append(opts)
    if "CPUExecutionProvider" not in names:
        names.append("CPUExecutionProvider")
        options.append({})
    return names, options


def open_session(bundle, manifest, part, threads=None, require=None):
    import onnxruntime as ort

    model = os.path.join(bundle, part["model"]["file"])
    requested = [p["name"] for p in manifest.get("providers", [])]
    names, options = provider_list(ort, bundle, manifest)
    start = time.perf_counter()
    session = ort.InferenceSession(model, sess_options=session_options(ort, manifest, threads),
                                   providers=names, provider_options=options)
    load_ms = (time.perf_counter() - start) * 1000.0
    running = session.get_providers()
    missing = [p for p in requested if p not in running]
    line = "edgepack: %s running on %s" % (part["name"], running[0])
    if missing:
        line += " (requested but not running here: %s)" % ", ".join(missing)
    sys.stderr.write(line + "\n")
    if require and require not in running:
        raise ProviderMissing("required provider %s is not running (running: %s)"
                              % (require, ", ".join(running)))
    return session, load_ms


class ProviderMissing(Exception):
    """--require-provider named a provider that did not start (exit 1)."""


# --------------------------------------------------------------------------- metrics


def compare(got, ref):
    """Per-output agreement between two (samples, ...) arrays."""
    a = got.reshape(got.shape[0], -1).astype(np.float64)
    b = ref.reshape(ref.shape[0], -1).astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cos = np.where(norms > 0, (a * b).sum(axis=1) / np.maximum(norms, 1e-30),
                   np.where(np.abs(a - b).max(axis=1) == 0, 1.0, 0.0))
    result = {"cosine_min": float(cos.min()), "cosine_mean": float(cos.mean()),
              "max_abs": float(np.abs(a - b).max()) if a.size else 0.0}
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
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") as f:
            info["governor"] = f.read().strip()
    except OSError:
        pass
    return info


def peak_rss_mb():
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0


# --------------------------------------------------------------------------- commands


def load_golden(bundle, part):
    golden = part.get("golden")
    if not golden:
        raise BundleError("the manifest has no golden data; rebuild the bundle with edgepack")
    with np.load(os.path.join(bundle, golden["inputs"])) as f:
        inputs = {k: f[k] for k in f.files}
    with np.load(os.path.join(bundle, golden["outputs"])) as f:
        outputs = {k: f[k] for k in f.files}
    return inputs, outputs


def run_samples(session, inputs):
    """Run each sample (axis 0 of every array) through the session; stack outputs per name."""
    names = [o.name for o in session.get_outputs()]
    count = len(next(iter(inputs.values())))
    rows = [session.run(names, {k: v[i] for k, v in inputs.items()}) for i in range(count)]
    return {name: np.stack([row[j] for row in rows]) for j, name in enumerate(names)}


def cmd_check(bundle, manifest, args):
    report = {"bundle": manifest.get("name"), "integrity": integrity_problems(bundle, manifest),
              "parts": {}}
    if report["integrity"]:
        report["passed"] = False
        return report
    passed = True
    for part in select_parts(manifest, args.part):
        session, _ = open_session(bundle, manifest, part, args.threads, args.require_provider)
        report.setdefault("providers", session.get_providers())
        inputs, reference = load_golden(bundle, part)
        got = run_samples(session, inputs)
        min_cosine = part["golden"].get("min_cosine", 0.99)
        entry = {"outputs": {}, "min_cosine": min_cosine,
                 "samples": len(next(iter(inputs.values()))), "providers": session.get_providers()}
        for name, ref in reference.items():
            stats = compare(got[name], ref)
            stats["passed"] = stats["cosine_min"] >= min_cosine
            passed = passed and stats["passed"]
            entry["outputs"][name] = stats
        entry["passed"] = all(o["passed"] for o in entry["outputs"].values())
        report["parts"][part["name"]] = entry
    report["passed"] = passed
    return report


def bench_part(bundle, manifest, part, args):
    session, load_ms = open_session(bundle, manifest, part, args.threads, args.require_provider)
    inputs, _ = load_golden(bundle, part)
    feed = {k: v[0] for k, v in inputs.items()}
    names = [o.name for o in session.get_outputs()]
    for _ in range(args.warmup):
        session.run(names, feed)
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        session.run(names, feed)
        times.append((time.perf_counter() - start) * 1000.0)
    t = np.asarray(times)
    batch = max(int(next(iter(feed.values())).shape[0]) if feed else 1, 1)
    return {
        "precision": part.get("precision", {}).get("precision"), "batch": batch,
        "latency_ms": {"p50": float(np.percentile(t, 50)), "p90": float(np.percentile(t, 90)),
                       "p99": float(np.percentile(t, 99)), "mean": float(t.mean()),
                       "std": float(t.std()), "min": float(t.min()), "max": float(t.max())},
        "throughput_per_s": float(1000.0 * batch / t.mean()),
        "session_load_ms": load_ms,
        "providers": session.get_providers(),
    }


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
        "threads": session_options_threads(manifest, args.threads),
        "parts": parts,
        "providers": first["providers"],
        "peak_rss_mb": peak_rss_mb(),
        "device": device_info(),
        "onnxruntime": __import__("onnxruntime").__version__,
    }


def session_options_threads(manifest, threads):
    return int(manifest.get("session", {}).get("intra_op_threads", 0) if threads is None
               else threads)


def load_input_file(path, part):
    """Return {input name: tensor} for one .npy/.npz/image file."""
    inputs = part["inputs"]
    lower = path.lower()
    if lower.endswith(".npz"):
        with np.load(path) as f:
            missing = [i["name"] for i in inputs if i["name"] not in f.files]
            if missing:
                raise BundleError("%s: no array named %s (has: %s)"
                                  % (path, ", ".join(missing), ", ".join(f.files)))
            feed = {i["name"]: f[i["name"]] for i in inputs}
    elif lower.endswith(".npy"):
        if len(inputs) != 1:
            raise BundleError("%s: the model has %d inputs; pass an .npz keyed by input name"
                              % (path, len(inputs)))
        feed = {inputs[0]["name"]: np.load(path)}
    elif lower.endswith(IMAGE_SUFFIXES):
        spec = part.get("preprocess")
        if not spec:
            raise BundleError("%s: %s has no image preprocessing; pass .npy/.npz"
                              % (path, part["name"]))
        feed = {inputs[0]["name"]: preprocess(read_image(path, spec), spec)}
    else:
        raise BundleError("%s: unsupported input (use an image, .npy or .npz)" % path)
    for spec in inputs:
        arr = feed[spec["name"]]
        if list(arr.shape) != list(spec["shape"]):
            raise BundleError("%s: %s has shape %s, the model wants %s"
                              % (path, spec["name"], list(arr.shape), spec["shape"]))
        feed[spec["name"]] = arr.astype(spec["dtype"], copy=False)
    return feed


def cmd_infer(bundle, manifest, args):
    parts = select_parts(manifest, args.part)
    if len(parts) > 1:
        raise BundleError("this bundle holds %d models (%s); pick one with --part NAME"
                          % (len(parts), ", ".join(p["name"] for p in parts)))
    part = parts[0]
    session, _ = open_session(bundle, manifest, part, args.threads, args.require_provider)
    names = [o.name for o in session.get_outputs()]
    labels = part.get("labels")
    results, arrays = [], {}
    for path in args.files:
        if not os.path.isfile(path):
            raise BundleError("%s: no such file" % path)
        outputs = session.run(names, load_input_file(path, part))
        entry = {"file": path, "outputs": {}}
        for name, value in zip(names, outputs):
            arrays["%s/%s" % (os.path.basename(path), name)] = value
            item = {"shape": list(value.shape)}
            if looks_like_scores(value[None]):
                order = np.argsort(-value[0])[:args.top]
                item["top"] = [{"index": int(i), "score": float(value[0][i]),
                                "label": labels[i] if labels and i < len(labels) else None}
                               for i in order]
            else:
                item["values"] = value.tolist()
            entry["outputs"][name] = item
        results.append(entry)
    if args.out:
        np.savez(args.out, **arrays)
    return {"results": results, "providers": session.get_providers(), "passed": True}


# --------------------------------------------------------------------------- CLI


def print_human(command, report):
    if command == "check":
        for line in report.get("integrity", []):
            print("integrity: " + line)
        for part, entry in report.get("parts", {}).items():
            for name, s in entry["outputs"].items():
                extra = ""
                if "top1_agreement" in s:
                    extra = ", top-1 agreement %.1f%%" % (100 * s["top1_agreement"])
                print("%s/%s: cosine min %.5f (need >= %.4f), max abs %.4g%s: %s" % (
                    part, name, s["cosine_min"], entry["min_cosine"], s["max_abs"], extra,
                    "ok" if s["passed"] else "FAILED"))
        print("check %s" % ("passed" if report["passed"] else "FAILED"))
    elif command == "bench":
        print("%s on %s (%s, %s cores), %d runs" % (
            report["bundle"], report["providers"][0], report["device"]["arch"],
            report["device"]["cores"], report["runs"]))
        for part, entry in report["parts"].items():
            lat = entry["latency_ms"]
            print("%s (%s): p50 %.3f  p90 %.3f  p99 %.3f  mean %.3f  std %.3f ms, %.1f/s" % (
                part, entry["precision"], lat["p50"], lat["p90"], lat["p99"], lat["mean"],
                lat["std"], entry["throughput_per_s"]))
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
                       ("infer", "run the model on image / .npy / .npz files")):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("--json", action="store_true", help="print one JSON object")
        p.add_argument("--threads", type=int, default=None, help="intra-op threads (0 = ORT)")
        p.add_argument("--require-provider", default=None,
                       help="fail (exit 1) unless this execution provider runs")
        p.add_argument("--part", default=None,
                       help="only this model of a multi-model bundle (default: all)")
        if name == "bench":
            p.add_argument("--runs", type=int, default=100, help="timed runs (default 100)")
            p.add_argument("--warmup", type=int, default=10, help="untimed runs first")
        if name == "infer":
            p.add_argument("files", nargs="+", help="image, .npy or .npz files")
            p.add_argument("--out", default=None, help="also write all outputs to this .npz")
            p.add_argument("--top", type=int, default=5, help="classes shown per output")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        raise SystemExit(EXIT_BAD_INPUT)
    if args.command == "bench" and (args.runs < 1 or args.warmup < 0):
        parser.error("--runs must be >= 1 and --warmup >= 0")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    commands = {"check": cmd_check, "bench": cmd_bench, "infer": cmd_infer}
    try:
        manifest = load_manifest(args.bundle)
        report = commands[args.command](args.bundle, manifest, args)
    except BundleError as exc:
        sys.stderr.write("error: %s\n" % exc)
        return EXIT_BAD_INPUT
    except ProviderMissing as exc:
        sys.stderr.write("error: %s\n" % exc)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print_human(args.command, report)
    return EXIT_OK if report.get("passed", True) else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
