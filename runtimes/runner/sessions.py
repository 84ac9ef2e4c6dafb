"""Sessions: their options (manifest, tuned, command line), the provider plan with its graphs
and TensorRT caches, and opening the first provider that really starts here."""

import os
import re
import sys
import time

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .contents import GPU_PROVIDERS, TENSORRT, optional_module  # noqa: F401 (read here too)
from .errors import BundleError, ProviderMissing
from .metrics import stack_or_ragged
from .places import names_a_place, provider_path_problems

OPT_LEVELS = {"disabled": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
              "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}
SESSION_OVERRIDES = (("intra_op_threads", "threads"), ("inter_op_threads", "inter_threads"),
                     ("graph_optimization_level", "opt_level"),
                     ("execution_mode", "execution_mode"))
TUNED = "session.tuned.json"   # bench --tune's choice on this device (tuning.py, tuned.py)
TUNE_MARGIN = 0.03   # a setting replaces the current one only when this much faster


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
    """*conf* as onnxruntime SessionOptions. Intra-op threads do not spin while idle, as in
    the host's timing (packager/timing.py): the build, `verify` and `run.py bench` then time
    alike, and a busy device is not slowed further by threads spinning against its other work
    (a bundle timed 2.5 ms in the build and 10.4 ms in `verify` on a loaded machine; idle
    spinning saves about 0.01 ms a call on a quiet one)."""
    so = ort.SessionOptions()
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.intra_op_num_threads = int(conf.get("intra_op_threads", 0))
    so.inter_op_num_threads = int(conf.get("inter_op_threads", 0))
    level = OPT_LEVELS.get(conf.get("graph_optimization_level", "all"), "ORT_ENABLE_ALL")
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    if conf.get("execution_mode") == "parallel":
        so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    return so


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


def session_origin(manifest, args):
    """Where the session options in use come from, in words."""
    if any(getattr(args, attr, None) is not None for _, attr in SESSION_OVERRIDES):
        return "the command line"
    if getattr(args, "tuned", None) and full_session(session_settings(manifest, args)) != \
            full_session(manifest.get("session", {})):
        return "%s, tuned on this device" % TUNED
    return "the manifest"


CPU = "CPUExecutionProvider"


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
    problems = provider_path_problems(manifest)
    if problems:
        raise BundleError("%s; rebuild the bundle with edgepack" % problems[0])
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
                opts[key] = optional_module("tensorrt").trt_cache_dir(bundle, part, graph)
            elif isinstance(value, str) and value.startswith("{bundle}"):
                opts[key] = os.path.join(bundle, value[len("{bundle}/"):])
                inside = os.path.realpath(bundle) + os.sep
                if names_a_place(key, value) and \
                        not os.path.realpath(opts[key]).startswith(inside):
                    raise BundleError("manifest: providers: %s = %r leads outside the bundle "
                                      "(through a link); copy the bundle again" % (key, value))
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
        folders, cache = _provider_places(bundle, part, name, options)
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
                optional_module("tensorrt").write_cache_key(cache, part, graph)
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
    if not getattr(args, "quiet_open", False):
        sys.stderr.write(_running_line(part, info, requested) + "\n")
    require = getattr(args, "require_provider", None)
    if require and require != name:
        raise ProviderMissing("required provider %s is not running (running: %s%s)" % (
            require, name, "; %s: %s" % (require, not_running[require])
            if require in not_running else ""))
    return session, info


def _provider_places(bundle, part, name, options):
    """(folders made for *name*'s path options inside the bundle, its TensorRT engine cache or
    None: tensorrt.py's, which says when the engine is built on this first run)."""
    folders = sorted(set(v for k, v in options.items() if k.endswith(("_path", "_dir")) and
                         isinstance(v, str) and v.startswith(bundle) and
                         not os.path.isdir(v)))
    for folder in folders:
        os.makedirs(folder)
    cache = options.get("trt_engine_cache_path") if name == TENSORRT else None
    if cache:
        optional_module("tensorrt").say_engine_build(bundle, part, cache)
    return folders, cache


def _running_line(part, info, requested):
    """'edgepack: PART running on PROVIDER (graph, precision...)' and what did not run."""
    graph, load, not_running = info["entry"], info["loaded"], info["not_running"]
    line = "edgepack: %s running on %s (%s%s%s)" % (
        part["name"], info["provider"], graph["file"],
        ", " + graph["precision"].upper() if graph.get("precision") else "",
        ", loaded from %s, optimised offline" % load if load != graph["file"] else "")
    if info["offline_note"]:
        line += "; " + info["offline_note"]
    missing = [p for p in requested if p in not_running]
    if missing:
        line += "; requested but not running here: " + "; ".join(
            "%s (%s)" % (p, not_running[p]) for p in missing)
    return line


def run_samples(session, inputs):
    """Run each sample (axis 0 of every array) through the session; stack outputs per name
    (a ragged output where their shapes differ: metrics.stack_or_ragged)."""
    names = [o.name for o in session.get_outputs()]
    count = len(next(iter(inputs.values())))
    # np.asarray: indexing a stack of scalars (an int64 sample rate) gives numpy scalars,
    # which onnxruntime refuses
    rows = [session.run(names, {k: np.asarray(v[i]) for k, v in inputs.items()})
            for i in range(count)]
    return {name: stack_or_ragged([row[j] for row in rows]) for j, name in enumerate(names)}
