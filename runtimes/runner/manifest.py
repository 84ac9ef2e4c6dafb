"""The bundle: manifest.json read and its shape checked, file hashes, integrity, golden data."""

import hashlib
import importlib.machinery
import json
import os
import re
import zipfile

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .contents import RUNNER_DIR, RUNNER_FILE, optional_module, runner_needed, runner_package
from .errors import BundleError, one_line
from .metrics import from_npz
from .places import provider_path_problems, regular_file

MANIFEST = "manifest.json"
SUPPORTED_SCHEMA = 2
# The bundle's name is used as a folder and archive name on hosts and devices: one safe component.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")
MAX_THREADS = 4096       # a manifest's session thread counts (a device's own: at most its cores)
OPT_LEVEL_NAMES = ("disabled", "basic", "extended", "all")
EXECUTION_MODES = ("sequential", "parallel")
MAX_ROOFLINE_SIZE = 4096   # bench --roofline's n x n MatMul (512 as built: 1 MB a matrix)
MAX_MANIFEST_BYTES = 16 << 20   # a real one is a few KB; a larger one is not ours
WHEN = ("always", "faster")   # a provider's "when": always tried, or only where it is faster


def load_manifest(bundle):
    path = os.path.join(bundle, MANIFEST)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_MANIFEST_BYTES + 1)
        if len(data) > MAX_MANIFEST_BYTES:
            raise BundleError("%s: more than a manifest holds (%d MiB); rebuild the bundle"
                              % (path, MAX_MANIFEST_BYTES >> 20))
        manifest = json.loads(data.decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:   # (nested 100000 deep: recursion)
        raise BundleError("%s: cannot read the manifest (%s); is this an edgepack bundle?"
                          % (path, one_line(str(exc))[:200] or type(exc).__name__)) from None
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


def session_value_problem(key, value, max_threads=MAX_THREADS):
    """What is wrong with one session option (*key*: *value*), or '': thread counts are 0
    (onnxruntime's choice) to *max_threads*."""
    if key in ("intra_op_threads", "inter_op_threads"):
        if not isinstance(value, int) or isinstance(value, bool) or \
                not 0 <= value <= max_threads:
            return "must be a thread count from 0 to %d, got %r" % (max_threads, value)
    elif key == "graph_optimization_level":
        if value not in OPT_LEVEL_NAMES:
            return "must be one of %s, got %r" % (", ".join(OPT_LEVEL_NAMES), str(value)[:40])
    elif key == "execution_mode":
        if value not in EXECUTION_MODES:
            return "must be sequential or parallel, got %r" % str(value)[:40]
    else:
        return "is not a session option (intra_op_threads, inter_op_threads, " \
               "graph_optimization_level, execution_mode)"
    return ""


def check_manifest(manifest):
    """BundleError naming the first field of *manifest* that is not what the runner reads."""
    m = ManifestShape()
    _check_bundle_fields(m, manifest)
    for i, part in enumerate(m.items(manifest, "parts", optional=False)):
        _check_part(m, i, part)
    m.pop()
    if "pipeline" in manifest:
        problem = optional_module("cascade_spec").pipeline_problem(
            manifest["pipeline"], manifest["parts"]) or \
            optional_module("cascade_judge").golden_problem(manifest["pipeline"].get("accuracy"),
                                                            manifest["pipeline"].get("kind"))
        if problem:
            raise BundleError("%s: %s; rebuild the bundle with edgepack" % (MANIFEST, problem))


def _check_bundle_fields(m, manifest):
    """The bundle-wide fields: name, target, session, roofline, files, budget, providers."""
    name = manifest.get("name")
    if not isinstance(name, str) or not SAFE_NAME.match(name):
        raise BundleError("%s: name %s is not one safe file name (letters, digits, '.', '_', "
                          "'-', at most 100, not starting with '.' or '-'); rebuild the bundle "
                          "with edgepack" % (MANIFEST, repr(name)[:60]))
    m.table(manifest, "target", optional=False)
    m.at("name", manifest["target"].get("name"), str, "a target name")
    m.pop()
    m.pop()
    for key in ("session", "budget"):
        m.table(manifest, key)
        m.pop()
    for key, value in sorted((manifest.get("session") or {}).items()):
        problem = session_value_problem(key, value)
        if problem:
            raise BundleError("%s: session.%s %s; rebuild the bundle with edgepack"
                              % (MANIFEST, key, problem))
    roofline = m.table(manifest, "roofline")
    for key in ("fp32", "int8"):
        m.at(key, roofline.get(key), str, "a file name", optional=key not in roofline)
        m.pop()
    for i, graph in enumerate(m.items(roofline, "graphs")):
        m.at(i, graph, dict, "an object")
        m.at("file", graph.get("file"), str, "a file name")
        m.pop()
        m.pop()
    m.pop()
    size = roofline.get("size", 512)
    if isinstance(size, bool) or not isinstance(size, int) or \
            not 1 <= size <= MAX_ROOFLINE_SIZE:
        m.where.append(".size")
        m.fail("a size from 1 to %d" % MAX_ROOFLINE_SIZE)
    m.pop()
    for rel, digest in m.table(manifest, "files").items():
        m.at(rel, digest, str, "a sha256")
        m.pop()
    m.pop()
    for key in ("latency_p90_ms", "min_cosine"):
        value = (manifest.get("budget") or {}).get(key)
        if value is not None and (isinstance(value, bool) or
                                  not isinstance(value, (int, float))):
            raise BundleError("%s: budget.%s is not a number (got %.40r); rebuild the bundle "
                              "with edgepack" % (MANIFEST, key, value))
    for i, entry in enumerate(m.items(manifest, "providers")):
        m.at(i, entry, dict, "an object")
        m.at("name", entry.get("name"), str, "a provider name")
        m.pop()
        if entry.get("when", "always") not in WHEN:
            m.where.append(".when")
            m.fail("one of %s (got %.40r)" % (", ".join(WHEN), entry.get("when")))
        m.table(entry, "options")
        m.pop()
        m.pop()
    m.pop()


def _check_part(m, i, part):
    """parts[i]: its name, model and provider graphs, inputs and outputs, preprocessing,
    labels, task and golden files (ManifestShape *m* says where a field is wrong)."""
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
    length = m.table(part, "length")   # a tts part's token length: open, or fixed
    if length and (length.get("input") not in [v.get("name") for v in part["inputs"]] or
                   length.get("axis") != 1 or not isinstance(length.get("dynamic"), bool)):
        m.fail("{input: one of the part's inputs, axis: 1, dynamic: true or false}")
    m.pop()
    for key in ("preprocess", "precision", "accuracy"):
        m.table(part, key, nullable=key == "preprocess")
        m.pop()
    problem = optional_module("images").preprocess_problem(part["preprocess"]) \
        if part.get("preprocess") else ""
    if problem:
        raise BundleError("%s: parts[%d].%s; rebuild the bundle with edgepack"
                          % (MANIFEST, i, problem))
    precision = part.get("precision") or {}
    m.at("precision", precision, dict, "an object")
    m.at("precision", precision.get("precision"), str, "a precision name", optional=True)
    m.pop()
    m.pop()
    for j, label in enumerate(m.items(part, "labels", nullable=True)):
        m.at(j, label, str, "a label")
        m.pop()
    m.pop()
    if part.get("task") is not None:   # (task_spec.py: shipped with a part that has a task)
        problem = optional_module("task_spec").task_problem(part["task"], part["outputs"])
        if problem:
            raise BundleError("%s: parts[%d].%s; rebuild the bundle with edgepack"
                              % (MANIFEST, i, problem))
    golden = m.table(part, "golden", optional=False)
    m.at("inputs", golden.get("inputs"), str, "a file name")
    m.pop()
    for key in ("outputs", "shipped", "reference", "shipped_provider"):
        m.at(key, golden.get(key), str, "a name", optional=True)
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


def one_part(manifest, name):
    parts = select_parts(manifest, name)
    if len(parts) > 1:
        raise BundleError("this bundle holds %d models (%s); pick one with --part NAME"
                          % (len(parts), ", ".join(p["name"] for p in parts)))
    return parts[0]


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# Names Python imports a module from: this Python's suffixes (its ABI-tagged .so, .pyd on
# Windows), a Linux device's whichever Python checks the bundle, and .pth, which site reads.
IMPORTABLE = tuple(sorted(set(importlib.machinery.all_suffixes()) | {".py", ".pyc", ".so", ".pth"}))


def manifest_files(manifest, bundle=None):
    """The files a bundle cannot do without: the runner, each part's graphs and golden data.

    The runner is runner_needed(manifest) (run.py, the package's entry modules and the
    modules the manifest uses) when the bundle ships the package, i.e. when the manifest's file
    table lists any runner/ file or *bundle* has a runner/ folder; otherwise it is run.py alone,
    as in a bundle built before the split, whose run.py is the whole runner. Every other
    runner/ file the table lists is checked like any file; one it does not list is refused."""
    needed = list(runner_needed(manifest)) if runner_package(manifest, bundle) else [RUNNER_FILE]
    for part in manifest.get("parts") or []:
        needed.append(part.get("model", {}).get("file"))
        needed += [g.get("file") for g in part.get("graphs", [])]
        if (part.get("offline") or {}).get("file"):
            needed.append(part["offline"]["file"])
        golden = part.get("golden", {})
        needed += [golden.get(k) for k in ("inputs", "outputs", "shipped") if golden.get(k)]
    needed += pipeline_golden_files(manifest)
    return needed


def pipeline_golden_files(manifest):
    """The golden photos and answers of a pipeline bundle (pipeline.accuracy.golden), if any."""
    golden = manifest.get("pipeline")
    for key in ("accuracy", "golden"):
        golden = golden.get(key) if isinstance(golden, dict) else None
    if not isinstance(golden, dict):
        return []
    return [golden[k] for k in ("photos", "answers", "tokens", "audio")
            if isinstance(golden.get(k), str)]


def folder_entries(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


MAX_WALK = 10000   # entries looked at inside one folder beside run.py


def importable_inside(folder, files):
    """The first file under *folder* (a folder beside run.py, walked without following links)
    that the file table does not list and whose name Python imports, or None. A folder of
    such files is a package (with an __init__ of any suffix) or a namespace package."""
    seen = 0
    root = os.path.dirname(folder)
    for top, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            seen += 1
            rel = os.path.relpath(os.path.join(top, name), root).replace(os.sep, "/")
            if name.endswith(IMPORTABLE) and rel not in files:
                return rel
            if seen > MAX_WALK:
                return None
    return None


def integrity_problems(bundle, manifest):
    """One line per problem: a file missing or changed, a file the manifest's table leaves out,
    a part whose model hash disagrees with the table, a floor that is not a cosine, a roofline
    graph or a provider path outside the bundle, a stray module Python could import in place of
    run.py's own. (The manifest itself is vouched for by its digest, which `edgepack verify`
    and `deploy` record and compare.)

    Stray: beside run.py, a file the table does not list whose name Python imports (a suffix in
    IMPORTABLE: .py, .pyc, any .so, .pth) or a folder named like a module holding such a file
    at any depth that the table does not list (a package with an __init__ of any suffix, or a
    namespace package);
    inside runner/, any entry the table does not list (a .so, .pyc or __pycache__/ there would
    be imported in place of the runner's own modules). run.py keeps this folder off sys.path
    as well: the two rules guard each other."""
    problems = []
    files = manifest.get("files") or {}
    for rel in files:
        if os.path.isabs(rel) or ".." in rel.replace("\\", "/").split("/"):
            problems.append("manifest: file table entry %r points outside the bundle" % rel)
    for rel in manifest_files(manifest, bundle):
        if not rel or rel not in files:
            problems.append("manifest: %s is not in its file table" % rel)
    problems += roofline_problems(manifest.get("roofline") or {}, files)
    problems += provider_path_problems(manifest)
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
        if not os.path.lexists(path):
            problems.append("%s: missing" % rel)
        elif not regular_file(path):
            problems.append("%s: not a regular file (a FIFO, a device or a dangling link)" % rel)
        elif sha256(path) != expected:
            problems.append("%s: sha256 mismatch (file changed or truncated in transfer)" % rel)
    listed = set(rel.split("/")[0] for rel in files)
    for name in folder_entries(bundle):
        path = os.path.join(bundle, name)
        if name == RUNNER_DIR and os.path.isdir(path):
            problems += ["%s/%s: not part of the runner (the manifest's file table does not list "
                         "it); remove it" % (name, entry) for entry in folder_entries(path)
                         if "%s/%s" % (name, entry) not in files]
            continue
        if name == MANIFEST:
            continue
        if os.path.isdir(path):
            # only a folder named like a module can be imported (.venv/, my-data/ cannot)
            found = importable_inside(path, files) if name.isidentifier() else None
            if found:
                problems.append("%s: not part of the bundle, and Python could import it (%s) "
                                "in place of run.py's own modules; remove it" % (name, found))
        elif name not in listed and name.endswith(IMPORTABLE):
            problems.append("%s: not part of the bundle, and Python would import it before "
                            "run.py's own modules; remove it" % name)
    return problems


def roofline_problems(roofline, files):
    """The roofline graphs the manifest names that its file table does not list."""
    problems = []
    for key in ("fp32", "int8"):
        if key in roofline and (not isinstance(roofline[key], str)
                                or roofline[key] not in files):
            problems.append("manifest: roofline.%s = %r is not in its file table"
                            % (key, str(roofline[key])[:80]))
    extra = roofline.get("graphs") if isinstance(roofline.get("graphs"), list) else []
    for i, graph in enumerate(extra):
        rel = graph.get("file") if isinstance(graph, dict) else None
        if not isinstance(rel, str) or rel not in files:
            problems.append("manifest: roofline.graphs[%d] = %r is not in its file table"
                            % (i, str(rel)[:80]))
    return problems


def manifest_digest(bundle):
    return "sha256:" + sha256(os.path.join(bundle, MANIFEST))


def require_intact(bundle, manifest):
    """bench, infer and serve run nothing from a bundle that fails its integrity check."""
    problems = integrity_problems(bundle, manifest)
    if problems:
        raise BundleError("integrity check failed: %s; copy the bundle again" % problems[0])


def read_npz(bundle, rel):
    """The arrays of a golden .npz of the bundle (no pickles, whatever the manifest points at)."""
    try:
        with np.load(os.path.join(bundle, rel), allow_pickle=False) as f:
            if not hasattr(f, "files"):
                raise ValueError("not an .npz archive")
            return from_npz({k: f[k] for k in f.files})
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
