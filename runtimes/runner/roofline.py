"""`run.py bench --roofline`: the device's ceiling, its best FP32 and integer rates over the
bundle's roofline graphs (several GEMM and convolution graphs), and each part's share of it.
Shipped with the roofline extra, which also ships the graphs (the packager's compare and verify
read these same functions)."""

import os

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .errors import BundleError, one_line
from .metrics import timed
from .places import regular_file
from .sessions import CPU, session_settings

OPENVINO = "OpenVINOExecutionProvider"


ROOFLINE_DTYPES = ("float32", "uint8", "int8")
MAX_ROOFLINE_ELEMENTS = 1 << 24   # one input of a roofline graph (the 512x512 ones: 1 << 18)


def roofline_graphs(spec):
    """Every roofline graph of the manifest's *spec*: roofline.fp32 and roofline.int8 (the
    512x512 MatMuls every bundle has), then roofline.graphs (newer bundles: more MatMul shapes,
    QLinearMatMul, Conv and QLinearConv). Each {kind, op, shape, ops, file, inputs}."""
    n = int(spec.get("size", 512))
    a8 = "uint8" if spec.get("int8_kind") == "u8s8" else "int8"
    graphs = [{"kind": "fp32", "op": "MatMul", "shape": [n, n, n], "ops": 2 * n ** 3,
               "file": spec.get("fp32"), "key": "roofline.fp32",
               "inputs": {"a": ["float32", [n, n]], "b": ["float32", [n, n]]}},
              {"kind": "int8", "op": "MatMulInteger", "shape": [n, n, n], "ops": 2 * n ** 3,
               "file": spec.get("int8"), "key": "roofline.int8",
               "inputs": {"a": [a8, [n, n]], "b": ["int8", [n, n]]}}]
    extra = spec.get("graphs") or []
    if not isinstance(extra, list):
        raise BundleError("manifest: roofline.graphs is not a list; rebuild the bundle")
    for i, entry in enumerate(extra):
        where = "roofline.graphs[%d]" % i
        if not _roofline_entry_ok(entry):
            raise BundleError("manifest: %s is not a roofline graph entry (kind, op, shape, ops, "
                              "file, inputs); rebuild the bundle" % where)
        graphs.append(dict(entry, key=where))
    return graphs


def _roofline_entry_ok(entry):
    if not isinstance(entry, dict) or entry.get("kind") not in ("fp32", "int8") or \
            not isinstance(entry.get("file"), str) or not isinstance(entry.get("op"), str) or \
            not isinstance(entry.get("shape"), list):
        return False
    ops = entry.get("ops")
    if isinstance(ops, bool) or not isinstance(ops, (int, float)) or not ops > 0:
        return False
    inputs = entry.get("inputs")
    if not isinstance(inputs, dict) or not inputs:
        return False
    for spec in inputs.values():
        if not isinstance(spec, list) or len(spec) != 2 or spec[0] not in ROOFLINE_DTYPES or \
                not isinstance(spec[1], list) or not spec[1] or \
                not all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                        for d in spec[1]):
            return False
        size = 1
        for d in spec[1]:
            size *= d
        if size > MAX_ROOFLINE_ELEMENTS:
            return False
    return True


def roofline_feed(graph):
    """Inputs of one roofline graph: uniform [0, 1) floats, u8 in [0, 127), s8 in [-64, 64)
    (no saturation in u8s8's 16-bit pairs), the same numbers every run."""
    rng = np.random.RandomState(0)
    feed = {}
    for name, (dtype, shape) in sorted(graph["inputs"].items()):
        if dtype == "float32":
            feed[name] = rng.rand(*shape).astype(np.float32)
        elif dtype == "uint8":
            feed[name] = rng.randint(0, 127, shape).astype(np.uint8)
        else:
            feed[name] = rng.randint(-64, 64, shape).astype(np.int8)
    return feed


def best_rates(rates):
    """{"fp32_gops", "int8_gops", "fp32_best", "int8_best"} from [(graph, GOP/s), ...]: the
    best graph of each kind."""
    result = {}
    for kind in ("fp32", "int8"):
        mine = [(gops, g) for g, gops in rates if g["kind"] == kind]
        if mine:
            gops, g = max(mine, key=lambda t: t[0])
            result[kind + "_gops"] = gops
            result[kind + "_best"] = "%s %s" % (g["op"], "x".join(str(d) for d in g["shape"]))
    return result


def ceiling_share(gops, precision, graphs, provider=CPU):
    """The one "% of ceiling" (bench, verify and compare say the same): *gops* (operations per
    call over p50) against the best rate of its kind (INT8: the integer graphs; FP32 and FP16,
    which a CPU runs in FP32: the FP32 ones) among the roofline *graphs* ({"kind", "gops",
    "provider"}) timed with the same threads under the CPU provider, and under *provider* too
    where the part runs on another (OpenVINO). None where no such graph was timed."""
    kind = "int8" if precision == "int8" else "fp32"
    rates = [g["gops"] for g in graphs if g["kind"] == kind and g.get("provider", CPU) in
             (CPU, provider) and g.get("gops")]
    return gops / max(rates) if gops and rates else None


def time_roofline(folder, graphs, threads, providers=None, runs=10):
    """[(graph, GOP/s at p50, provider that ran), ...] for *graphs* (files under *folder*),
    each on the first of *providers* ([(name, options), ...]; default the CPU) that starts.
    The packager also calls this in another Python (onnxruntime-openvino's) for its ceiling."""
    import onnxruntime as ort

    chain = [(name, dict(options)) for name, options in (providers or [(CPU, {})])
             if name in ort.get_available_providers()] or [(CPU, {})]
    if chain[-1][0] != CPU:
        chain.append((CPU, {}))
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    rates = []
    for graph in graphs:
        path = os.path.join(folder, graph["file"])
        try:
            session = ort.InferenceSession(path, sess_options=so,
                                           providers=[n for n, _ in chain],
                                           provider_options=[o for _, o in chain])
        except Exception as exc:   # a file of the table that is no graph: a damaged build
            raise BundleError("%s: onnxruntime cannot load it (%s); rebuild the bundle"
                              % (graph["file"], one_line(exc))) from None
        feed = roofline_feed(graph)
        times = timed(lambda s=session, f=feed: s.run(None, f), 3, runs)
        rates.append((graph, float(graph["ops"]) / (float(np.percentile(times, 50)) * 1e6),
                      session.get_providers()[0]))
    return rates


def roofline(bundle, manifest, args, threads, other=()):
    """GOP/s of every roofline graph on this device's CPU provider with the same threads (and
    under *other*, [(provider, options)], where a part ran on it); the best FP32 and the best
    integer rate are the ceiling the bundle's GOP/s is a share of."""
    spec = manifest.get("roofline") or {}
    if not spec.get("fp32") or not spec.get("int8"):
        raise BundleError("this bundle has no roofline graphs (built by an older edgepack); "
                          "rebuild it to use --roofline")
    graphs = roofline_graphs(spec)
    for graph in graphs:
        # require_intact has checked the file table's files, hashes and all
        if graph["file"] not in (manifest.get("files") or {}) or \
                not regular_file(os.path.join(bundle, graph["file"])):
            raise BundleError("manifest: %s = %r is not a graph file of the bundle; "
                              "rebuild it" % (graph["key"], graph["file"][:80]))
    rates = time_roofline(bundle, graphs, threads)
    for provider in other:
        try:
            rates += [r for r in time_roofline(bundle, graphs, threads, [provider])
                      if r[2] == provider[0]]
        except BundleError:   # the part ran there; a graph that does not: the CPU's rates stand
            pass
    result = {"threads": threads, "size": int(spec.get("size", 512)),
              "int8_kind": spec.get("int8_kind"),
              "graphs": [{"kind": g["kind"], "op": g["op"], "shape": g["shape"], "gops": gops,
                          "provider": provider} for g, gops, provider in rates]}
    result.update(best_rates([(g, gops) for g, gops, _ in rates]))
    return result


def bench_ceiling(bundle, manifest, args, parts):
    """The device's ceiling (roofline()) with the threads the parts ran with, and each part's
    share of it in its entry of *parts* ({name: bench entry}) as "roofline_share"."""
    threads = int(session_settings(manifest, args).get("intra_op_threads", 0)) or \
        (os.cpu_count() or 1)
    # a part that runs on OpenVINO is held to OpenVINO's rates too (its INT8 kernels beat
    # the CPU provider's by several times where the CPU has AMX)
    other = [(OPENVINO, dict((k, v) for k, v in (p.get("options") or {}).items()
                             if k in ("device_type", "precision")))
             for p in manifest.get("providers") or [] if p.get("name") == OPENVINO
             and any(e["providers"][0] == OPENVINO for e in parts.values())]
    ceiling = roofline(bundle, manifest, args, threads, other[:1])
    for entry in parts.values():
        if "achieved_gops" in entry:
            entry["roofline_share"] = ceiling_share(entry["achieved_gops"], entry["precision"],
                                                    ceiling["graphs"], entry["providers"][0])
    return ceiling


def print_ceiling(ceiling):
    print("roofline (best of %d graphs, %d threads, CPU): FP32 %.1f GOP/s (%s), %s "
          "integer %.1f GOP/s (%s)" % (
              len(ceiling.get("graphs") or ()), ceiling["threads"], ceiling["fp32_gops"],
              ceiling.get("fp32_best"), ceiling["int8_kind"], ceiling["int8_gops"],
              ceiling.get("int8_best")))
